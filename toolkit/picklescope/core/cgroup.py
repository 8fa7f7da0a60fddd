"""Memory cgroups (v1) for budgets enforced by the kernel itself, where the machine allows it.

A run's cgroup is created *under the parent's own memory cgroup*, never beside it, so whatever limit
the machine already puts on the parent still applies to the children and nothing escapes it. A side
joins its cgroup right after its baseline, so only what it allocates from then on is charged, and
the limit is "charged now + budget". The kernel's OOM killer then kills the side with SIGKILL at the
limit, which is exactly how the production node died. Every cgroup is removed when its run ends.

cgroup v2 would need the parent's cgroup to delegate the memory controller to a child, which a
process that lives in that cgroup cannot arrange for itself; :func:`support` says so and the run
uses the watchdog.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

from picklescope.core.procmem import kill_until_gone

_support: tuple[str | None, str] | None = None


def _v1_memory_mount(controller: str = "memory") -> tuple[str, str] | None:
    """(mount point, mounted root) of the cgroup v1 hierarchy of ``controller``, if mounted."""
    try:
        with open("/proc/self/mountinfo") as f:
            for line in f:
                left, _, right = line.partition(" - ")
                parts, rparts = left.split(), right.split()
                if len(rparts) >= 3 and rparts[0] == "cgroup" and controller in rparts[2].split(","):
                    return parts[4], parts[3]
    except OSError:
        return None
    return None


def _own_v1_path(controller: str = "memory") -> str | None:
    try:
        with open("/proc/self/cgroup") as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controller in controllers.split(","):
                    return path
    except OSError:
        return None
    return None


def _own_dir(controller: str) -> str | None:
    """This process's own cgroup directory in the v1 hierarchy of ``controller``, if it is writable."""
    mount = _v1_memory_mount(controller)
    own = _own_v1_path(controller)
    if mount is None or own is None:
        return None
    point, root = mount
    if not own.startswith(root):
        return None
    base = os.path.normpath(os.path.join(point, os.path.relpath(own, root)))
    return base if os.path.isfile(os.path.join(base, "cgroup.procs")) and os.access(base, os.W_OK) else None


# -- tracking a run's processes, whatever session or process group they start -----------------------
_tracking: list[str | None] = []


def tracking_base() -> str | None:
    """Where run cgroups that only *track* processes go: this process's cgroup in the v1 ``pids`` (or
    ``freezer``) hierarchy, which no budget uses, so a side that later joins a memory cgroup stays
    tracked. None where neither is mounted and writable (the runner then relies on subreapers)."""
    if not _tracking:
        _tracking.append(_own_dir("pids") or _own_dir("freezer"))
    return _tracking[0]


def procs(path: str) -> list[int]:
    """Pids in the cgroup ``path`` (empty if it is gone)."""
    try:
        with open(os.path.join(path, "cgroup.procs")) as f:
            return [int(x) for x in f.read().split()]
    except (OSError, ValueError):
        return []


def add_process(path: str, pid: int) -> bool:
    """Move ``pid`` into the cgroup ``path``; its future children are born there, whatever session they start."""
    try:
        _write(os.path.join(path, "cgroup.procs"), str(pid))
        return True
    except OSError:
        return False


def kill_all(path: str, wait_s: float = 5.0) -> list[int]:
    """SIGKILL every process in the cgroup until it is empty (new children included); returns the pids killed."""
    return kill_until_gone(lambda: [p for p in procs(path) if p != os.getpid()], wait_s)


def remove_stale_everywhere() -> list[str]:
    """Remove the run cgroups of picklescope processes that are gone, killing what is still inside them.

    Called by every run (not only cgroup runs), so a parent killed mid-run costs nothing past the next
    run: its memory cgroups go, and its tracking cgroup's processes (a grandchild that started its own
    session included) are killed first.
    """
    removed = []
    for controller in ("memory", "pids", "freezer"):
        base = _own_dir(controller)
        if base is not None:
            removed += _remove_stale(base)
    return removed


def _base() -> tuple[str | None, str]:
    """The directory run cgroups would go in (the parent's own memory cgroup), or why there is none."""
    mount = _v1_memory_mount()
    if mount is None:
        if os.path.exists("/sys/fs/cgroup/cgroup.controllers"):
            return None, "only cgroup v2 is mounted and picklescope cannot delegate its memory controller"
        return None, "no memory cgroup hierarchy is mounted"
    point, root = mount
    own = _own_v1_path()
    if own is None:
        return None, "this process is in no memory cgroup"
    rel = os.path.relpath(own, root) if own.startswith(root) else None
    if rel is None:
        return None, f"this process's memory cgroup {own} is outside the mounted hierarchy"
    base = os.path.normpath(os.path.join(point, rel))
    if not os.path.isfile(os.path.join(base, "memory.limit_in_bytes")):
        return None, f"{base} is not a memory cgroup directory"
    if not os.access(base, os.W_OK):
        return None, f"{base} is not writable by this user"
    return base, f"memory cgroup v1 under {base}"


