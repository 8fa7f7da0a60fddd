"""A capture probe for a live job: what the trainer's own batches look like and what serializing them cost.

One line in a trainer::

    import picklescope.investigate.capture; picklescope.investigate.capture.install("batch-capture/", limit=3)

or ``PICKLESCOPE_CAPTURE=batch-capture/`` in the job's environment plus ``picklescope.investigate.capture.auto()``
(e.g. in a ``sitecustomize`` or at the top of the entry point). The probe wraps
``verl.protocol:DataProto.__getstate__`` (or any ``module:Class.method``). For the first ``limit``
calls in each process it records, next to the call:

- the batch's structure, as a workload file in the format of ``data/workloads/`` (no values:
  :func:`picklescope.investigate.workload_from.describe_live`), ``call-<pid>-<n>.yaml``; the first one written in
  the folder is also ``workload.yaml``, ready for ``picklescope run --workload batch-capture/workload.yaml``;
- one JSON line in ``calls.jsonl``: the process, verl's serialization mode
  (``VERL_DATAPROTO_SERIALIZATION_METHOD``), the tensor payload, resident memory before and after the
  call, and the call's exact peak: the process's high-water mark is reset (``/proc/self/clear_refs``)
  right before the call and read right after it, where the kernel allows a process to reset its own
  peak (``peak_exact`` says whether it did).

The call itself pays only for the measurement: the reset, four reads of the kernel's counters and a
shallow copy of the batch's containers (a few microseconds, whatever the batch's size; files stay
open between calls). Describing the batch and writing the files happen on the probe's own thread
right after the call (the copy keeps the batch's structure as it was at the call). After ``limit``
calls the original method is put back, so later calls run exactly as if the probe had never been
there. It never raises into the trainer: the original method runs with the same arguments and its
result or exception passes through untouched; a failure to record is logged once (logger
``picklescope.investigate.capture``) and the probe steps aside. Resetting the high-water mark is the one side
effect on the process: a peak read by someone else across a recorded call starts at that call.
"""

from __future__ import annotations

import atexit
import collections
import functools
import importlib
import json
import logging
import os
import resource
import sys
import threading
import time
import weakref
from pathlib import Path
from typing import Any

ENV = "PICKLESCOPE_CAPTURE"
LIMIT_ENV = "PICKLESCOPE_CAPTURE_LIMIT"
TARGET_ENV = "PICKLESCOPE_CAPTURE_TARGET"
DEFAULT_TARGET = "verl.protocol:DataProto.__getstate__"
MODE_ENV = "VERL_DATAPROTO_SERIALIZATION_METHOD"
PAGE = os.sysconf("SC_PAGE_SIZE")
# getrusage's ru_maxrss is max(the reset high-water mark, the highest mark of threads that exited
# before): usable as the exact peak only when, right after the reset, it is the current RSS.
_RUSAGE_SLACK = 1 << 20
POLL_S = 0.05  # how often the writer looks for recorded calls (a call never wakes it: that costs the call)

log = logging.getLogger("picklescope.investigate.capture")
_PROBES: weakref.WeakSet[Probe] = weakref.WeakSet()


class _FrozenTD(dict):
    """A TensorDict's leaves as they were at the call (a shallow copy: the tensors are shared)."""

    batch_size: Any = ()


class _Frozen:
    """What ``describe_live`` reads of a DataProto, copied shallowly at call time."""

    __slots__ = ("batch", "non_tensor_batch", "meta_info")

    def __init__(self, batch: Any, non_tensor_batch: Any, meta_info: Any) -> None:
        self.batch, self.non_tensor_batch, self.meta_info = batch, non_tensor_batch, meta_info


def _freeze_td(td: Any) -> Any:
    inner = getattr(td, "_tensordict", None)  # tensordict's own dict of leaves: one copy, no per-leaf work
    if type(inner) is dict:
        f = _FrozenTD(inner)
        f.batch_size = td.batch_size
        return f
    return dict(td) if type(td) is dict else td


def _snapshot(obj: Any) -> tuple[Any, type | None]:
    """The batch's containers copied shallowly, so its structure can be described after the call."""
    try:
        ntb, meta = obj.non_tensor_batch, obj.meta_info
    except Exception:  # noqa: BLE001 - not a DataProto: a TensorDict, a dict, or whatever the target is given
        try:
            return _freeze_td(obj), (type(obj) if hasattr(obj, "_tensordict") else None)
        except Exception:  # noqa: BLE001
            return obj, None
    return (_Frozen(_freeze_td(getattr(obj, "batch", None)), dict(ntb) if type(ntb) is dict else ntb,
                    dict(meta) if type(meta) is dict else meta), type(obj))


