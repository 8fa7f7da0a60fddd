"""Measured runs in real sender and receiver processes: the ratios the codecs' code predicts.

The replica codecs copy verl's ``DataProto.__getstate__`` behaviour before and after verl PR #7539
(verl 0.9.1: the numpy branch runs before ``contiguous().consolidate()``), so each expected ratio is
a count of payload copies read from that code (``codecs/numpy_codec.py``, ``codecs/torch_codec.py``).

Checks are ratios to the payload measured in the same run, never times.
"""

from __future__ import annotations

import os
import time

import pytest

import picklescope as ps
from picklescope.core.kill import Kill
from picklescope.core.result import Measured, Process, RunResult, Series, Step
from picklescope.investigate.node.result import NodeResult
from picklescope.measure import verdicts
from picklescope.measure.session import Session
from picklescope.views.timeline import RunTimeline


def ratio(n, r):
    return n / r.payload_bytes


def test_numpy_legacy_pays_one_full_copy_that_numpy_does_not(flowgrpo_quarter):
    legacy = flowgrpo_quarter[("numpy-legacy", "pickle5-oob")]
    fixed = flowgrpo_quarter[("numpy", "pickle5-oob")]
    assert legacy.outcome == fixed.outcome == "ok"
    assert abs(ratio(legacy.sender.peak_bytes - fixed.sender.peak_bytes, legacy) - 1.0) < 0.05
    assert ratio(fixed.sender.peak_bytes, fixed) < 0.02
    step = legacy.sender.step("consolidate")
    assert abs(ratio(step.added_bytes, legacy) - 1.0) < 0.05


def test_torch_steps_each_add_one_payload(flowgrpo_quarter):
    r = flowgrpo_quarter[("torch", "pickle5-oob")]
    assert abs(ratio(r.sender.step("consolidate").added_bytes, r) - 1.0) < 0.05
    assert abs(ratio(r.sender.step("torch.save").added_bytes, r) - 1.0) < 0.05


@pytest.mark.parametrize("codec", ["torch", "numpy-legacy"])
def test_consolidate_buffer_is_held_by_a_reference_cycle(flowgrpo_quarter, codec):
    r = flowgrpo_quarter[(codec, "pickle5-oob")]
    assert abs(ratio(r.sender.cycle_held_bytes, r) - 1.0) < 0.05
    assert ratio(flowgrpo_quarter[("numpy", "pickle5-oob")].sender.cycle_held_bytes, r) < 0.02


def test_numpy_receiver_pays_its_bytearray_copy(flowgrpo_quarter):
    r = flowgrpo_quarter[("numpy", "pickle5-oob")]
    assert 0.95 < ratio(r.receiver.peak_bytes, r) < 1.10
    assert abs(ratio(r.receiver.step("frombuffer").added_bytes, r) - 1.0) < 0.06


def test_transport_changes_the_cost_of_the_same_codec(flowgrpo_quarter):
    oob = flowgrpo_quarter[("numpy", "pickle5-oob")]
    inband = flowgrpo_quarter[("numpy", "pickle")]
    # numpy (verl >= 0.9.1) makes no copy of its own: over pickle5-oob its arrays travel out of band (~0x
    # payload), over protocol 4 pickle copies them in-band into the stream, then the bytes (~2x payload)
    assert abs(ratio(inband.sender.peak_bytes, inband) - 2.0) < 0.1
    assert ratio(inband.sender.peak_bytes - oob.sender.peak_bytes, oob) > 1.8
    legacy4 = flowgrpo_quarter[("numpy-legacy", "pickle")]
    assert abs(ratio(legacy4.sender.peak_bytes, legacy4) - 3.0) < 0.1


