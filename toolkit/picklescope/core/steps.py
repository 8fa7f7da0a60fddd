"""Named steps with exact kernel peaks, nested, streamed as they happen.

A codec marks its work with ``with step("consolidate"):``. Inside a measured child a :class:`Meter` is
installed and every step gets its exact peak from ``VmHWM``: at each step boundary the meter folds the
current high-water mark into every open step, then resets it, so nested steps (``pickle.dumps``
containing ``__getstate__`` containing ``consolidate``) all keep exact peaks. Outside a measured child
(no meter installed) a step costs nothing, so the same codec code runs in a notebook or in verl.

Each boundary is sent to the parent at once, so a run killed by SIGKILL keeps every step it finished.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from picklescope.core import procmem
from picklescope.core.childconfig import ChildConfig
from picklescope.core.events import Baseline, Event, Probe, StepEnd, StepStart


@dataclass
class _Open:
    name: str
    start_s: float
    start_rss: int
    peak: int
    depth: int
    info: dict[str, Any] = field(default_factory=dict)


class Meter:
    """Exact per-step peaks for the current process, relative to a baseline taken after setup.

    It also keeps, per step name, how many such steps have ended (:attr:`ended`), and names the innermost open
    step (:meth:`innermost`): a collector's callback reads both to say where in a codec's work a collection
    came, without allocating (investigate.node.collector)."""

    tracks_steps = True  # every begin and end is kept (ProbeMeter keeps only its target's)

    def __init__(self, sink: Callable[[Event], None], t0: float, side: str) -> None:
        self.sink = sink
        self.t0 = t0
        self.side = side
        self.baseline = 0
        self.peak = 0  # absolute VmHWM over the measured phase
        self._open: list[_Open] = []
        self.steps: list[StepEnd] = []
        self.ended: dict[str, int] = {}  # per step name, the steps of that name that have ended

    def innermost(self) -> str | None:
        """The name of the innermost open step (None: none is open)."""
        return self._open[-1].name if self._open else None

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self) -> int:
        """Take the baseline and reset the high-water mark; returns the baseline in bytes."""
        self.baseline = procmem.rss()
        procmem.reset_hwm()
        self.peak = self.baseline
        self.sink(Baseline(type="baseline", side=self.side, t_s=self.now(), baseline_bytes=self.baseline))
        return self.baseline

    def _fold(self) -> int:
        h = procmem.hwm()
        self.peak = max(self.peak, h)
        for o in self._open:
            o.peak = max(o.peak, h)
        return h

    def begin(self, name: str, **info: Any) -> None:
        self._fold()
        r = procmem.rss()
        procmem.reset_hwm()
        o = _Open(name, self.now(), r, r, len(self._open), info)
        self._open.append(o)
        self.sink(StepStart(type="step_start", side=self.side, name=name, t_s=o.start_s, depth=o.depth,
                            rss_bytes=r))

    def end(self, error: BaseException | None = None) -> StepEnd | Probe | dict[str, Any]:
        self._fold()
        o = self._open.pop()
        r = procmem.rss()
        procmem.reset_hwm()
        ev = StepEnd(
            type="step_end", side=self.side, name=o.name, start_s=o.start_s,
            end_s=self.now(), depth=o.depth,
            peak_bytes=o.peak - self.baseline,
            added_bytes=o.peak - o.start_rss,
            retained_bytes=r - o.start_rss,
            rss_end_bytes=r,
            error=None if error is None else f"{type(error).__name__}: {error}",
        )
        ev.update(o.info)  # type: ignore[typeddict-item] - step(name, **info): declared in StepEnd
        self.steps.append(ev)
        self.ended[o.name] = self.ended.get(o.name, 0) + 1
        self.sink(ev)
        return ev

    def finish(self) -> int:
        """Close any open steps and return the side's peak above baseline."""
        while self._open:
            self.end()
        self._fold()
        return self.peak - self.baseline


class ProbeMeter(Meter):
    """Fidelity check: one reset at the start of one named step, one read at its end, nothing else.

    ``benchmarks/fidelity.py`` compares the :class:`Meter`'s nested, many-reset peaks with this
    independent single reading of the kernel's high-water mark, taken in a separate run. With no
    target step, the single reading spans the whole measured phase (the side's peak).
    """

    tracks_steps = False

    def __init__(self, sink: Callable[[Event], None], t0: float, side: str, target: str | None) -> None:
        super().__init__(sink, t0, side)
        self.target = target
        self._names: list[str] = []
        self._start_rss: int | None = None
        self._done = False

    def begin(self, name: str, **info: Any) -> None:
        self._names.append(name)
        if name == self.target and self._start_rss is None:
            self._start_rss = procmem.rss()
            procmem.reset_hwm()

    def end(self, error: BaseException | None = None) -> StepEnd | Probe | dict[str, Any]:
        name = self._names.pop()
        if name == self.target and self._start_rss is not None and not self._done:
            self._done = True
            h = procmem.hwm()
            ev = Probe(type="probe", side=self.side, name=name, peak_bytes=h - self.baseline,
                       added_bytes=h - self._start_rss)
            self.sink(ev)
            return ev
        return {}

    def finish(self) -> int:
        h = procmem.hwm()
        if self.target is None:
            self.sink(Probe(type="probe", side=self.side, name=None, peak_bytes=h - self.baseline))
        return h - self.baseline


def make_meter(sink: Callable[[Event], None], cfg: ChildConfig, side: str) -> Meter:
    """The meter a child installs: the normal one, or a single-reading probe for fidelity checks."""
    probe = cfg.probe.get(side, False)
    if probe is not False:
        return ProbeMeter(sink, cfg.t0, side, probe)
    return Meter(sink, cfg.t0, side)


_current: Meter | None = None


def install(meter: Meter | None) -> None:
    """Make ``meter`` receive this process's steps (None: steps become free no-ops)."""
    global _current
    _current = meter


def current() -> Meter | None:
    return _current


@contextmanager
def step(name: str, **info: Any) -> Iterator[None]:
    """Mark a named unit of work; exact peak and time are recorded when a meter is installed."""
    meter = _current
    if meter is None:
        yield
        return
    meter.begin(name, **info)
    try:
        yield
    except BaseException as exc:
        meter.end(exc)
        raise
    meter.end()
