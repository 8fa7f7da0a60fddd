"""``picklescope workload from FILE``: a workload from a saved batch, read without running the file.

Blobs come from real verl 0.9.0 ``DataProto.save_to_disk`` in both modes (installed into the cache by
``picklescope verl install``, loaded in a child process) and from ``torch.save`` in this process, each
built from a schema made up here; the derived workload must give back its keys, dtypes and shapes and
a payload within 1% of the original's tensor bytes.
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from picklescope.errors import PicklescopeError
from picklescope.workloads.spec import WORKLOAD_DIR, load_workload, parse_workload

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from hostile_files import deflate_bomb, many_keys  # noqa: E402

# 12 tensor keys, 5 dtypes, a non-contiguous leaf, a zero-size leaf, a jagged nested leaf, two non-tensor keys
SCHEMA = """
name: made-up
batch_size: 8
seed: 5
tensors:
  latents:    {shape: [N, 4, 32, 32], dtype: bfloat16}
  embeds:     {shape: [N, 77, 256], dtype: float32}
  half:       {shape: [N, 64], dtype: float16}
  log_probs:  {shape: [N, 10], dtype: float32}
  advantages: {shape: [N], dtype: float32}
  ids:        {shape: [N, 300], dtype: int64, high: 1000}
  positions:  {shape: [N, 300], dtype: int32, high: 300}
  mask:       {shape: [N, 300], dtype: bool}
  done:       {shape: [N, 1], dtype: bool}
  swapped:    {shape: [N, 48, 16], dtype: float32, kind: non-contiguous}
  empty:      {shape: [N, 0], dtype: float32}
  ragged:     {shape: [N, J, 4], dtype: float32, kind: jagged-nested, min_len: 2, max_len: 6}
non_tensor:
  prompts: {kind: strings, length: 30}
  rewards: {kind: dicts}
meta_info:
  global_steps: 4
  temperature: 0.9
"""


def cli(*args: str, timeout: float = 600, cwd: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "picklescope", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd)


@pytest.fixture(scope="module")
def schema(tmp_path_factory):
    path = tmp_path_factory.mktemp("schema") / "made-up.yaml"
    path.write_text(SCHEMA)
    return path


def _same_structure(derived, spec, views_kept: bool) -> None:
    """Same keys, dtypes and shapes (N in front); payload within 1% of the original's tensor bytes."""
    assert list(derived.tensors) == [t.name for t in spec.tensors]
    for t in spec.tensors:
        d = derived.tensors[t.name]
        assert d["dtype"] == t.dtype, t.name
        assert d["shape"] == list(t.shape), t.name
        want = t.kind if (views_kept or t.kind != "non-contiguous") else "dense"
        assert d.get("kind", "dense") == want, t.name
    assert {k: v["kind"] for k, v in derived.non_tensor.items()} == {s.name: s.kind for s in spec.non_tensor}
    assert derived.meta_info == spec.meta_info
    assert derived.batch_size == spec.batch_size
    original = spec.payload_bytes(1.0)
    assert derived.file_payload_bytes == original  # read from the file: the exact bytes
    from picklescope.investigate.workload_from import to_yaml

    regenerated = parse_workload(to_yaml(derived)).payload_bytes(1.0)
    assert abs(regenerated - original) <= 0.01 * original, (regenerated, original)


@pytest.fixture(scope="module")
def verl_090_blobs(schema, tmp_path_factory, verl_envs):
    """Real verl 0.9.0 save_to_disk of the made-up schema, once in numpy mode and once in torch mode."""
    from picklescope.verl import childcall

    out = tmp_path_factory.mktemp("verl-blobs")
    m = childcall.call("picklescope.verl.blobs.write_in_child", label="0.9.0", out_dir=str(out), spec=str(schema))
    assert m["written_by"]["verl"] == "0.9.0"
    return {b["mode"]: out / b["file"] for b in m["blobs"]}


@pytest.mark.parametrize("mode", ["numpy", "torch"])
def test_real_verl_090_save_to_disk(verl_090_blobs, schema, mode):
    from picklescope.investigate.workload_from import describe_file

    d = describe_file(verl_090_blobs[mode])
    assert d.format == f"verl DataProto ({mode} mode)" and not d.loaded
    # both verl modes write views contiguous, so a view comes back dense (and the file says so)
    _same_structure(d, load_workload(schema), views_kept=False)
    assert any("dense" in n for n in d.notes)