def test_every_run_round_trips_exactly_and_reports_both_sides(flowgrpo_quarter):
    for (codec, transport), r in flowgrpo_quarter.items():
        assert r.outcome == "ok", (codec, transport, r.error)
        assert r.roundtrip == {"ok": True, "mismatches": []}
        for side in r.processes.values():
            assert side.baseline_bytes and side.pid and side.exit_code == 0
            assert len(side.timeline.t_s) > 10
            names = [s.name for s in side.steps]
            assert ("pickle.dumps" in names) if side.name == "sender" else ("pickle.loads" in names)
        assert r.serialize_s is not None and r.deserialize_s is not None
        assert r.blob_bytes >= (r.inband_bytes or 0)


def test_handoff_adds_nothing_to_the_sender(flowgrpo_quarter):
    for r in flowgrpo_quarter.values():
        assert ratio(r.sender.step("handoff").added_bytes, r) < 0.02


def test_sampled_curve_agrees_with_exact_peak(steady_torch_pickle):
    """On the steadiest of up to three runs (tests/conftest.py, ``steady_torch_pickle``): a sampler held off a
    core for 33 ms by a loaded machine missed the peak by 16% in one run."""
    r = steady_torch_pickle.run
    assert abs(ratio(r.sender.own_peak_bytes() - r.sender.peak_bytes, r)) < 0.1


@pytest.mark.parametrize("codec", ["torch", "numpy-legacy", "numpy"])
def test_mixed_runs_fail_clearly_on_declared_gaps(codec):
    r = ps.run(codec, "pickle5-oob", "mixed", 1.0)
    assert r.outcome == "error"
    assert "cannot carry leaf" in r.error and "'" in r.error
    assert r.roundtrip["ok"] is None


def test_mismatched_codecs_across_processes_are_explained():
    r = ps.run("numpy", "pickle5-oob", "tiny", 1.0, receiver_codec="torch")
    assert r.outcome == "error" and r.error.startswith("receiver:")
    assert "written in numpy mode, read in torch mode" in r.error


def test_result_json_round_trip():
    r = ps.run("numpy", "pickle", "tiny", 1.0)
    again = ps.RunResult.from_json(r.to_json())
    assert again == r


def test_every_value_of_a_result_is_a_field_and_results_saved_with_an_extra_dict_still_load():
    """A result has no ``extra`` dict: each value is a typed field, saved under its own name. A results.json
    written when some values sat under ``extra`` loads into the fields (core/result.py, ``lift_old_extra``)."""
    from picklescope.investigate.reproduce import Investigation

    r = RunResult("numpy", "pickle", "tiny", 1.0, 100, processes={"sender": Process("sender", private_peak_bytes=7)},
                  killed_at="codec.py:3 in encode", role="budgeted", headroom_bytes=42)
    d = r.to_dict()
    assert "extra" not in d and "extra" not in d["sides"]["sender"]
    assert (d["killed_at"], d["role"], d["headroom_bytes"], d["sides"]["sender"]["private_peak_bytes"]) == \
           ("codec.py:3 in encode", "budgeted", 42, 7)
    # a results.json written when some values sat under "extra" (headroom under its old name) still loads
    old = {k: v for k, v in d.items() if k not in ("killed_at", "role", "headroom_bytes", "run_dir")}
    old["extra"] = {"killed_at": "codec.py:3 in encode", "role": "budgeted", "headroom": 42, "run_dir": "/r",
                    "gone": 1}
    old["sides"] = {"sender": {k: v for k, v in d["sides"]["sender"].items() if k != "private_peak_bytes"}}
    old["sides"]["sender"]["extra"] = {"private_peak_bytes": 7}
    back = RunResult.from_dict(old)
    assert (back.killed_at, back.role, back.headroom_bytes, back.sender.private_peak_bytes, back.run_dir) == \
           ("codec.py:3 in encode", "budgeted", 42, 7, "/r")
    back.run_dir = None
    assert back == RunResult.from_dict(d) == r
    inv = Investigation.from_dict({"workload": "tiny", "scale": 1.0, "results": [],
                                   "extra": {"headline": "h", "budget": "0.5x", "other": 1}})
    assert (inv.headline, inv.budget) == ("h", "0.5x")
    assert "extra" not in inv.to_dict() and Investigation.from_dict(inv.to_dict()) == inv


