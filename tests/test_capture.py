"""The capture probe: installed in a trainer, it records the batch's structure and what the call cost.

The trainer here is a fresh Python process running real verl (0.9.0, the copy in numpy mode; 0.9.1,
the fix from verl PR #7539) with the probe installed from the environment
(``PICKLESCOPE_CAPTURE``). Serialization goes through ``pickle.dumps`` with protocol 5 and
out-of-band buffers, as Ray ships a DataProto.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

TRAINER = r'''
import gc, json, os, pickle, sys
site, workload, scale, calls = sys.argv[1:5]
sys.path.insert(0, site)
os.environ["VERL_DATAPROTO_SERIALIZATION_METHOD"] = "numpy"
import verl.protocol as vp
import picklescope.investigate.capture
probe = picklescope.investigate.capture.auto()          # the one line a user adds (folder from PICKLESCOPE_CAPTURE)
from picklescope.workloads.spec import load_workload
b = load_workload(workload).build(float(scale))
dp = vp.DataProto(batch=b.batch, non_tensor_batch=b.non_tensor_batch, meta_info=b.meta_info)
for _ in range(int(calls)):
    buffers = []
    blob = pickle.dumps(dp, protocol=5, buffer_callback=buffers.append)
    del blob, buffers
    gc.collect()  # 0.9.0's copy sits in a reference cycle; collect it so each call starts from the same floor
print(json.dumps({"error": probe.error, "active": probe.active, "calls": probe.calls}))
'''
WORKLOAD, SCALE = "seed-6400x20480", 0.125  # 62.5 MiB of payload


def _trainer(site: str, folder, tmp_path, calls: int = 4) -> tuple[dict, list[dict]]:
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    env = {**__import__("os").environ, "PICKLESCOPE_CAPTURE": str(folder), "PICKLESCOPE_CAPTURE_LIMIT": "2"}
    p = subprocess.run([sys.executable, str(script), site, WORKLOAD, str(SCALE), str(calls)], capture_output=True,
                       text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    state = json.loads(p.stdout.strip().splitlines()[-1])
    lines = [json.loads(x) for x in (folder / "calls.jsonl").read_text().splitlines()]
    return state, lines


@pytest.fixture(scope="module")
def captured(verl_envs, tmp_path_factory):
    out = {}
    for label in ("0.9.0", "0.9.1"):
        tmp = tmp_path_factory.mktemp(f"trainer-{label}")
        out[label] = (tmp / "batch-capture", *_trainer(str(verl_envs[label].site), tmp / "batch-capture", tmp))
    return out


def test_probe_records_one_payload_per_call_on_090_and_none_on_091(captured):
    from picklescope.workloads.spec import load_workload

    payload = load_workload(WORKLOAD).payload_bytes(SCALE)
    for label, (folder, state, lines) in captured.items():
        assert state == {"error": None, "active": False, "calls": 2}, label  # limit 2 of 4 calls, then gone
        assert [x["call"] for x in lines] == [1, 2]
        for x in lines:
            assert x["mode"] == "numpy" and x["verl_version"] == label and x["peak_exact"]
            assert x["payload_bytes"] == payload and "workload_error" not in x
        peaks = [x["peak_x_payload"] for x in lines]
        if label == "0.9.0":
            assert all(0.95 <= p <= 1.1 for p in peaks), peaks  # the consolidate() copy numpy mode ignores
        else:
            assert all(p < 0.02 for p in peaks), peaks
        assert (folder / "workload.yaml").is_file() and (folder / lines[0]["workload"]).is_file()


def test_the_captured_workload_gives_the_verdict(captured):
    """The captured batch through numpy-legacy and numpy: the sender peaks differ by one payload."""
    from picklescope import run
    from picklescope.workloads.spec import load_workload

    folder = captured["0.9.0"][0]
    path = str(folder / "workload.yaml")
    w = load_workload(path)
    assert [t.name for t in w.tensors] == [t.name for t in load_workload(WORKLOAD).tensors]
    legacy, fixed = run("numpy-legacy", "pickle5-oob", path, 1.0), run("numpy", "pickle5-oob", path, 1.0)
    assert legacy.outcome == fixed.outcome == "ok", (legacy.error, fixed.error)
    assert legacy.payload_bytes == w.payload_bytes(1.0) == load_workload(WORKLOAD).payload_bytes(SCALE)
    diff = (legacy.sender.peak_bytes - fixed.sender.peak_bytes) / legacy.payload_bytes
    assert 0.95 <= diff <= 1.05, diff


class _Boom(Exception):
    pass


def test_the_probe_never_raises_into_the_caller(tmp_path, caplog):
    """Failures to record are logged once; the original runs unchanged, its own errors pass through."""
    import json as json_mod

    from picklescope.investigate import capture

    original = json_mod.decoder.JSONDecoder.decode
    # a batch it cannot describe: the cost is still one JSON line, with the reason
    probe = capture.install(tmp_path / "cap", limit=2, target="json.decoder:JSONDecoder.decode")
    try:
        assert json_mod.loads('{"a": 1}') == {"a": 1}
        with pytest.raises(json_mod.JSONDecodeError):
            json_mod.loads("{not json")  # the caller's own error, untouched (and counted)
        assert json_mod.loads("[2]") == [2]
    finally:
        probe.remove()
    assert json_mod.decoder.JSONDecoder.decode is original and probe.calls == 2
    lines = [json_mod.loads(x) for x in (tmp_path / "cap" / "calls.jsonl").read_text().splitlines()]
    assert len(lines) == 1 and "not a DataProto" in lines[0]["workload_error"] and lines[0]["rss_before_bytes"] > 0

    # a folder that cannot be written: logged once, the probe steps aside
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with caplog.at_level(logging.WARNING, logger="picklescope.investigate.capture"):
        probe = capture.install(blocker / "sub", limit=3, target="json.decoder:JSONDecoder.decode")
        try:
            for _ in range(3):
                assert json_mod.loads("[1]") == [1]
        finally:
            probe.remove()
    assert probe.error and len([r for r in caplog.records if r.name == "picklescope.investigate.capture"]) == 1
    assert json_mod.decoder.JSONDecoder.decode is original

    # a target that does not resolve: logged, nothing installed, nothing raised
    probe = capture.install(tmp_path / "cap2", target="no_such_module_here:X.y")
    assert not probe.active and "no_such_module_here" in probe.error
    assert capture.install(tmp_path / "cap3", limit=0).error


def test_auto_reads_the_environment(monkeypatch, tmp_path):
    from picklescope.investigate import capture

    monkeypatch.delenv(capture.ENV, raising=False)
    assert capture.auto() is None
    monkeypatch.setenv(capture.ENV, str(tmp_path / "c"))
    monkeypatch.setenv(capture.TARGET_ENV, "json.decoder:JSONDecoder.decode")
    monkeypatch.setenv(capture.LIMIT_ENV, "1")
    probe = capture.auto()
    try:
        assert probe is not None and probe.active and probe.limit == 1
        import json as json_mod

        json_mod.loads("[1]")
        assert not probe.active  # out of the way after its limit
    finally:
        probe.remove()


def test_a_last_call_that_raises_still_puts_the_original_back(tmp_path):
    import json as json_mod

    from picklescope.investigate import capture

    original = json_mod.decoder.JSONDecoder.decode
    probe = capture.install(tmp_path / "cap", limit=1, target="json.decoder:JSONDecoder.decode")
    with pytest.raises(json_mod.JSONDecodeError):
        json_mod.loads("{not json")
    assert not probe.active and probe.flush()
    for _ in range(100):  # the probe's thread puts it back; flush() returned once it had looked
        if json_mod.decoder.JSONDecoder.decode is original:
            break
        __import__("time").sleep(0.01)
    assert json_mod.decoder.JSONDecoder.decode is original and not (tmp_path / "cap" / "calls.jsonl").exists()


FORKER = r'''
import json, os, sys
import picklescope.investigate.capture as capture
probe = capture.install(sys.argv[1], limit=1, target="json.decoder:JSONDecoder.decode")
pid = os.fork()
json.loads('{"a": 1}')  # parent and child each make their first call after the fork
if pid == 0:
    os._exit(0 if probe.flush() and probe.records and probe.records[0]["pid"] == os.getpid() else 3)
_, status = os.waitpid(pid, 0)
probe.remove()
print(json.dumps({"child": os.waitstatus_to_exitcode(status), "parent": [r["pid"] for r in probe.records]}))
'''


@pytest.mark.parametrize("handler_first", [False, True], ids=["alone", "after-another-at-fork-handler"])
def test_each_process_records_its_own_calls_after_a_fork(tmp_path, handler_first):
    """Counters opened as /proc/self in the parent would read the parent's memory: a child opens its own.
    Its limit is its own too, also when an at-fork handler registered before the probe's (coverage.py's
    fork patch is one) calls the target in the child before the probe's handler has run."""
    script = tmp_path / "forker.py"
    # registered after threading's own at-fork handler, as coverage.py's is (a thread started before
    # threading's handler has run would be marked stopped by it in the child)
    early = "import threading\nos.register_at_fork(after_in_child=lambda: json.loads('2'))\n" if handler_first else ""
    script.write_text(FORKER.replace("import picklescope.investigate.capture as capture\n",
                                     early + "import picklescope.investigate.capture as capture\n", 1))
    p = subprocess.run([sys.executable, str(script), str(tmp_path / "cap")], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    lines = [json.loads(x) for x in (tmp_path / "cap" / "calls.jsonl").read_text().splitlines()]
    assert out["child"] == 0 and len(lines) == 2 and len({x["pid"] for x in lines}) == 2
    assert all(x["rss_before_bytes"] > 0 and "peak_source" in x for x in lines)
