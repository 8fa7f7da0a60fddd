"""The session-wide leftover check (tests/conftest.py) can fail, and says exactly what was left.

Each case runs a small pytest session in a subprocess with the same hooks tests/conftest.py uses
(``picklescope.measure.pytest_leftovers``): one that runs a real measurement and must end clean (the warm
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
from multiprocessing import util
from pathlib import Path

import psutil
import pytest

import picklescope as ps
from picklescope.core import cgroup, leftovers, paths
from picklescope.core.paths import OutFolder
from picklescope.errors import PicklescopeError
from picklescope.measure import launcher
from picklescope.ray import cluster, ray_available
from picklescope.ray.startup import DID_NOT_START

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from private_tmp import private_tmp, unshare_works  # noqa: E402

CONFTEST = "from picklescope.measure.pytest_leftovers import pytest_sessionfinish, pytest_sessionstart  # noqa: F401\n"

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


# -- a run's descendants, multiprocessing's folder, stale cgroups, dead creators' Ray processes ---------
ESCAPER = textwrap.dedent('''
    import os, subprocess, time
    from picklescope.codecs import CODECS, get_codec, register_codec

    PIDS = {pids!r}  # the forkserver's environment is fixed when it starts, so the path is written here

    class Escaper(type(get_codec("numpy"))):
        """numpy, plus a grandchild in its own session whose pid goes to a file the test reads."""
        name = "test-escaper"

        def encode(self, b):
            p = subprocess.Popen(["sleep", "600"], start_new_session=True)
            with open(PIDS, "a") as f:
                f.write(f"{p.pid}\\n")
            return super().encode(b)

    if "test-escaper" not in CODECS:
        register_codec(Escaper())
''')


@pytest.mark.parametrize("tracking", ["cgroup", "subreaper"])
def test_a_grandchild_in_its_own_session_ends_with_the_run(tmp_path, monkeypatch, tracking):
    """The sender starts ``sleep 600`` with ``setsid``: a process group and session of its own, which no
    process-group kill reaches. The run's tracking (a cgroup, else a subreaper) still ends it."""
    if tracking == "cgroup" and cgroup.tracking_base() is None:
        pytest.skip("no writable v1 pids/freezer cgroup here")
    if tracking == "subreaper":
        monkeypatch.setattr(cgroup, "tracking_base", lambda: None)

    plugin = tmp_path / "escaper.py"
    pids = tmp_path / "pids.txt"
    plugin.write_text(ESCAPER.replace("{pids!r}", repr(str(pids))))
    r = ps.run("test-escaper", "pickle5-oob", "tiny", 0.25, plugins=[str(plugin)])
    escaped = [int(x) for x in pids.read_text().split()]
    assert escaped, r.error
    try:
        assert all(gone(pid) for pid in escaped), [psutil.Process(p).cmdline() for p in escaped if not gone(p)]
        assert set(escaped) <= set(r.killed_descendants)
    finally:
        for pid in escaped:
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)


KILLED_PARENT = textwrap.dedent('''
    import sys, time
    from multiprocessing import process
    import picklescope as ps

    def hook(ev):
        if ev.get("type") == "baseline" and ev.get("side") == "sender":
            print("TEMPDIR", process.current_process()._config.get("tempdir"), flush=True)
            time.sleep(600)

    ps.run("numpy", "pickle5-oob", "tiny", 0.25, on_event=hook)
''')


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def _swept(path: str) -> bool:
    """Whether a sweep removed ``path``: this one, or one that another xdist worker's run made first (every run
    sweeps at its start, and a leftover planted here is a leftover to it too); either is the behaviour under
    test, and a path no sweep removed still exists."""
    return path in leftovers.sweep_orphans() or not os.path.exists(path)


