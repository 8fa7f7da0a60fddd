"""The tracers that need no capture file: the always-on sampler, tracemalloc and torch.profiler.

``sampler`` is the truth the others are compared with: the parent reads the child's RSS from
``/proc`` about every millisecond (unattributed, sees everything resident), and the foundation's
exact per-step peaks come from the kernel's ``VmHWM``. ``tracemalloc`` and ``torch-profiler`` run
as "what this tool would have shown": tracemalloc only sees memory allocated through Python's
allocator, so a torch tensor's storage is invisible to it; torch.profiler only sees allocations
made by torch's allocator, so pickle buffers, ``BytesIO`` and ``bytearray`` copies are invisible
to it.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from picklescope.core.result import Series
from picklescope.tracers.base import ChildContext, ParentContext, SideData, Tracer


class SamplerTracer(Tracer):
    name = "sampler"
    description = "RSS of each side read from /proc by the parent about every 1 ms, plus exact per-step peaks"
    sees = "everything resident in the process, without saying who allocated it"
    in_child = False
    sampled = True

    @classmethod
    def availability(cls) -> tuple[bool, str | None]:
        if not os.path.exists("/proc/self/statm"):
            return False, "this system has no /proc/<pid>/statm to sample"
        return True, None

    def collect(self, ctx: ParentContext, side: str, data: SideData) -> dict[str, Any]:
        tl = ctx.timelines.get(side)
        proc = ctx.result.processes.get(side)
        above = replace(proc, timeline=tl).above_baseline() if proc is not None and tl is not None else Series()
        if not above.t_s:
            return {"reason": "no samples were taken for this side"}
        values = above.bytes
        exact: dict[str, int | None] = {}
        for st in ctx.result.processes[side].steps:
            exact.setdefault(st.name, st.added_bytes)
        return {"series": {"t_s": list(tl.t_s), "bytes": values}, "peak_bytes": max(values),
                "exact_peak_bytes": ctx.result.processes[side].peak_bytes, "exact_per_step": exact}


class TracemallocTracer(Tracer):
    name = "tracemalloc"
    description = "Python's tracemalloc, read at every step boundary (traced bytes and the peak since the last one)"
    sees = "memory allocated through Python's allocator only; torch tensor storage is invisible to it"
    sampled = False

    def start(self, ctx: ChildContext) -> None:
        import tracemalloc

        if tracemalloc.is_tracing():
            raise RuntimeError("tracemalloc is already tracing in this process")
        self.ctx = ctx
        tracemalloc.start(1)
        self.base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        self.first = (ctx.now(), 0)

    def _read(self, t: float) -> list[tuple[float, int]]:
        import tracemalloc

        cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        return [(t, peak - self.base), (t, cur - self.base)]

    def at_boundary(self, ev: dict[str, Any]) -> list[tuple[float, int]]:
        t = ev["t_s"] if ev["type"] == "step_start" else ev["end_s"]
        points = self._read(t)
        if self.first is not None:
            points.insert(0, self.first)
            self.first = None
        return points

    def stop(self) -> dict[str, Any]:
        import tracemalloc

        points = self._read(self.ctx.now())
        tracemalloc.stop()
        return {"points": points}


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Kineto prints stage banners on fd 2 when the profiler starts and stops; keep them off the terminal."""
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


class TorchProfilerTracer(Tracer):
    name = "torch-profiler"
    description = "torch.profiler with profile_memory=True (allocation events from kineto_results)"
    sees = "allocations made by torch's CPU allocator only; pickle buffers, BytesIO and bytearray are invisible to it"
    sampled = False

    @classmethod
    def availability(cls) -> tuple[bool, str | None]:
        try:
            import torch.autograd
        except ImportError:
            return False, "torch is not installed"
        if not torch.autograd.kineto_available():
            return False, "this torch build has no kineto profiler"
        return True, None

    def start(self, ctx: ChildContext) -> None:
        from torch.profiler import ProfilerActivity, profile

        self.ctx = ctx
        self.t_start = ctx.now()
        self.prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=False)
        with _quiet_stderr():
            self.prof.__enter__()

    def stop(self) -> dict[str, Any]:
        with _quiet_stderr():
            self.prof.__exit__(None, None, None)
        t_stop = self.ctx.now()
        # torch 2.13 keeps the memory events here; prof.events() leaves them out
        events = self.prof.profiler.kineto_results.events()
        mem = sorted((e.start_ns(), e.nbytes()) for e in events
                     if e.name() == "[memory]" and str(e.device_type()).endswith("CPU"))
        offset = time.time() - time.monotonic() + self.ctx.t0
        points: list[tuple[float, int]] = [(self.t_start, 0)]
        total = 0
        for ns, nbytes in mem:
            total += nbytes
            points.append((ns / 1e9 - offset, total))
        points.append((t_stop, total))
        del self.prof
        return {"points": points, "events": len(mem)}
