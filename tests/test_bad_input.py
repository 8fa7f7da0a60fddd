"""The bad-input catalogue (``tests/bad_input_cases.py``): one line naming cause and fix, exit 2,
no traceback, nothing of the user's changed; and the docs page lists exactly these cases."""

from __future__ import annotations

import hashlib
import os
import re
import stat
import sys
from pathlib import Path

import pytest

from picklescope.cli import main

CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from bad_input_cases import CASES, ROOT, error_line, materialize, prepare_needs, run_case  # noqa: E402


def _fingerprint(p: Path) -> str:
    """What a file is: its checksum, or for a FIFO, a link, a device or a file over 16 MiB (a sparse
    giant) its kind, target, size and mtime (reading those would hang or cost gigabytes)."""
    st = p.lstat()
    if stat.S_ISLNK(st.st_mode):
        return f"link -> {os.readlink(p)}"
    if not stat.S_ISREG(st.st_mode):
        return f"mode {st.st_mode:o}"
    if st.st_size > 16 * 1024**2:
        return f"{st.st_size} bytes, mtime {st.st_mtime_ns}"
    return hashlib.sha256(p.read_bytes()).hexdigest()


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): _fingerprint(p)
            for p in sorted(folder.rglob("*")) if not p.is_dir() and ".cache" not in p.parts}


def test_catalogue_is_big_and_distinct():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(CASES) >= 150  # docs/bad_input.md lists every one
    assert {c.surface for c in CASES} == {"CLI", "API"}
    assert len({(c.argv, c.what) for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input(case, tmp_path):
    materialize(case, tmp_path)
    prepare_needs(case, tmp_path)
    before = _snapshot(tmp_path)
    code, text = run_case(case, tmp_path)
    assert code == 2, f"exit {code}: {text[-2000:]}"
    assert "Traceback" not in text, text
    msg = text.strip() if case.call is not None else error_line(text)
    assert msg.count("\n") == 0 and msg, f"want exactly one error line, got: {text!r}"
    assert not CONTROL.search(text.strip()), f"unescaped control characters reach the terminal: {text!r}"
    low = msg.lower()
    for frag in case.cause + case.way_out:
        assert frag.lower() in low, f"{frag!r} missing from: {msg}"
    assert _snapshot(tmp_path) == before, "the case changed the user's folder"


def test_debug_shows_the_traceback(capsys):
    assert main(["--debug", "run", "--codec", "nope"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "unknown codec 'nope'" in err


def test_docs_page_lists_every_case():
    page = (ROOT / "docs" / "bad_input.md").read_text()
    listed = re.findall(r"^\| `([^`]+)` \|", page, flags=re.MULTILINE)
    assert listed == [c.id for c in CASES], "re-run: python tests/bad_input_cases.py"
    for line in page.splitlines():
        if line.startswith("| `"):
            assert line.rstrip().endswith("|") and "picklescope: error:" in line or "API" in line, line


def test_output_piped_into_head_ends_without_a_traceback():
    """``picklescope run --json | head -c 10``: the reader goes away mid-write; no BrokenPipeError traceback
    (before the fix: a traceback from json.dump and exit 1)."""
    import subprocess

    p = subprocess.run(f"{sys.executable} -m picklescope run --workload tiny --json | head -c 10",
                       shell=True, capture_output=True, text=True, timeout=300)
    assert p.stdout == '{"codec": '[:10], p.stdout
    assert "Traceback" not in p.stderr and "BrokenPipe" not in p.stderr, p.stderr


# The cases of the "Why" list that once grew the parent without bound or hung it; the growth of the CLI
# process while it handles each is read from the kernel (VmHWM after writing 5 to clear_refs).
HEAVY = ("workload-alias-bomb", "workload-trillion-jagged", "workload-2m-nested-rows", "workload-sparse-3g",
         "workload-fifo", "workload-dev-zero", "workload-5mib", "workload-batch-5000-digits", "workload-deep-nesting",
         "workload-dims-product", "inspect-dev-zero", "inspect-fifo", "inspect-over-limit", "inspect-sparse-zeros",
         "inspect-many-keys", "inspect-zip64-100g", "inspect-zip-million-members", "inspect-long-line",
         "inspect-huge-int", "inspect-polyglot", "scale-rows-overflow")

_MEASURE = """
import contextlib, io, json, sys, time
from picklescope.cli import main

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

# `import picklescope` is light (torch and the rest load on first use): one unmeasured pass loads what the
# cases need, so the measured pass sees each case's own growth, not the first import of torch
argvs = json.loads(sys.argv[1])
for argv in argvs:
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        main(argv)
out = []
for argv in argvs:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start, t0 = status("VmRSS"), time.monotonic()
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    out.append({"code": code, "growth": status("VmHWM") - start, "s": time.monotonic() - t0, "err": err.getvalue()})
print(json.dumps(out))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc/self/clear_refs")
def test_parsing_never_grows_the_cli_by_200_mib(tmp_path):
    """Each once-unbounded case, in a real CLI process: exit 2, one line, and its peak RSS above the
    memory it had before the case stays under 200 MiB (before: an alias bomb passed 6 GB, a 10^12-row
    jagged batch 1.26 GB and growing, /dev/zero forever)."""
    import json
    import subprocess

    from bad_input_cases import fill

    by_id = {c.id: c for c in CASES}
    argvs = []
    for cid in HEAVY:
        case = by_id[cid]
        folder = tmp_path / cid
        folder.mkdir()
        materialize(case, folder)
        argvs.append(fill(case, folder)[0])
    p = subprocess.run([sys.executable, "-c", _MEASURE, json.dumps(argvs)], capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    for cid, r in zip(HEAVY, json.loads(p.stdout.strip().splitlines()[-1]), strict=True):
        assert r["code"] == 2, (cid, r)
        assert error_line(r["err"]) and "Traceback" not in r["err"], (cid, r)
        assert r["growth"] < 200 * 1024**2, f"{cid}: the CLI grew by {r['growth'] / 1024**2:.1f} MiB"


def test_handoff_dir_runs_where_shm_is_too_small(tmp_path):
    """flowgrpo x0.15 (about 70 MiB) where /dev/shm has 64 MiB free (Docker's default, acted out with
    PICKLESCOPE_SHM_FREE_BYTES): refused with the one line naming /dev/shm and --handoff-dir; with
    --handoff-dir on disk the same run works, its hand-off is bigger than 64 MiB, and the folder is
    left empty."""
    import json
    import subprocess

    env = {**os.environ, "PICKLESCOPE_SHM_FREE_BYTES": "64MiB"}
    cmd = [sys.executable, "-m", "picklescope", "run", "--codec", "numpy", "--transport", "pickle5-oob",
           "--workload", "flowgrpo", "--scale", "0.15"]
    refused = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert refused.returncode == 2, refused.stderr
    line = error_line(refused.stderr)
    assert "/dev/shm" in line and "64.0 MiB free" in line and "--handoff-dir" in line, refused.stderr
    disk = tmp_path / "handoff"
    disk.mkdir()
    ok = subprocess.run([*cmd, "--handoff-dir", str(disk), "--json"], capture_output=True, text=True, env=env,
                        timeout=600)
    assert ok.returncode == 0, ok.stderr[-2000:]
    r = json.loads(ok.stdout)
    assert r["outcome"] == "ok" and r["roundtrip"]["ok"], r.get("error")
    assert r["blob_bytes"] > 64 * 1024**2
    assert r["run_dir"].startswith(str(disk) + os.sep)
    assert os.listdir(disk) == []