def test_one_step_and_one_series_shape_and_documents_saved_before_them_still_load():
    """A step is one :class:`Step` everywhere (a run's side, a node's process, a drawn timeline) and bytes over
    time one :class:`Series`. Saved documents of the shapes before (a side's ``timeline`` with ``rss_bytes``, a
    node process's steps without ``line``, a RunTimeline's ``bands``, a RunTimeline's sides of their own shape)
    load into them."""
    step = Step(name="consolidate", start_s=1.0, end_s=None, peak_bytes=5, added_bytes=5, depth=1)
    assert step.until(0.5) == 1.0 and step.until(2.0) == 2.0 and Step("s", 1.0, 3.0).until(9.0) == 3.0
    side = Process("sender", baseline_bytes=10, steps=[step], timeline=Series([0.0, 0.1], [10, 25]))
    r = RunResult("numpy", "pickle", "tiny", 1.0, 100, processes={"sender": side})
    d = r.to_dict()
    assert d["sides"]["sender"]["timeline"] == {"t_s": [0.0, 0.1], "bytes": [10, 25]}
    assert RunResult.from_dict(d) == r and r.sender.own_peak_bytes() == 15
    old = r.to_dict()
    old["sides"]["sender"]["timeline"] = {"t_s": [0.0, 0.1], "rss_bytes": [10, 25]}  # the Timeline of before
    for s in old["sides"]["sender"]["steps"]:
        del s["training_step"]
    assert RunResult.from_dict(old) == r
    # a RunTimeline holds the run's own records (copies), its tracers' series beside them
    r.tracers = {"memray": {"available": True, "sides": {"sender": {"series": {"t_s": [0.05], "bytes": [3]}}}}}
    tl = RunTimeline.from_result(r)
    assert tl.sides["sender"] == side and tl.sides["sender"].steps[0] is not step
    assert tl.sides["sender"].above_baseline() == Series([0.0, 0.1], [0, 15]) and tl.end_s("sender") == 1.0
    assert tl.tracer_series == {"sender": {"memray": Series([0.05], [3])}}
    assert RunTimeline.from_json(tl.to_json()) == tl
    # a RunTimeline saved when each side had a shape of its own (the curve above the baseline as "rss", the
    # tracers' series beside it), with its steps as "bands" (a subset of a step's fields)
    old_tl = {k: v for k, v in tl.to_dict().items() if k != "tracer_series"}
    old_tl["sides"] = {"sender": {
        "name": "sender", "baseline_bytes": 10, "baseline_s": None, "rss": {"t_s": [0.0, 0.1], "bytes": [0, 15]},
        "bands": [{"name": "consolidate", "start_s": 1.0, "end_s": None, "depth": 1, "peak_bytes": 5,
                   "added_bytes": 5, "error": None}],
        "peak_bytes": None, "held_bytes": None, "cycle_held_bytes": None, "budget_bytes": None, "exit_code": None,
        "tracers": {"memray": {"t_s": [0.05], "bytes": [3]}}}}
    assert RunTimeline.from_dict(old_tl) == tl
    # a node document whose process steps carry training_step and no line
    node = NodeResult("numpy", "ray-arg", "flowgrpo", 0.05, 1,
                      workers=2, steps=2, dispatch="chunk", gc="off", returns=None)
    node.processes["driver"] = Process("driver", 1, "driver", reading="private", steps=[
        Step(name="ray.put", start_s=0.5, end_s=0.7, peak_bytes=3, depth=0, training_step=1)],
        timeline=Series([0.5], [7]))
    doc = node.to_json_dict()
    for s in doc["processes"]["driver"]["steps"]:
        del s["line"]
    back = NodeResult.from_json_dict(doc).processes["driver"]
    assert back.steps == node.processes["driver"].steps and back.timeline == Series([0.5], [7])