def test_multiprocessing_folder_of_a_killed_parent_is_removed(tmp_path):
    """multiprocessing's folder (the forkserver's socket) of a SIGKILLed parent is removed by the
    forkserver as it exits (see picklescope/measure/forkserver_setup.py); it is picklescope-named, so the next
    run's sweep would remove it too (a ``/tmp/pymp-*`` folder would stay forever)."""
    script = tmp_path / "parent.py"
    script.write_text(KILLED_PARENT)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        line = ""
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and not line.startswith("TEMPDIR"):
            line = p.stdout.readline()
            if not line and p.poll() is not None:
                break
        folder = line.split()[1]
        assert os.path.basename(folder).startswith(f"picklescope-mp-{p.pid}-"), folder
        assert os.path.basename(folder) in os.listdir(os.path.dirname(folder))
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(folder):
        time.sleep(0.1)
    assert not os.path.exists(folder), "the forkserver left its killed starter's folder behind"
    assert folder not in leftovers.sweep_orphans()  # nothing left for the sweep


def test_the_sweep_removes_a_multiprocessing_folder_whose_creator_is_gone(tmp_path):
    """The backstop: a ``picklescope-mp-<pid>-*`` folder of a dead creator (whose forkserver could not
    remove it, e.g. killed too) goes at the next run's sweep."""
    import tempfile

    folder = tempfile.mkdtemp(prefix=f"picklescope-mp-{_dead_pid()}-")
    assert _swept(folder)
    assert not os.path.exists(folder)


def test_a_stale_tracking_cgroup_is_emptied_and_removed(tmp_path):
    """A parent killed mid-run leaves its tracking cgroup (named with its pid) and whatever still runs in
    it; any later run's sweep kills those processes and removes the cgroup."""
    base = cgroup.tracking_base()
    if base is None:
        pytest.skip("no writable v1 pids/freezer cgroup here (the subreaper path is the one used)")
    path = cgroup.create(base, f"picklescope-{_dead_pid()}-1-stale")
    sleeper = subprocess.Popen(["sleep", "600"], start_new_session=True)
    try:
        assert cgroup.add_process(path, sleeper.pid)
        assert _swept(path) and not os.path.exists(path)
        sleeper.wait(timeout=10)
        assert sleeper.returncode == -signal.SIGKILL
    finally:
        if sleeper.poll() is None:
            sleeper.kill()
        if os.path.exists(path):
            cgroup.kill_all(path)
            cgroup.remove(path)


def test_processes_of_a_dead_creators_ray_folder_are_killed(tmp_path):
    """A parent SIGKILLed while Ray starts leaves Ray's agents running; they name the run's private Ray
    temp folder on their command line, so the next sweep kills them before removing the folder."""
    folder = tempfile.mkdtemp(prefix=f"psray-{_dead_pid()}-", dir="/tmp")
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", f"--temp-dir={folder}"],
                             start_new_session=True)
    try:
        assert _swept(folder)
        stray.wait(timeout=10)
        assert stray.returncode == -signal.SIGKILL and not os.path.exists(folder)
    finally:
        if stray.poll() is None:
            stray.kill()
        shutil.rmtree(folder, ignore_errors=True)


def test_ray_processes_of_a_dead_creator_are_killed_when_their_folder_is_already_gone():
    """A driver whose parent died removes its Ray folder first, then kills its cluster; ended in between,
    its Ray processes name a folder that no longer exists, and the sweep still finds them by the name."""
    gone = f"/tmp/psray-{_dead_pid()}-nofolder"
    assert not os.path.exists(gone)
    ray_like = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                 "/site-packages/ray/_private/workers/default_worker.py", f"--temp-dir={gone}"],
                                start_new_session=True)
    alive_creator = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)",
                                      "/site-packages/ray/_private/workers/default_worker.py",
                                      f"--temp-dir=/tmp/psray-{os.getpid()}-ours"], start_new_session=True)
    try:
        time.sleep(0.5)  # both have exec'd, so their command lines are the ones above
        leftovers.sweep_orphans()
        ray_like.wait(timeout=10)
        assert ray_like.returncode == -signal.SIGKILL
        assert alive_creator.poll() is None  # its creator (this process) is alive: not a leftover
    finally:
        for q in (ray_like, alive_creator):
            if q.poll() is None:
                q.kill()
                q.wait()


LOCAL_CLUSTER_PARENT = textwrap.dedent('''
    from picklescope.ray.local_cluster import LocalCluster

    LocalCluster(object_store_bytes=80 * 1024 * 1024).start()
    print("STARTED", flush=True)
    import time
    time.sleep(600)
''')