def _field(status: bytes, name: bytes) -> int | None:
    i = status.find(name)
    return int(status[i + len(name):status.index(b"\n", i)].split()[0]) * 1024 if i >= 0 else None


class Meter:
    """The kernel's counters a recorded call is measured with, opened once per process.

    ``before()`` resets the process's high-water mark (``/proc/self/clear_refs``, 5) and reads it back:
    right after a reset the mark is the resident size, so that one read is also the size before the
    call. ``after()`` reads the mark and the resident size (``/proc/self/statm``) again. Four system
    calls on the fds opened here, and nothing else, is what a recorded call waits for besides a shallow
    copy of the batch's containers (``benchmarks/capture_overhead.py`` times them apart from the rest).
    The mark is read with ``getrusage`` (no text to format or parse); where that reports a peak older
    than the reset (checked once, when the meter is made), the resident size is read before the call
    and ``VmHWM`` from ``/proc/self/status`` after it. Where ``clear_refs`` cannot be written, only the
    resident sizes are read and the record says its peak is not exact.
    """

    def __init__(self) -> None:
        try:
            self.clear: int | None = os.open("/proc/self/clear_refs", os.O_WRONLY)
        except OSError:
            self.clear = None
        self.statm = os.open("/proc/self/statm", os.O_RDONLY)
        self.status = os.open("/proc/self/status", os.O_RDONLY)
        self.via_status = False
        if self.clear is not None:  # does getrusage follow the reset in this process?
            os.write(self.clear, b"5")
            m0 = resource.getrusage(resource.RUSAGE_THREAD).ru_maxrss
            self.via_status = self.stale(m0, os.pread(self.statm, 128, 0))

    def before(self) -> tuple[int | None, bytes | None]:
        """(the mark in KiB right after the reset, None); or (None, statm) where that mark cannot be had."""
        if self.clear is None:
            return None, os.pread(self.statm, 128, 0)
        os.write(self.clear, b"5")
        if self.via_status:
            return None, os.pread(self.statm, 128, 0)
        return resource.getrusage(resource.RUSAGE_THREAD).ru_maxrss, None

    def after(self) -> tuple[int | None, bytes | None, bytes]:
        """(the mark in KiB, or None; ``/proc/self/status`` where the mark is read there, or None; statm)."""
        if self.clear is None:
            return None, None, os.pread(self.statm, 128, 0)
        if self.via_status:
            return None, os.pread(self.status, 4096, 0), os.pread(self.statm, 128, 0)
        return resource.getrusage(resource.RUSAGE_THREAD).ru_maxrss, None, os.pread(self.statm, 128, 0)

    @staticmethod
    def stale(m0: int | None, statm0: bytes) -> bool:
        """True when the mark read right after the reset is above the resident size: not the reset mark."""
        return m0 is not None and m0 * 1024 > int(statm0.split()[1]) * PAGE + _RUSAGE_SLACK

    def close(self) -> None:
        for fd in (self.clear, self.statm, self.status):
            if fd is not None:
                try:
                    os.close(fd)
                except OSError:
                    pass


