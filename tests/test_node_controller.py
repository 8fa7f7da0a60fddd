"""``picklescope node --controller actor``: the training loop in a Ray actor, as verl's ``TaskRunner`` runs it.

The actor is measured under the driver's name (the node's schema stays), the process that started
Ray as ``script``; the legacy codec's discarded copies must then show in the actor, not in the script.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from picklescope.errors import PicklescopeError
from picklescope.investigate.node import NodeResult, node, node_series
from picklescope.measure.session import Session
from picklescope.ray import ray_available

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from test_node_ray_monitor import _usable  # noqa: E402

ray_only = pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'picklescope[ray]')")


def test_an_unknown_controller_is_one_line_before_anything_starts():
    with pytest.raises(PicklescopeError) as exc:
        node("numpy", controller="thread")
    assert "--controller 'thread'" in exc.value.problem and "actor" in exc.value.hint
    done = subprocess.run([sys.executable, "-m", "picklescope", "node", "--controller", "thread"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "--controller" in lines[0] and "Traceback" not in done.stderr, done.stderr


def test_hand_over_keeps_the_old_curve_under_its_new_name():
    """The session measures a name in another process from a moment on; the first process goes on as itself."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    session = Session(time.monotonic(), None, 0.001, reading="private")
    try:
        session.adopt("driver", os.getpid(), role="driver")
        session.start()
        deadline = time.monotonic() + 60
        while len(session.processes["driver"].timeline.t_s) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        before = len(session.processes["driver"].timeline.t_s)
        assert before >= 3
        rec = session.hand_over("driver", child.pid, "script", role="driver", node_id="n1")
        assert rec.pid == child.pid and rec.node_id == "n1" and session.processes["driver"] is rec
        script = session.processes["script"]
        assert script.pid == os.getpid() and script.name == script.role == "script"
        while (not rec.timeline.t_s or len(script.timeline.t_s) <= before) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert rec.timeline.t_s and len(script.timeline.t_s) > before  # both sampled from then on
        assert rec.timeline.t_s[0] >= script.timeline.t_s[before - 1]  # the new curve starts at the hand-over
    finally:
        session.stop()
        child.kill()
        child.wait()


def test_json_names_the_controller_and_reads_back():
    r = NodeResult("numpy", "ray-arg", "flowgrpo", 0.05, 1,
                   workers=2, steps=2, dispatch="chunk", gc="off", returns=None, controller="actor")
    doc = r.to_json_dict()
    assert doc["controller"] == "actor" and doc["node"]["config"]["controller"] == "actor"
    assert NodeResult.from_json_dict(doc).controller == "actor"
    doc.pop("controller")  # a document written before the option existed: the driver process ran the loop
    assert NodeResult.from_json_dict(doc).controller == "process"


@ray_only
@pytest.mark.ray
def test_the_actor_runs_the_loop_and_is_measured_as_the_driver():
    # a series: the second replay's session finds the actor again (the same processes, measured again).
    # A cluster of the run's own, not the shared one: its clean-up (cleanup["remaining"], only reported for a
    # cluster the run starts and ends) is checked below with the actor in it
    legacy, fixed = node_series(("numpy-legacy", "numpy"), "flowgrpo", 0.05, workers=2, steps=2, gc="off",
                                controller="actor")
    for r in (legacy, fixed):
        assert r.outcome == "ok", (r.codec, r.error, r.notes)
        assert r.controller == "actor" and r.to_json_dict()["controller"] == "actor"
        assert set(r.processes) == {"driver", "script", "worker-0", "worker-1"}
        driver, script = r.processes["driver"], r.processes["script"]
        assert driver.pid != script.pid and driver.role == "driver" and script.role == "script"
        assert not script.steps  # the script only relays
        assert {s.training_step for s in driver.steps if s.name == "chunk"} == {1, 2}
        assert r.own_peak_bytes("script") < 0.2 * r.payload_bytes, r.own_peak_bytes("script")
    assert legacy.processes["driver"].pid == fixed.processes["driver"].pid
    names = {s.name for s in legacy.driver.steps}
    assert {"chunk", "argument serialization", "consolidate", "ray.get", "concat"} <= names, names
    assert "consolidate" not in {s.name for s in fixed.driver.steps}
    # with the collector off the legacy codec keeps each step's consolidated copies (about one payload):
    # in the actor, where the loop ran, and not in the script; the fixed codec keeps none
    grew = {r.codec: (r.training_steps[-1].driver_bytes - r.training_steps[0].driver_bytes) / r.payload_bytes
            for r in (legacy, fixed)}
    assert grew["numpy-legacy"] >= 0.8 and grew["numpy"] < 0.1, grew
    assert fixed.cleanup["remaining"] == [], fixed.cleanup
    alive = [p.pid for p in fixed.processes.values() if psutil.pid_exists(p.pid)
             and psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE]
    assert alive == []


