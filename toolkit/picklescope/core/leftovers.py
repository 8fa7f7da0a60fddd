"""Did anything outlive its run? Processes and temporary files a session of picklescope left behind.

A diagnostic that leaves a raylet holding the object store's shared memory, a child stuck in a
sleep, or a hand-off file in ``/dev/shm`` makes the incident it was chasing worse, so the test suite
ends with this check (see :mod:`picklescope.measure.pytest_leftovers`) and fails if it finds anything. Any
long-lived process (a Jupyter kernel, a CI job) can use it the same way: :func:`begin` when it
starts, :func:`check` when it is done.

Whose is what, on a machine shared with other programs:

- processes: every descendant of this process, plus every process whose environment carries this
  session's marker (:data:`SESSION_ENV`, set by :func:`begin` and inherited by every child, the Ray
  processes a driver starts included), which finds the orphans that were re-parented to init;
- files: entries of ``/dev/shm`` and the temp directory named with picklescope's prefixes
  (:data:`PREFIXES`) that did not exist at :func:`begin`. The toolkit names them
  ``<prefix>-<creator pid>-<random>``, so an entry whose creator is alive and not ours is another
  program's run in progress and is skipped; one whose creator is gone is a leftover.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil

from picklescope.core import cgroup

SESSION_ENV = "PICKLESCOPE_SESSION"
# Every temporary name the toolkit creates: runs and cell runs (/dev/shm), a run's private Ray temp
# dir, a shared LocalCluster's temp dir, a notebook execution, emitted verl blobs (temp dir).
PREFIXES = ("picklescope-", "psray-", "psrayc-")
# Kept on purpose: the %%picklescope magic's plugin files, named by their content, which every later
# child of the kernel loads (see magic.write_codec_plugin). Not a per-run temporary.
PERSISTENT = ("picklescope-codecs-",)
_CREATOR = re.compile(r"^(?:picklescope|psray|psrayc)(?:-[a-z]+)?-(\d+)-[^-]+$")
RAY_MARKERS = ("raylet", "gcs_server", "ray::", "default_worker.py", "plasma", "ray/dashboard",
               "ray/autoscaler", "ray/_private")


def temp_name(prefix: str) -> str:
    """``prefix`` with this process's pid, for ``mkdtemp(prefix=...)``: the leftover check's attribution."""
    return f"{prefix}{os.getpid()}-"


def _remove(path: str) -> None:
    """Remove a temporary, a folder with its contents or a single file (OSError if it cannot)."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    else:
        os.unlink(path)


def sweep_orphans(extra_roots: list[str] | None = None) -> list[str]:
    """Remove temporaries whose creator process is gone (a parent killed with SIGKILL cannot clean up).

    Called at the start of every run, so one killed parent costs one stale hand-off file until the
    next run, not forever. Only names that carry a creator pid (:func:`temp_name`) are touched, and
    only when no process with that pid exists; returns what was removed.
    """
    removed = cgroup.remove_stale_everywhere()  # dead creators' cgroups, with whatever still runs in them
    kill_dead_creators_ray()  # Ray processes of a dead creator whose temp dir is already gone
    roots = temp_roots() + [r for r in extra_roots or () if r and os.path.isdir(r)]
    return removed + _remove_where(roots, lambda pid: pid is not None and not psutil.pid_exists(pid))


def remove_own(pid: int | None = None) -> list[str]:
    """Remove every temporary this process made (its pid is in the name) and returns what went.

    The last step of a command that was interrupted: each run removes its own temporaries, but a run
    in another thread that had not finished its clean-up when the process ends (``reproduce``'s Ray lane
    given up after its wait) would otherwise leave its folder until a later run's sweep."""
    own = os.getpid() if pid is None else pid
    return _remove_where(temp_roots(), lambda creator: creator == own)