class Probe:
    """One installed probe: where it writes, how many calls it has left, and whether it failed."""

    def __init__(self, folder: str | os.PathLike, limit: int, target: str) -> None:
        self.folder = Path(folder).expanduser()
        self.limit = limit
        self.target = target
        self.calls = 0
        self.records: list[dict[str, Any]] = []
        self.error: str | None = None
        self.installed = False
        self._armed = False  # the one flag the wrapper reads when it is not recording
        self._owner: Any = None
        self._attr = ""
        self._original: Any = None
        self._describer: Any = None  # picklescope.investigate.workload_from, imported when the probe wraps its target
        self._lock = threading.Lock()
        self._warned = False
        self._meter: Meter | None = None
        self._pending: collections.deque[Any] = collections.deque()  # appended by calls, emptied by the writer
        self._wake = threading.Event()
        self._writer: threading.Thread | None = None
        self._wrote_first = False
        self._closing = False  # set when the original is back: the writer ends once it has written all
        self._pid = os.getpid()  # the process whose counters and limit these are (a forked child resets them)

    @property
    def active(self) -> bool:
        """True while calls are still being recorded."""
        return self._armed

    # -- life cycle --------------------------------------------------------------------------------------
    def _resolve(self) -> tuple[Any, str, Any]:
        module_name, sep, qual = self.target.partition(":")
        if not sep or not module_name or not qual:
            raise ValueError(f"target {self.target!r} is not of the form module:Class.method")
        owner: Any = importlib.import_module(module_name)
        *path, attr = qual.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
        if not callable(original):
            raise TypeError(f"{self.target} is not callable")
        return owner, attr, original

    def _start(self) -> None:
        """Open the kernel's counters and start the thread that writes, in this process."""
        self._meter = Meter()
        self._pending = collections.deque()
        self._writer = threading.Thread(target=self._write_loop, name="picklescope-capture", daemon=True)
        self._writer.start()
        self.flush(5.0)  # the thread is parked before any call: it wants no lock during one

    def _after_fork(self) -> None:
        """In a forked child, once: its own counters, writer and limit. Both the probe's at-fork handler and
        a call call this; whichever comes first resets, since an at-fork handler registered before the
        probe's (coverage.py's fork patch is one) may call the target before the probe's handler runs."""
        if self._pid == os.getpid():
            return
        # the counters opened as /proc/self belong to the parent, and the writer thread did not come along
        self._meter, self._writer, self._lock = None, None, threading.Lock()
        self.calls, self.records = 0, []  # the limit counts per process
        self._pid = os.getpid()

    def _wrap(self) -> None:
        # Deferred on purpose: workload_from imports numpy and YAML, which installing the probe in a job's start-up
        # must not pay (tests/test_install.py); it is imported here, once, rather than on a recorded call.
        from picklescope.investigate import workload_from

        self._describer = workload_from
        owner, attr, original = self._resolve()
        probe = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if not probe._armed:
                return original(*args, **kwargs)
            return probe._call(original, args, kwargs)

        wrapper.__picklescope_probe__ = probe  # type: ignore[attr-defined]
        self._owner, self._attr, self._original = owner, attr, original
        self._start()
        ref = weakref.ref(self)
        os.register_at_fork(after_in_child=lambda: (p := ref()) is not None and p._after_fork())
        setattr(owner, attr, wrapper)
        self.installed = self._armed = True
        _PROBES.add(self)

    def _restore(self) -> None:
        with self._lock:
            self._armed = False
            if self.installed and self._owner is not None:
                try:
                    setattr(self._owner, self._attr, self._original)
                except Exception as exc:  # noqa: BLE001 - never raise into the trainer
                    self._fail(f"could not restore {self.target}: {exc}")
            self.installed = False
            self._closing = True
            self._wake.set()

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until every recorded call is written (True) or ``timeout`` seconds pass (False)."""
        if self._writer is None or not self._writer.is_alive():
            return True
        done = threading.Event()
        self._pending.append(done)
        self._wake.set()
        return done.wait(timeout)

    def remove(self) -> None:
        """Put the original method back (done by itself after ``limit`` calls) and finish writing."""
        self._restore()
        self.flush()

    def _fail(self, why: str) -> None:
        self.error = why
        self._armed = False
        if not self._warned:
            self._warned = True
            log.warning("picklescope capture: %s; the probe steps aside and %s runs unchanged", why, self.target)

    # -- one call: only the measurement --------------------------------------------------------------------
    def _call(self, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        self._after_fork()  # a no-op unless this is a forked child whose at-fork handler has not run yet
        with self._lock:
            n = self.calls + 1
            take = self._armed and n <= self.limit
            if take:
                self.calls = n
                if n >= self.limit:
                    self._armed = False  # the writer puts the original back after this call's record
        if not take:
            return original(*args, **kwargs)
        m0 = statm0 = None
        meter = self._meter
        try:
            if meter is None:  # first call in a forked child
                self._start()
                meter = self._meter
            m0, statm0 = meter.before()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001
            self._fail(f"reading memory before the call failed: {exc}")
        t0 = time.perf_counter()
        try:
            result = original(*args, **kwargs)  # the trainer's own call: its exceptions are its own
        except BaseException:
            self._pending.append(n)  # nothing to record; the writer still puts the original back after the last
            raise
        t1 = time.perf_counter()
        try:
            m1, status1, statm1 = meter.after()  # type: ignore[union-attr]
            # a deque append: no lock, no wake-up; the writer looks every POLL_S seconds
            self._pending.append((n, _snapshot(args[0]) if args else (None, None), m0, statm0, m1, status1, statm1,
                                  t1 - t0))
        except Exception as exc:  # noqa: BLE001 - never raise into the trainer
            self._fail(f"recording call {n} failed: {type(exc).__name__}: {exc}")
        return result

    # -- after the call: describing and writing, on the probe's thread ------------------------------------
    def _write_loop(self) -> None:
        while True:
            self._wake.wait(POLL_S)
            self._wake.clear()
            while self._pending:
                item = self._pending.popleft()
                if isinstance(item, threading.Event):
                    item.set()
                    continue
                if isinstance(item, int):  # a call that raised
                    if item >= self.limit:
                        self._restore()
                    continue
                if self.error is None:
                    try:
                        self._record(*item)
                    except Exception as exc:  # noqa: BLE001 - never raise into the trainer
                        self._fail(f"recording call {item[0]} failed: {type(exc).__name__}: {exc}")
                if item[0] >= self.limit or self.error is not None:
                    self._restore()
                del item
            if self._closing and not self._pending:
                if self._meter is not None:
                    self._meter.close()
                return  # the original is back: nothing more will come

    def _record(self, n: int, snap: tuple[Any, type | None], m0: int | None, statm0: bytes | None, m1: int | None,
                status1: bytes | None, statm1: bytes, wall: float) -> None:
        describe_live, to_yaml = self._describer.describe_live, self._describer.to_yaml
        c_start = time.thread_time()
        when = time.time()
        # right after the reset the mark is the resident size: that is the size before the call
        before = m0 * 1024 if m0 is not None else (int(statm0.split()[1]) * PAGE if statm0 else None)
        after = int(statm1.split()[1]) * PAGE
        if m1 is not None:
            hwm: int | None = m1 * 1024
        elif status1 is not None:
            hwm = _field(status1, b"VmHWM:")
        else:
            hwm = None
        self.folder.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        rec: dict[str, Any] = {
            "call": n, "pid": pid, "process": " ".join(sys.argv[:3])[:200], "target": self.target,
            "mode": os.environ.get(MODE_ENV) or "torch (default)", "time": when, "wall_s": wall,
            "rss_before_bytes": before, "rss_after_bytes": after,
            "held_bytes": (after - before) if before is not None else None,
            "peak_bytes": max(hwm - before, after - before, 0) if hwm is not None and before is not None else None,
            "peak_exact": hwm is not None, "peak_source": "getrusage" if m1 is not None else (
                "VmHWM" if hwm is not None else None),
            "verl_version": getattr(sys.modules.get("verl"), "__version__", None),
        }
        obj, kind = snap
        try:
            d = describe_live(obj, path=f"{self.target} call {n} in pid {pid}",
                              fmt=f"{kind.__module__}.{kind.__name__}" if kind is not None else None)
            name = f"call-{pid}-{n}"
            text = to_yaml(d, name=f"captured-{pid}-{n}", validate=False)
            (self.folder / f"{name}.yaml").write_text(text)
            rec["workload"] = f"{name}.yaml"
            rec["payload_bytes"] = d.file_payload_bytes
            rec["summary"] = d.summary()
            if not self._wrote_first:
                try:  # the first workload of the folder, whoever wrote it
                    fd = os.open(self.folder / "workload.yaml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                    with os.fdopen(fd, "w") as f:
                        f.write(text)
                    rec["also"] = "workload.yaml"
                except FileExistsError:
                    pass
                self._wrote_first = True
        except Exception as exc:  # noqa: BLE001 - the cost is still worth a line without the structure
            rec["workload_error"] = f"{type(exc).__name__}: {exc}"
        del obj, snap  # the batch's leaves are not kept past the description
        p = rec.get("payload_bytes")
        for k in ("peak", "held"):
            v = rec[f"{k}_bytes"]
            rec[f"{k}_x_payload"] = (v / p) if p and v is not None else None
        rec["probe_cpu_s"] = time.thread_time() - c_start  # this thread's work for the record, off the call
        with open(self.folder / "calls.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records.append(rec)


@atexit.register
def _finish() -> None:
    """Let each probe's thread write what it has before the interpreter goes."""
    for probe in list(_PROBES):
        probe.flush(timeout=10.0)


