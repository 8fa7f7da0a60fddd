"""Real verl, side by side: the wheels installed at test time, their codecs, confirm, emitted tests.

Every figure is measured here, on verl 0.9.0 (the bug) and 0.9.1 (the fix) downloaded from PyPI by
``picklescope verl install``. The real codecs' sender peaks must match, within 3% of the payload, the
number of payload copies verl's own ``DataProto.__getstate__`` makes (``EXPECTED_SENDER_COPIES``). verl
costs ~5 s to import in each child, so the expensive runs are shared through module-scoped fixtures.
"""

from __future__ import annotations

import json
import linecache
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKLOAD, SCALE, TRANSPORT = "seed-6400x20480", 0.4, "pickle5-oob"  # ~200 MiB of payload
MiB = 1 << 20
# Sender peak above its baseline, in payloads: the copies verl's DataProto.__getstate__ makes over pickle5-oob.
# numpy mode in 0.9.0 runs contiguous().consolidate() before its numpy branch (one copy; the arrays are views of
# it, sent out of band); verl PR #7539 (in 0.9.1) checks the mode first (views of the leaves, no copy); torch
# mode in both: consolidate's buffer, torch.save's bytes, and pickle's in-band copy of those bytes (three copies).
EXPECTED_SENDER_COPIES = {"verl-0.9.0:numpy": 1, "verl-0.9.1:numpy": 0, "verl-0.9.0:torch": 3, "verl-0.9.1:torch": 3}
TOLERANCE = 0.03  # of the payload

NUMPY_FIRST = '''"""Candidate: check the numpy mode before consolidating."""
import io
import os

import torch

from verl.protocol import serialize_tensordict


def __getstate__(self):
    if os.getenv("VERL_DATAPROTO_SERIALIZATION_METHOD") == "numpy":
        batch = serialize_tensordict(self.batch) if self.batch is not None else None
        return batch, self.non_tensor_batch, self.meta_info
    batch = self.batch
    if batch is not None and len(batch.keys()) > 0:
        batch = batch.contiguous().consolidate()
    buffer = io.BytesIO()
    torch.save(batch, buffer)
    return buffer.getvalue(), self.non_tensor_batch, self.meta_info
'''

FORGETFUL_SETSTATE = '''"""A bad candidate: its __setstate__ forgets meta_info."""
from verl.protocol import DataProto

_original = DataProto.__setstate__


def __setstate__(self, data):
    _original(self, data)
    self.meta_info = {}
'''


def in_process(*args: str, capfd: pytest.CaptureFixture[str]) -> subprocess.CompletedProcess:
    """``picklescope ARGS`` through the CLI's ``main()`` in this process, for checks of its exit status and
    messages: no interpreter to start, no torch to import, no forkserver to warm. Whatever the command
    starts itself still runs in children (their output is captured at the file descriptors)."""
    from picklescope.cli import main

    capfd.readouterr()
    rc = main(list(args))
    out, err = capfd.readouterr()
    return subprocess.CompletedProcess(["picklescope", *args], rc, out, err)


@pytest.fixture(scope="module")
def numpy_first(tmp_path_factory):
    path = tmp_path_factory.mktemp("candidate") / "numpy_first.py"
    path.write_text(NUMPY_FIRST)
    return path


@pytest.fixture(scope="module")
def confirmed(verl_envs, numpy_first):
    """The must-show confirm: 0.9.0 numpy vs the numpy-first patch at ~200 MiB, with step-through."""
    from picklescope.investigate.confirm import confirm

    return confirm("verl-0.9.0:numpy", str(numpy_first), workload=WORKLOAD, scale=SCALE, transport=TRANSPORT,
                   headroom=False)


@pytest.fixture(scope="module")
def real_runs(confirmed):
    """The four real codecs on the same ~200 MiB case (0.9.0 numpy is the confirm's baseline run)."""
    from picklescope import run

    runs = {"verl-0.9.0:numpy": confirmed.baseline.result}
    for codec in ("verl-0.9.1:numpy", "verl-0.9.0:torch", "verl-0.9.1:torch"):
        runs[codec] = run(codec, TRANSPORT, WORKLOAD, SCALE)
    return runs


