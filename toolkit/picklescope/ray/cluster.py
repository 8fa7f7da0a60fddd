"""Every process of a Ray cluster we started, found and ended from the parent, whatever happened.

``ray.init(address="local")`` in the driver starts gcs_server, raylet, a log monitor, an autoscaler
monitor, dashboard and runtime-env agents and worker processes. A clean ``ray.shutdown()`` stops
them, but a SIGKILLed driver cannot, and several of them outlive it. So the driver makes itself a
session leader (``os.setsid``) before ``ray.init``: every Ray process inherits that session id
(workers change their process group, not their session), and the parent, which never imports Ray,
finds them by scanning ``/proc`` for the session, for descendants of the pids the driver reported,
and for command lines naming the run's private Ray temp directory. Three independent nets, because
a leftover raylet holds the object store's shared memory until it dies.
"""

from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable

# Ray's settings for every cluster the toolkit starts (the user's own RAY_* environment wins): token auth
# off, since the cluster is private to the run; no usage report; and unpinned objects freed at once
# (free_objects_period_milliseconds 0) where Ray by default frees them in batches at most every 1000 ms. A
# replay's training steps last seconds, a production job's minutes: with Ray's period, steps shorter than it
# allocate the next step's chunks before the last step's are freed, so the object store puts every step on
# fresh pages and the node grows by about a payload per step that no training job grows by (docs/node.md).
OWN_CLUSTER_ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0",
                   "RAY_free_objects_period_milliseconds": "0"}


def _stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, session id, start time in clock ticks) of ``pid``, or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    rest = data[data.rindex(b")") + 2:].split()  # the name may hold spaces and parentheses
    return int(rest[1]), int(rest[3]), int(rest[19])


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _pids() -> list[int]:
    return [int(n) for n in os.listdir("/proc") if n.isdigit()]


def start_ticks(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot): guards against a reused pid."""
    st = _stat(pid)
    return None if st is None else st[2]


def cluster_processes(session: int | None, not_before: int | None, known: Iterable[int] = (),
                      temp_dir: str | None = None) -> set[int]:
    """Live pids that belong to the cluster: same session, descendants of ``known``, or naming ``temp_dir``.

    ``not_before`` (start ticks of the driver) excludes older processes that merely reuse a number.
    """
    me = os.getpid()
    table: dict[int, tuple[int, int, int]] = {}
    for pid in _pids():
        st = _stat(pid)
        if st is not None:
            table[pid] = st
    found: set[int] = set()
    for pid, (_, sid, ticks) in table.items():
        if pid == me or (not_before is not None and ticks < not_before) or _is_zombie(pid):
            continue
        if (session is not None and sid == session) or (temp_dir and temp_dir in _cmdline(pid)):
            found.add(pid)
    roots = {p for p in known if p in table} | found
    changed = True
    while changed:  # descendants of anything found so far
        changed = False
        for pid, (ppid, _, ticks) in table.items():
            if pid not in roots and ppid in roots and pid != me and (not_before is None or ticks >= not_before):
                roots.add(pid)
                changed = True
    return {pid for pid in roots if not _is_zombie(pid)}  # a zombie holds no memory; its parent reaps it


def kill(pids: Iterable[int], wait_s: float = 10.0) -> list[int]:
    """SIGKILL every pid and wait until they are gone; returns those that were still alive.

    Not :func:`picklescope.core.procmem.kill_until_gone`: this module is also run as a script by
    ``python -S`` (the watcher, :func:`watch_main`), which must start in milliseconds with the standard
    library only, so it imports nothing of picklescope.
    """
    alive = []
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
            alive.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    deadline = time.monotonic() + wait_s
    pending = set(alive)
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            if _stat(pid) is None or _is_zombie(pid):
                pending.discard(pid)
        if pending:
            time.sleep(0.02)
    return alive


def stop_all(scan: Callable[[], set[int]], rounds: int = 10) -> tuple[list[int], list[int]]:
    """Freeze, then kill, everything ``scan()`` finds, until a scan finds nothing: (killed, remaining).

    A raylet that loses its driver starts new workers, so a single scan-then-kill can miss a process
    forked in between. SIGSTOP first freezes every process found (a frozen raylet forks nothing), a
    rescan catches what was forked before the freeze, and only then does everything get SIGKILL.
    """
    frozen: set[int] = set()
    for _ in range(rounds):
        new = scan() - frozen
        if not new:
            break
        for pid in new:
            try:
                os.kill(pid, signal.SIGSTOP)
            except (ProcessLookupError, PermissionError):
                pass
        frozen |= new
    killed = kill(frozen)
    remaining = sorted(scan())
    for _ in range(rounds):
        if not remaining:
            break
        killed += kill(remaining)
        remaining = sorted(scan())
    return killed, remaining


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return True
    return data[data.rindex(b")") + 2:].split()[0] in (b"Z", b"X")


def plasma_file(raylet_pid: int) -> str | None:
    """``/proc/<raylet>/fd/<n>`` of the shared-memory file that backs the object store, if found.

    Plasma creates the file in ``/dev/shm`` (or its fallback directory) and unlinks it at once, so it
    is only reachable through the raylet's open descriptor.
    """
    fd_dir = f"/proc/{raylet_pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    for n in names:
        try:
            target = os.readlink(os.path.join(fd_dir, n))
        except OSError:
            continue
        if "plasma" in os.path.basename(target):
            return os.path.join(fd_dir, n)
    return None


def raylet_serving(socket_name: str) -> int | None:
    """Pid of the raylet on this machine that serves ``socket_name`` (a cluster we joined)."""
    for pid in _pids():
        cmd = _cmdline(pid)
        if "raylet" in cmd and f"--raylet_socket_name={socket_name}" in cmd:
            return pid
    return None


def running(pid: int, ticks: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``ticks`` and has not ended (a zombie has)."""
    return start_ticks(pid) == ticks and not _is_zombie(pid)