def _remove_where(roots: list[str], creator_is: Callable[[int | None], bool]) -> list[str]:
    """Remove the temporaries in ``roots`` whose creator pid passes ``creator_is``; what was removed. A
    private Ray temp dir's processes (which name it) are killed first."""
    removed = []
    for path in sorted(_entries(roots)[0]):
        if not creator_is(creator_pid(path)):
            continue
        if os.path.basename(path).startswith(("psray-", "psrayc-")):
            kill_naming(path)
        try:
            _remove(path)
            removed.append(path)
        except OSError:
            pass
    return removed


def _kill_where(matches: Callable[[str], bool]) -> list[int]:
    """SIGKILL every process of this user (but this one) whose command line, joined with spaces, ``matches``."""
    killed = []
    me = os.getpid()
    for p in psutil.process_iter():
        if p.pid == me:
            continue
        try:
            if matches(" ".join(p.cmdline())):
                p.kill()
                killed.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return killed


def kill_naming(path: str) -> list[int]:
    """SIGKILL every process of this user whose command line names ``path`` (a dead run's Ray temp dir)."""
    return _kill_where(lambda cmd: path in cmd)


_RAY_DIR = re.compile(r"/(?:psray|psrayc)-(\d+)-[^/\s]+")


def _names_a_dead_creators_dir(cmd: str) -> bool:
    m = _RAY_DIR.search(cmd)
    return m is not None and _is_ray(cmd) and not psutil.pid_exists(int(m.group(1)))


def kill_dead_creators_ray() -> list[int]:
    """SIGKILL every Ray process of this user whose command line names a picklescope Ray temp dir
    (``/tmp/psray-<pid>-...``) whose creator ``pid`` is gone, whether or not the dir still exists.

    A driver whose parent died removes the dir before it kills the cluster (see
    ``ray.cluster.ParentWatch``); if it is itself ended in between, the processes name a
    dir that no longer exists, which the per-entry sweep would never visit.
    """
    return _kill_where(_names_a_dead_creators_dir)


PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux ``PR_SET_CHILD_SUBREAPER``).

    A grandchild that starts its own session and whose parent exits is then re-parented to this
    process instead of init, so it stays in this process's tree, where the run finds and ends it.
    Returns False where the call is not available.
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


class RunTracker:
    """Every process a run starts, and every process those start, ended when the run ends.

    Where a v1 ``pids`` (or ``freezer``) cgroup can be created, each side is moved into the run's own
    cgroup as it starts; the kernel puts every descendant there too, whatever session or process
    group it starts, so :meth:`end` kills the cgroup's members until it is empty. Elsewhere the sides
    make themselves subreapers (:func:`become_subreaper`), so their descendants stay in their tree,
    and :meth:`snapshot` records that tree while the sides are alive. A parent killed before
    :meth:`end` leaves the cgroup named with its pid, which the next run's :func:`sweep_orphans` empties
    and removes.
    """

    _count = 0

    def __init__(self) -> None:
        RunTracker._count += 1
        self.path: str | None = None
        base = cgroup.tracking_base()
        if base is not None:
            try:
                self.path = cgroup.create(base, f"picklescope-{os.getpid()}-{RunTracker._count}-{uuid.uuid4().hex[:6]}")
            except OSError:
                self.path = None
        self.pids: list[int] = []
        self.seen: dict[int, psutil.Process] = {}

    def add(self, pid: int) -> None:
        """Track ``pid`` (a side just started) and everything it will start."""
        self.pids.append(pid)
        if self.path is not None:
            cgroup.add_process(self.path, pid)
        self.snapshot()

    def snapshot(self) -> None:
        """Remember the sides' current descendants (the fallback where there is no tracking cgroup)."""
        for pid in self.pids:
            try:
                root = psutil.Process(pid)
                for p in [root, *root.children(recursive=True)]:
                    self.seen.setdefault(p.pid, p)
            except psutil.Error:
                continue

    def end(self, keep: Callable[[], set[int]] | None = None) -> list[int]:
        """Kill whatever of the run is still alive and remove its cgroup; returns the pids killed.

        ``keep`` names the parent's own live children (other runs' sides), which an orphan sweep of the
        forkserver's children must spare; without it, every live ``multiprocessing`` child is spared."""
        killed: list[int] = []
        if self.path is not None:
            killed += cgroup.kill_all(self.path)
        for p in self.seen.values():
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    p.kill()
                    killed.append(p.pid)
            except psutil.Error:
                continue
        if self.path is not None:
            cgroup.remove(self.path)
            self.path = None
        else:
            killed += _kill_adopted(keep)
        return killed


