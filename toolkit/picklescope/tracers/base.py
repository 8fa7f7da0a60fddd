"""What a tracer is: one way of watching a side's memory, with an honest answer to "is it here?".

A tracer has up to two halves. The child half runs inside the measured process (memray's hooks,
tracemalloc, torch.profiler must live where the allocations happen): it starts just before the
baseline is taken, sees every step boundary the :class:`~picklescope.core.steps.Meter` streams, and
stops right after the measured phase. Whatever it learns at a step boundary rides on that step's
event, so a side killed by SIGKILL still delivers every boundary it reached. The parent half turns
what arrived (and any capture file) into a plain per-side view: a series over run time, a peak and
optionally attribution rows. The always-on ``sampler`` has only a parent half.

A tracer that cannot run here says why (:meth:`Tracer.availability`); it never reports numbers it
did not measure.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from picklescope.core.result import RunResult, Series


@dataclass
class ChildContext:
    """What a tracer's child half knows about the process it runs in."""

    side: str
    run_dir: str
    t0: float  # the run's time origin (time.monotonic() in the parent; same clock here)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def run_time_from_epoch(self, epoch_s: float) -> float:
        """Convert a wall-clock timestamp (what memray and kineto record) to run time."""
        return epoch_s - (time.time() - time.monotonic()) - self.t0


@dataclass
class SideData:
    """Everything the parent received from one side for one tracer."""

    started: bool = False
    reason: str | None = None  # why the child half could not start or finish
    points: list[tuple[float, int]] = field(default_factory=list)  # streamed (t_s, bytes)
    final: dict[str, Any] | None = None  # what the child half returned when it stopped


@dataclass
class ParentContext:
    """What the parent knows after both sides ended (capture files still on disk)."""

    result: RunResult
    run_dir: str
    t0: float
    timelines: dict[str, Series]
    blocks: dict[str, list[dict[str, Any]]]  # side -> step blocks (name, file, function, lines)

    def run_time_from_epoch(self, epoch_s: float) -> float:
        return epoch_s - (time.time() - time.monotonic()) - self.t0


class Tracer:
    """Base class. Subclasses override the halves they have."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    sees: ClassVar[str] = ""  # one sentence: what this tool can and cannot see
    in_child: ClassVar[bool] = True
    needs_blocks: ClassVar[bool] = False  # wants the code location of each step (stack attribution)
    sampled: ClassVar[bool] = True  # a series of samples (no point in a step: unknown), not of events

    @classmethod
    def availability(cls) -> tuple[bool, str | None]:
        """(available, reason if not) on this machine, checked without starting anything."""
        return True, None

    # -- child half -----------------------------------------------------------------------------
    def start(self, ctx: ChildContext) -> None:
        """Begin watching (called before the baseline). Raise to report the tracer unavailable."""

    def at_boundary(self, ev: dict[str, Any]) -> list[tuple[float, int]] | None:
        """Called at each step start/end; returns points (t_s, bytes) to stream with that event."""
        return None

    def stop(self) -> dict[str, Any] | None:
        """Stop watching; returns plain data for the parent (sent as one event)."""
        return None

    # -- parent half ----------------------------------------------------------------------------
    def collect(self, ctx: ParentContext, side: str, data: SideData) -> dict[str, Any]:
        """This side's view: ``{"series": {"t_s", "bytes"}, "peak_bytes", ...}`` (may be partial).

        A view may carry ``"attribution"``: rows ``{"bytes", "step", "side", "stack"}`` for the
        allocations live at the peak; the collector moves them to ``RunResult.attribution``. The
        default turns streamed points (and points the child returned) into the series.
        """
        points = list(data.points)
        if data.final:
            points += [tuple(p) for p in data.final.get("points", [])]
        points.sort(key=lambda p: p[0])
        view: dict[str, Any] = {"series": {"t_s": [p[0] for p in points], "bytes": [p[1] for p in points]}}
        if data.final and data.final.get("peak_bytes") is not None:
            view["peak_bytes"] = data.final["peak_bytes"]
        elif points:
            view["peak_bytes"] = max(p[1] for p in points)
        return view
