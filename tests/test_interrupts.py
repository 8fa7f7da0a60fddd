"""Ctrl-C (or a kill) in the parent in the middle of a run leaves no process and no run directory.

Each case starts a real parent process (a script using the Python API, or the CLI), waits until the
run's children exist and the sender is inside its measured step (a plugin codec that sleeps there),
interrupts the parent, and then checks every process that existed at that moment and the run's
directory (the parent is pointed at a private directory for its runs, so nothing else can be in it).
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import textwrap
import time
import uuid

import psutil
import pytest

from picklescope.ray import ray_available
from picklescope.ray.startup import DID_NOT_START

PLUGIN = textwrap.dedent('''
    import time
    from picklescope.codecs import CODECS, Codec, register_codec

    class Asleep(Codec):
        name = "test-asleep"
        def encode(self, b):
            time.sleep(300)
        def decode(self, b, state):
            pass

    if "test-asleep" not in CODECS:
        register_codec(Asleep())
''')

API_PARENT = textwrap.dedent('''
    import sys
    import picklescope as ps
    from picklescope.measure import runner

    runner.SHM_DIR = sys.argv[2]  # the run directory goes where the test can see all of it

    def hook(ev):
        if ev.get("type") == "step_start" and ev.get("side") == "sender":
            print("MEASURING", flush=True)

    try:
        ps.run(sys.argv[3], sys.argv[4], "tiny", 1.0, plugins=[sys.argv[1]], on_event=hook, timeout_s=600)
    except KeyboardInterrupt:
        print("KEYBOARDINTERRUPT", flush=True)
        raise
    print("RETURNED", flush=True)
''')

CLI_PARENT = textwrap.dedent('''
    import functools, sys
    from picklescope.measure import runner
    import picklescope.cli.commands.run as command

    runner.SHM_DIR = sys.argv[2]
    command.run = functools.partial(command.run, plugins=[sys.argv[1]])  # the CLI has no --plugin
    from picklescope.cli import main

    sys.exit(main(["run", "--codec", "test-asleep", "--transport", "pickle", "--workload", "tiny", "--scale", "1"]))
''')


@pytest.fixture
def files(tmp_path):
    (tmp_path / "plugin.py").write_text(PLUGIN)
    (tmp_path / "api_parent.py").write_text(API_PARENT)
    (tmp_path / "cli_parent.py").write_text(CLI_PARENT)
    (tmp_path / "runs").mkdir()
    return tmp_path


def wait_for_line(p: subprocess.Popen, needle: str, timeout_s: float) -> str:
    """Read the parent's stdout until a line that starts with ``needle`` (a guard against a parent that
    never gets there). Reads the pipe itself: a buffered ``readline`` could keep the wanted line in its
    buffer, where a ``select`` on the pipe never sees it (two lines flushed in one write)."""
    fd = p.stdout.fileno()
    sel = selectors.DefaultSelector()
    sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        if sel.select(timeout=1.0):
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            seen += chunk.decode(errors="replace")
            lines = seen.splitlines(keepends=True)
            for i, line in enumerate(lines):
                if line.startswith(needle) and line.endswith("\n"):
                    return "".join(lines[i:])
    p.kill()
    raise AssertionError(f"the parent never printed {needle!r}; it printed {seen!r}, stderr {p.stderr.read()!r}")


def descendants(pid: int) -> list[psutil.Process]:
    return psutil.Process(pid).children(recursive=True)


def alive(procs: list[psutil.Process], wait_s: float = 15.0) -> list[str]:
    """Those of ``procs`` still running after up to ``wait_s`` (a zombie counts as gone)."""
    deadline = time.monotonic() + wait_s
    while True:
        left = []
        for q in procs:
            try:
                if q.is_running() and q.status() != psutil.STATUS_ZOMBIE:
                    left.append(f"{q.pid} {' '.join(q.cmdline())[:100]}")
            except psutil.Error:  # gone, or turned a zombie between the two reads
                continue
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def kill_all(procs: list[psutil.Process]) -> None:
    for q in procs:
        try:
            q.kill()
        except psutil.NoSuchProcess:
            pass


def start_api(files, codec: str = "test-asleep", transport: str = "pickle") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(files / "api_parent.py"), str(files / "plugin.py"),
                             str(files / "runs"), codec, transport],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def test_ctrl_c_in_the_api_parent_propagates_and_ends_every_child(files):
    p = start_api(files)
    wait_for_line(p, "MEASURING", 240)
    procs = descendants(p.pid)
    measured = [q for q in procs if q.ppid() != p.pid]  # the forkserver's children: sender and receiver
    assert len(measured) == 2, procs
    try:
        os.kill(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
        assert "KEYBOARDINTERRUPT" in out and "RETURNED" not in out
        assert err.rstrip().endswith("KeyboardInterrupt") and p.returncode == -signal.SIGINT
        assert alive(procs) == []  # sender, receiver, forkserver, resource tracker
        assert os.listdir(files / "runs") == []
    finally:
        kill_all(procs)


def start_cli_in_a_run(files) -> tuple[subprocess.Popen, list[psutil.Process]]:
    """The CLI in its own session, returned once its sender and receiver exist and the sender sleeps."""
    p = subprocess.Popen([sys.executable, str(files / "cli_parent.py"), str(files / "plugin.py"), str(files / "runs")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 240
    procs: list[psutil.Process] = []
    while time.monotonic() < deadline and p.poll() is None:  # wait until the sender and receiver exist
        procs = descendants(p.pid)
        if len([q for q in procs if q.ppid() != p.pid]) == 2 and os.listdir(files / "runs"):
            break
        time.sleep(0.1)
    assert p.poll() is None, p.communicate()
    time.sleep(1.0)  # into the sender's sleeping step (either phase must end the same way)
    procs = descendants(p.pid)
    return p, procs


def test_ctrl_c_in_the_terminal_exits_130_with_one_line(files):
    """Ctrl-C in a terminal reaches the whole foreground process group: the parent and its children."""
    p, procs = start_cli_in_a_run(files)
    try:
        os.killpg(p.pid, signal.SIGINT)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 130, err
        assert err.strip() == "picklescope: interrupted"
        assert alive(procs) == []
        assert os.listdir(files / "runs") == []
    finally:
        kill_all(procs)


def test_killed_parent_takes_its_children_along(files):
    """SIGKILL leaves the parent no chance to clean up: the forkserver ends, and its children with it."""
    p = start_api(files)
    wait_for_line(p, "MEASURING", 240)
    procs = descendants(p.pid)
    assert len([q for q in procs if q.ppid() != p.pid]) == 2, procs
    try:
        p.kill()
        p.communicate(timeout=60)
        assert alive(procs) == []  # without die_with_parent the sender would sleep on for minutes
    finally:
        kill_all(procs)
    # the run directory cannot be removed by a parent that was SIGKILLed; it is named after that
    # parent, so the leftover check (and a person) can tell whose it was
    left = os.listdir(files / "runs")
    assert [n.split("-")[1] for n in left] == [str(p.pid)]


@pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'picklescope[ray]')")
def test_ctrl_c_during_a_ray_run_ends_the_cluster(files):
    """Interrupted once the run's own cluster is up: the driver, every Ray process and the temp dirs go."""
    script = files / "api_parent.py"
    script.write_text(API_PARENT.replace('ev.get("type") == "step_start" and ev.get("side") == "sender"',
                                         'ev.get("type") == "ray_info"'))
    p = start_api(files, codec="numpy", transport="ray")
    wait_for_line(p, "MEASURING", 240)
    procs = descendants(p.pid)
    drivers = [q for q in procs if os.getsid(q.pid) == q.pid]
    assert len(drivers) == 1, procs
    ray_procs = [q for q in psutil.process_iter() if q.pid != drivers[0].pid and _sid(q.pid) == drivers[0].pid]
    assert any("raylet" in " ".join(_cmdline(q)) for q in ray_procs), ray_procs  # a zombie (a failed try's) has none
    try:
        os.kill(p.pid, signal.SIGINT)
        out, _ = p.communicate(timeout=180)
        assert "KEYBOARDINTERRUPT" in out and p.returncode == -signal.SIGINT
        assert alive(procs + ray_procs) == []
        assert os.listdir(files / "runs") == []
        assert [n for n in os.listdir("/tmp") if n.startswith(f"psray-{p.pid}-")] == []  # Ray's temp dir
    finally:
        kill_all(procs + ray_procs)


@pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'picklescope[ray]')")
def test_ctrl_c_while_reproduce_runs_its_two_lanes_ends_both(files):
    """``reproduce`` runs the Ray rows and the node pair in a thread beside the in-process matrix. Ctrl-C
    while both go (the local cluster is up, the matrix is measuring) ends the lane's runs too: exit 130
    with one line, no process of either lane and no temporary left."""
    from picklescope.core import leftovers

    out = files / "out"
    p = subprocess.Popen([sys.executable, "-m", "picklescope", "reproduce", "--workload", "tiny", "--scale", "1",
                          "--no-headroom", "--no-trace", "--out", str(out)],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    raylet = None
    while raylet is None and time.monotonic() < deadline and p.poll() is None:
        for q in psutil.process_iter():
            try:
                if "raylet" in q.name() and any(f"psrayc-{p.pid}-" in a for a in q.cmdline()):
                    raylet = q
            except psutil.Error:
                continue
        time.sleep(0.1)
    assert raylet is not None, p.communicate(timeout=60)
    time.sleep(2)  # the cluster's other processes start, the matrix goes on
    procs = descendants(p.pid)
    cluster = [q for q in psutil.process_iter() if _sid(q.pid) == _sid(raylet.pid)]
    assert any(q.pid != raylet.pid for q in cluster)
    try:
        os.kill(p.pid, signal.SIGINT)
        stdout, stderr = p.communicate(timeout=180)
        assert p.returncode == 130, (stdout[-2000:], stderr[-2000:])
        assert stderr.strip().splitlines()[-1].split("\r")[-1].strip() == "picklescope: interrupted", stderr[-2000:]
        assert alive(procs + cluster, wait_s=10) == []
        assert _poll(lambda: [q for q in psutil.process_iter() if any("psray" in a and f"-{p.pid}-" in a
                                                                      for a in _cmdline(q))], 5) == []
        assert _poll(lambda: [e for root in leftovers.temp_roots() for e in os.listdir(root)
                              if leftovers.creator_pid(os.path.join(root, e)) == p.pid], 5) == []
    finally:
        kill_all(procs + cluster)


def _cmdline(q: psutil.Process) -> list[str]:
    try:
        return q.cmdline()
    except psutil.Error:
        return []


def _sid(pid: int) -> int | None:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def test_sigterm_to_the_cli_ends_the_run_like_ctrl_c(files):
    """SIGTERM to the parent alone (a job scheduler, ``timeout``, ``kill PID``): exit 143 with one line,
    every child gone and the run directory removed (before: the default action killed the parent on
    the spot and its hand-off folder stayed behind)."""
    p, procs = start_cli_in_a_run(files)
    try:
        os.kill(p.pid, signal.SIGTERM)
        out, err = p.communicate(timeout=120)
        assert p.returncode == 143, err
        assert err.strip() == "picklescope: terminated"
        assert alive(procs) == []
        assert os.listdir(files / "runs") == []
    finally:
        kill_all(procs)


# -- the fault matrix: SIGINT, SIGTERM and SIGKILL at each point of a run, then a leftover check ---------
MATRIX_PARENT = textwrap.dedent('''
    import functools, os, sys, time
    from multiprocessing import process
    from picklescope.measure import runner
    import picklescope.cli.commands.run as command

    runner.SHM_DIR = sys.argv[1]
    side, kind, name = sys.argv[2].split(":")

    def at():
        print("AT", process.current_process()._config.get("tempdir"), flush=True)
        time.sleep(600)

    def hook(ev):
        if ev.get("side") == side and ev.get("type") == kind and (name == "*" or ev.get("name") == name):
            at()

    if side == "report":  # the run is over; the parent is printing its tables
        import picklescope.views.table as table
        table.render = lambda *a, **k: at()
    command.run = functools.partial(command.run, on_event=hook)
    from picklescope.cli import main

    print("STARTING", flush=True)
    sys.exit(main(["run", "--codec", "numpy-legacy", "--transport", "pickle", "--workload", "tiny", "--scale", "1",
                   *sys.argv[3:]]))
''')
POINTS = {  # where the parent is when the signal arrives
    "forkserver-warm-up": ("none:none:none", ()),
    "sender-setup": ("sender:ready:*", ()),
    "consolidate": ("sender:step_start:consolidate", ()),
    "hand-off": ("sender:step_start:handoff", ()),
    "receiver": ("receiver:step_start:pickle.loads", ()),
    "budgeted-kill": ("sender:step_start:consolidate", ("--budget", "0.3x")),
    # over Ray: during ray.init (the test signals once the driver's session has a raylet), while the
    # driver puts the batch, while the actor gets it; and after the run, while the CLI writes its report
    "ray-start-up": ("none:none:none", ("--transport", "ray")),
    "ray-put": ("sender:step_start:ray.put", ("--transport", "ray")),
    "actor-get": ("receiver:step_start:ray.get", ("--transport", "ray")),
    "report-writing": ("report:none:none", ()),
}
RAY_POINTS = ("ray-start-up", "ray-put", "actor-get")


def _session_processes(pid: int) -> list[psutil.Process]:
    """Processes whose session is the parent's (it was started in a session of its own)."""
    found = []
    for q in psutil.process_iter():
        try:
            if q.pid != pid and os.getsid(q.pid) == pid and q.status() != psutil.STATUS_ZOMBIE:
                found.append(q)
        except (psutil.Error, OSError):
            continue
    return found


SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}
# By default each point runs once, with the signals rotated so that each is sent at three or four
# points (SIGKILL during Ray start-up among them); PICKLESCOPE_FULL_FAULT_MATRIX=1 runs every signal at
# every point (30 parents, 12 of them over Ray).
ROTATION = [("forkserver-warm-up", "SIGINT"), ("sender-setup", "SIGTERM"), ("consolidate", "SIGKILL"),
            ("hand-off", "SIGINT"), ("receiver", "SIGTERM"), ("budgeted-kill", "SIGKILL"),
            ("ray-start-up", "SIGKILL"), ("ray-put", "SIGTERM"), ("actor-get", "SIGINT"),
            ("report-writing", "SIGKILL")]