def _session_of(leader: int) -> list[str]:
    found = []
    for q in psutil.process_iter():
        try:
            if os.getsid(q.pid) == leader and q.status() != psutil.STATUS_ZOMBIE:
                found.append(f"{q.pid} {q.name()}")
        except (psutil.Error, OSError):
            continue
    return found


def test_a_local_cluster_whose_starter_is_killed_during_start_up_is_ended(tmp_path):
    """``LocalCluster`` runs ``ray start --block`` in a session of its own; its starter SIGKILLed while the
    cluster comes up (a raylet exists) must not leave that session or its psrayc- folder: a watcher
    process (transports_ray.cluster.watch_main) ends them within seconds, without waiting for a sweep."""
    if not ray_available():
        pytest.skip("ray is not installed (pip install 'picklescope[ray]')")
    script = tmp_path / "parent.py"
    script.write_text(LOCAL_CLUSTER_PARENT)
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         start_new_session=True)
    leader = None
    try:
        deadline = time.monotonic() + 240
        while leader is None and time.monotonic() < deadline and p.poll() is None:
            for c in psutil.Process(p.pid).children():
                if _session_of(c.pid) and any("raylet" in s for s in _session_of(c.pid)):
                    leader = c.pid
            time.sleep(0.05)
        assert leader is not None, p.communicate()
        p.kill()
        p.wait()
        folders = lambda: [n for n in os.listdir("/tmp") if n.startswith(f"psrayc-{p.pid}-")]  # noqa: E731
        deadline = time.monotonic() + 10.0  # generous: the watcher needs one ray start freeze-and-kill round
        while (_session_of(leader) or folders()) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _session_of(leader) == [] and folders() == []
    finally:
        if p.poll() is None:
            p.kill()
        if leader is not None:
            for entry in _session_of(leader):
                os.kill(int(entry.split()[0]), signal.SIGKILL)


def test_the_cluster_watcher_starts_on_the_standard_library_alone(tmp_path):
    """The watcher runs ``cluster.py`` as a script under ``python -S`` (no site-packages, no picklescope on the
    path): an import of picklescope there would kill it at once and leave a dead starter's cluster running."""
    # a leader that is not running (pid 1 never started at tick 0): the watcher has nothing to do and exits 0
    p = subprocess.run([sys.executable, "-S", cluster.__file__, str(os.getpid()), "0", "1", "0", ""],
                       capture_output=True, text=True, timeout=60, cwd=tmp_path,
                       env={"PATH": os.environ.get("PATH", "")})
    assert p.returncode == 0 and p.stderr == "", p.stderr[-2000:]


# -- temporaries follow TMPDIR; an --out folder is locked and never left half-made ------------------


def test_temp_folders_go_under_tmpdir_and_a_too_long_one_is_refused_in_one_line(tmp_path, monkeypatch):
    short = tempfile.mkdtemp(prefix="ps-t-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    try:
        monkeypatch.setattr(tempfile, "tempdir", short)
        made = paths.make_temp_dir("psray-", for_ray=True)
        assert os.path.dirname(made) == short and leftovers.creator_pid(made) == os.getpid()
        os.rmdir(made)
        assert paths.torch_cache_env(made) in ({}, {"TORCHINDUCTOR_CACHE_DIR": os.path.join(made, "torchinductor")})
    finally:
        shutil.rmtree(short, ignore_errors=True)
    deep = tmp_path / ("d" * 60)
    deep.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(deep))
    with pytest.raises(PicklescopeError) as info:
        paths.make_temp_dir("psray-", for_ray=True)
    assert "TMPDIR" in str(info.value) and "\n" not in str(info.value)
    assert os.listdir(deep) == []  # the refused folder was not left behind