def test_cli_writes_a_workload_that_runs(verl_090_blobs, tmp_path):
    out = tmp_path / "mine.yaml"
    p = cli("workload", "from", str(verl_090_blobs["numpy"]), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "12 tensor keys, 2 non-tensor keys" in p.stdout and "at batch 8" in p.stdout
    w = load_workload(out)
    assert w.batch_size == 8 and len(w.tensors) == 12
    # torch: numpy mode cannot carry the zero-size leaf (docs/capabilities.md)
    p = cli("run", "--codec", "torch", "--workload", str(out), "--scale", "1", "--json")
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout)
    assert r["outcome"] == "ok" and r["payload_bytes"] == w.payload_bytes(1.0)
    again = cli("workload", "from", str(verl_090_blobs["numpy"]), "--out", str(out))
    assert again.returncode == 2 and "--force" in again.stderr  # never overwrites silently


def test_torch_save_tensordict_keeps_views(schema, tmp_path):
    import torch

    from picklescope.investigate.workload_from import describe_file

    spec = load_workload(schema)
    b = spec.build(1.0)
    assert not b.batch["swapped"].is_contiguous()
    plain, consolidated = tmp_path / "td.pt", tmp_path / "td-consolidated.pt"
    torch.save(b.batch, plain)
    d = describe_file(plain)
    assert d.format == "torch.save TensorDict"
    _same_structure(_with_non_tensor(d, spec), spec, views_kept=True)
    torch.save(b.batch.contiguous().consolidate(), consolidated)
    _same_structure(_with_non_tensor(describe_file(consolidated), spec), spec, views_kept=False)


def _with_non_tensor(d, spec):
    """A TensorDict carries no non_tensor_batch or meta_info: add the schema's, to compare the rest."""
    d.non_tensor = {s.name: {"kind": s.kind} for s in spec.non_tensor}
    d.meta_info = dict(spec.meta_info)
    return d


def test_dict_of_tensors_and_npz(tmp_path):
    import numpy as np
    import torch

    from picklescope.investigate.workload_from import describe_file

    x = {"obs": torch.zeros(6, 3, 5), "ids": torch.zeros(6, 7, dtype=torch.int64), "scalar": torch.zeros(())}
    torch.save(x, tmp_path / "d.pt")
    with pytest.raises(PicklescopeError, match="leaf 'scalar': a 0-dim tensor"):
        describe_file(tmp_path / "d.pt")
    del x["scalar"]
    torch.save(x, tmp_path / "d.pt")
    d = describe_file(tmp_path / "d.pt")
    assert d.format == "torch.save dict" and d.batch_size == 6
    assert d.tensors == {"obs": {"shape": ["N", 3, 5], "dtype": "float32"},
                         "ids": {"shape": ["N", 7], "dtype": "int64"}}
    uid = np.array([f"u{i}" for i in range(6)], dtype=object)
    np.savez(tmp_path / "b.npz", obs=np.zeros((6, 4), np.float16), uid=uid, name=np.array(["abc"] * 6))
    d = describe_file(tmp_path / "b.npz")
    assert d.tensors == {"obs": {"shape": ["N", 4], "dtype": "float16"}}
    assert d.non_tensor == {"uid": {"kind": "strings", "length": 2}, "name": {"kind": "strings", "length": 3}}
    np.savez(tmp_path / "c.npz", a=np.zeros((6, 4)), b=np.zeros((5, 4)))
    with pytest.raises(PicklescopeError, match="--batch-dim"):
        describe_file(tmp_path / "c.npz")
    with pytest.raises(PicklescopeError, match="leaf 'b': its first dimension is 5, not the batch dimension 6"):
        describe_file(tmp_path / "c.npz", batch_dim=6)


def test_what_the_format_cannot_say_is_refused_by_leaf(tmp_path):
    import torch
    from tensordict import TensorDict

    from picklescope.investigate.workload_from import describe_file

    cases = {
        "sub-td": (TensorDict({"inner": TensorDict({"a": torch.zeros(2, 3)}, [2])}, [2]), "leaf 'inner'"),
        "strided-view": (TensorDict({"v": torch.zeros(2, 8)[:, ::2]}, [2]), "leaf 'v': a view with strides"),
        "uint16": (TensorDict({"u": torch.zeros(2, 3, dtype=torch.uint16)}, [2]), "uint16"),
    }
    for name, (td, needle) in cases.items():
        torch.save(td, tmp_path / f"{name}.pt")
        with pytest.raises(PicklescopeError, match=needle.replace("(", r"\(")):
            describe_file(tmp_path / f"{name}.pt")
    p = cli("workload", "from", str(tmp_path / "uint16.pt"))
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr


class _Creates:
    """Unpickling this creates a file: exactly what reading a batch must never do."""

    def __init__(self, target: str) -> None:
        self.target = target

    def __reduce__(self):
        return (open, (self.target, "w"))


def test_a_pickle_that_runs_code_is_refused_and_never_run(tmp_path, verl_090_blobs):
    target = tmp_path / "created-by-the-pickle"
    evil = tmp_path / "batch.pkl"
    evil.write_bytes(pickle.dumps({"batch": _Creates(str(target))}))
    evil_top = tmp_path / "top.pkl"
    evil_top.write_bytes(pickle.dumps(_Creates(str(target))))
    for path in (evil, evil_top):
        for trust in ([], ["--trust"]):  # open is on no allow-list: --trust changes nothing
            p = cli("workload", "from", str(path), *trust, "--out", str(tmp_path / "w.yaml"))
            assert p.returncode == 2, p.stdout
            assert "io.open" in p.stderr and "refused with or without --trust" in p.stderr, p.stderr
            assert len(p.stderr.strip().splitlines()) == 1
            assert not target.exists()
    assert not (tmp_path / "w.yaml").exists()
    # a format the reader understands is never loaded, --trust or not
    p = cli("workload", "from", str(verl_090_blobs["numpy"]), "--trust", "--json", "--out", str(tmp_path / "v.yaml"))
    assert p.returncode == 0 and json.loads(p.stdout)["loaded"] is False


def test_trust_loads_a_plain_pickle_of_tensors_through_the_allow_list(tmp_path):
    """pickle.dumps of a TensorDict or a dict of tensors carries each storage as a torch.save blob, which the
    reader does not open: without --trust it says so; with it a child loads the file through the allow-list
    unpickler (storages with torch.load(weights_only=True)) and describes it."""
    import torch
    from tensordict import TensorDict

    from picklescope.investigate.workload_from import describe_file

    files = {"td.pkl": TensorDict({"a": torch.ones(4, 3), "b": torch.zeros(4, dtype=torch.int64)}, [4]),
             "dict.pkl": {"a": torch.ones(4, 3), "b": torch.zeros(4, dtype=torch.int64)}}
    for name, obj in files.items():
        (tmp_path / name).write_bytes(pickle.dumps(obj))
        with pytest.raises(PicklescopeError, match="pass --trust"):
            describe_file(tmp_path / name)
        d = describe_file(tmp_path / name, trust=True)
        assert d.loaded and d.batch_size == 4, name
        assert d.tensors == {"a": {"shape": ["N", 3], "dtype": "float32"}, "b": {"shape": ["N"], "dtype": "int64"}}