def _kill_adopted(keep: Callable[[], set[int]] | None = None) -> list[int]:
    """Kill the orphans the forkserver adopted (:mod:`picklescope.measure.forkserver_setup`): its children that are
    no live process of this parent's. Only used where no tracking cgroup exists."""
    import multiprocessing
    from multiprocessing import forkserver

    pid = getattr(forkserver._forkserver, "_forkserver_pid", None)
    if pid is None:
        return []
    ours = keep() if keep is not None else {p.pid for p in multiprocessing.active_children()}
    killed = []
    try:
        adopted = [p for p in psutil.Process(pid).children() if p.pid not in ours]
    except psutil.Error:
        return []
    for p in adopted:
        try:
            for q in [p, *p.children(recursive=True)]:
                q.kill()
                killed.append(q.pid)
        except psutil.Error:
            continue
    return killed


def temp_roots() -> list[str]:
    """Where the toolkit creates temporaries: ``/dev/shm`` and the temp directory (``/tmp`` unless TMPDIR)."""
    roots = []
    for root in ("/dev/shm", "/tmp", tempfile.gettempdir()):
        if os.path.isdir(root) and root not in roots:
            roots.append(root)
    return roots


def _entries(roots: list[str]) -> tuple[set[str], int]:
    """(paths named with our prefixes, how many entries were looked at)."""
    found, seen = set(), 0
    for root in roots:
        try:
            names = os.listdir(root)
        except OSError:
            continue
        seen += len(names)
        for name in names:
            if name.startswith(PREFIXES) and not name.startswith(PERSISTENT):
                found.add(os.path.join(root, name))
    return found, seen


def creator_pid(path: str) -> int | None:
    """The pid encoded in a temporary's name by :func:`temp_name`, or None (an older or foreign name)."""
    m = _CREATOR.match(os.path.basename(path))
    return int(m.group(1)) if m else None


@dataclass
class Snapshot:
    """What existed when the session began, and the marker its processes carry."""

    pid: int
    marker: str
    started_at: float
    roots: list[str]
    entries: set[str]


@dataclass
class Leftover:
    """One process or file that outlived the session."""

    kind: str  # "process" | "ray process" | "file"
    pid: int | None = None
    cmdline: str = ""
    path: str = ""
    why: str = ""

    def __str__(self) -> str:
        if self.kind == "file":
            return f"file {self.path} ({self.why})"
        return f"{self.kind} pid {self.pid} ({self.why}): {self.cmdline}"


@dataclass
class Report:
    """What :func:`check` found; ``ok`` when nothing was left."""

    leftovers: list[Leftover] = field(default_factory=list)
    processes_checked: int = 0
    entries_checked: int = 0
    notes: list[str] = field(default_factory=list)
    roots: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.leftovers

    def summary(self) -> str:
        procs = sum(1 for x in self.leftovers if x.kind != "file")
        files = len(self.leftovers) - procs
        return (f"leftover check: {procs} processes, {files} files (checked {self.processes_checked} processes, "
                f"{self.entries_checked} entries in {', '.join(self.roots)})")