def test_install_keeps_each_version_in_its_own_folder_without_strays(verl_envs):
    assert set(verl_envs) == {"0.9.0", "0.9.1"}
    for label, env in verl_envs.items():
        assert env.version == label and env.source == "pypi"
        assert sorted(p.name for p in env.site.iterdir()) == ["verl", f"verl-{label}.dist-info"]
        assert {"tests", "scripts"} <= set(env.stray)
        assert (Path(env.root) / "stray" / "tests").is_dir()


@pytest.mark.parametrize("codec", list(EXPECTED_SENDER_COPIES))
def test_real_codecs_make_the_copies_their_code_makes(real_runs, codec):
    r = real_runs[codec]
    assert r.outcome == "ok", r.error
    assert r.roundtrip["ok"], r.roundtrip
    ratio = r.sender.peak_bytes / r.payload_bytes
    expected = EXPECTED_SENDER_COPIES[codec]
    assert abs(ratio - expected) <= TOLERANCE, f"{codec}: sender peak {ratio:.3f}x payload, expected {expected}x"
    label = codec.split(":")[0].removeprefix("verl-")
    for side in ("sender", "receiver"):  # each side records the verl it actually imported
        info = r.codec_info[side]
        assert info["verl_version"] == label
        assert info["verl_file"].endswith(f"verl-{label}/site/verl/protocol.py")


def test_the_bug_and_the_fix_on_the_real_wheels(real_runs):
    old, new = real_runs["verl-0.9.0:numpy"], real_runs["verl-0.9.1:numpy"]
    assert new.sender.peak_bytes < 0.02 * new.payload_bytes
    assert old.sender.peak_bytes > 0.97 * old.payload_bytes
    # the step names the line of verl's own file where consolidate ran
    step = old.sender.step("consolidate")
    assert step is not None and step.added_bytes > 0.97 * old.payload_bytes
    verl_file = old.codec_info["sender"]["verl_file"]
    assert ".consolidate()" in linecache.getline(verl_file, step.line)
    assert new.sender.step("consolidate") is None
    # the copy stays in a reference cycle: only gc.collect() frees it
    assert old.sender.cycle_held_bytes > 0.97 * old.payload_bytes
    torch_old, torch_new = real_runs["verl-0.9.0:torch"], real_runs["verl-0.9.1:torch"]
    assert abs(torch_old.sender.peak_bytes - torch_new.sender.peak_bytes) < TOLERANCE * torch_old.payload_bytes


def test_confirm_says_the_fix_removes_one_payload(confirmed):
    rep = confirmed
    assert rep.ok, rep.verdict
    assert abs(rep.removed_fraction - (202 - 0.7) / 200) <= TOLERANCE
    assert rep.verdict.startswith("CONFIRMED: the candidate removes 1.0")
    assert "round trip exact" in rep.verdict and "2/2 reference blobs" in rep.verdict
    assert rep.candidate.result.roundtrip["ok"]
    assert {b["mode"] for b in rep.blobs if b["ok"]} == {"numpy", "torch"}
    assert rep.candidate.verl_info["patched"] == ["__getstate__"]
    # step-through: the baseline's costly line is verl's consolidate; the candidate has none
    base = rep.baseline.trace["methods"]["__getstate__"]
    assert base["outcome"] == "ok"
    assert "consolidate()" in base["top_line_in_code"]["source"]
    assert base["top_line_in_code"]["added_bytes"] > 0.9 * rep.payload_bytes
    cand = rep.candidate.trace["methods"]["__getstate__"]
    assert cand["outcome"] == "ok" and not cand["costly_lines"]
    assert "bytearray" in rep.candidate.trace["methods"]["__setstate__"]["culprit"]["source"]
    assert [s["line"] for s in rep.baseline.call_sites if s["side"] == "sender"] == [
        rep.baseline.result.sender.step("consolidate").line]
    assert not [s for s in rep.candidate.call_sites if s["side"] == "sender"]


def test_emitted_test_fails_on_090_and_passes_on_091(confirmed, tmp_path):
    from picklescope.investigate.emit import emit_test, run_emitted

    path = emit_test(confirmed, tmp_path / "test_dataproto_serialization_memory.py")
    text = path.read_text()
    assert "picklescope" not in text.split('"""', 2)[2]  # self-contained: only the docstring names us
    assert "def test_consolidate_is_not_called" in text and "def test_serialize_peak_is_bounded" in text
    old = run_emitted(path, "0.9.0")
    assert old.returncode == 1, old.output
    assert "2 failed" in old.output and "consolidate() called while serializing in numpy mode" in old.output
    new = run_emitted(path, "0.9.1")
    assert new.passed, new.output
    assert "2 passed" in new.output


