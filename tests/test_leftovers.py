"""The session-wide leftover check (tests/conftest.py) can fail, and says exactly what was left.

Each case runs a small pytest session in a subprocess with the same hooks tests/conftest.py uses
(``picklescope.pytest_leftovers``): one that runs a real measurement and must end clean (the warm
forkserver is shut down, the run's directory is gone), and one that leaves a child, an orphan
re-parented away from pytest, and a /dev/shm file, and must fail naming each of them.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time

import psutil

from picklescope import leftovers

CONFTEST = "from picklescope.pytest_leftovers import pytest_sessionfinish, pytest_sessionstart  # noqa: F401\n"

CLEAN = textwrap.dedent('''
    import picklescope as ps

    def test_a_real_run_ends_clean():
        r = ps.run("numpy", "pickle5-oob", "tiny", 1.0)
        assert r.outcome == "ok"
''')

DIRTY = textwrap.dedent('''
    import os, subprocess

    def test_leaves_things_behind(tmp_path_factory):
        child = subprocess.Popen(["sleep", "600"])
        orphan = subprocess.run(["sh", "-c", "sleep 601 >/dev/null 2>&1 & echo $!"], capture_output=True,
                                text=True, check=True).stdout.strip()
        path = os.path.join("{shm}", f"picklescope-{{os.getpid()}}-leftovertest")
        open(path, "w").close()
        with open("{record}", "w") as f:
            f.write(f"{{child.pid}} {{orphan}} {{path}}")
''')


def session(tmp_path, body: str) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(body)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", str(tmp_path)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_clean_session_passes_after_stopping_the_forkserver(tmp_path):
    p = session(tmp_path, CLEAN)
    assert p.returncode == 0, p.stdout + p.stderr
    m = re.search(r"leftover check: 0 processes, 0 files \(checked (\d+) processes, (\d+) entries in ", p.stdout)
    assert m, p.stdout
    assert int(m.group(1)) > 1  # it really looked at the machine's processes


def test_session_that_leaves_a_child_an_orphan_and_a_file_fails_naming_them(tmp_path):
    record = tmp_path / "left.txt"
    shm = leftovers.temp_roots()[0]
    p = session(tmp_path, DIRTY.format(shm=shm, record=record))
    out = p.stdout + p.stderr
    child = orphan = None
    path = ""
    try:
        child, orphan, path = record.read_text().split()
        child, orphan = int(child), int(orphan)
        assert "1 passed" in p.stdout  # the test itself passed ...
        assert p.returncode == 1, out  # ... the session fails
        assert "leftover check: 2 processes, 1 files" in out and "the session FAILS" in out
        assert re.search(rf"left behind: process pid {child} \(descendant of this process\): sleep 600", out), out
        assert re.search(rf"left behind: process pid {orphan} \(carries this session's marker.*\): sleep 601", out), out
        assert f"left behind: file {path} (created during the session by pid" in out
        deadline = time.monotonic() + 10  # the failing session then ends what it found
        while not (gone(child) and gone(orphan)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert gone(child) and gone(orphan) and not os.path.exists(path)
    finally:
        for pid in (child, orphan):
            if pid and not gone(pid):
                os.kill(pid, signal.SIGKILL)
        if path and os.path.exists(path):
            os.unlink(path)


def test_a_run_sweeps_temporaries_of_dead_creators_only(tmp_path):
    """A parent killed with SIGKILL leaves its hand-off folder; the next run removes it, and never
    touches one whose creator is alive (another run in progress)."""
    import picklescope as ps

    dead = subprocess.Popen(["true"])
    dead.wait()  # its pid now names nobody
    root = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    stale = os.path.join(root, f"picklescope-{dead.pid}-sweeptest")
    live = os.path.join(root, f"picklescope-{os.getpid()}-sweeptest")
    for d in (stale, live):
        os.makedirs(d, exist_ok=True)
        with open(os.path.join(d, "blob"), "wb") as f:
            f.write(b"x" * 4096)
    try:
        r = ps.run("numpy", "pickle5-oob", "tiny", 0.25)
        assert r.outcome == "ok"
        assert not os.path.exists(stale), "the dead creator's folder survived a run"
        assert os.path.exists(live), "a live creator's folder was removed"
    finally:
        shutil.rmtree(live, ignore_errors=True)
        shutil.rmtree(stale, ignore_errors=True)