def test_an_out_folder_is_locked_while_held_and_removed_when_the_run_that_made_it_stops(tmp_path):
    new = tmp_path / "new"
    with OutFolder(str(new), own=("results.json",)):
        assert new.is_dir()
        with pytest.raises(PicklescopeError, match="being written by another picklescope run"):
            OutFolder(str(new)).__enter__()
    assert not new.exists()  # made by this run, never kept: removed
    with pytest.raises(KeyboardInterrupt), OutFolder(str(new), own=("results.json",)):
        (new / "results.json").write_text("{}")
        raise KeyboardInterrupt
    assert not new.exists()
    with OutFolder(str(new)) as held:
        watcher = held._undertaker
        held.keep()
    assert new.is_dir()  # kept: the run wrote its outputs
    assert watcher is not None and watcher.returncode == 0  # its watcher was told, and ended
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("the user's")
    with pytest.raises(RuntimeError), OutFolder(str(mine)):
        raise RuntimeError
    assert (mine / "notes.txt").read_text() == "the user's"  # a folder that existed before is left alone


_KILLED_AFTER_MAKEDIRS = """
import os, signal, sys
from picklescope.core import paths
real = os.makedirs
def makedirs(*a, **k):
    real(*a, **k)
    os.kill(os.getpid(), signal.SIGKILL)  # killed the moment the folder exists, before anything else runs
paths.os.makedirs = makedirs
with paths.OutFolder(sys.argv[1]):
    pass
"""


def test_a_run_killed_the_moment_its_out_folder_exists_leaves_no_folder(tmp_path):
    """The window between making the folder and starting its watcher: a run SIGKILLed there (a user's kill
    right as the folder appears, on a loaded machine a wait of a process start) left an empty folder, so the
    watcher starts before the folder is made."""
    out = tmp_path / "new-out"
    p = subprocess.run([sys.executable, "-c", _KILLED_AFTER_MAKEDIRS, str(out)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == -signal.SIGKILL, (p.returncode, p.stderr)
    deadline = time.monotonic() + 30  # the watcher wakes at once on the pipe's end; 30 s for a loaded machine
    while out.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not out.exists()


def _cli(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "picklescope", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **kw)


def test_reproduce_into_a_folder_another_run_writes_gets_one_line(tmp_path):
    out = tmp_path / "out"
    with OutFolder(str(out)):  # held as a running reproduce holds it
        p = _cli("reproduce", "--workload", "tiny", "--out", str(out), "--no-ray")
        stdout, stderr = p.communicate(timeout=300)
    assert p.returncode == 2, (stdout, stderr)
    assert stderr.strip().count("\n") == 0 and "being written by another picklescope run" in stderr, stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGKILL])
def test_a_killed_reproduce_removes_the_out_folder_it_created(tmp_path, sig):
    """Ctrl-C and SIGTERM: the run removes the folder itself. SIGKILL: its watcher process does
    (core/paths.OutFolder), once the run's pipe to it ends."""
    out = tmp_path / "new-out"
    p = _cli("reproduce", "--workload", "tiny", "--out", str(out), "--no-ray", "--no-headroom", "--no-trace",
             "--repeat", "1")
    deadline = time.monotonic() + 300
    while not out.exists() and p.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert out.is_dir(), p.communicate()
    p.send_signal(sig)
    stdout, stderr = p.communicate(timeout=300)
    assert p.returncode in ((-signal.SIGKILL,) if sig == signal.SIGKILL else (130, 143)), (p.returncode, stderr)
    deadline = time.monotonic() + 30  # the watcher wakes at once on the pipe's end; 30 s for a loaded machine
    while out.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not out.exists(), os.listdir(out)


@pytest.mark.skipif(not unshare_works(), reason="needs 'unshare --mount' and tmpfs mounts (root, or a user namespace)")
@pytest.mark.parametrize("transport", ["pickle5-oob", pytest.param("ray", marks=[pytest.mark.slow, pytest.mark.ray])])
def test_a_run_leaves_nothing_in_tmp_or_tmpdir_when_tmpdir_points_elsewhere(transport):
    """Over Ray the cluster's temp dir, its sockets and torch's cache of every Ray worker go under TMPDIR
    too; a Ray that cannot start on a busy machine ends in its one line (exit 2), and leaves nothing either."""
    if transport == "ray" and not ray_available():
        pytest.skip("ray is not installed")
    tmpdir = tempfile.mkdtemp(prefix="ps-t-", dir="/var/tmp")
    try:
        rc, out, err, left = private_tmp([sys.executable, "-m", "picklescope", "run", "--codec", "numpy",
                                          "--workload", "tiny", "--transport", transport], tmpdir, 900)
        assert rc == 0 or (transport == "ray" and rc == 2 and DID_NOT_START in err), \
            (out, err)
        assert left == [], f"left in /tmp: {left}"
        assert os.listdir(tmpdir) == [], f"left in TMPDIR: {os.listdir(tmpdir)}"  # torchinductor_* included
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