def test_one_process_shape_with_one_meaning_per_baseline_and_documents_saved_before_it_still_load():
    """A measured process is one :class:`Process` (a run's side, a node replay's process). ``baseline_bytes``
    is always the VmRSS the process reported; a node's curve (private bytes) is measured from its sample at
    the baseline tick, ``sampled_baseline_bytes``, and the curve above it comes from ``above_baseline``. A
    node process or a side saved before this shape (one ``baseline_bytes``, their timeline's) still loads."""
    side = Process("sender", baseline_bytes=10, baseline_s=0.1, timeline=Series([0.0, 0.1, 0.2], [8, 25, 12]))
    assert side.reading == "rss" and side.timeline_baseline_bytes == 10
    assert side.above_baseline() == Series([0.0, 0.1, 0.2], [-2, 15, 2]) and side.own_peak_bytes() == 15
    assert side.above_baseline(0.15) == Series([0.2], [2]) and side.above(30) == 20
    worker = Process("worker-0", 7, "worker", "n1", reading="private", baseline_bytes=900,
                     sampled_baseline_bytes=100, timeline=Series([0.0, 0.1, 0.2], [90, 130, 110]))
    assert worker.own_peak_bytes() == 30 and worker.own_peak_bytes(since_s=0.15) == 10 and worker.above(100) == 0
    late = Process("worker-1", 8, "worker", reading="private", baseline_bytes=900, timeline=Series([0.2], [50]))
    assert late.above_baseline() == Series() and late.own_peak_bytes() is None and late.above(50) is None
    assert late.above_baseline(unknown_baseline=0) == Series([0.2], [50])  # a node's sum counts it from zero
    # a node replay's document: the record as it is, plus its own peak above the baseline tick
    node = NodeResult("numpy", "ray-arg", "flowgrpo", 0.05, 1,
                      workers=2, steps=2, dispatch="chunk", gc="off", returns=None, baseline_s=0.1)
    node.processes = {"worker-0": worker, "worker-1": late}
    doc = node.to_json_dict()
    p = doc["processes"]["worker-0"]
    assert {"peak_bytes", "own_peak_bytes", "held_bytes", "cycle_held_bytes", "node_id", "sampled", "pid",
            "baseline_bytes", "steps", "timeline", "role", "reading", "sampled_baseline_bytes"} <= set(p)
    assert (p["own_peak_bytes"], p["baseline_bytes"], p["sampled_baseline_bytes"]) == (30, 900, 100)
    assert "open_steps" not in p and "done" not in p  # the fold's bookkeeping is the session's
    assert NodeResult.from_json_dict(doc).processes == node.processes
    # a node process saved before: its baseline_bytes was the sampled private baseline, it had no reading
    old = {"peak_bytes": 5, "own_peak_bytes": 30, "held_bytes": 1, "cycle_held_bytes": 0, "node_id": "n1",
           "sampled": True, "pid": 7, "role": "worker", "baseline_bytes": 100, "error": None,
           "steps": [{"name": "frombuffer", "start_s": 0.1, "end_s": 0.2, "peak_bytes": 5, "added_bytes": 5,
                      "retained_bytes": 0, "depth": 0, "error": None, "training_step": 1}],
           "timeline": {"t_s": [0.0, 0.1, 0.2], "bytes": [90, 130, 110]}}
    doc["processes"] = {"worker-0": old}
    back = NodeResult.from_json_dict(doc)
    was = back.processes["worker-0"]
    assert (was.name, was.reading, was.baseline_bytes, was.sampled_baseline_bytes) == ("worker-0", "private", None, 100)
    assert back.own_peak_bytes("worker-0") == 30 and was.steps == [Step("frombuffer", 0.1, 0.2, 5, 5, 0,
                                                                         training_step=1)]
    assert back.to_json_dict()["processes"]["worker-0"]["own_peak_bytes"] == 30
    # a run's side saved before: no reading, role, node, sampled or error; its timeline named rss_bytes
    old_side = {"name": "sender", "pid": 3, "baseline_bytes": 10, "baseline_s": 0.1, "peak_bytes": 14,
                "held_bytes": 0, "cycle_held_bytes": 0, "steps": [], "exit_code": 0, "budget_bytes": None,
                "timeline": {"t_s": [0.0, 0.1, 0.2], "rss_bytes": [8, 25, 12]}, "private_peak_bytes": None,
                "killed": False, "peak_source": None, "codec_info": None, "store_pages_bytes": None,
                "store_pages_by_step": None, "note": None}
    loaded = RunResult.from_dict({**RunResult("numpy", "pickle", "tiny", 1.0, 100).to_dict(),
                                  "sides": {"sender": old_side}}).sender
    assert loaded == Process("sender", 3, baseline_bytes=10, baseline_s=0.1, peak_bytes=14, held_bytes=0,
                             cycle_held_bytes=0, timeline=Series([0.0, 0.1, 0.2], [8, 25, 12]), exit_code=0)
    assert loaded.own_peak_bytes() == 15


