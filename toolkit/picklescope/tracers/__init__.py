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

from collections.abc import Sequence
from typing import Any

from ..errors import PicklescopeError, UnknownNameError
from ..registry import Registry
from .base import ChildContext, ParentContext, SideData, Tracer
from .child import ChildTracing
from .collect import Collector, per_step
from .compare import add_notes, report_lines, tracer_report
from .memray_tracer import MemrayNativeTracer, MemrayTracer
from .simple import SamplerTracer, TorchProfilerTracer, TracemallocTracer

DEFAULT_TRACER = "sampler"
ALL = ("sampler", "memray", "tracemalloc", "torch-profiler")
KEYWORDS = ("all", "none")

TRACERS: Registry[type[Tracer]] = Registry("tracer")
for _cls in (SamplerTracer, MemrayTracer, MemrayNativeTracer, TracemallocTracer, TorchProfilerTracer):
    TRACERS.register(_cls.name, _cls)


def get_tracer(name: str) -> type[Tracer]:
    """The tracer class called ``name``; an unknown name lists the known ones."""
    return TRACERS.get(name)


def parse_tracers(spec: str | Sequence[str] | None) -> list[str]:
    """Tracer names for a run: ``"memray"``, ``"memray,tracemalloc"``, ``"all"``, ``"none"`` or a list.

    The sampler comes first and is always included, except with ``"none"``. A tracer named
    explicitly must be available here; ``"all"`` takes the available ones and reports the rest.
    """
    if spec is None:
        spec = DEFAULT_TRACER
    parts = [p.strip() for p in (spec.split(",") if isinstance(spec, str) else spec) if p and p.strip()]
    if parts == ["none"]:
        return []
    names: list[str] = [DEFAULT_TRACER]
    for p in parts:
        if p == "all":
            names += [n for n in ALL if n not in names]
            continue
        if p not in TRACERS:
            raise UnknownNameError("tracer", p, TRACERS.names() + list(KEYWORDS))
        ok, reason = TRACERS.get(p).availability()
        if not ok:  # asked for by name: refuse; under "all" it is listed as unavailable instead
            raise PicklescopeError(f"tracer {p!r} is not available here: {reason}",
                                   "install it, or drop it from --tracer ('all' runs every tracer that is "
                                   "available and lists the others)")
        if p not in names:
            names.append(p)
    if "memray" in names and "memray-native" in names:
        raise PicklescopeError("memray and memray-native cannot run in the same process",
                               "choose one (memray-native adds C/C++ frames)")
    return names


def availability() -> dict[str, dict[str, Any]]:
    """Every registered tracer: available here or not (and why), and what it sees."""
    out = {}
    for name in TRACERS:
        cls = TRACERS.get(name)
        ok, reason = cls.availability()
        out[name] = {"available": ok, "reason": reason, "description": cls.description, "sees": cls.sees}
    return out


__all__ = [
    "ALL", "DEFAULT_TRACER", "TRACERS", "ChildContext", "ChildTracing", "Collector", "ParentContext",
    "SideData", "Tracer", "add_notes", "availability", "get_tracer", "parse_tracers", "per_step", "report_lines",
    "tracer_report",
]
