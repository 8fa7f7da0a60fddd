"""``picklescope node --data-plane transferqueue``: verl's TransferQueue trainer flow on a real Ray cluster.

The TQ trainer (verl PR #5401, ``verl/trainer/main_ppo_sync.py``; design in verl issue #5400) keeps the
batch out of the single controller: a producer writes it into TransferQueue's storage units, the
controller passes metadata only, the workers read their shards from the storage units. These tests
replay it at small sizes (flowgrpo x0.05, 2 workers, 2 steps) next to the DataProto plane with the same
codecs, and check what must hold at any size: the controller's own memory stays far under a payload,
the storage units hold the batch, nothing is left behind, and a missing TransferQueue is one line.
Every figure is a ratio to the payload measured in the same run, or a fact about processes.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from picklescope.cli import main
from picklescope.core.result import Process
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import NodeResult, node, node_series
from picklescope.investigate.node.tq_plane import STORAGE_UNITS, TQEngine, cpus_needed, plane_lines, plane_verdict
from picklescope.ray import ray_available
from picklescope.ray.transferqueue import missing

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from test_node import _cmd as _cmdline  # noqa: E402
from test_node import _ours, _start_running, gone, left_nothing  # noqa: E402

pytestmark = [pytest.mark.ray,
              pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'picklescope[ray]')")]
needs_tq = pytest.mark.skipif(missing() is not None, reason=f"TransferQueue is not installed: {missing()}")

SCALE, WORKERS, STEPS = 0.05, 2, 2  # flowgrpo x0.05: 22 MiB, 6 rows
PAIR = ("numpy-legacy", "numpy")
SMALL = ["--codec", "numpy", "--workers", str(WORKERS), "--scale", str(SCALE), "--data-plane", "transferqueue"]


@pytest.fixture(scope="module")
def clean_run() -> tuple[int, dict, str]:
    """``picklescope node --data-plane transferqueue --json`` (numpy, x0.05, 2 workers, 2 steps) through the
    command's main() in this process (the session's warm forkserver, no interpreter of its own to start):
    (exit code, its JSON document, what it wrote to stderr).

    It must own its cluster: it is the default path (a run that starts and ends a cluster of its own,
    docs/testing.md), whose clean-up ``test_a_clean_run_leaves_no_transferqueue_or_ray_process`` checks.
    Its options are those of the TransferQueue plane's numpy replay in ``planes``, so its result is that
    replay too (made once for both)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["node", *SMALL, "--steps", str(STEPS), "--json"])
    return rc, (json.loads(out.getvalue()) if out.getvalue().strip() else {}), err.getvalue()


@pytest.fixture(scope="module")
def planes(ray_cluster, clean_run) -> dict[tuple[str, str], NodeResult]:
    """Both codecs on both data planes: (plane, codec) -> result.

    The DataProto plane's pair is one series (the same driver and workers) on the shared cluster; each
    TransferQueue replay starts its own processes: in a series the unmeasured steps before a replay leave
    the storage units' allocator holding a step's batch (freed by ``kv_clear``, kept resident for the next
    write), so their memory would sit in the baseline and not show above it (docs/node.md). The legacy
    codec's TransferQueue replay joins the shared cluster; the numpy codec's is ``clean_run``'s (the same
    options, on the cluster that run starts and ends), read back from its JSON document."""
    out = {}
    for r in node_series(PAIR, workers=WORKERS, steps=STEPS, scale=SCALE, ray_address=ray_cluster.address,
                         timeout_s=600):
        out[("dataproto", r.codec)] = r
    out[("transferqueue", "numpy-legacy")] = node("numpy-legacy", workers=WORKERS, steps=STEPS, scale=SCALE,
                                                  ray_address=ray_cluster.address, data_plane="transferqueue",
                                                  timeout_s=600)
    rc, doc, _ = clean_run
    if rc == 0 and doc.get("outcome") == "ok":
        out[("transferqueue", "numpy")] = NodeResult.from_json_dict(doc)
    else:  # its own cluster did not start or the run failed: that test says why; these replay it here
        out[("transferqueue", "numpy")] = node("numpy", workers=WORKERS, steps=STEPS, scale=SCALE,
                                               ray_address=ray_cluster.address, data_plane="transferqueue",
                                               timeout_s=600)
    return out


