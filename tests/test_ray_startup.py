"""Ray's start-up on a busy machine (ray/startup.py, docs/ray.md "Starting on a busy machine").

On a loaded two-core machine the usual failure is Ray's own: the raylet aborts when its dashboard agent
has not written its port file within a fixed 15 s (ray-project/ray#65983). Such a try ends early, so
the policy makes several short tries within one budget. The second test holds the agent back at
start-up (a ``sitecustomize`` on the cluster's ``PYTHONPATH`` sleeps inside the agent's process before
it imports anything) for the first two starts: the same failure as on a busy machine, without
loading the machine for the other tests.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from picklescope.ray import ray_available, startup
from picklescope.ray.local_cluster import LocalCluster

MiB = 2**20

HOLD_BACK = '''
import os, time
try:
    _cmd = open("/proc/self/cmdline", "rb").read()
except OSError:
    _cmd = b""
if b"dashboard/agent.py" in _cmd:
    _count = os.path.join(os.environ["PS_TEST_AGENT_DIR"], "held")
    with open(_count, "a") as _f:
        _f.write("x")
    if os.path.getsize(_count) <= int(os.environ["PS_TEST_AGENT_HOLD_STARTS"]):
        time.sleep(float(os.environ["PS_TEST_AGENT_HOLD_S"]))
'''


def _hold_back_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, starts: int) -> None:
    """Every Ray started from here on holds its dashboard agent back 25 s (past the raylet's fixed 15 s)
    at its first ``starts`` starts; ``tmp_path / "held"`` gets an "x" per agent started."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(HOLD_BACK)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p))
    monkeypatch.setenv("PS_TEST_AGENT_DIR", str(tmp_path))
    monkeypatch.setenv("PS_TEST_AGENT_HOLD_STARTS", str(starts))
    monkeypatch.setenv("PS_TEST_AGENT_HOLD_S", "25")


def test_tries_fit_the_budget_and_early_failures_leave_room_for_more(monkeypatch):
    """Each try gets at most TRY_TIMEOUT_S of what is left; all together at most START_BUDGET_S or the
    caller's limit; a retry only with MIN_TRY_S left. Tries that fail early (20 s each, as when the
    raylet gives up on its agent) make all TRIES tries; tries that use their whole budget make two."""
    now = [1000.0]
    monkeypatch.setattr(startup.time, "monotonic", lambda: now[0])

    def spend(left_s, each_s):
        budgets = []
        for budget in startup.try_budgets(left_s):
            budgets.append(budget)
            now[0] += min(budget, each_s)
        return budgets

    assert spend(None, 20.0) == [startup.TRY_TIMEOUT_S] * startup.TRIES
    assert startup.TRIES >= 4
    assert spend(None, 1e9) == [startup.TRY_TIMEOUT_S, startup.START_BUDGET_S - startup.TRY_TIMEOUT_S]
    limited = spend(100.0, 1e9)
    assert limited == [100.0]  # nothing left for a retry: never past the caller's limit
    assert spend(160.0, 1e9) == [150.0]  # 10 s left is under MIN_TRY_S: no retry
    assert sum(spend(170.0, 1e9)) == 170.0  # 20 s left is enough for one more


def test_components_that_die_together_are_named_by_the_one_that_ended_them(monkeypatch):
    """A raylet that gives up on its dashboard agent stops its runtime-env agent a moment before it exits
    itself: a poll between the two found the agent dead and named it, which says nothing of the cause (a
    fresh-clone CI: "the runtime-env agent died 0:16 into start-up"). The raylet gets AGENT_GRACE_S to show
    its own end; an agent that died alone is still named, once that wait is over."""
    t0 = startup.time.monotonic()
    raylet_ends = [t0 + 0.2]
    monkeypatch.setattr(startup.cluster, "running",
                        lambda pid, ticks: pid == 1 and startup.time.monotonic() < raylet_ends[0])
    labels = dict(startup.COMPONENTS)
    watch = startup.ComponentWatch(lambda: [], t0=t0)
    watch.seen = {2: (labels["runtime_env/agent/main.py"], None), 1: (labels["/raylet/raylet"], None)}
    assert watch.poll() == labels["/raylet/raylet"]
    assert "raylet" in watch.sentence("start-up") and watch.sentence("start-up").endswith("0:00 into start-up")
    raylet_ends[0] = float("inf")  # the raylet lives on: the agent died alone
    alone = startup.ComponentWatch(lambda: [], t0=t0)
    alone.seen = {2: (labels["runtime_env/agent/main.py"], None), 1: (labels["/raylet/raylet"], None)}
    assert alone.poll() == labels["runtime_env/agent/main.py"]
    assert startup.time.monotonic() - t0 >= startup.AGENT_GRACE_S


@pytest.mark.slow
@pytest.mark.ray
def test_a_cluster_whose_agent_misses_rays_deadline_twice_starts_on_a_later_try(tmp_path, monkeypatch):
    if not ray_available():
        pytest.skip("ray is not installed (pip install 'picklescope[ray]')")
    _hold_back_agent(tmp_path, monkeypatch, starts=2)
    cluster = LocalCluster(object_store_bytes=100 * MiB, num_cpus=1)
    try:
        cluster.start()
        assert len(cluster.failures) == 2, cluster.failures
        for reason in cluster.failures:  # each failed try named the raylet and why it gave up
            assert "raylet" in reason and "dashboard agent" in reason, cluster.failures
        assert Path(tmp_path / "held").read_text() == "xxx"  # three agents started: two held back, one not
    finally:
        report = cluster.stop()
    assert report["remaining"] == [], report


@pytest.mark.slow
@pytest.mark.ray
def test_a_node_joining_a_cluster_starts_under_the_same_policy_and_stops_alone(ray_cluster, tmp_path, monkeypatch):
    """``LocalCluster(join=...)`` (a second Ray node on this machine, tests/test_node.py's two-node replay):
    an address where no cluster listens ends in one sentence naming the join, within the caller's limit;
    a node whose agent misses Ray's deadline on its first try joins on the next; stopping it leaves the
    cluster it joined running."""
    if not ray_available():
        pytest.skip("ray is not installed (pip install 'picklescope[ray]')")
    nowhere = LocalCluster(object_store_bytes=100 * MiB, num_cpus=0, join="127.0.0.1:9")
    with pytest.raises(startup.RayStartError) as err:
        nowhere.start(timeout_s=20)
    assert str(err.value).startswith("a node joining the Ray cluster at 127.0.0.1:9 did not start within"), err.value
    assert nowhere.report["remaining"] == [], nowhere.report

    _hold_back_agent(tmp_path, monkeypatch, starts=1)
    node = LocalCluster(object_store_bytes=100 * MiB, num_cpus=0, join=ray_cluster.address, resources={"held": 1})
    try:
        node.start()
        assert node.address == ray_cluster.address
        assert len(node.failures) == 1 and "raylet" in node.failures[0], node.failures
        assert Path(tmp_path / "held").read_text() == "xx"
    finally:
        report = node.stop()
    assert report["remaining"] == [], report
    assert ray_cluster.pids(), "stopping the added node stopped the cluster it joined"