def test_truncated_and_foreign_files_are_one_line(tmp_path, verl_090_blobs):
    data = verl_090_blobs["torch"].read_bytes()
    (tmp_path / "cut.pkl").write_bytes(data[: len(data) // 2])
    (tmp_path / "text.pkl").write_text("hello\n")
    for name, needle in (("cut.pkl", "truncated"), ("text.pkl", "not a pickle stream")):
        p = cli("workload", "from", str(tmp_path / name))
        assert p.returncode == 2 and needle in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1


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


@pytest.mark.slow
def test_confirm_with_a_workload_path_steps_through(tmp_path, verl_envs):
    """The step-through children get the file, not the name inside it (which no preset has)."""
    wl = tmp_path / "sub" / "my.yaml"
    wl.parent.mkdir()
    wl.write_text((WORKLOAD_DIR / "tiny.yaml").read_text().replace("name: tiny", "name: my-name"))
    patch = tmp_path / "numpy_first.py"
    patch.write_text(NUMPY_FIRST)
    p = cli("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", str(patch), "--workload", "sub/my.yaml",
            "--scale", "1", "--no-headroom", "--json", cwd=str(tmp_path), timeout=900)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["workload"] == "my-name"
    for role in ("baseline", "candidate"):
        t = d[role]["trace"]
        if not t["available"]:
            pytest.skip(f"no line tracer here: {t['reason']}")
        for method, m in t["methods"].items():
            assert m["outcome"] == "ok" and m["error"] is None, (role, method, m)


def test_describing_reads_no_tensor_data(tmp_path):
    """Tensor bytes are skipped, not read: describing 64 MiB files raises this process's peak by far less."""
    import torch
    from tensordict import TensorDict

    from picklescope.batch import Batch, set_active_codec
    from picklescope.core import procmem
    from picklescope.investigate.workload_from import describe_file

    td = TensorDict({"x": torch.ones(64, 1 << 18), "y": torch.ones(64, 4, dtype=torch.int64)}, [64])  # 64 MiB
    torch.save(td, tmp_path / "td.pt")
    set_active_codec("torch")  # a pickle carrying the torch archive as bytes, like verl's torch mode
    try:
        (tmp_path / "b.pkl").write_bytes(pickle.dumps(Batch(batch=td), protocol=4))
    finally:
        set_active_codec(None)
    del td
    for name in ("td.pt", "b.pkl"):
        before = procmem.rss()
        procmem.reset_hwm()
        d = describe_file(tmp_path / name)
        grew = procmem.hwm() - before
        assert d.file_payload_bytes == 64 * (1 << 20) + 64 * 4 * 8
        assert grew < 8 << 20, (name, grew)  # the data is 64 MiB; reading it would show


def test_a_relative_workload_path_reaches_children_as_an_absolute_one(tmp_path, monkeypatch):
    """Children that run in another folder (a Ray worker, the node's driver) get a path they can open."""
    from picklescope.workloads.spec import load_workload

    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mine.yaml").write_text((Path(__file__).resolve().parents[1] / "data" / "workloads" /
                                                  "tiny.yaml").read_text())
    monkeypatch.chdir(tmp_path)
    spec = load_workload("sub/mine.yaml")
    assert spec.source == str(tmp_path / "sub" / "mine.yaml")
    monkeypatch.chdir("/")
    assert load_workload(spec.source).payload_bytes(1.0) == spec.payload_bytes(1.0)


@pytest.fixture
def my_workload(tmp_path, monkeypatch) -> str:
    """A workload file under a relative path, named so that no preset answers to its name."""
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "my.yaml").write_text((WORKLOAD_DIR / "tiny.yaml").read_text().replace("name: tiny",
                                                                                            "name: my-name"))
    monkeypatch.chdir(tmp_path)
    return "sub/my.yaml"


def test_stepthrough_takes_a_workload_path(my_workload):
    from picklescope.investigate.stepthrough import stepthrough

    r = stepthrough(codec="numpy", workload=my_workload, scale=1.0)
    assert r.outcome == "ok" and r.error is None and r.workload == "my-name", (r.error, r.traceback)


def test_headroom_and_reproduce_take_a_workload_path(my_workload):
    from picklescope.investigate.headroom import find_headroom
    from picklescope.investigate.reproduce import investigate

    h = find_headroom("numpy", "pickle5-oob", my_workload, 1.0, repeat=1, resolution=0.5)
    assert h.workload == "my-name" and h.headroom_bytes is not None, h
    inv = investigate(my_workload, 1.0, codecs=("numpy",), transports=("pickle5-oob",), headroom=False, trace=None,
                      ray=False, repeat=1)
    assert [r.outcome for r in inv.results] == ["ok"], [r.error for r in inv.results]
    assert inv.workload == "my-name" and [r.workload for r in inv.results] == ["my-name"]


# -- hostile files: built here, refused or bounded, never run ---------------------------------------------
# Each calls code when unpickled: protocol-0 streams, so the test holds the exact bytes a hostile writer would.
def _calls(marker: Path) -> dict[str, bytes]:
    m = str(marker)
    return {
        "os.system": f"cos\nsystem\n(S'touch {m}'\ntR.".encode(),
        "builtins.exec": f"cbuiltins\nexec\n(S'open(\"{m}\", \"w\").close()'\ntR.".encode(),
        "subprocess.Popen": f"csubprocess\nPopen\n((S'touch'\nS'{m}'\nltR.".encode(),
    }


def _zip(members: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _torch_zip_bytes() -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"x": torch.zeros(4, 2)}, buf)
    return buf.getvalue()