@ray_only
@pytest.mark.ray
def test_verls_worker_group_runs_from_the_actor(verl_envs):
    """--engine verl with --controller actor: verl's RayWorkerGroup is built and called from the actor."""
    # A cluster of the run's own, not the shared one (as tests/test_node.py's --engine verl test): it is
    # sized for verl's resource pool (a CPU bundle per worker, one more for the actor), and what verl's
    # worker group leaves behind is checked when that cluster ends.
    # three steps: two discarded copies between the first step's end and the last's, so that the allocator
    # reusing pages the first step freed (0.69x payload of growth over one step was seen) cannot hide them
    r = node("verl-0.9.0:numpy", scale=0.0625, workers=2, steps=3, engine="verl", gc="off", controller="actor")
    assert r.outcome == "ok", (r.error, r.notes)
    assert r.engine_info["worker_group"] == "verl.single_controller.ray.base.RayWorkerGroup", r.engine_info
    names = {s.name for s in r.processes["driver"].steps}
    assert {"worker group call", "DataProto.chunk", "consolidate", "DataProto.concat"} <= names, names
    assert not r.processes["script"].steps
    grew = r.training_steps[-1].driver_bytes - r.training_steps[0].driver_bytes
    assert grew >= 1.2 * r.payload_bytes, (grew, r.payload_bytes)  # verl 0.9.0's discarded copies, in the actor
    assert r.cleanup["remaining"] == [], r.cleanup


@ray_only
@pytest.mark.ray
@pytest.mark.slow
def test_under_rays_monitor_the_actor_is_among_what_ray_considers_and_names():
    """--enforcement ray: with the loop in an actor, Ray's message lists the controller as users see it
    (``ray::TaskRunner.run`` among the top memory users; verl #3453), whichever process it kills."""
    # A cluster of the run's own by design: --enforcement ray puts the cluster it starts in a memory cgroup
    # and sets Ray's monitor at that start; a joined cluster is refused (its processes are not the run's).
    why = _usable()
    if why:
        pytest.skip(f"--enforcement ray is unavailable here: {why}")
    r = node("numpy-legacy", "flowgrpo", 0.1, workers=2, steps=4, gc="off", node_budget="4x", enforcement="ray",
             controller="actor")
    assert r.outcome == "oom-killed" and r.killed is not None and r.killed.by == "ray", (r.error, r.cgroup, r.notes)
    message = r.killed.message or ""
    assert "ray::TaskRunner.run" in message and "task name=TaskRunner" in message, message
    top = [row["command"] for row in r.cgroup["ray_top_memory_users"]]
    assert "ray::TaskRunner.run" in top, top
    assert r.killed.process in r.processes, r.killed  # Ray's victim, one of the node's sampled processes
    assert r.cgroup["removed"] and r.cgroup["start_removed"] and r.cleanup["remaining"] == [], (r.cgroup, r.cleanup)
