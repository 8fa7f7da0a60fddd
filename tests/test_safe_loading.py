"""Safe loading (docs/safe_loading.md): weights_only torch loads, trusted files only, clean errors, escaped HTML.

- the torch codec's receiver loads its archive with ``torch.load(weights_only=True)``; the globals it
  allows are exactly those real archives name, for the call only, and anything else is refused
  without being run; the measured ratios are those of verl's codec;
- every deserializing call in the code is listed in ``docs/safe_loading.md``, with no
  ``weights_only=False`` anywhere;
- a file is unpickled only from ``data/``, from picklescope's own output, or with ``--trust`` /
  ``trust=True``, and the refusal names the file, why and the way out;
- ``picklescope inspect`` ends with one line and exit status 2 on a file that is not a whole pickle,
  and never changes the user's files;
- user strings (a workload YAML's name and path, a plugin codec's name and error) reach every HTML
  picklescope writes escaped.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.serialization as ts
from tensordict import NonTensorData, TensorDict

import picklescope as ps
from picklescope import cli
from picklescope.batch import Batch, set_active_codec
from picklescope.codecs import trust
from picklescope.codecs.verify import compare, manifest
from picklescope.core.safeload import allow_tensordict_globals, load_tensordict_archive, tensordict_archive_globals
from picklescope.errors import PicklescopeError
from picklescope.verl.blobs import BLOB_DIR, check_reference_blobs, load_blob
from picklescope.workloads.spec import load_workload

ROOT = Path(__file__).resolve().parents[1]
EVIL_NAME = "<img src=x onerror=alert(1)>"
EVIL_ERROR = "<script>alert('boom')</script> & friends"
EVIL_CODEC = "<script>alert('codec')</script>"


def _name(g) -> str:
    return f"{g.__module__}.{g.__qualname__}"


def _archive(td: TensorDict) -> bytes:
    """What the torch codec's sender sends for ``td``."""
    x = td.contiguous().consolidate() if len(td.keys()) else td
    buf = io.BytesIO()
    torch.save(x, buf)
    return buf.getvalue()


def _cases() -> dict[str, TensorDict]:
    n = 4
    out = {"tiny": load_workload("tiny").build(1.0).batch,
           "mixed": load_workload("mixed").build(1.0).batch.exclude("scores_fp8"),  # consolidate refuses fp8
           "flowgrpo": load_workload("flowgrpo").build(0.02).batch}
    jag = torch.nested.nested_tensor([torch.randn(i + 1, 4) for i in range(n)], layout=torch.jagged)
    out["jagged"] = TensorDict({"j": jag}, [n])
    out["sub-tensordict"] = TensorDict({"sub": TensorDict({"x": torch.randn(n, 3)}, [n]), "y": torch.ones(n)}, [n])
    out["zero-size+0dim"] = TensorDict({"z": torch.zeros(n, 0), "c": torch.randn(n, 2, dtype=torch.complex64)}, [n])
    out["locked+names"] = TensorDict({"a": torch.ones(n, 3)}, [n], names=["b"]).lock_()
    out["non-tensor str"] = TensorDict({"a": torch.ones(n, 2), "s": NonTensorData("hi", batch_size=[n])}, [n])
    out["empty"] = TensorDict({}, [n])
    return out


@pytest.fixture
def without_tensordict_allowance():
    """torch's allowlist as tensordict 0.10 leaves it (0.15 adds its globals at import), restored after."""
    saved = ts.get_safe_globals()
    ours = set(tensordict_archive_globals())
    ts.clear_safe_globals()
    ts.add_safe_globals([g for g in saved if g not in ours])
    try:
        yield
    finally:
        ts.clear_safe_globals()
        ts.add_safe_globals(saved)