@needs_tq
def test_the_controller_passes_metadata_only_and_the_storage_units_hold_the_batch(planes):
    for codec in PAIR:
        dp, tq = planes[("dataproto", codec)], planes[("transferqueue", codec)]
        assert dp.outcome == tq.outcome == "ok", (codec, dp.error, tq.error)
        assert tq.data_plane == "transferqueue" and dp.data_plane == "dataproto"
        assert set(tq.processes) == {"driver", "producer", "tq-controller", "storage-0", "storage-1",
                                     *(f"worker-{i}" for i in range(WORKERS))}, sorted(tq.processes)
        assert set(dp.processes) == {"driver", *(f"worker-{i}" for i in range(WORKERS))}
        p = tq.payload_bytes
        own = {n: tq.own_peak_bytes(n) for n in tq.processes}
        # the controller never holds a tensor of the batch: only metadata and the small per-token result
        assert own["driver"] < 0.05 * p, (codec, own["driver"] / p)
        # the batch sits in the storage units between the producer's write and the clear at the step's end
        storage = sum(own[f"storage-{i}"] for i in range(2))
        assert storage >= 0.9 * p, (codec, storage / p)
        # each worker reads its shard out of the storage units (the rows are split, so together they read it all)
        assert sum(own[f"worker-{i}"] for i in range(WORKERS)) >= 0.9 * p, own
        steps = {s.name for s in tq.processes["worker-0"].steps}
        assert {"kv_batch_get", "compute", "kv_batch_put"} <= steps, steps
        driver_steps = {s.name for s in tq.driver.steps}
        assert {"rollout", "chunk", "kv_batch_get", "kv_clear"} <= driver_steps, driver_steps
        assert "consolidate" not in driver_steps and "__getstate__" not in driver_steps
        assert {s.training_step for s in tq.driver.steps} == set(range(1, STEPS + 1))
    # on the DataProto plane the legacy codec's discarded copies are the controller's own: far above the TQ plane's
    legacy = planes[("dataproto", "numpy-legacy")]
    assert legacy.own_peak_bytes() >= 0.9 * legacy.payload_bytes
    assert planes[("transferqueue", "numpy-legacy")].own_peak_bytes() < 0.05 * legacy.own_peak_bytes()


@needs_tq
def test_json_keeps_the_node_schema_and_says_which_plane_ran(planes):
    r = planes[("transferqueue", "numpy")]
    doc = json.loads(json.dumps(r.to_json_dict()))
    assert doc["node"]["config"]["data_plane"] == "transferqueue"
    assert doc["node"]["engine"]["data_plane"] == "transferqueue" and doc["node"]["engine"]["storage_units"] == 2
    for name in ("driver", "storage-0", "storage-1", "producer", "tq-controller"):
        assert doc["processes"][name]["own_peak_bytes"] is not None, name
    assert [doc["processes"][n]["role"] for n in ("storage-0", "producer", "worker-0", "driver")] == \
        ["storage", "producer", "worker", "driver"]
    back = NodeResult.from_json_dict(doc)
    assert back.data_plane == "transferqueue" and back.own_peak_bytes("storage-1") == r.own_peak_bytes("storage-1")
    assert "data plane transferqueue" in r.summary().splitlines()[0]
    lines = plane_lines([planes[("dataproto", "numpy")], r])
    assert lines[0].startswith("dataproto") and lines[1].startswith("transferqueue"), lines
    assert "storage units" in lines[1] and "storage units" not in lines[0]
    from picklescope.views.table import node_rows

    assert [row["data plane"] for row in node_rows([planes[("dataproto", "numpy")], r])] == ["dataproto",
                                                                                              "transferqueue"]
    assert "data plane" not in node_rows([planes[("dataproto", "numpy")]])[0]
    from picklescope.views.node_figure import node_figure

    names = [t.name for t in node_figure(r, group_workers=True).data]  # TransferQueue's processes stay apart
    assert {"driver", f"workers ({WORKERS})", "producer", "storage-0", "storage-1", "tq-controller"} <= set(names)


@needs_tq
def test_the_figure_title_names_the_plane_where_it_is_not_the_usual_one(planes):
    """A TransferQueue replay's figure looks like a DataProto one: its title says which plane it is."""
    from picklescope.views import figures

    tq, dp = planes[("transferqueue", "numpy")], planes[("dataproto", "numpy")]
    assert figures.node_figure(tq).layout.title.text.startswith("numpy on the TransferQueue data plane: ")
    assert figures.node_figure(dp).layout.title.text.startswith("numpy: ")


