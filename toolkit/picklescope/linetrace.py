"""A line tracer with exact per-line memory: the engine of the step-through.

:class:`LineTracer` runs one call under ``sys.settrace`` and records, for every line executed in the
traced functions, how long it took, how much memory it added and the exact peak while it ran. The
peak comes from the kernel, as in :class:`~picklescope.steps.Meter`: at every line boundary the
tracer folds ``VmHWM`` into every line still open (the caller's line stays open while a callee
runs, so its figures include the callee's) and resets the mark with ``/proc/self/clear_refs``.
Sampling could not do this: a single line such as ``consolidate()`` allocates and fills a full
copy within one GIL-holding C call.

Which functions are traced: the target, and every function it reaches (directly or through other
code) whose module belongs to one of the ``expand`` packages; on entering any ``__getstate__`` or
``__setstate__`` its package joins them (so stepping through a codec that wraps a real verl
``DataProto`` shows verl's lines). Instrumentation modules are never expanded. Call it only in a
child process: tracing slows the traced code, and the figures are about that process alone.
"""

from __future__ import annotations

import linecache
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import CodeType, FrameType
from typing import Any

from . import procmem

# instrumentation: the step markers, this tracer, and the wrapper that marks verl's consolidate()
NEVER_EXPAND = ("picklescope.steps", "picklescope.linetrace", "picklescope.procmem", "picklescope.tracers",
                "picklescope.stepthrough", "picklescope.verl.loader")
STATE_METHODS = ("__getstate__", "__setstate__")


def _status() -> tuple[int, int]:
    """(VmRSS, VmHWM) in bytes from one read of ``/proc/self/status``."""
    rss = hwm = 0
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(b"VmHWM:"):
                hwm = int(line.split()[1]) * 1024
            elif line.startswith(b"VmRSS:"):
                rss = int(line.split()[1]) * 1024
                break  # VmRSS follows VmHWM in the file
    return rss, hwm


@dataclass
class LineRow:
    """One source line of a traced function, over all the times it ran."""

    order: int  # first-execution order
    depth: int  # 0: the target function; 1: a function it called; ...
    function: str  # qualified name
    module: str
    filename: str
    lineno: int
    source: str
    hits: int = 0
    time_s: float = 0.0  # wall time over all hits, callees included
    added_bytes: int = 0  # largest (peak during one hit - RSS at that hit's start)
    retained_bytes: int = 0  # RSS change summed over hits
    peak_bytes: int = 0  # highest RSS during any hit, above the baseline

    @property
    def cost_bytes(self) -> int:
        """What the line costs: its largest single rise, or what its hits kept in total if more
        (a loop line that allocates a little each time and keeps it)."""
        return max(self.added_bytes, self.retained_bytes)


class _Open:
    __slots__ = ("row", "t", "start", "peak")

    def __init__(self, row: LineRow, t: float, start: int) -> None:
        self.row, self.t, self.start, self.peak = row, t, start, start


class LineTracer:
    """Trace one call line by line; rows come out in first-execution order."""

    def __init__(self, expand: set[str] | list[str] | None = None) -> None:
        self.expand = set(expand or ())  # top-level package names whose functions are traced too
        self.rows: dict[tuple[CodeType, int], LineRow] = {}
        self.baseline = 0
        self.peak = 0
        self._frames: dict[int, tuple[FrameType, int]] = {}  # id(frame) -> (frame, depth)
        self._open: dict[int, _Open] = {}  # id(frame) -> that frame's running line
        self._root: CodeType | None = None

    # -- what to trace ------------------------------------------------------------------------------
    def _package(self, frame: FrameType) -> str:
        return str(frame.f_globals.get("__name__", "")).split(".")[0]

    def _wanted(self, frame: FrameType) -> bool:
        if frame.f_code is self._root and not self._frames:
            return True
        if not self._frames:
            return False
        module = str(frame.f_globals.get("__name__", ""))
        if any(module == m or module.startswith(m + ".") for m in NEVER_EXPAND):
            return False
        if frame.f_code.co_name in STATE_METHODS:
            self.expand.add(self._package(frame))
        return self._package(frame) in self.expand

    # -- the trace functions --------------------------------------------------------------------------
    def _global(self, frame: FrameType, event: str, arg: Any) -> Any:
        if event != "call" or not self._wanted(frame):
            return None
        depth = len(self._frames)
        self._frames[id(frame)] = (frame, depth)
        return self._local

    def _boundary(self) -> int:
        rss, hwm = _status()
        for o in self._open.values():
            if hwm > o.peak:
                o.peak = hwm
        if hwm > self.peak:
            self.peak = hwm
        procmem.reset_hwm()
        return rss

    def _close(self, key: int, rss: int, now: float) -> None:
        o = self._open.pop(key, None)
        if o is None:
            return
        r = o.row
        r.hits += 1
        r.time_s += now - o.t
        r.added_bytes = max(r.added_bytes, o.peak - o.start)
        r.retained_bytes += rss - o.start
        r.peak_bytes = max(r.peak_bytes, o.peak - self.baseline)

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        key = id(frame)
        if event == "line":
            rss = self._boundary()
            now = time.perf_counter()
            self._close(key, rss, now)
            code, lineno = frame.f_code, frame.f_lineno
            row = self.rows.get((code, lineno))
            if row is None:
                row = LineRow(len(self.rows), self._frames[key][1], code.co_qualname,
                              str(frame.f_globals.get("__name__", "")), code.co_filename, lineno,
                              linecache.getline(code.co_filename, lineno).strip())
                self.rows[(code, lineno)] = row
            self._open[key] = _Open(row, time.perf_counter(), rss)
        elif event == "return":
            rss = self._boundary()
            self._close(key, rss, time.perf_counter())
            self._frames.pop(key, None)
        return self._local

    # -- running ----------------------------------------------------------------------------------
    def run(self, fn: Callable[..., Any], code: CodeType, *args: Any) -> Any:
        """Call ``fn(*args)`` tracing ``code`` (the function's own code object) and what it reaches."""
        self._root = code
        procmem.populate_file_mappings()  # library pages into the baseline, not onto a line
        self.baseline = procmem.rss()
        procmem.reset_hwm()
        self.peak = self.baseline
        sys.settrace(self._global)
        try:
            return fn(*args)
        finally:
            sys.settrace(None)
            rss = self._boundary()
            now = time.perf_counter()
            for key in list(self._open):
                self._close(key, rss, now)

    def result_rows(self) -> list[LineRow]:
        return sorted(self.rows.values(), key=lambda r: r.order)
