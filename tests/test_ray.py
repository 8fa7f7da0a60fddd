"""The ray transports on real local clusters: both sides measured, the store traced, nothing left behind.

One cluster (``LocalCluster``, joined like a real one with ``ray_address``) carries the seed workload
scaled to ~128 MiB for each codec and the call-argument path; two runs start their own cluster (the
default path): one ends cleanly and shows the zero-copy hazard, one has its driver SIGKILLed. Every
check is a ratio to the payload measured in the same run, or a fact about processes; no wall time.
"""

from __future__ import annotations

import os
import signal

import psutil
import pytest

import picklescope as ps
from picklescope.ray import ray_available
from picklescope.ray.transport import TransferQueueTransport

pytestmark = pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'picklescope[ray]')")

SEED, SEED_SCALE = "seed-6400x20480", 0.256  # ~128 MiB
MiB = 1024**2


def leftovers(driver_pid: int | None, temp_root: str | None) -> list[str]:
    """An independent check (psutil, not the toolkit's own scan): live processes of that cluster."""
    found = []
    for p in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            if p.info["status"] == psutil.STATUS_ZOMBIE or p.pid == os.getpid():
                continue
            cmd = " ".join(p.info["cmdline"] or [])
            in_session = driver_pid is not None and os.getsid(p.pid) == driver_pid
            if in_session or (temp_root and temp_root in cmd):
                found.append(f"{p.pid} {cmd[:120]}")
        except (psutil.NoSuchProcess, ProcessLookupError, PermissionError):
            continue
    return found


def temp_root(r: ps.RunResult) -> str | None:
    session = r.ray.get("session_dir")
    return os.path.dirname(session) if session else None


@pytest.fixture(scope="module")
def cluster():
    """A cluster of this module's own, not the session's ``ray_cluster``: the store checks below read the
    plasma file's allocated pages, which never shrink, so the store must start with no other tests' pages."""
    from picklescope.ray.local_cluster import LocalCluster

    c = LocalCluster(object_store_bytes=640 * MiB, num_cpus=3).start()
    yield c
    report = c.stop()
    assert report["remaining"] == [], report
    assert leftovers(c.proc.pid, c.temp_dir) == []


@pytest.fixture(scope="module")
def seed(cluster):
    """torch, numpy and numpy-legacy over ray on the seed workload, one run each on the shared cluster."""
    opts = {"ray_address": cluster.address}
    return {c: ps.run(c, "ray", SEED, SEED_SCALE, transport_options=opts) for c in ("torch", "numpy", "numpy-legacy")}


OWN_ZEROCOPY_EVENTS: list[dict] = []  # what the parent's event hook saw during own_zerocopy


@pytest.fixture(scope="module")
def own_zerocopy():
    """numpy-zerocopy over ray on a cluster of the run's own (the default path), ended cleanly."""
    return ps.run("numpy-zerocopy", "ray", "tiny", 1.0, on_event=OWN_ZEROCOPY_EVENTS.append)


def ratio(n: int, r: ps.RunResult) -> float:
    return n / r.payload_bytes


def test_every_seed_run_round_trips_with_both_sides_and_the_store(seed):
    for codec, r in seed.items():
        assert r.outcome == "ok", (codec, r.error)
        assert r.roundtrip == {"ok": True, "mismatches": []}
        assert [s.name for s in r.sender.steps][:2] == ["ray.put", "ray.serialize"]
        assert r.receiver.steps[0].name == "ray.get" and r.receiver.step("ray.deserialize")
        for side in r.processes.values():
            assert side.pid and side.baseline_bytes and side.peak_bytes is not None
            assert len(side.timeline.t_s) > 10
        assert r.sender.pid != r.receiver.pid
        store = r.object_store
        assert "plasma" in store["source"] and len(store["t_s"]) > 10
        # the store's pages: at least the one stored object (a shared cluster keeps earlier runs' pages)
        assert 0.95 < ratio(max(store["bytes"]), r) < 2.5