def test_bad_data_plane_options_are_one_line_before_anything_runs():
    for kw in ({"data_plane": "shared-memory"}, {"data_plane": "transferqueue", "dispatch": "broadcast"},
               {"data_plane": "transferqueue", "transport": "ray"},
               {"data_plane": "transferqueue", "engine": "verl"}):
        with pytest.raises(PicklescopeError) as err:
            node("numpy", **kw)
        assert "\n" not in str(err.value) and err.value.hint, kw
    with pytest.raises(PicklescopeError, match="verl DataProto"):
        node("verl-0.9.1:numpy", data_plane="transferqueue")
    if missing() is None:  # the loop in a Ray actor is the DataProto plane's (docs/node.md)
        with pytest.raises(PicklescopeError, match="--controller actor runs the DataProto plane only") as err:
            node("numpy", data_plane="transferqueue", controller="actor")
        assert "\n" not in str(err.value) and err.value.hint


def test_missing_transferqueue_is_one_line_naming_the_install(tmp_path, monkeypatch, capsys):
    """The command's main() in this process (as the other bad-input checks: no interpreter to start)."""
    monkeypatch.setenv("PICKLESCOPE_TQ_DIR", str(tmp_path / "no-transferqueue-here"))
    capsys.readouterr()
    rc = main(["node", *SMALL])
    out, err = capsys.readouterr()
    assert rc == 2, (out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert "no-transferqueue-here" in lines[0] and "pip install --no-deps --target" in lines[0], lines[0]
    assert out == ""


def _cmd(q: psutil.Process) -> str:
    return " ".join(_cmdline(q))


@needs_tq
def test_a_clean_run_leaves_no_transferqueue_or_ray_process(clean_run):
    """A run on a cluster of its own (the default path) exits 0, its clean-up leaves nothing, and every
    process it measured (TransferQueue's storage units, controller and producer among them) is gone."""
    rc, doc, err = clean_run
    assert rc == 0, (err[-3000:], doc.get("node", {}).get("error"))
    assert doc["outcome"] == "ok" and doc["node"]["cleanup"]["remaining"] == [], doc["node"]["cleanup"]
    assert {"storage-0", "storage-1", "tq-controller", "producer"} <= set(doc["processes"])
    assert gone([v["pid"] for v in doc["processes"].values()], wait_s=60) == []


@needs_tq
def test_an_interrupted_run_leaves_no_transferqueue_or_ray_process_or_file():
    # with Python's fault handler on, a run that outlives its Ctrl-C is made to print every thread's stack
    p, procs = _start_running(["node", *SMALL, "--steps", "1000"],
                              lambda procs: sum("SimpleStorageUnit" in _cmd(q) for q in procs) >= 2
                              and sum("TQWorker" in _cmd(q) for q in procs) >= WORKERS,
                              env={**os.environ, "PYTHONFAULTHANDLER": "1"})
    try:
        assert _ours(p.pid), "the run's temporaries should exist while it runs"
        os.kill(p.pid, signal.SIGINT)
        try:
            p.wait(timeout=180)
        except subprocess.TimeoutExpired:
            os.kill(p.pid, signal.SIGABRT)  # the fault handler prints where each thread of the run was
            p.wait(timeout=60)
            raise AssertionError("the run outlived its Ctrl-C by 180 s; its threads were at:\n"
                                 + p.stderr.read()[-8000:]) from None
        left_nothing(p, procs, _ours, interrupted=True)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def test_the_plane_is_in_the_cli_help():
    from picklescope.cli import build_parser

    parser = build_parser()
    args = parser.parse_args(["node", "--data-plane", "dataproto,transferqueue"])
    assert args.data_plane == "dataproto,transferqueue"
    assert parser.parse_args(["node"]).data_plane == "dataproto"


def test_a_killed_replay_says_what_each_process_held_at_the_kill():
    from picklescope.core.kill import Kill
    r = NodeResult("numpy", "ray-arg", "flowgrpo", SCALE, 100,
                   workers=WORKERS, steps=STEPS, dispatch="chunk", gc="default", returns=None,
                   data_plane="transferqueue")
    for name, base in (("driver", 1000), ("producer", 2000), ("storage-0", 500)):
        r.processes[name] = Process(name, 1, "worker", reading="private", sampled_baseline_bytes=base)
    r.killed = Kill("producer", 1.0, 300, 1, node_bytes=400, training_step=2, step="kv_batch_put",
                    oom_scores={"producer": 700},
                    memory_bytes={"driver": 1001, "producer": 2250, "storage-0": 600, "store": 0})
    lines = plane_lines([r])
    assert lines[0].startswith("transferqueue killed producer in training step 2"), lines
    assert lines[1] == "  at the kill, above baselines: producer 2.50x, storage-0 1.00x, driver 0.01x " \
                       "(oom_score: producer 700)", lines


def test_the_plane_verdict_answers_yes_or_no_with_the_step_each_plane_lost_a_process_in():
    from picklescope.core.kill import Kill

    def replay(plane: str, killed: tuple[str, int] | None = None, outcome: str = "ok") -> NodeResult:
        r = NodeResult("numpy-legacy", "ray-arg", "flowgrpo", SCALE, 100, workers=WORKERS, steps=4, dispatch="chunk",
                       gc="off", returns=None, data_plane=plane)
        r.outcome = "oom-killed" if killed else outcome
        if killed:
            r.killed = Kill(killed[0], 1.0, 300, 1, node_bytes=400, training_step=killed[1], step="compute")
        return r

    dp_killed, tq_killed = replay("dataproto", ("worker-1", 2)), replay("transferqueue", ("storage-0", 3))
    assert plane_verdict(dp_killed, replay("transferqueue")) == (
        "Yes: under the same node budget the TransferQueue plane completed every training step, where the "
        "DataProto plane lost its worker-1 in training step 2.")
    assert plane_verdict(dp_killed, tq_killed) == (
        "No: under the same node budget the TransferQueue plane lost its storage-0 in training step 3, later than "
        "the DataProto plane, which lost its worker-1 in training step 2.")
    assert plane_verdict(replay("dataproto", ("driver", 3)), tq_killed).startswith(
        "No: under the same node budget both planes lost a process in training step 3 (TransferQueue its "
        "storage-0, DataProto its driver)")
    assert plane_verdict(replay("dataproto"), tq_killed).endswith("where the DataProto plane completed every "
                                                                  "training step.")
    assert plane_verdict(replay("dataproto"), replay("transferqueue")).startswith("The question did not arise")
    assert plane_verdict(dp_killed, replay("transferqueue", outcome="timeout")).startswith(
        "Not known: the TransferQueue replay ended timeout")


def test_the_command_comparing_both_planes_under_a_budget_ends_with_the_verdict(monkeypatch, capsys):
    """``node --data-plane dataproto,transferqueue --node-budget ...`` prints the plane lines, then the yes or
    no of :func:`plane_verdict` (the replays are stubbed here: the verdict's words are the command's)."""
    from picklescope.cli.commands import node as node_cmd
    from picklescope.core.kill import Kill

    def replays(codecs, *a, data_plane: str = "dataproto", **kw):
        r = NodeResult(codecs[0], "ray-arg", "flowgrpo", SCALE, 100, workers=WORKERS, steps=STEPS,
                       dispatch="chunk", gc="off", returns=None, data_plane=data_plane, budget_bytes=150)
        r.processes["driver"] = Process("driver", 1, "driver", reading="private", sampled_baseline_bytes=0)
        if data_plane == "dataproto":
            r.outcome = "oom-killed"
            r.killed = Kill("worker-1", 1.0, 300, 1, node_bytes=160, training_step=2, step="compute")
        return [r]

    monkeypatch.setattr(node_cmd, "node_series", replays)
    assert main(["node", *SMALL[:-2], "--data-plane", "dataproto,transferqueue", "--node-budget", "1.5x"]) in (0, 1)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last == ("Would the TransferQueue plane have saved this node? Yes: under the same node budget the "
                    "TransferQueue plane completed every training step, where the DataProto plane lost its "
                    "worker-1 in training step 2."), last


def test_a_joined_cluster_without_a_cpu_for_each_transferqueue_actor_is_one_line():
    """TransferQueue's controller and each storage unit reserve one logical CPU: on a joined cluster with
    fewer, its actors would wait for one forever. The controller says so before starting anything."""
    class OneCpuRay:
        def cluster_resources(self) -> dict[str, float]:
            return {"CPU": 1.0}

    assert cpus_needed() == 1 + STORAGE_UNITS
    with pytest.raises(PicklescopeError) as err:
        TQEngine(OneCpuRay(), {"workers": 2, "ray_address": "127.0.0.1:1"}, None)
    assert "and the Ray cluster has 1" in err.value.problem and f"--num-cpus {cpus_needed()}" in err.value.hint