WARM_START_SIGINT = textwrap.dedent('''
    import os, signal, sys, time
    from multiprocessing import forkserver
    from picklescope.measure import launcher

    real = forkserver._forkserver.ensure_running

    def interrupted_while_starting():
        real()
        os.kill(os.getpid(), signal.SIGINT)  # as if Ctrl-C came while the forkserver is being started

    forkserver._forkserver.ensure_running = interrupted_while_starting
    try:
        launcher.warm_up()
    except KeyboardInterrupt:
        forkserver._forkserver.ensure_running = real
        pid = launcher.warm_up()
        # the pid is a fork of this process, then the shell that sets its trap, and only then the forkserver's
        # Python (on a busy machine the reading can come before either exec): wait for the forkserver's command.
        # The shell's own command line carries the forkserver's code as an argument too: its first one is the shell.
        shell = launcher._SH.encode()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with open(f"/proc/{pid}/cmdline", "rb") as f:  # (this script's own text names the module too)
                args = f.read().split(b"\\0")
            if args[0] != shell and any(a.startswith(b"from multiprocessing.forkserver import") for a in args):
                break
            time.sleep(0.05)
        with open(f"/proc/{pid}/status") as f:
            ignored = int(next(line for line in f if line.startswith("SigIgn:")).split()[1], 16)
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()[:100]
        print("interrupted", bool(ignored & (1 << (signal.SIGINT - 1))))
        print("forkserver", pid, hex(ignored), command, file=sys.stderr)  # for the assertion's message
    else:
        print("ran on")
''')


def test_a_ctrl_c_while_the_forkserver_starts_is_not_lost():
    """The forkserver starts with SIGINT ignored (a Ctrl-C while it imports torch prints no traceback of
    its own), but the command does not: a SIGINT that arrives while the forkserver starts ends it."""
    p = subprocess.run([sys.executable, "-c", WARM_START_SIGINT], capture_output=True, text=True, timeout=600)
    assert p.stdout.split() == ["interrupted", "True"], (p.stdout, p.stderr)


def test_without_a_shell_the_forkserver_starts_as_it_would_and_with_one_through_its_trap(monkeypatch, tmp_path):
    """``_spawn_ignoring_sigint`` starts processes through ``sh -c 'trap "" INT; exec ...'``; on a system
    with no ``/bin/sh`` it leaves ``multiprocessing``'s spawn alone (the forkserver then starts with SIGINT
    as it is, and a Ctrl-C while it imports torch may print its traceback; nothing else changes)."""
    calls: list[tuple[bytes, list[str]]] = []
    monkeypatch.setattr(util, "spawnv_passfds", lambda path, args, passfds: calls.append((path, args)) or 7)
    plain = util.spawnv_passfds
    monkeypatch.setattr(launcher, "_SH", str(tmp_path / "no-shell"))
    with launcher._spawn_ignoring_sigint():
        assert util.spawnv_passfds is plain
        util.spawnv_passfds(b"/usr/bin/python3", ["python3", "-c", "pass"], ())
    assert calls == [(b"/usr/bin/python3", ["python3", "-c", "pass"])]
    calls.clear()
    monkeypatch.setattr(launcher, "_SH", "/bin/sh")
    with launcher._spawn_ignoring_sigint():
        assert util.spawnv_passfds(b"/usr/bin/python3", ["python3", "-c", "pass"], ()) == 7
    assert util.spawnv_passfds is plain
    assert calls == [(b"/bin/sh", ["/bin/sh", "-c", 'trap "" INT; exec "$0" "$@"', "/usr/bin/python3", "-c", "pass"])]