def describe() -> str:
    """Whether run cgroups look possible here, without creating anything (for environment reports)."""
    base, why = _base()
    return f"probably usable: {why}" if base else f"unavailable: {why}"


def _remove_stale(base: str) -> list[str]:
    """Remove run cgroups left by a picklescope process that died before cleaning up (killing what is left
    inside them first); returns the removed paths."""
    try:
        names = os.listdir(base)
    except OSError:
        return []
    removed = []
    for name in names:
        parts = name.split("-")
        if len(parts) >= 3 and parts[0] == "picklescope" and parts[1].isdigit():
            pid = int(parts[1])
            if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
                path = os.path.join(base, name)
                kill_all(path, wait_s=2.0)
                if remove(path):
                    removed.append(path)
    return removed


def _probe() -> tuple[str | None, str]:
    base, why = _base()
    if base is None:
        return None, why
    _remove_stale(base)
    probe = os.path.join(base, f"picklescope-probe-{os.getpid()}")
    try:
        os.mkdir(probe)
    except OSError as exc:
        return None, f"cannot create a child cgroup under {base} ({exc.strerror or exc})"
    try:
        ok = os.path.isfile(os.path.join(probe, "memory.limit_in_bytes"))
    finally:
        remove(probe)
    if not ok:
        return None, f"a child cgroup under {base} has no memory.limit_in_bytes"
    return base, f"memory cgroup v1 under {base}"


def support() -> tuple[str | None, str]:
    """(directory to create run cgroups in, or None; the reason in words). Probed once per process."""
    global _support
    if _support is None:
        _support = _probe()
    return _support


def create(base: str, name: str) -> str:
    """Create an empty child cgroup; the caller must :func:`remove` it."""
    path = os.path.join(base, name)
    os.mkdir(path)
    return path


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _read_int(path: str) -> int:
    with open(path) as f:
        return int(f.read().split()[0])


def join_and_limit(path: str, budget_bytes: int) -> None:
    """Move the calling process into ``path`` and cap what it may charge from now on (child side)."""
    _write(os.path.join(path, "cgroup.procs"), str(os.getpid()))
    limit_above_usage(path, budget_bytes)


def limit_above_usage(path: str, budget_bytes: int) -> tuple[int, int]:
    """Cap ``path`` at what it charges now plus ``budget_bytes``, swap counted too: (usage, limit)."""
    usage = _read_int(os.path.join(path, "memory.usage_in_bytes"))
    limit = usage + budget_bytes
    _write(os.path.join(path, "memory.limit_in_bytes"), str(limit))
    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):  # with swap, the limit alone would swap instead of kill
        try:
            _write(memsw, str(limit))
        except OSError:
            pass
    return usage, limit


def counters(path: str) -> dict[str, int]:
    """How often the cgroup hit its limit, how many processes its OOM killer killed, and what it charged.

    The charge is what the kernel counted against the limit, which is more than a process's RSS: a
    file a side writes to ``/dev/shm`` (the hand-off) is shared memory charged to the writer's cgroup
    and stays charged after the writer dies, while the file exists. So ``max_usage_bytes`` (the
    cgroup's peak charge), ``limit_bytes`` and the ``shmem_bytes`` still charged (read before the run
    directory is removed) tell what the OOM killer saw; RSS samples alone can show 0 B at death.
    """
    out = {}
    try:
        out["failcnt"] = _read_int(os.path.join(path, "memory.failcnt"))
        with open(os.path.join(path, "memory.oom_control")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    out["oom_kill"] = int(value)
    except (OSError, ValueError):
        pass
    for key, name in (("max_usage_bytes", "memory.max_usage_in_bytes"), ("limit_bytes", "memory.limit_in_bytes"),
                      ("usage_bytes", "memory.usage_in_bytes")):
        try:
            out[key] = _read_int(os.path.join(path, name))
        except (OSError, ValueError, IndexError):
            pass
    stat = memory_stat(path)
    for key, names in (("shmem_bytes", ("total_shmem", "shmem")), ("rss_bytes", ("total_rss", "rss")),
                       ("cache_bytes", ("total_cache", "cache"))):
        found = [stat[n] for n in names if n in stat]
        if found:
            out[key] = found[0]
    return out


def memory_stat(path: str) -> dict[str, int]:
    """The cgroup's ``memory.stat`` as {name: value} (empty if unreadable)."""
    out: dict[str, int] = {}
    try:
        with open(os.path.join(path, "memory.stat")) as f:
            for line in f:
                key, _, value = line.partition(" ")
                try:
                    out[key] = int(value)
                except ValueError:
                    continue
    except OSError:
        pass
    return out


def remove(path: str, dir_fd: int | None = None) -> bool:
    """Remove an (empty) cgroup (``path`` relative to ``dir_fd`` if given); a just-killed process may take a
    moment to leave it. True if this call removed it."""
    for _ in range(50):
        try:
            os.rmdir(path, dir_fd=dir_fd)
            return True
        except FileNotFoundError:
            return False
        except OSError:
            time.sleep(0.02)
    return False


# -- a cgroup seen as the machine's memory cgroup, by one process tree ------------------------------
_CLONE_NEWNS = 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE = 4096, 16384, 1 << 18


def view_as_root(path: str) -> None:
    """Make the calling thread (and every process it starts from now on) see the cgroup ``path`` where
    the machine's v1 memory hierarchy is mounted, as a container sees its own cgroup.

    Ray's memory monitor reads ``/sys/fs/cgroup/memory/memory.limit_in_bytes`` and
    ``memory.usage_in_bytes`` at that fixed place, never the cgroup its raylet is in; inside a private
    mount namespace with ``path`` bound there, it reads ``path``'s limit as the node's memory and
    ``path``'s usage as what the node uses. Needs CAP_SYS_ADMIN; raises OSError (with why) otherwise.
    Nothing outside the new namespace changes, and it ends with the last process in it.
    """
    mount = _v1_memory_mount()
    if mount is None:
        raise OSError("no cgroup v1 memory hierarchy is mounted")
    libc = ctypes.CDLL(None, use_errno=True)
    for what, ok in (("unshare(CLONE_NEWNS)", lambda: libc.unshare(_CLONE_NEWNS)),
                     ("making / private", lambda: libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None)),
                     (f"binding {path}", lambda: libc.mount(path.encode(), mount[0].encode(), None, _MS_BIND, None))):
        if ok() != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"{what} failed: {os.strerror(err)}")