@pytest.fixture
def hostile(tmp_path):
    """The polyglot and .pt zips whose data.pkl calls code (top level and inside a dict), plus the marker
    each would create."""
    marker = tmp_path / "marker-created-by-the-file"
    calls = _calls(marker)
    files = {"polyglot.pt": calls["os.system"] + _torch_zip_bytes()}
    for name, call in calls.items():
        short = name.split(".")[-1].lower()
        files[f"{short}.pt"] = _zip({"archive/data.pkl": call, "archive/version": b"3\n"})
        files[f"{short}-in-dict.pt"] = _zip({"archive/data.pkl": b"(dp0\nS'x'\n" + call[:-1] + b"s.",
                                             "archive/version": b"3\n"})
        files[f"{short}.pkl"] = b"(dp0\nS'x'\n" + call[:-1] + b"s."
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    return tmp_path, marker, calls


def test_the_hostile_payloads_do_run_when_unpickled(hostile, tmp_path):
    """The test's own check that its payloads are live: a plain pickle.loads of each (with another marker,
    in a throwaway process) creates the file. The refusals below mean something only because of this."""
    for name, call in _calls(tmp_path / "control").items():
        (tmp_path / "control").unlink(missing_ok=True)
        p = subprocess.run([sys.executable, "-c", "import pickle, sys, time; pickle.loads(sys.stdin.buffer.read()); "
                            "time.sleep(0.5)"], input=call, capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr
        assert (tmp_path / "control").exists(), name


def test_polyglot_and_code_calling_archives_are_refused_with_and_without_trust(hostile, capsys):
    """Through the command's own entry point (``cli.main``, in this process: had anything run, the marker
    would be here too); one real CLI process checks the polyglot end to end."""
    from picklescope.cli import main

    folder, marker, _ = hostile
    names = sorted(p.name for p in folder.iterdir() if p.suffix in (".pt", ".pkl"))
    assert len(names) == 10
    for name in names:
        for trust in ([], ["--trust"]):
            code = main(["workload", "from", str(folder / name), *trust, "--out", str(folder / "w.yaml")])
            line = capsys.readouterr().err.strip()
            assert code == 2 and len(line.splitlines()) == 1 and "Traceback" not in line, (name, trust, line)
            assert "--trust" in line and ("refused with or without --trust" in line or "--trust or not" in line), line
            if name == "polyglot.pt":
                assert "polyglot" in line and "zip" in line, line
            assert not marker.exists(), (name, trust)
            assert not (folder / "w.yaml").exists()
    p = cli("workload", "from", str(folder / "polyglot.pt"), "--trust", "--out", str(folder / "w.yaml"))
    assert p.returncode == 2 and "polyglot" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not marker.exists()


_PEAK = """
import json, sys
from picklescope.cli import main
code = main(sys.argv[2:])
with open("/proc/self/status") as f:
    hwm = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "hwm": hwm}, f)
sys.exit(code)
"""


def cli_peak(report: Path, *args: str, timeout: float = 300) -> tuple[subprocess.CompletedProcess, int, float]:
    """The CLI in its own process: its result, its peak resident memory (VmHWM) and how long it took."""
    import time

    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", _PEAK, str(report), *args], capture_output=True, text=True,
                       timeout=timeout)
    took = time.monotonic() - t0
    return p, json.loads(report.read_text())["hwm"], took


def _assert_one_line_and_small(p, hwm: int, took: float, *needles: str) -> None:
    line = p.stderr.strip()
    print(f"peak {hwm / 2**20:.0f} MiB in {took:.1f} s: {line}")
    assert len(line.splitlines()) == 1, p.stderr[-2000:]
    assert p.returncode == 2 and "Traceback" not in line, p.stderr[-2000:]
    for n in needles:
        assert n in line, line
    assert hwm < 1 << 30, f"the CLI's peak resident memory was {hwm / 2**20:.0f} MiB"


@pytest.mark.parametrize("size", [512 << 20, pytest.param(3 << 30, marks=pytest.mark.slow)],
                         ids=["512MiB", "3GiB"])
def test_a_deflate_expansion_is_refused_by_its_declared_size(tmp_path, size):
    pt = tmp_path / "expands.pt"
    deflate_bomb(pt, size)
    assert pt.stat().st_size < size // 100  # a small file that claims a big member
    p, hwm, took = cli_peak(tmp_path / "peak.json", "workload", "from", str(pt), "--out", str(tmp_path / "w.yaml"))
    _assert_one_line_and_small(p, hwm, took, "data.pkl declares", "over the 64.0 MiB limit")