def test_numpy_driver_serialize_is_under_2_percent_of_torch_memory(seed):
    numpy, torch = seed["numpy"].sender_cost, seed["torch"].sender_cost
    assert torch["serialize_peak_bytes"] > 2.5 * seed["torch"].payload_bytes  # consolidate + save + in-band
    assert numpy["serialize_peak_bytes"] < 0.02 * torch["serialize_peak_bytes"]
    # the serialize is the codec's; the store write is Ray's copy, one payload for every codec
    for r in seed.values():
        assert abs(ratio(r.sender_cost["store_write_store_pages_bytes"], r) - 1.0) < 0.05


def test_numpy_worker_cost_is_the_receivers_copy_and_reported_as_such(seed):
    r = seed["numpy"]
    cost = r.receiver_cost
    assert cost["kind"] == "copy" and cost["step"] == "frombuffer" and cost["received"] == "copied"
    assert abs(ratio(cost["step_private_added_bytes"], r) - 1.0) < 0.06
    assert abs(ratio(cost["private_peak_bytes"], r) - 1.0) < 0.08
    assert abs(ratio(cost["store_pages_bytes"], r) - 1.0) < 0.05  # the rest of its RSS peak is the store's
    assert "codec's copy" in cost["explanation"] and "frombuffer" in cost["explanation"]


def test_numpy_legacy_driver_peak_is_one_payload_above_numpy(seed):
    legacy, fixed = seed["numpy-legacy"], seed["numpy"]
    # two processes' peaks: each carries its own allocator's arenas and page rounding, a few MiB apart on
    # a 128 MiB payload (1.050x was read once), so the same 0.08 as the private peak above
    assert abs(ratio(legacy.sender.peak_bytes - fixed.sender.peak_bytes, fixed) - 1.0) < 0.08
    assert abs(ratio(legacy.sender.cycle_held_bytes, legacy) - 1.0) < 0.05  # the consolidate, in a cycle


def test_copying_codecs_receive_private_writable_tensors(seed):
    for r in seed.values():
        rec = r.received
        assert rec["status"] == "copied" and rec["shared_bytes"] == 0
        assert all(leaf["writable"] for leaf in rec["leaves"].values())
        assert rec["hazard"]["probed"] is False


def test_zero_copy_codec_shares_the_store_and_a_write_reaches_other_readers(own_zerocopy):
    r = own_zerocopy
    assert r.outcome == "ok" and r.roundtrip["ok"] is True, r.error
    rec = r.received
    assert rec["status"] == "shared"
    assert all(leaf["region"] == "object store" for leaf in rec["leaves"].values())
    hazard = rec["hazard"]
    assert hazard["probed"] and hazard["visible_to_other_readers"], hazard
    assert r.receiver_cost["kind"] == "zero-copy"
    # a fresh cluster's store fills during the driver's put, on the sides' clock
    store, write = r.object_store, r.sender.step("object-store write")
    before = [b for t, b in zip(store["t_s"], store["bytes"]) if t <= write.start_s]
    after = [b for t, b in zip(store["t_s"], store["bytes"]) if t >= write.end_s]
    assert before and after and ratio(after[-1] - before[-1], r) > 0.9


def test_own_cluster_run_leaves_no_ray_process(own_zerocopy):
    r = own_zerocopy
    assert r.ray["address"] == "local" and r.ray["cluster_pids"].get("raylet")
    assert r.ray["remaining"] == []
    assert leftovers(r.ray["driver_pid"], temp_root(r)) == []


def test_ray_sides_send_only_declared_events(own_zerocopy):
    """The driver and the actor speak the protocol of core/events.py: declared kinds and keys only."""
    from picklescope.core.events import undeclared_keys

    assert own_zerocopy.outcome == "ok", own_zerocopy.error
    kinds = {ev["type"] for ev in OWN_ZEROCOPY_EVENTS}
    assert {"ray_info", "hello", "ready", "baseline", "step_start", "step_end", "done"} <= kinds, kinds
    wrong = [(ev["type"], undeclared_keys(ev)) for ev in OWN_ZEROCOPY_EVENTS if undeclared_keys(ev) != (set(), set())]
    assert not wrong, wrong