def can_view_as_root() -> tuple[bool, str]:
    """Whether :func:`view_as_root` works here, tried in a throw-away child (this process keeps its mounts)."""
    code = ("import ctypes,sys; l=ctypes.CDLL(None,use_errno=True); "
            f"sys.exit(0 if l.unshare({_CLONE_NEWNS})==0 else ctypes.get_errno())")
    try:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"cannot start a probe ({exc})"
    if done.returncode == 0:
        return True, "a private mount namespace can show the run's cgroup to Ray"
    return False, f"this user cannot make a private mount namespace ({os.strerror(done.returncode)})"


def move_all(src: str, dst: str) -> list[int]:
    """Move every process of ``src`` into ``dst`` (their charges so far stay with ``src``); the pids moved."""
    moved = []
    for pid in procs(src):
        if add_process(dst, pid):
            moved.append(pid)
    return moved


def set_limit(path: str, limit_bytes: int) -> None:
    """Cap ``path`` at ``limit_bytes`` (swap counted too, where the kernel counts it)."""
    _write(os.path.join(path, "memory.limit_in_bytes"), str(limit_bytes))
    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):
        try:
            _write(memsw, str(limit_bytes))
        except OSError:
            pass


class Remover:
    """Removes cgroups from any thread of this process, one in a private mount namespace included.

    After :func:`view_as_root` the calling thread sees another cgroup at the hierarchy's mount point, so
    the run's cgroups can no longer be named by path there. A node's driver makes one of these before
    that, from the paths: it holds a descriptor of each cgroup's parent directory, so when the run's
    parent dies without cleaning up (SIGKILL), the driver can still leave its cgroups, kill what is left
    in them and remove them.
    """

    def __init__(self, paths: list[str]) -> None:
        self.entries: list[tuple[int, str]] = []
        for path in paths:
            try:
                fd = os.open(os.path.dirname(path), os.O_RDONLY | os.O_DIRECTORY)
            except OSError:
                continue
            self.entries.append((fd, os.path.basename(path)))

    def _procs(self, fd: int, name: str) -> list[int]:
        try:
            with open(os.open(f"{name}/cgroup.procs", os.O_RDONLY, dir_fd=fd)) as f:
                return [int(x) for x in f.read().split()]
        except (OSError, ValueError):
            return []

    def remove(self, wait_s: float = 5.0) -> list[str]:
        """Move this process out (to each cgroup's parent), kill what is left inside, remove each; the
        names removed."""
        removed = []
        for fd, name in self.entries:
            try:
                with open(os.open("cgroup.procs", os.O_WRONLY, dir_fd=fd), "w") as f:
                    f.write(str(os.getpid()))
            except OSError:
                pass
            kill_until_gone(lambda fd=fd, name=name: [p for p in self._procs(fd, name) if p != os.getpid()], wait_s)
            if remove(name, dir_fd=fd):
                removed.append(name)
        return removed

    def close(self) -> None:
        """Let the descriptors go (the cgroups stay)."""
        for fd, _ in self.entries:
            try:
                os.close(fd)
            except OSError:
                pass
        self.entries = []