def test_a_pairs_run_and_a_node_replay_share_one_root_and_their_documents_keep_their_keys():
    """A pair's (or a cell's) :class:`RunResult` and a node replay's :class:`NodeResult` are one root,
    :class:`Measured`: the same processes, the same typed kill record and outcome, read the same way by a
    view. Each keeps its ``--json`` keys (a run's ``sides`` and ``kill``, a node's ``processes`` and
    ``killed``), and a run saved with its kill record as a plain dictionary loads it typed."""
    kill = Kill(process="sender", t_s=1.5, budget_bytes=64, pid=11, above_baseline_bytes=70, step="consolidate")
    run = RunResult("numpy-legacy", "pickle", "tiny", 1.0, 100, outcome="oom-killed", killed=kill,
                    processes={"sender": Process("sender", 11, peak_bytes=70), "receiver": Process("receiver")})
    node = NodeResult("numpy-legacy", "ray-arg", "flowgrpo", 0.05, 100, workers=2, steps=2, dispatch="chunk",
                      gc="off", returns=None, outcome="oom-killed",
                      killed=Kill(process="driver", t_s=2.0, node_bytes=300, training_step=2))
    node.processes["driver"] = Process("driver", 12, "driver", reading="private", peak_bytes=250)
    for r, victim, peak in ((run, "sender", 70), (node, "driver", 250)):
        assert isinstance(r, Measured) and r.outcome == "oom-killed"
        assert r.killed is not None and r.processes[r.killed.process].peak_bytes == peak and r.killed.process == victim
    doc = run.to_dict()
    assert set(doc["sides"]) == {"sender", "receiver"} and doc["kill"]["above_baseline_bytes"] == 70
    assert "processes" not in doc and "killed" not in doc
    assert RunResult.from_dict(doc) == run and RunResult.from_json(run.to_json()).killed == kill
    nodedoc = node.to_json_dict()
    assert nodedoc["killed"]["training_step"] == 2 and "driver" in nodedoc["processes"]
    assert NodeResult.from_json_dict(nodedoc).killed == node.killed
    untouched = RunResult("numpy", "pickle", "tiny", 1.0, 100)
    assert untouched.killed is None and untouched.to_dict()["kill"] is None
    assert RunResult.from_dict(untouched.to_dict()) == untouched


