"""The tracers picklescope knows, by name, and the list a run uses.

Kept apart from the package's ``__init__`` so that the tracers' child half (:mod:`.child`) and
parent half (:mod:`.collect`) can look a tracer up by name without importing the package that
imports them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from picklescope.core.registry import Registry
from picklescope.errors import PicklescopeError, UnknownNameError
from picklescope.tracers.base import Tracer
from picklescope.tracers.memray_tracer import MemrayNativeTracer, MemrayTracer
from picklescope.tracers.simple import SamplerTracer, TorchProfilerTracer, TracemallocTracer

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