def begin(marker: str | None = None) -> Snapshot:
    """Mark this process's future children and remember which temporaries already exist."""
    marker = marker or uuid.uuid4().hex
    os.environ[SESSION_ENV] = marker
    roots = temp_roots()
    entries, _ = _entries(roots)
    return Snapshot(os.getpid(), marker, time.time(), roots, entries)


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline())[:300] or f"[{p.name()}]"
    except (psutil.Error, OSError):
        return "?"


def _is_ray(cmd: str) -> bool:
    return any(m in cmd for m in RAY_MARKERS)


def _ours(snap: Snapshot) -> tuple[dict[int, str], int]:
    """{pid: why} of live processes of this session (not this process), and how many were looked at."""
    me = psutil.Process(snap.pid)
    found: dict[int, str] = {}
    try:
        for c in me.children(recursive=True):
            found[c.pid] = "descendant of this process"
    except psutil.Error:
        pass
    checked = 0
    for p in psutil.process_iter():
        checked += 1
        if p.pid == snap.pid or p.pid in found:
            continue
        try:
            if p.environ().get(SESSION_ENV) == snap.marker:
                found[p.pid] = "carries this session's marker (re-parented after its parent ended)"
        except (psutil.Error, OSError):
            continue
    live = {}
    for pid, why in found.items():
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:  # a zombie holds nothing; its parent reaps it
                live[pid] = why
        except psutil.Error:
            continue
    return live, checked


def _scan(snap: Snapshot) -> tuple[list[Leftover], int, int, list[str]]:
    ours, checked = _ours(snap)
    found: list[Leftover] = []
    for pid, why in sorted(ours.items()):
        try:
            cmd = _cmdline(psutil.Process(pid))
        except psutil.Error:
            continue
        found.append(Leftover("ray process" if _is_ray(cmd) else "process", pid, cmd, why=why))
    entries, seen = _entries(snap.roots)
    notes, foreign = [], []
    for path in sorted(entries - snap.entries):
        creator = creator_pid(path)
        if creator is None:
            found.append(Leftover("file", path=path, why="created during the session"))
        elif creator == snap.pid or creator in ours or not psutil.pid_exists(creator):
            alive = "alive" if psutil.pid_exists(creator) else "gone"
            found.append(Leftover("file", path=path, why=f"created during the session by pid {creator}, {alive}"))
        else:
            foreign.append(f"{os.path.basename(path)} (pid {creator})")
    if foreign:
        notes.append(f"skipped {len(foreign)} new entries whose creator is alive and not ours (other programs' "
                     f"runs in progress): {', '.join(foreign[:4])}{' ...' if len(foreign) > 4 else ''}")
    return found, checked, seen, notes


def check(snap: Snapshot, grace_s: float = 5.0) -> Report:
    """Everything this session left; what disappears within ``grace_s`` was still ending, not left."""
    deadline = time.monotonic() + grace_s
    while True:
        found, checked, seen, notes = _scan(snap)
        if not found or time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    report = Report(found, checked, seen, notes, snap.roots)
    foreign = []
    listed = {x.pid for x in found}
    for p in psutil.process_iter():
        try:
            if p.pid in listed or p.pid == snap.pid or p.create_time() < snap.started_at:
                continue
            cmd = _cmdline(p)
            if _is_ray(cmd) and "ray" in cmd:
                foreign.append(f"{p.pid} {cmd[:80]}")
        except psutil.Error:
            continue
    if foreign:
        report.notes.append(f"{len(foreign)} Ray processes started during the session belong to other programs "
                            f"(no session marker): {'; '.join(foreign[:5])}")
    return report


def clean(report: Report) -> list[str]:
    """SIGKILL the leftover processes and remove the leftover files; returns what failed."""
    failed = []
    for x in report.leftovers:
        if x.kind == "file":
            try:
                _remove(x.path)
            except OSError as exc:
                failed.append(f"{x.path}: {exc}")
        elif x.pid is not None:
            try:
                os.kill(x.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            except OSError as exc:
                failed.append(f"pid {x.pid}: {exc}")
    return failed