def test_a_growing_file_is_read_only_as_far_as_it_was_at_open(tmp_path):
    """A truncated batch pickle that another process keeps appending zeros to: the CLI reads what the file
    held at open, says it is truncated, and ends while the file is still growing."""
    import threading

    from picklescope.batch import set_active_codec

    b = load_workload(WORKLOAD_DIR / "flowgrpo.yaml").build(0.1)
    set_active_codec("numpy")
    try:
        data = pickle.dumps(b, protocol=4)
    finally:
        set_active_codec(None)
    grow = tmp_path / "growing.pkl"
    grow.write_bytes(data[: len(data) // 2])
    stop = threading.Event()
    appended = [0]

    cap = 2 << 30  # about 100 s of appending: far longer than the CLI needs, even on a loaded machine

    def append() -> None:
        chunk = bytes(1 << 20)
        with open(grow, "ab") as f:
            while not stop.is_set() and appended[0] < cap:
                f.write(chunk)
                f.flush()
                appended[0] += len(chunk)
                stop.wait(0.05)

    writer = threading.Thread(target=append, daemon=True)
    writer.start()
    try:
        while appended[0] == 0:
            stop.wait(0.01)
        p, hwm, took = cli_peak(tmp_path / "peak.json", "workload", "from", str(grow), "--out",
                                str(tmp_path / "w.yaml"))
        still_growing = appended[0] < cap
    finally:
        stop.set()
        writer.join()
    # what the file held at open: the pickle cut short, then the first zeros another process appended
    _assert_one_line_and_small(p, hwm, took, str(grow))
    assert "truncated" in p.stderr or "is not a pickle stream" in p.stderr, p.stderr
    assert still_growing, "the writer had stopped before the CLI ended: the test proves nothing"
    print(f"{appended[0] >> 20} MiB appended while the CLI ran")


@pytest.mark.parametrize("batch", [1000, None], ids=["setitems-of-1000", "one-mark"])
def test_ten_million_keys_are_refused_early_with_the_count(tmp_path, batch):
    big = tmp_path / "keys.pkl"
    many_keys(big, 10_000_000, batch)
    assert big.stat().st_size > 60 << 20
    p, hwm, took = cli_peak(tmp_path / "peak.json", "workload", "from", str(big), "--out", str(tmp_path / "w.yaml"))
    _assert_one_line_and_small(p, hwm, took, "entries by byte", "refused before reading the rest")
    assert ("a dict holds 6" if batch else "stack holds 1,") in p.stderr, p.stderr


def test_a_file_name_with_control_characters_converts_and_name_ok_works(tmp_path):
    """The name of the file becomes a printable workload name (with a note saying how to pick another);
    --name ok is taken as given."""
    import torch

    from picklescope.cli import main

    bad = tmp_path / "step\x1b[31m812.pt"
    torch.save({"x": torch.zeros(4, 3)}, bad)
    for extra, want in (([], "step_[31m812"), (["--name", "ok"], "ok")):
        out = tmp_path / f"{want.replace('[', '')}.yaml"
        assert main(["workload", "from", str(bad), "--out", str(out), *extra]) == 0
        assert load_workload(out).name == want
        assert "\x1b" not in out.read_text()
    assert main(["workload", "from", str(bad), "--out", str(tmp_path / "c.yaml"), "--name", "a\x07"]) == 2
    assert not (tmp_path / "c.yaml").exists()


def test_a_live_description_advises_the_python_keyword_not_a_flag():
    """The capture probe describes live batches inside a trainer, where no command-line flag exists."""
    import numpy as np

    from picklescope.investigate.workload_from import describe_live

    class Proto:  # a DataProto's three fields
        def __init__(self, batch, non_tensor):
            self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor, {}

    for obj in (Proto(None, {}), Proto({"a": np.zeros((3, 2)), "b": np.zeros((4, 2))}, {})):
        with pytest.raises(PicklescopeError) as info:
            describe_live(obj)
        assert "--batch-dim" not in str(info.value) and "batch_dim=N" in info.value.hint, str(info.value)
    with pytest.raises(PicklescopeError) as info:
        describe_live(Proto({"a": np.zeros((0, 2))}, {}))
    assert "--" not in info.value.hint and "rows" in info.value.hint