def parent_of(pid: int) -> int | None:
    """The parent pid of ``pid`` (read from ``/proc``), or None if it is gone."""
    st = _stat(pid)
    return None if st is None else st[0]


def wait_gone(pid: int, ticks: int | None, poll_s: float = 0.1) -> None:
    """Block until ``pid`` (started at ``ticks``) has ended.

    A pidfd becomes readable the moment the process ends (a zombie included), so the wait costs no
    CPU; where pidfds are missing (an old kernel) the start time is polled instead.
    """
    try:
        fd: int | None = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    try:
        while running(pid, ticks):  # also covers a pid already gone or reused before pidfd_open
            if fd is None:
                time.sleep(poll_s)
            else:
                select.select([fd], [], [], 1.0)
    finally:
        if fd is not None:
            os.close(fd)


class ParentWatch:
    """End a cluster we started, and the run's temporaries, as soon as the run's parent process dies.

    The driver starts a cluster the parent cannot stop once it is gone: a parent SIGKILLed during
    ``ray.init`` (or any later moment) would leave gcs_server, the raylet, its agents and workers until
    Ray's own health checks (about a minute) or the next run's sweep. A thread of the driver waits on
    the parent; when it dies, it removes the temporaries first, then freezes and kills every process
    of the driver's session (:func:`stop_all`), then removes the temporaries again and ends the driver.
    The order matters: once its raylet is gone, Ray's core worker ends the driver at once, so the
    files go before the processes. A thread rather than a signal handler, because a handler only runs
    when the main thread is back in Python, which a call blocked inside Ray's C++ may never be.
    """

    def __init__(self, parent: int, temporaries: Iterable[str | None], temp_dir: str | None = None,
                 exit_code: int = 1, before_exit: Callable[[], object] | None = None) -> None:
        self.parent = parent
        self.before_exit = before_exit  # what else goes once the cluster is gone (a node's cgroups)
        self.ticks = start_ticks(parent)
        self.temporaries = [t for t in temporaries if t]
        self.temp_dir = temp_dir
        self.exit_code = exit_code
        self.lock = threading.Lock()
        self.report: dict[str, object] = {}
        self.thread = threading.Thread(target=self._watch, name="picklescope-parent-watch", daemon=True)

    def start(self) -> ParentWatch:
        self.thread.start()
        return self

    def parent_alive(self) -> bool:
        return running(self.parent, self.ticks)

    def _watch(self) -> None:
        wait_gone(self.parent, self.ticks)  # for the driver's life: see driver.end_session
        self.end_orphaned()

    def remove_temporaries(self) -> None:
        for path in self.temporaries:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.lexists(path):
                try:
                    os.unlink(path)
                except OSError:
                    pass

    def end_orphaned(self) -> None:
        """The parent is gone: remove the files, end the session's cluster, end this process."""
        with self.lock:  # the main thread may get here too (its SIGTERM from the parent's death)
            self.remove_temporaries()
            me = os.getpid()
            killed, remaining = stop_all(lambda: cluster_processes(me, None, (), self.temp_dir))
            self.report = {"killed": killed, "remaining": remaining}
            self.remove_temporaries()
            if self.before_exit is not None:
                try:
                    self.before_exit()
                except Exception:  # noqa: BLE001 - the process ends now whatever this left
                    pass
            os._exit(self.exit_code)