def test_sigkilled_driver_leaves_no_ray_process():
    """Kill the driver in the middle of its ray.put: Ray's processes outlive it; the parent ends them."""
    state = {}

    def kill_in_put(ev):
        if ev.get("type") == "step_start" and ev.get("name") == "ray.put" and "killed" not in state:
            state["killed"] = True
            os.kill(state["pid"], signal.SIGKILL)
        if ev.get("type") == "ready":
            state["pid"] = ev["pid"]

    r = ps.run("numpy", "ray", "tiny", 1.0, on_event=kill_in_put)
    assert state.get("killed"), f"the run never reached its ray.put: {r.error}"
    assert r.outcome != "ok"
    assert r.sender.exit_code == -signal.SIGKILL
    tracking = r.ray
    assert tracking["left_after_driver"], "expected Ray processes to outlive a SIGKILLed driver"
    assert tracking["remaining"] == []
    assert leftovers(tracking["driver_pid"], temp_root(r)) == []


def test_call_argument_path_measures_both_sides(cluster):
    r = ps.run("numpy", "ray-arg", "tiny", 1.0, transport_options={"ray_address": cluster.address})
    assert r.outcome == "ok" and r.roundtrip["ok"] is True, r.error
    snd = [s.name for s in r.sender.steps]
    assert snd[:3] == ["actor.call", "ray.serialize", "__getstate__"] and "object-store write" in snd
    assert r.sender.step("object-store write").depth == 1
    assert [s.name for s in r.receiver.steps][:3] == ["ray.deserialize", "__setstate__", "frombuffer"]
    assert r.received["status"] == "copied"


def test_mismatched_codecs_fail_on_the_worker_with_the_reason(cluster):
    r = ps.run("numpy", "ray", "tiny", 1.0, receiver_codec="torch", transport_options={"ray_address": cluster.address})
    assert r.outcome == "error" and r.error.startswith("receiver:")
    assert "written in numpy mode, read in torch mode" in r.error


def test_two_sided_figure_has_the_store_between_the_sides(seed):
    from picklescope.views.ray_figure import ray_timeline_figure

    fig = ray_timeline_figure(seed["numpy"])
    titles = [a.text for a in fig.layout.annotations if a.text and ":" in a.text]
    assert titles[0].startswith("driver") and titles[1].startswith("object store") and titles[2].startswith("worker")
    store = [t for t in fig.data if t.name and t.name.startswith("object store")]
    assert store and max(store[0].y) > 100  # MiB


def test_unavailable_transport_says_why_before_anything_runs(monkeypatch):
    from picklescope.ray import transport

    monkeypatch.setattr(transport.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(transport.TransportUnavailable, match="ray package is not installed"):
        ps.run("numpy", "ray", "tiny", 1.0)


@pytest.mark.skipif(TransferQueueTransport().availability() is not None,
                    reason=f"TransferQueue unavailable: {TransferQueueTransport().availability()}")
def test_transferqueue_round_trip_is_measured_on_both_sides(cluster):
    r = ps.run("numpy", "transferqueue", "tiny", 1.0, transport_options={"ray_address": cluster.address})
    assert r.outcome == "ok" and r.roundtrip == {"ok": True, "mismatches": []}, r.error
    assert [s.name for s in r.sender.steps] == ["tq.put", "kv_batch_put"]
    assert [s.name for s in r.receiver.steps] == ["tq.get", "kv_batch_get", "to_dense"]
    assert "never called" in r.codec_note
    store = r.object_store
    assert store["source"].startswith("RSS of the TransferQueue storage unit") and len(store["t_s"]) > 10