def install(folder: str | os.PathLike = "batch-capture/", limit: int = 3,
            target: str = DEFAULT_TARGET) -> Probe:
    """Wrap ``target`` so its first ``limit`` calls are recorded into ``folder``; returns the probe.

    Never raises: a target that does not resolve (verl not importable in this process, a typo) is
    logged once and the returned probe has ``error`` set and ``active`` False.
    """
    probe = Probe(folder, limit if isinstance(limit, int) and not isinstance(limit, bool) else 0, str(target))
    if probe.limit <= 0:
        probe._fail(f"limit {limit!r} must be a positive integer")
        return probe
    try:
        probe._wrap()
    except Exception as exc:  # noqa: BLE001 - never raise into the trainer
        probe._fail(f"cannot install on {target}: {type(exc).__name__}: {exc}")
    return probe


def auto() -> Probe | None:
    """Install from the environment: ``PICKLESCOPE_CAPTURE=folder`` (``_LIMIT``, ``_TARGET`` optional)."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    try:
        limit = int(os.environ.get(LIMIT_ENV) or 3)
    except ValueError:
        limit = 3
        log.warning("picklescope capture: %s=%r is not a whole number; using 3", LIMIT_ENV, os.environ.get(LIMIT_ENV))
    return install(folder, limit, os.environ.get(TARGET_ENV) or DEFAULT_TARGET)
