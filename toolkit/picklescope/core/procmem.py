"""Reading memory from the kernel, the only source of exact peaks.

``VmHWM`` in ``/proc/<pid>/status`` is the kernel's own high-water mark of resident memory; writing
``5`` to ``/proc/self/clear_refs`` resets it to the current RSS. A thread sampling RSS inside the
measured process is starved by the GIL during ``pickle.dumps`` and ``torch.save``, so exact peaks come
from this pair and the sampled curve comes from another process reading ``statm``.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

PAGE = os.sysconf("SC_PAGE_SIZE")


def _status_field(pid: int | str, field: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/{pid}/status has no {field}")


def status_bytes(data: bytes, name: bytes) -> int | None:
    """A ``kB`` field (``b"VmRSS:"``) of a ``/proc/PID/status`` text already read, in bytes; None if absent."""
    i = data.find(name)
    if i < 0:
        return None
    return int(data[i + len(name):data.index(b"kB", i)]) * 1024


def private_rss(pid: int | str = "self") -> int:
    """``VmRSS - RssShmem``: what a process holds that no other process maps (the node session's count)."""
    with open(f"/proc/{pid}/status", "rb") as f:
        data = f.read()
    return (status_bytes(data, b"VmRSS:") or 0) - (status_bytes(data, b"RssShmem:") or 0)


def rss(pid: int | str = "self") -> int:
    """Resident set size in bytes (anonymous + file + shared memory pages)."""
    return _status_field(pid, "VmRSS:")


def hwm(pid: int | str = "self") -> int:
    """The kernel's high-water mark of RSS since the last reset."""
    return _status_field(pid, "VmHWM:")


def reset_hwm() -> None:
    """Reset this process's VmHWM to its current RSS."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def hwm_resettable() -> bool:
    """Whether this kernel lets a process reset its own peak (needed for exact per-step peaks)."""
    try:
        reset_hwm()
        return True
    except OSError:
        return False


class ProcFileReader:
    """Fast repeated reads of one ``/proc/PID`` file (opened once, one ``pread`` a sample), for 1 ms
    sampling: the one reader behind every reading the session samples. A subclass names the file and
    parses its bytes; a read returns None once the process is gone (or, a zombie, has no memory)."""

    FILE = ""
    SIZE = 256  # bytes read a sample: enough for the fields parsed

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._fd = os.open(f"/proc/{pid}/{self.FILE}", os.O_RDONLY)

    def read(self) -> int | None:
        try:
            data = os.pread(self._fd, self.SIZE, 0)
        except OSError:
            return None
        return self.parse(data) if data else None

    def parse(self, data: bytes) -> int | None:
        raise NotImplementedError

    def close(self) -> None:
        if self._fd >= 0:
            fd, self._fd = self._fd, -1
            try:
                os.close(fd)
            except OSError:  # already closed (a process that forked after opening it, say): nothing to free
                pass


class StatmReader(ProcFileReader):
    """Resident bytes (RSS, shared pages included) from ``statm``."""

    FILE = "statm"

    def parse(self, data: bytes) -> int | None:
        return int(data.split()[1]) * PAGE


class StatusReader(ProcFileReader):
    """Private resident bytes (``VmRSS - RssShmem``) from ``status``: a node's processes, whose mapped
    object-store pages belong to the store."""

    FILE = "status"
    SIZE = 4096

    def parse(self, data: bytes) -> int | None:
        rss = status_bytes(data, b"VmRSS:")
        if rss is None:  # a zombie has no memory fields
            return None
        return rss - (status_bytes(data, b"RssShmem:") or 0)


class HwmReader(ProcFileReader):
    """The kernel's peak resident bytes (``VmHWM``) from ``status``: what the watchdog checks between its
    RSS samples, since a spike shorter than a sample still raises it."""

    FILE = "status"
    SIZE = 4096

    def parse(self, data: bytes) -> int | None:
        return status_bytes(data, b"VmHWM:")


def trim_heap() -> bool:
    """Give the memory glibc's allocator holds free back to the kernel (``malloc_trim(0)``).

    glibc keeps freed heap pages resident for reuse; a measurement that starts after earlier work in
    the same process (a traced line after set-up, the next replay of a node series) would otherwise see
    an allocation land in pages already counted, and RSS would not show what it really needs.
    Returns False where there is no glibc.
    """
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
        return True
    except (OSError, AttributeError):
        return False


_mallinfo2: list[Any] = []  # glibc's mallinfo2, once loaded (empty: not yet; [None]: no glibc)


def heap_in_use() -> int:
    """Bytes glibc's allocator has handed out and not had back: its heap's blocks in use plus its mapped ones
    (``mallinfo2``'s ``uordblks + hblkhd``); -1 without glibc.

    A collector's callback reads it to tell whether a call's copy had been allocated when the collector ran
    (``picklescope.investigate.node.collector``), so after its first call it allocates no container that
    outlives it: the load and the result's type are made once, by the first call (make it outside a callback).
    """
    if not _mallinfo2:
        try:
            import ctypes

            class _Info(ctypes.Structure):
                _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                            "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

            fn = ctypes.CDLL("libc.so.6").mallinfo2
            fn.restype, fn.argtypes = _Info, []
            _mallinfo2.append(fn)
        except (OSError, AttributeError):  # no glibc, or one older than 2.33 (no mallinfo2)
            _mallinfo2.append(None)
    fn = _mallinfo2[0]
    if fn is None:
        return -1
    info = fn()
    return int(info.uordblks + info.hblkhd)


def machine_memory() -> dict[str, int]:
    """Total and available memory of the machine (bytes), from ``/proc/meminfo``."""
    out: dict[str, int] = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, rest = line.split(":", 1)
            if key in ("MemTotal", "MemAvailable"):
                out[key] = int(rest.split()[0]) * 1024
    return {"total": out.get("MemTotal", 0), "available": out.get("MemAvailable", 0)}


_MADV_POPULATE_READ = 22  # Linux >= 5.14


def populate_file_mappings() -> bool:
    """Fault in every page of this process's file-backed mappings (shared libraries), before a baseline.

    A forked child does not inherit its parent's page-table entries for file mappings, so the first
    time it runs a torch code path the pages of ``libtorch`` are mapped in and RSS grows by several
    MiB of page cache that no codec allocated. Mapping them all during setup puts that into the
    baseline, so step peaks count only memory the step really used. Returns False where the kernel
    lacks ``MADV_POPULATE_READ`` (the measurement then includes those page-ins, a few MiB).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    ok = False
    with open("/proc/self/maps") as f:
        lines = f.readlines()
    for line in lines:
        parts = line.split()
        if len(parts) < 6 or not parts[5].startswith("/") or parts[5].startswith("/dev/") or "r" not in parts[1]:
            continue
        start, end = (int(x, 16) for x in parts[0].split("-"))
        if libc.madvise(start, end - start, _MADV_POPULATE_READ) == 0:
            ok = True
    return ok


def kill_until_gone(still_there: Callable[[], Iterable[int]], wait_s: float, poll_s: float = 0.02) -> list[int]:
    """SIGKILL every pid ``still_there()`` lists, ask again, and repeat until it lists none or ``wait_s`` passed.

    What must end (a cgroup's processes) may fork while it is being killed, so the caller's
    ``still_there`` is asked again after each round and says what is left (a cgroup's members, new
    children included). Each pid is signalled once. Returns the pids that took the signal, in order.
    ``ray/cluster.kill`` keeps a loop of its own: that module also runs as a script under
    ``python -S``, with the standard library only.
    """
    sent: list[int] = []
    deadline = time.monotonic() + wait_s
    while True:
        left = list(still_there())
        if not left or time.monotonic() > deadline:
            return sent
        for pid in left:
            if pid in sent:
                continue
            try:
                os.kill(pid, signal.SIGKILL)
                sent.append(pid)
            except OSError:  # gone already, or not ours to signal
                pass
        time.sleep(poll_s)
