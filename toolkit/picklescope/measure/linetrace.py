"""A line tracer with exact per-line memory: the engine of the step-through.

:class:`LineTracer` runs one call under ``sys.settrace`` and records, for every line executed in the
traced functions, how long it took, how much memory it added and the exact peak while it ran. The
peak comes from the kernel, as in :class:`~picklescope.core.steps.Meter`: at every line boundary the
tracer folds ``VmHWM`` into every line still open (the caller's line stays open while a callee
runs, so its figures include the callee's) and resets the mark with ``/proc/self/clear_refs``.
Those are *inclusive* figures. Each line also gets its *self* cost: the inclusive figure minus
what the traced functions it called added (a wrapper such as ``return self.encode(b)`` is 2x
inclusive and 0 self; the ``consolidate()`` line inside it carries the copy as its own cost), and
the order of the line that called its function (``caller``), so a view can rank lines by self
cost and still show the call nesting.
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

from picklescope.core import procmem

# instrumentation: the step markers, this tracer, and the wrapper that marks verl's consolidate()
NEVER_EXPAND = ("picklescope.core.steps", "picklescope.measure.linetrace", "picklescope.core.procmem",
                "picklescope.tracers",
                "picklescope.investigate.stepthrough", "picklescope.verl.loader")
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
    self_added_bytes: int = 0  # largest (rise during one hit - what the traced callees of that hit added)
    self_retained_bytes: int = 0  # RSS change kept over hits, minus what the traced callees kept
    caller: int = -1  # ``order`` of the line that called this line's function (-1: the target itself)

    @property
    def cost_bytes(self) -> int:
        """What the line costs, callees included: its largest single rise, or what its hits kept in
        total if more (a loop line that allocates a little each time and keeps it)."""
        return max(self.added_bytes, self.retained_bytes)

    @property
    def self_bytes(self) -> int:
        """What the line's own code costs (:attr:`cost_bytes` without its traced callees'): the
        figure a culprit is ranked by, so a wrapper never outranks the line that allocates."""
        return max(self.self_added_bytes, self.self_retained_bytes, 0)


class _Open:
    __slots__ = ("row", "t", "start", "peak", "child_added", "child_kept")

    def __init__(self, row: LineRow, t: float, start: int) -> None:
        self.row, self.t, self.start, self.peak = row, t, start, start
        self.child_added = 0  # what the traced functions called from this hit added (their rises, summed)
        self.child_kept = 0  # ... and what they left resident


class _Frame:
    """One traced call: its depth, where it started and the highest RSS any of its lines saw."""

    __slots__ = ("frame", "depth", "start", "peak", "caller")

    def __init__(self, frame: FrameType, depth: int, caller: int) -> None:
        self.frame, self.depth, self.caller = frame, depth, caller
        self.start: int | None = None
        self.peak = 0


class LineTracer:
    """Trace one call line by line; rows come out in first-execution order."""

    def __init__(self, expand: set[str] | list[str] | None = None) -> None:
        self.expand = set(expand or ())  # top-level package names whose functions are traced too
        self.rows: dict[tuple[CodeType, int], LineRow] = {}
        self.baseline = 0
        self.peak = 0
        self._frames: dict[int, _Frame] = {}  # id(frame) -> the traced call
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
        parent = self._parent(frame)
        caller = self._open[id(parent.frame)].row.order if parent and id(parent.frame) in self._open else -1
        self._frames[id(frame)] = _Frame(frame, depth, caller)
        return self._local

    def _parent(self, frame: FrameType) -> _Frame | None:
        """The nearest traced call below ``frame`` on the stack (untraced frames in between skipped)."""
        f = frame.f_back
        while f is not None:
            rec = self._frames.get(id(f))
            if rec is not None and rec.frame is f:
                return rec
            f = f.f_back
        return None

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
        r.self_added_bytes = max(r.self_added_bytes, o.peak - o.start - o.child_added)
        r.self_retained_bytes += rss - o.start - o.child_kept
        rec = self._frames.get(key)
        if rec is not None and o.peak > rec.peak:
            rec.peak = o.peak

    def _returned(self, key: int, rss: int) -> None:
        """Hand what a finished traced call added and kept to the caller's open line."""
        rec = self._frames.pop(key, None)
        if rec is None or rec.start is None:
            return
        parent = self._parent(rec.frame)
        o = self._open.get(id(parent.frame)) if parent is not None else None
        if o is not None:
            o.child_added += max(rec.peak - rec.start, 0)
            o.child_kept += rss - rec.start

    def _local(self, frame: FrameType, event: str, arg: Any) -> Any:
        key = id(frame)
        if event == "line":
            rss = self._boundary()
            now = time.perf_counter()
            self._close(key, rss, now)
            code, lineno = frame.f_code, frame.f_lineno
            row = self.rows.get((code, lineno))
            if row is None:
                rec = self._frames[key]
                row = LineRow(len(self.rows), rec.depth, code.co_qualname,
                              str(frame.f_globals.get("__name__", "")), code.co_filename, lineno,
                              linecache.getline(code.co_filename, lineno).strip(), caller=rec.caller)
                self.rows[(code, lineno)] = row
            rec = self._frames[key]
            if rec.start is None:
                rec.start = rec.peak = rss
            self._open[key] = _Open(row, time.perf_counter(), rss)
        elif event == "return":
            rss = self._boundary()
            self._close(key, rss, time.perf_counter())
            self._returned(key, rss)
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
            for key in reversed(list(self._frames)):  # innermost first, each handing its cost outwards
                self._close(key, rss, now)
                self._returned(key, rss)
            for key in list(self._open):
                self._close(key, rss, now)

    def result_rows(self) -> list[LineRow]:
        return sorted(self.rows.values(), key=lambda r: r.order)