# -- torch.load -----------------------------------------------------------------------------------
def test_archives_name_exactly_the_allowed_globals(without_tensordict_allowance):
    """Read off real archives: every global they need is allowed, and nothing is allowed that none needs."""
    allowed = {_name(g) for g in tensordict_archive_globals()}
    needed: set[str] = set()
    for label, td in _cases().items():
        data = _archive(td)
        unsafe = set(ts.get_unsafe_globals_in_checkpoint(io.BytesIO(data)))
        assert unsafe and unsafe <= allowed, (label, unsafe)
        needed |= unsafe
        with pytest.raises(pickle.UnpicklingError):  # without the allowance weights_only refuses it
            torch.load(io.BytesIO(data), weights_only=True)
        back = load_tensordict_archive(data)
        assert type(back) is TensorDict and back.batch_size == td.batch_size, label
        want = Batch(td.exclude(*[k for k, v in td.items() if isinstance(v, NonTensorData)]), {}, {})
        got = Batch(back.exclude(*[k for k, v in back.items() if isinstance(v, NonTensorData)]), {}, {})
        assert compare(manifest(want), got) == [], label
    assert needed == allowed


def test_the_allowance_is_scoped_and_keeps_what_was_allowed_before(without_tensordict_allowance):
    before = ts.get_safe_globals()
    with allow_tensordict_globals() as added:
        assert {_name(g) for g in added} == {_name(g) for g in tensordict_archive_globals()}
    assert ts.get_safe_globals() == before  # gone again: not a global mutation
    ts.add_safe_globals(tensordict_archive_globals())  # as tensordict 0.15 does at import
    with allow_tensordict_globals() as added:
        assert added == []
    assert set(tensordict_archive_globals()) <= set(ts.get_safe_globals())  # torch's safe_globals would drop them


def test_torch_codec_receiver_uses_weights_only(monkeypatch):
    calls = []
    real = torch.load

    def spy(*args, **kw):
        calls.append(kw.get("weights_only"))
        return real(*args, **kw)

    monkeypatch.setattr(torch, "load", spy)
    codec = ps.get_codec("torch")
    for label, td in _cases().items():
        if any(isinstance(v, NonTensorData) for v in td.values()):
            continue  # a workload batch holds tensors only (non-tensor data travels beside the archive)
        b = Batch(td, {"uid": np.array(["a"] * td.batch_size[0], dtype=object)}, {"step": 1})
        expected = manifest(b)
        state = codec.encode(b)
        got = Batch()
        codec.decode(got, pickle.loads(pickle.dumps(state)))
        assert compare(expected, got) == [], label
    assert calls and all(w is True for w in calls)


def test_an_archive_naming_other_globals_is_refused_without_running_them(tmp_path):
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.makedirs, (str(marker),))

    n = 2
    evil = TensorDict({"a": torch.ones(n), "s": NonTensorData(Payload(), batch_size=[n])}, [n])
    with pytest.raises(PicklescopeError, match="os.makedirs") as info:
        load_tensordict_archive(_archive(evil))
    assert "weights_only" in str(info.value) and "non_tensor_batch" in info.value.hint
    assert not marker.exists()
    arrays = TensorDict({"a": torch.ones(n), "s": NonTensorData(np.arange(3), batch_size=[n])}, [n])
    with pytest.raises(PicklescopeError, match="numpy"):
        load_tensordict_archive(_archive(arrays))


def test_torch_codec_ratios_are_verls(flowgrpo_quarter):
    """Same memory as verl's weights_only=False load: sender 3x, receiver 2x, torch.load +1x payload."""
    r = flowgrpo_quarter[("torch", "pickle5-oob")]
    p = r.payload_bytes
    assert r.outcome == "ok" and r.roundtrip == {"ok": True, "mismatches": []}
    assert abs(r.sender.peak_bytes / p - 3.0) < 0.05
    assert abs(r.receiver.peak_bytes / p - 2.0) < 0.05
    assert abs(r.receiver.step("torch.load").added_bytes / p - 1.0) < 0.05


# -- every load site --------------------------------------------------------------------------------
_LOADERS = {"torch.load", "pickle.load", "pickle.loads", "pickle.Unpickler", "np.load", "numpy.load",
            "cloudpickle.load", "cloudpickle.loads", "dill.load", "dill.loads", "joblib.load",
            "torch.serialization.load", "marshal.loads", "shelve.open"}