@pytest.mark.parametrize("label", ["0.9.0", "0.9.1"])
def test_capability_matrix_reproduces_the_known_gaps(verl_envs, label):
    from picklescope.codecs import get_codec
    from picklescope.verl.matrix import capability_matrix, replica_for

    m = capability_matrix(label)
    assert m.version == label and m.mode_read_at_call_time is True
    assert {"zero-size"} <= m.unsupported("numpy")
    assert {"fp8", "strided-nested"} <= m.unsupported("torch")
    for mode in ("numpy", "torch"):
        tested = {c.feature for c in m.cells if c.mode == mode and not c.case.startswith("whole")}
        declared = {f for f in tested if not get_codec(replica_for(label, mode)).supports(f)}
        assert m.unsupported(mode) == declared, f"{label} {mode}: measured vs replica declarations"
        assert not [c for c in m.cells if c.mode == mode and c.status in ("error", "mismatch")]
    zero = m.cell("leaf empty", "numpy")
    assert zero.side == "receiver" and "'empty'" in zero.message and "zero-size" in zero.message
    assert "ValueError" in zero.message  # verl's own exception, kept in the message
    fp8 = m.cell("leaf scores_fp8", "torch")
    assert fp8.side == "sender" and "'scores_fp8'" in fp8.message and "KeyError" in fp8.message
    assert m.cell("whole mixed batch", "torch").leaf == "scores_fp8"


def test_mode_mismatch_between_sender_and_receiver_is_explained(verl_envs):
    from picklescope import run

    r = run("verl-0.9.1:numpy", TRANSPORT, "tiny", 1.0, receiver_codec="verl-0.9.1:torch")
    assert r.outcome == "error"
    assert "written in numpy mode, read in torch mode" in r.error
    assert "VERL_DATAPROTO_SERIALIZATION_METHOD=numpy on the receiver" in r.error
    assert "a bytes-like object is required" in r.error  # verl's own error is kept for reference


def test_inspect_loads_only_trusted_blobs_and_explains_the_wrong_mode(verl_envs, tmp_path, capfd):
    # the command in this process (the blob is loaded in a child with --as; verl never enters this process,
    # which test_verl_is_never_imported_in_the_parent checks)
    outside = tmp_path / "old.pkl"
    shutil.copy(Path(__file__).parents[1] / "data" / "blobs" / "verl-0.9.0-numpy.pkl", outside)
    p = in_process("inspect", str(outside), "--as", "verl-0.9.1:numpy", capfd=capfd)
    assert p.returncode == 2 and "refusing to unpickle" in p.stderr and "--trust" in p.stderr
    p = in_process("inspect", str(outside), "--as", "verl-0.9.1:torch", "--trust", capfd=capfd)
    assert p.returncode == 2
    assert "written in numpy mode, read in torch mode" in p.stderr
    assert "set VERL_DATAPROTO_SERIALIZATION_METHOD=numpy on the receiver" in p.stderr
    assert "numpy mode" in p.stdout  # identified before the load was tried


def test_the_script_rewrites_the_shipped_blobs_from_the_real_package(verl_envs, tmp_path):
    from picklescope.verl.blobs import BLOB_DIR, read_manifest

    script = Path(__file__).parents[1] / "scripts" / "make_reference_blobs.py"
    p = subprocess.run([sys.executable, str(script), "--out", str(tmp_path)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr
    fresh, shipped = read_manifest(tmp_path), read_manifest(BLOB_DIR)
    assert fresh["written_by"]["verl"] == "0.9.0"
    assert fresh["written_by"]["verl_protocol_sha256"] == shipped["written_by"]["verl_protocol_sha256"]
    for a, b in zip(fresh["blobs"], shipped["blobs"]):
        assert (a["file"], a["mode"], a["expected"]) == (b["file"], b["mode"], b["expected"])
    from picklescope.verl.blobs import check_trusted

    for a in fresh["blobs"]:  # picklescope's own output: recorded, so loading it needs no --trust
        assert check_trusted(tmp_path / a["file"]) == (tmp_path / a["file"]).resolve()


def test_a_candidate_that_breaks_old_blobs_is_caught(verl_envs, tmp_path):
    from picklescope.verl.blobs import check_reference_blobs

    patch = tmp_path / "forgetful.py"
    patch.write_text(FORGETFUL_SETSTATE)
    rows = check_reference_blobs("0.9.0", str(patch))
    assert len(rows) == 2 and not any(r["ok"] for r in rows)
    assert all(any("meta_info" in p for p in r["problems"]) for r in rows)


def test_checkout_source_links_only_the_package(verl_envs, tmp_path, monkeypatch):
    from picklescope.verl import envs
    from picklescope.verl.childcall import call

    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path / "cache"))
    checkout = tmp_path / "verl-checkout"
    shutil.copytree(verl_envs["0.9.1"].site / "verl", checkout / "verl")
    (checkout / "tests").mkdir()
    (checkout / "tests" / "__init__.py").write_text("raise ImportError('the checkout tests were imported')\n")
    env = envs.install_source(checkout)
    assert env.label == "local" and env.version == "0.9.1"
    assert (env.site / "verl").is_symlink() and sorted(p.name for p in env.site.iterdir()) == ["verl"]
    report = call("picklescope.verl.loader.import_report", label="local")
    assert report["verl_file"] == str(env.site / "verl" / "protocol.py")
    assert len(report["verl_dirs_on_path"]) == 1 and not report["stray_tests_shadowing"]
    assert not any(str(checkout) in p for p in report["tests_importable_from"])