def test_the_session_keeps_the_folds_bookkeeping_beside_the_records():
    """Which steps are open and which processes are done is the session's to know while it folds; a
    handed-over process takes its open steps to its new name."""
    session = Session(0.0)
    session.processes["driver"] = Process("driver", 1, "driver", reading="private")
    session.fold("driver", {"type": "baseline", "t_s": 0.5, "baseline_bytes": 1000})
    session.fold("driver", {"type": "step_start", "name": "ray.put", "t_s": 1.0, "depth": 0})
    assert session.step_at_kill("driver") == ("ray.put", "driver")
    rec = session.processes["driver"]
    assert (rec.baseline_bytes, rec.baseline_s, rec.sampled_baseline_bytes) == (1000, 0.5, None)
    session.fold("driver", {"type": "step_end", "name": "ray.put", "start_s": 1.0, "end_s": 1.5, "peak_bytes": 9})
    assert session.step_at_kill("driver") == (None, None) and rec.peak_bytes == 9 and rec.steps[0].end_s == 1.5
    session.fold("driver", {"type": "step_start", "name": "loop", "t_s": 2.0, "depth": 0})
    session.fold("driver", {"type": "done", "peak_bytes": 12})
    assert session.done == {"driver"} and rec.peak_bytes == 12
    new = session.hand_over("driver", os.getpid(), "script", role="driver")  # the loop moves into an actor
    try:
        assert session.processes["script"] is rec and rec.name == "script" and session.done == {"script"}
        assert session.step_at_kill("script") == ("loop", "script")
        assert session.step_at_kill("driver") == (None, None)  # the new driver has opened none yet
        assert new.reading == "private" and new.steps == [] and session.processes["driver"] is new
    finally:
        session.stop()


def test_a_sample_is_timed_after_its_reads_so_a_killed_process_teardown_is_trimmed():
    """A budget kill times its SIGKILL just before sending it (``Kill.sigkill_t_s``) while the sampling thread
    goes on; a tick timed before its reads could read the dying process's teardown (its level falling back to
    its baseline, mapping by mapping) under a time before the SIGKILL, and the trim at the kill would keep it.
    Timed after its reads, every sample's time is at or after the moment of each read it holds."""
    read_at: list[float] = []

    class Clocked:
        def read(self) -> int:  # a read that takes 2 ms, as /proc under load can: timed when it is done
            time.sleep(0.002)
            read_at.append(time.monotonic())
            return 100

        def close(self) -> None:
            pass

    t0 = time.monotonic()
    session = Session(t0)
    session.processes["sender"] = Process("sender", 1, "sender")
    session._readers["sender"] = Clocked()
    session.set_store(Clocked(), "test")
    try:
        for _ in range(3):
            session.tick()
    finally:
        session.stop()
    times = session.processes["sender"].timeline.t_s
    assert len(times) == 3 and session.store.t_s == times == session.node.t_s
    for t, sender_read, store_read in zip(times, read_at[0::2], read_at[1::2]):
        assert t >= round(max(sender_read, store_read) - t0, 6)
    kill = Kill("sender", t_s=times[0], sigkill_t_s=(times[1] + times[0]) / 2)
    verdicts._trim(session.processes["sender"], kill.sigkill_t_s)
    assert session.processes["sender"].timeline.t_s == times[:1]  # what was read after the SIGKILL is gone


def test_unknown_names_fail_before_any_process_starts():
    with pytest.raises(ps.UnknownNameError):
        ps.run("nope", "pickle", "tiny")


def test_a_series_replay_that_never_ran_is_told_from_one_that_failed():
    """A replay of a series after one that ended early is concluded ``error`` with "not replayed: ..."
    (investigate/node/parent.py); the notebook and the driver-log note tell it from a replay that ran and
    failed by ``NodeResult.replayed``, not by reading the message again."""

    def result() -> NodeResult:
        return NodeResult("numpy", "ray-arg", "flowgrpo", 0.05, 1, workers=2, steps=2, dispatch="chunk", gc="off",
                          returns=None)

    skipped, failed, ok = result(), result(), result()
    verdicts.conclude(skipped, "error", "not replayed: the numpy-legacy replay before it ended oom-killed")
    verdicts.conclude(failed, "error", "the driver ended before its first training step")
    verdicts.conclude(ok, "ok", None)
    assert (skipped.replayed, failed.replayed, ok.replayed) == (False, True, True)