def _dotted(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return f"{_dotted(node.value)}.{node.attr}"
    return "?"


def load_sites() -> tuple[set[tuple[str, str]], list[str]]:
    """(file, call) of every deserializing call, and every torch.load/np.load not passing safe flags."""
    sites: set[tuple[str, str]] = set()
    unsafe: list[str] = []
    for folder in ("toolkit", "scripts", "benchmarks", "notebooks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            for node in ast.walk(ast.parse(path.read_text(), filename=rel)):
                if isinstance(node, ast.keyword) and node.arg == "weights_only" and \
                        not (isinstance(node.value, ast.Constant) and node.value.value is True):
                    unsafe.append(f"{rel}:{node.value.lineno}: weights_only={ast.unparse(node.value)}")
                if isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                    unsafe.append(f"{rel}:{node.value.lineno}: allow_pickle={ast.unparse(node.value)}")
                name = _dotted(node.func) if isinstance(node, ast.Call) else (
                    _dotted(node) if isinstance(node, ast.Attribute) and node.attr == "Unpickler" else "")
                if name in _LOADERS:
                    sites.add((rel, name))
                    if name == "torch.load" and not any(
                            k.arg == "weights_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                            for k in node.keywords):
                        unsafe.append(f"{rel}:{node.lineno}: torch.load without weights_only=True")
    return sites, unsafe


def documented_sites() -> set[tuple[str, str]]:
    text = (ROOT / "docs" / "safe_loading.md").read_text()
    section = text.split("## Every load site", 1)[1].split("\n## ", 1)[0]
    return set(re.findall(r"^\| `([^`]+\.py)` \| `([^`]+)` \|", section, flags=re.M))


def test_every_load_site_is_documented():
    sites, unsafe = load_sites()
    assert unsafe == []
    assert ("toolkit/picklescope/core/safeload.py", "torch.load") in sites  # the scan sees real calls
    assert ("toolkit/picklescope/codecs/trust.py", "pickle.Unpickler") in sites
    documented = documented_sites()
    assert sites - documented == set(), "a new load: add it to docs/safe_loading.md with where it loads from"
    assert documented - sites == set(), "docs/safe_loading.md lists a load the code no longer has"


# -- trusted files ------------------------------------------------------------------------------------
@pytest.fixture
def own_ledger(tmp_path, monkeypatch):
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _batch_blob(path: Path) -> Path:
    b = load_workload("tiny").build(0.25)
    set_active_codec("numpy")
    try:
        path.write_bytes(pickle.dumps(b, protocol=4))
    finally:
        set_active_codec(None)
    return path


def test_untrusted_blob_is_refused_naming_file_reason_and_way_out(own_ledger):
    blob = _batch_blob(own_ledger / "batch.pkl")
    with pytest.raises(PicklescopeError) as info:
        load_blob(blob, "numpy")
    msg = str(info.value)
    assert str(blob) in msg and "runs any code" in msg and "--trust" in msg and "trust=True" in msg
    loaded = load_blob(blob, "numpy", trust=True)  # in a child process
    assert loaded["type"] == "Batch" and loaded["leaves"] == 4
    trust.record_written([blob])  # picklescope's own output: no --trust needed while unchanged
    assert load_blob(blob, "numpy")["leaves"] == 4
    cut = own_ledger / "cut.pkl"
    cut.write_bytes(blob.read_bytes()[:200])
    with pytest.raises(PicklescopeError, match=f"{cut} is truncated"):
        load_blob(cut, "numpy", trust=True)  # the same words as inspect, before any child starts


def test_trust_follows_symlinks_out_of_data(own_ledger, monkeypatch):
    data = own_ledger / "data"
    data.mkdir()
    monkeypatch.setattr(trust, "DATA_DIR", data)
    inside = _batch_blob(data / "in.pkl")
    outside = _batch_blob(own_ledger / "out.pkl")
    (data / "link.pkl").symlink_to(outside)
    assert trust.check_trusted(inside) == inside.resolve()
    with pytest.raises(PicklescopeError, match="refusing to unpickle"):
        trust.check_trusted(data / "link.pkl")


def test_reference_blobs_from_another_folder_need_trust(own_ledger):
    folder = own_ledger / "blobs"
    folder.mkdir()
    for f in BLOB_DIR.iterdir():
        (folder / f.name).write_bytes(f.read_bytes())
    with pytest.raises(PicklescopeError, match="refusing to unpickle .*verl-0.9.0-"):
        check_reference_blobs("0.9.1", folder=folder)  # refused before any child or verl is needed


# -- inspect on bad files -------------------------------------------------------------------------------
def inspect(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["inspect", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _snapshot(folder: Path) -> dict[str, tuple[int, int, bytes]]:
    return {p.name: (p.stat().st_mtime_ns, p.stat().st_size, p.read_bytes()) for p in folder.iterdir() if p.is_file()}


@pytest.mark.parametrize("blob", ["verl-0.9.0-numpy.pkl", "verl-0.9.0-torch.pkl"])
def test_truncated_blobs_exit_2_naming_where_the_stream_ends(tmp_path, capsys, blob):
    data = (BLOB_DIR / blob).read_bytes()
    for cut in (100, len(data) // 2, len(data) * 9 // 10, len(data) - 1):
        f = tmp_path / f"cut{cut}.pkl"
        f.write_bytes(data[:cut])
        before = _snapshot(tmp_path)
        code, out, err = inspect(capsys, f, "--trust")
        assert code == 2 and out == "", (cut, out)
        line = err.strip()
        assert len(line.splitlines()) == 1
        assert line.startswith(f"picklescope: error: {f} is truncated: the pickle stream ends at byte {cut}")
        assert "before its STOP opcode (an interrupted copy or download?)" in line
        assert "copy or download it again" in line
        assert _snapshot(tmp_path) == before


def test_not_a_pickle_empty_missing_and_directory_exit_2(tmp_path, capsys):
    junk = tmp_path / "notpickle.bin"
    junk.write_bytes(b"hello world")
    empty = tmp_path / "empty.pkl"
    empty.write_bytes(b"")
    import zipfile

    with zipfile.ZipFile(tmp_path / "plain.zip", "w") as z:
        z.writestr("a.txt", "x")
    torch.save({"x": torch.zeros(2)}, tmp_path / "bare.pt")
    cases = {
        junk: f"{junk} is not a pickle stream (opcode b' ' at byte 5 is no pickle opcode",
        empty: f"{empty} is empty (0 bytes), not a pickle stream",
        tmp_path / "plain.zip": "is a zip file, not a pickle stream",
        tmp_path / "missing.pkl": f"blob {tmp_path / 'missing.pkl'} does not exist: check the path",
        tmp_path: f"{tmp_path} is a directory, not a blob",
    }
    before = _snapshot(tmp_path)
    for f, want in cases.items():
        for extra in ([], ["--trust"], ["--json"]):
            code, out, err = inspect(capsys, f, *extra)
            assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, (f, extra, err)
            assert want in err, (f, err)
    code, _, err = inspect(capsys, tmp_path / "bare.pt", "--as", "torch")
    assert code == 2 and "bare torch.save archive" in err and "weights_only=True" in err
    code, out, _ = inspect(capsys, tmp_path / "bare.pt")
    assert code == 0 and "bare torch.save archive" in out
    assert _snapshot(tmp_path) == before


def test_good_blobs_still_inspect_and_nothing_is_written_beside_them(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path / "cache"))
    before = _snapshot(BLOB_DIR)
    code, out, _ = inspect(capsys, BLOB_DIR / "verl-0.9.0-numpy.pkl", "--json")
    assert code == 0
    import json

    d = json.loads(out)
    assert d["blob"]["mode"] == "numpy" and d["blob"]["problem"] is None and d["manifest"]["mode"] == "numpy"
    code, _, err = inspect(capsys, BLOB_DIR / "verl-0.9.0-torch.pkl", "--as", "torch")  # kept: a DataProto
    assert code == 2 and "holds a verl DataProto" in err and "--as verl-0.9.1:numpy" in err
    copy = tmp_path / "batch.pkl"
    _batch_blob(copy)
    code, _, err = inspect(capsys, copy, "--as", "numpy")
    assert code == 2 and f"refusing to unpickle {copy}" in err and "--trust" in err
    code, out, _ = inspect(capsys, copy, "--as", "numpy", "--trust")
    assert code == 0 and "a Batch with 4 tensor leaves" in out
    assert sorted(os.listdir(tmp_path)) == ["batch.pkl"]  # no cache, no sidecar: nothing written
    assert _snapshot(BLOB_DIR) == before


def test_inspect_exit_status_from_the_shell(tmp_path):
    f = tmp_path / "cut.pkl"
    f.write_bytes((BLOB_DIR / "verl-0.9.0-numpy.pkl").read_bytes()[:100])
    p = subprocess.run([sys.executable, "-m", "picklescope", "inspect", str(f), "--trust"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    assert p.stderr.strip().splitlines() == [
        f"picklescope: error: {f} is truncated: the pickle stream ends at byte 100 of at least 121, inside the "
        "SHORT_BINUNICODE opcode at byte 97, before its STOP opcode (an interrupted copy or download?): copy or "
        "download it again and compare its size and sha256 with the original's"]


# -- HTML ------------------------------------------------------------------------------------------------
PLUGIN = textwrap.dedent(f'''
    from picklescope.codecs import Codec, CODECS, get_codec, register_codec

    class Evil(Codec):
        name = {EVIL_CODEC!r}
        description = "<b>described</b>"

        def encode(self, b):
            return get_codec("numpy-legacy").encode(b)

        def decode(self, b, state):
            raise RuntimeError({EVIL_ERROR!r})

    if Evil.name not in CODECS:
        register_codec(Evil())
''')


@pytest.fixture(scope="module")
def evil_runs(tmp_path_factory):
    """Real runs of a workload YAML named like an HTML tag through a plugin codec that errs in HTML."""
    folder = tmp_path_factory.mktemp("evil")
    spec = folder / "w<i>&.yaml"
    spec.write_text(textwrap.dedent(f"""\
        name: "{EVIL_NAME}"
        description: "<script>alert('desc')</script>"
        batch_size: 8
        tensors:
          obs: {{shape: [N, 1024, 1024], dtype: float32}}
        non_tensor:
          uid: {{kind: strings, length: 8}}
        """))
    plugin = folder / "evil_codec.py"
    plugin.write_text(PLUGIN)
    kw = {"workload": str(spec), "scale": 1.0, "plugins": [str(plugin)]}
    erred = ps.run(EVIL_CODEC, "pickle5-oob", **kw)
    killed = ps.run(EVIL_CODEC, "pickle5-oob", budget="0.5x", **kw)
    killed.role = "budgeted"
    ok = ps.run("numpy", "pickle5-oob", workload=str(spec), scale=1.0)
    return spec, erred, killed, ok


def _assert_escaped(text: str) -> None:
    for raw in (EVIL_NAME, EVIL_ERROR, EVIL_CODEC, "<i>&", "<b>described"):
        assert raw not in text, raw
    assert "<img" not in text and "<script>alert" not in text


def test_runs_carry_the_raw_strings(evil_runs):
    _, erred, killed, ok = evil_runs
    assert erred.workload == EVIL_NAME and erred.codec == EVIL_CODEC
    assert erred.outcome == "error" and EVIL_ERROR in erred.error
    assert killed.outcome == "oom-killed" and ok.outcome == "ok"


def test_report_escapes_workload_codec_and_error(evil_runs):
    from picklescope.investigate.reproduce import Investigation
    from picklescope.views.report import render

    spec, erred, killed, ok = evil_runs
    inv = Investigation(EVIL_NAME, 1.0, [erred, killed, ok], workload_source=str(spec),
                        headline=f"{EVIL_CODEC} failed: {erred.error}", budget="0.5x", budget_transport="pickle5-oob")
    html = render(inv)
    _assert_escaped(html)
    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "&lt;script&gt;alert(&#x27;boom&#x27;)&lt;/script&gt; &amp; friends" in html
    assert "w&lt;i&gt;&amp;.yaml" in html  # the path in the reproduce command


def test_explorer_cell_and_stepthrough_html_escape(evil_runs):
    from picklescope.views.magic import summary_html
    from picklescope.views.stepper import stepthrough_html
    from picklescope.views.widgets import results_html

    spec, erred, killed, ok = evil_runs
    table = results_html([erred, killed, ok], ["none", "0.5x", "none"])
    _assert_escaped(table)
    assert "&lt;img src=x onerror=alert(1)&gt;" in table
    from picklescope.measure.cellrun import run_cell

    cell = run_cell(f"raise RuntimeError({EVIL_ERROR!r})")
    assert cell.outcome == "error"
    summary = summary_html(cell)
    _assert_escaped(summary)
    assert "&lt;script&gt;" in summary
    from picklescope.investigate.stepthrough import stepthrough

    st = stepthrough(codec=EVIL_CODEC, method="__setstate__", workload=str(spec), scale=0.25,
                     plugins=[str(spec.parent / "evil_codec.py")])
    assert EVIL_ERROR in (st.error or "")
    page = stepthrough_html(st)
    _assert_escaped(page)
    assert "&lt;script&gt;alert(&#x27;boom&#x27;)" in page


def test_notebooks_escape_what_they_put_in_html():
    """Each value a notebook formats into HTML goes through report.e or html.escape."""
    checked = 0
    for nb in sorted((ROOT / "notebooks").glob("*.py")):
        for node in ast.walk(ast.parse(nb.read_text())):
            if not (isinstance(node, ast.Call) and _dotted(node.func) in ("HTML", "display", "Markdown")):
                continue
            for arg in node.args:
                # richtext.sentence(text) and table.Table(rows, caption=...) escape their text themselves
                # (views/table.html_table escapes every cell and the caption): an f-string given to them is
                # plain text
                plain = {id(n) for c in ast.walk(arg) if isinstance(c, ast.Call)
                         and _dotted(c.func) in ("sentence", "table.Table", "Table")
                         for a in [*c.args, *(k.value for k in c.keywords)] for n in ast.walk(a)}
                for fs in [n for n in ast.walk(arg) if isinstance(n, ast.JoinedStr) and id(n) not in plain]:
                    for v in fs.values:
                        if isinstance(v, ast.FormattedValue):
                            checked += 1
                            assert isinstance(v.value, ast.Call) and _dotted(v.value.func) in (
                                "report.e", "e", "html.escape", "escape"), f"{nb.name}: {ast.unparse(v.value)}"
    assert checked >= 1  # notebook 05's headline


def test_opening_the_report_runs_no_injected_script(evil_runs, tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from browser_lab import chromium, require_browser

    require_browser()
    from picklescope.investigate.reproduce import Investigation
    from picklescope.views.report import write_report

    spec, erred, killed, ok = evil_runs
    page_file = tmp_path / "report.html"
    write_report(Investigation(EVIL_NAME, 1.0, [erred, killed, ok], workload_source=str(spec)), str(page_file))
    dialogs: list[str] = []
    with chromium(tmp_path) as browser:
        ctx = getattr(browser, "context", browser)
        ctx.route("**/*", lambda route: route.continue_() if route.request.url.startswith("file://")
                  else route.abort("internetdisconnected"))
        page = ctx.new_page()
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(page_file.as_uri())
        page.wait_for_function("document.querySelectorAll('.figure .main-svg').length >= 1", timeout=60000)
        page.wait_for_timeout(500)
        imgs = page.evaluate("document.querySelectorAll('img').length")
        shown = page.evaluate("document.body.textContent")
    assert dialogs == [] and imgs == 0
    assert EVIL_NAME in shown, shown[:300]
    assert "alert('boom')" in shown, shown[-3000:]  # shown as text, not run