def test_confirm_cli_with_headroom_and_an_emitted_test(verl_envs, numpy_first, tmp_path, capfd):
    # the command's main() in this process: its runs, headroom searches and the emitted test's two pytest
    # runs are children either way; what is saved is an interpreter that imports torch and warms a forkserver
    emitted = tmp_path / "verl-repo" / "tests" / "test_dataproto_memory.py"
    p = in_process("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", str(numpy_first),
                   "--workload", WORKLOAD, "--scale", "0.05", "--no-trace", "--emit-test", str(emitted), "--json",
                   capfd=capfd)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["ok"] and d["verdict"].startswith("CONFIRMED")
    for role in ("baseline", "candidate"):
        h = d[role]["headroom"]
        assert h["available"], h
        peak = d[role]["result"]["sides"]["sender"]["peak_bytes"]
        assert h["headroom_bytes"] >= peak - h["resolution_bytes"]
    assert d["baseline"]["headroom"]["multiple"] > 0.95 > 0.05 > d["candidate"]["headroom"]["multiple"]
    assert d["baseline"]["trace"] == {"available": False, "reason": "not requested"}
    # the emitted test was run both ways: baseline verl fails it, the patched verl passes it
    e = d["emitted_test"]
    assert emitted.is_file() and e["discriminates"], e
    assert [(r["passed"], r["returncode"]) for r in e["runs"]] == [(False, 1), (True, 0)]  # same 0.9.0 wheel


def test_user_errors_are_one_line(verl_envs, tmp_path, capfd):
    from picklescope import run
    from picklescope.errors import PicklescopeError
    from picklescope.investigate.confirm import confirm

    empty = tmp_path / "nothing.py"
    empty.write_text("x = 1\n")
    patch = tmp_path / "fix.py"  # a readable candidate, so that what is wrong is the baseline's verl alone
    patch.write_text("def __getstate__(self):\n    return {}\n")
    for args, needle in [
        (("verl", "install", "nine"), "not a verl version number"),
        (("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", str(empty)), "defines neither"),
    ]:
        p = in_process(*args, capfd=capfd)  # messages only: the command's main() in this process
        assert p.returncode == 2, (args, p.stdout, p.stderr)
        assert needle in p.stderr and len(p.stderr.strip().splitlines()) == 1, (args, p.stderr)
    for call, needle in [
        (lambda: confirm("verl-0.9.0:numpy", str(tmp_path / "missing.py")), "does not exist"),
        (lambda: confirm("verl-7.7.7:numpy", str(patch)), "picklescope verl install 7.7.7"),
        (lambda: confirm("verl-7.7.7:numpy", str(empty)), "defines neither"),  # the user's own file comes first
        (lambda: confirm("verl-0.9.0:json", str(empty)), "unknown mode"),
        (lambda: run("verl-0.9.0:json", workload="tiny"), "verl-0.9.0:numpy"),  # lists the known codecs
    ]:
        with pytest.raises(PicklescopeError) as err:
            call()
        assert needle in str(err.value)


def test_verl_is_never_imported_in_the_parent(confirmed, real_runs):
    assert "verl" not in sys.modules and "verl.protocol" not in sys.modules
