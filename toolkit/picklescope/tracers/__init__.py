"""Tracers: the ways a run can watch each side's memory, chosen by name, each honest about availability.

- ``sampler`` (always on): the parent reads each side's RSS from ``/proc`` about every 1 ms; with
  the foundation's exact per-step peaks (``VmHWM``) it is the truth the others are compared with.
- ``memray`` / ``memray-native``: a memray capture inside the child (a format that survives
  SIGKILL); gives the allocations live at the peak with their stacks, each mapped to its step.
- ``tracemalloc`` and ``torch-profiler``: what those common tools would have shown, for a
  side-by-side with the truth (tracemalloc misses torch tensors; torch.profiler misses Python buffers).

Choose with ``picklescope.run(..., tracer="memray")`` or ``--tracer memray``; several at once with
``"memray,tracemalloc"``; ``"all"`` is sampler + memray + tracemalloc + torch-profiler. The sampler
is always added. ``"none"`` turns even the sampler off (for overhead benchmarks only: no timeline).

Each run's ``RunResult.tracers[name]`` is plain data::

    {"available": bool, "reason": str | None, "description": str, "sees": str,
     "peak_bytes": int | None,                 # highest value the tracer saw (max over sides)
     "per_step": {step: bytes | None},         # what it saw each step add (side-prefixed on clashes)
     "sides": {side: {"peak_bytes", "series": {"t_s": [...], "bytes": [...]}, "per_step", ...}},
     "notes": [str, ...]}                      # in words, against the kernel's exact figures

and ``RunResult.attribution`` lists ``{"bytes", "step", "side", "stack", "n_allocations",
"allocator", "tracer"}`` rows, largest first. A tracer that is not installed, or failed, has
``available: False`` and a ``reason``, and no numbers.
"""

from __future__ import annotations

from picklescope.tracers.base import ChildContext, ParentContext, SideData, Tracer
from picklescope.tracers.catalog import ALL, DEFAULT_TRACER, KEYWORDS, TRACERS, availability, get_tracer, parse_tracers
from picklescope.tracers.child import ChildTracing
from picklescope.tracers.collect import Collector, per_step
from picklescope.tracers.compare import add_notes, report_lines, tracer_report

__all__ = [
    "ALL", "DEFAULT_TRACER", "KEYWORDS", "TRACERS", "ChildContext", "ChildTracing", "Collector", "ParentContext",
    "SideData", "Tracer", "add_notes", "availability", "get_tracer", "parse_tracers", "per_step", "report_lines",
    "tracer_report",
]