MATRIX = ([(p, s) for p in POINTS for s in SIGNALS] if os.environ.get("PICKLESCOPE_FULL_FAULT_MATRIX")
          else ROTATION)


def _marked(marker: str, parent: int) -> list[psutil.Process]:
    """Live processes whose environment carries ``marker`` (every Ray process the run started does) or
    whose command line names the Ray temp dir of ``parent``'s run."""
    from picklescope.core.leftovers import SESSION_ENV

    found = []
    for q in psutil.process_iter():
        try:
            if q.status() == psutil.STATUS_ZOMBIE:
                continue
            if q.environ().get(SESSION_ENV) == marker or any(f"psray-{parent}-" in a for a in q.cmdline()):
                found.append(q)
        except (psutil.Error, OSError):
            continue
    return found


def _wait_for_raylet(p: subprocess.Popen, timeout_s: float) -> int:
    """The driver's pid, once its session (which ray.init fills) has a raylet: ray.init is then under way."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and p.poll() is None:
        for d in descendants(p.pid):
            if _sid(d.pid) == d.pid:
                for q in psutil.process_iter():
                    try:
                        if _sid(q.pid) == d.pid and "raylet" in q.name():
                            return d.pid
                    except psutil.Error:
                        continue
        time.sleep(0.05)
    p.kill()
    raise AssertionError(f"no raylet appeared in the driver's session: {p.communicate()}")


def _temporaries_of(pid: int, runs: str) -> list[str]:
    """Entries named after ``pid`` by the toolkit (``<prefix>-<pid>-...``) in the temp roots and ``runs``."""
    from picklescope.core import leftovers

    found = []
    for root in [*leftovers.temp_roots(), runs]:
        for name in os.listdir(root):
            path = os.path.join(root, name)
            if leftovers.creator_pid(path) == pid:
                found.append(path)
    return found


def _poll(fn, wait_s: float):
    """``fn()`` until it is empty or ``wait_s`` has passed; returns the last value."""
    deadline = time.monotonic() + wait_s
    while True:
        value = fn()
        if not value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


@pytest.mark.parametrize(("point", "signame"), MATRIX, ids=[f"{p}-{s}" for p, s in MATRIX])
def test_fault_matrix_leaves_nothing(tmp_path, point, signame):
    """Each signal at each point: SIGINT (to the group, as a terminal sends it) and SIGTERM end with one
    line; after any of them, within 5 s, no process of the run is alive and, once the next run's sweep
    has run (a SIGKILLed parent cannot clean up), no temporary of it is left."""
    from picklescope.core import leftovers

    if point in RAY_POINTS and not ray_available():
        pytest.skip("ray is not installed (pip install 'picklescope[ray]')")
    sig = SIGNALS[signame]
    runs = tmp_path / "runs"
    runs.mkdir()
    script = tmp_path / "parent.py"
    script.write_text(MATRIX_PARENT)
    where, extra = POINTS[point]
    # Ray's own line, or picklescope's when its two start-up tries failed (ray/startup.py)
    RAY_DID_NOT_START = ("timed out during startup", DID_NOT_START)  # noqa: N806
    for attempt in range(3):  # a run whose Ray never started (Ray's own 15 s deadline, on a loaded machine)
        # never reached the point: it is ended, checked for leftovers like any other run, and started again
        marker = f"fault-matrix-{uuid.uuid4().hex}"
        env = {**os.environ, leftovers.SESSION_ENV: marker}
        p = subprocess.Popen([sys.executable, str(script), str(runs), where, *extra], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
        mp_dir = None
        try:
            if point == "ray-start-up":
                _wait_for_raylet(p, 240)
            elif point == "forkserver-warm-up":
                wait_for_line(p, "STARTING", 240)
                deadline = time.monotonic() + 60  # until the forkserver exists, while it still imports torch
                while time.monotonic() < deadline and not [q for q in descendants(p.pid) if "forkserver" in
                                                           " ".join(_cmdline(q))]:
                    time.sleep(0.05)
            else:
                # over Ray, up to four start-up tries of Ray's own on a loaded machine come first
                mp_dir = wait_for_line(p, "AT ", 600 if point in RAY_POINTS else 240).split("AT ", 1)[1].split()[0]
            break
        except AssertionError as exc:
            if not (point in RAY_POINTS and any(t in str(exc) for t in RAY_DID_NOT_START)) or attempt == 2:
                if p.poll() is None:
                    p.kill()
                if point in RAY_POINTS and any(t in str(exc) for t in RAY_DID_NOT_START):
                    pytest.skip(f"Ray's own start-up timed out 3 times on this machine (load "
                                f"{os.getloadavg()[0]:.1f}), so the run never reached the point")
                raise
            p.communicate(timeout=120)  # the run ended on its own (one line); what it left is checked below
            assert _poll(lambda p=p, marker=marker: [f"{q.pid} {q.name()}" for q in _session_processes(p.pid)
                                                     + _marked(marker, p.pid)], 5.0) == []
    try:
        seen = descendants(p.pid)
        if sig == signal.SIGINT:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)
        _, err = p.communicate(timeout=120)
        if sig != signal.SIGKILL:
            word = "interrupted" if sig == signal.SIGINT else "terminated"
            assert err.strip() == f"picklescope: {word}", err
            assert p.returncode == (130 if sig == signal.SIGINT else 143)

        def left() -> list[str]:
            """Every process of the run (Ray's included, whatever session they are in) and, over Ray, every
            temporary: the driver removes them itself when its parent was SIGKILLed."""
            procs = alive(seen, wait_s=0) + [f"{q.pid} {q.name()}" for q in
                                             _session_processes(p.pid) + _marked(marker, p.pid)]
            return procs + (_temporaries_of(p.pid, str(runs)) if point in RAY_POINTS else [])

        assert _poll(left, 5.0) == []  # 5 s from the parent's end
        leftovers.sweep_orphans([str(runs)])  # what the next run does first
        assert os.listdir(runs) == []
        if mp_dir and mp_dir != "None":
            assert not os.path.exists(mp_dir)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
        kill_all(descendants(p.pid) if psutil.pid_exists(p.pid) else [])
        kill_all(_marked(marker, p.pid))  # a failed case must not leave its cluster to the next one


DRIVER_END = textwrap.dedent('''
    import os, subprocess, sys, tempfile, types
    from picklescope.ray.cluster import ParentWatch
    from picklescope.ray.driver import end_session

    os.setsid()  # the watch ends this process's session: only this process is in it
    parent = subprocess.Popen(["sleep", "600"], start_new_session=True)  # the run's parent, still alive
    files = [tempfile.mkdtemp(dir=sys.argv[1]), tempfile.mkdtemp(dir=sys.argv[1])]
    watch = ParentWatch(parent.pid, files).start()

    def shutdown():  # the parent ends while the driver stops its Ray session
        parent.kill()
        parent.wait()

    sys.modules["ray"] = types.SimpleNamespace(shutdown=shutdown)
    end_session(watch)
    print("ended as if the parent lived")
''')


def test_a_driver_whose_parent_dies_as_its_run_ends_still_removes_the_run_files(tmp_path):
    """A parent SIGKILLed closes its end of the run's channels before the kernel shows it gone, so a driver
    whose run ended on the closed channel can find its parent still there (a SIGKILLed ``node --enforcement
    ray --controller actor`` run does, tests/test_node_ray_faults.py). Its end (``end_session``) must still
    see the parent go, here during the Ray shutdown, and remove the files and end the driver as for a
    parent already gone."""
    script = tmp_path / "driver_end.py"
    script.write_text(DRIVER_END)
    files = tmp_path / "files"
    files.mkdir()
    done = subprocess.run([sys.executable, str(script), str(files)], capture_output=True, text=True, timeout=120)
    assert "ended as if the parent lived" not in done.stdout, done.stdout
    assert done.returncode == 1, (done.returncode, done.stderr[-2000:])  # the watch's exit: the parent is gone
    assert list(files.iterdir()) == []