LEADER_GRACE_S = 30.0  # how long a node's driver may take to end itself once its parent is gone
CGROUP_WAIT_S = 60.0  # a cgroup is removable once the kernel has let go of its killed processes


def _remove_cgroups(paths: list[str], wait_s: float = CGROUP_WAIT_S) -> None:
    """Kill what is left in each cgroup and remove it, the innermost first; gives up on one after ``wait_s``.
    Only a run's own cgroups (named ``picklescope-*``) are touched."""
    for path in sorted((p for p in paths if os.path.basename(p).startswith("picklescope-")), key=len, reverse=True):
        deadline = time.monotonic() + wait_s
        while os.path.isdir(path) and time.monotonic() < deadline:
            try:
                with open(os.path.join(path, "cgroup.procs")) as f:
                    pids = [int(x) for x in f.read().split()]
            except (OSError, ValueError):
                pids = []
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(path)
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.05)


def start_watch(parent: int, leader: int, leader_ticks: int, temp_dir: str | None = None,
                cgroups: Iterable[str] = ()) -> subprocess.Popen:
    """Start :func:`watch_main` in a session of its own (so that ending the leader's session spares it)."""
    args = [str(parent), str(start_ticks(parent)), str(leader), str(leader_ticks), temp_dir or "", *cgroups]
    return subprocess.Popen([sys.executable, "-S", __file__, *args], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def watch_main(argv: list[str]) -> int:
    """``python -S cluster.py PARENT PARENT_TICKS LEADER LEADER_TICKS TEMP_DIR [CGROUP ...]``: end a cluster
    whose starter died.

    :class:`~picklescope.ray.local_cluster.LocalCluster` starts ``ray start --head --block``
    in a session of its own (the leader); a starter SIGKILLed during or after the start-up could not
    stop it. This small process (the standard library only, so it starts in milliseconds) waits on
    the starter; when it dies it kills every process of the leader's session, removes the
    cluster's temp dir and the memory cgroups it was given (a node run's, which the node's driver
    cannot be trusted to remove: once its raylet is killed, Ray's core worker ends the driver at
    once). It exits on its own once the leader is gone while the starter lives (a run ended normally);
    a leader gone with its starter leaves only its temp dir and the cgroups to remove.
    """
    parent, parent_ticks, leader, leader_ticks = (int(a) for a in argv[:4])
    temp_dir = argv[4] if len(argv) > 4 and argv[4] else None
    cgroups = [a for a in argv[5:] if a]
    try:
        fd: int | None = os.pidfd_open(parent)
    except (AttributeError, OSError):
        fd = None
    while True:
        if not running(leader, leader_ticks):
            # a run that ended normally, or a node's driver that Ray ended when its starter died: then its temp
            # dir (the driver, ended at once, may not have removed it) and the cgroups are left (a dead leader's
            # session is never looked for: its number may be reused)
            if not running(parent, parent_ticks):
                if temp_dir:
                    shutil.rmtree(temp_dir, ignore_errors=True)
                if cgroups:
                    _remove_cgroups(cgroups)
                    return 1
            return 0
        if not running(parent, parent_ticks):
            break
        if fd is not None:
            select.select([fd], [], [], 0.5)
        else:
            time.sleep(0.2)
    if cgroups:  # a node's driver: it removes its files and ends its session itself (ParentWatch) first
        deadline = time.monotonic() + LEADER_GRACE_S
        while running(leader, leader_ticks) and time.monotonic() < deadline:
            time.sleep(0.1)
    if temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)
    stop_all(lambda: cluster_processes(leader, leader_ticks, (leader,), temp_dir))
    if temp_dir:
        shutil.rmtree(temp_dir, ignore_errors=True)
    _remove_cgroups(cgroups)
    return 1


if __name__ == "__main__":
    import sys

    sys.exit(watch_main(sys.argv[1:]))
