"""The standard investigation: every codec x transport on one workload, as one data object.

Computed here, printed by the CLI, drawn by figures and reports later. The default scale keeps the
whole investigation quick and within the machine's free memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .codecs import CODECS
from .procmem import machine_memory
from .result import RunResult
from .runner import run
from .transports import TRANSPORTS
from .workloads import DEFAULT_WORKLOAD, load_workload

DEFAULT_SCALE = 0.25
IN_PROCESS_TRANSPORTS = ("pickle", "pickle5-oob")
BUILTIN_CODECS = ("torch", "numpy-legacy", "numpy")


def default_scale(workload: str = DEFAULT_WORKLOAD) -> float:
    """0.25, or less if a payload would exceed 1/16 of the memory available now."""
    spec = load_workload(workload)
    avail = machine_memory()["available"] or 1 << 34
    full = spec.payload_bytes(1.0)
    return min(DEFAULT_SCALE, max(0.01, avail / 16 / full))


@dataclass
class Investigation:
    """All runs of one investigation, in the order they ran."""

    workload: str
    scale: float
    results: list[RunResult] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "scale": self.scale, "extra": self.extra,
                "results": [r.to_dict() for r in self.results]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Investigation:
        return cls(d["workload"], d["scale"], [RunResult.from_dict(r) for r in d["results"]], d.get("extra", {}))


def matrix(
    workload: str = DEFAULT_WORKLOAD,
    scale: float | None = None,
    codecs: tuple[str, ...] = BUILTIN_CODECS,
    transports: tuple[str, ...] = IN_PROCESS_TRANSPORTS,
    progress: Callable[[str], None] | None = None,
    **run_kw: Any,
) -> Investigation:
    """Run every codec over every transport; unknown names fail before anything runs."""
    for c in codecs:
        CODECS.get(c)
    for t in transports:
        TRANSPORTS.get(t)
    spec = load_workload(workload)
    scale = default_scale(workload) if scale is None else scale
    inv = Investigation(spec.name, scale)
    for c in codecs:
        for t in transports:
            if progress:
                progress(f"{c} over {t}")
            inv.results.append(run(c, t, workload, scale, **run_kw))
    return inv
