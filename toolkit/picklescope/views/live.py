"""A run's result while it is still streaming, for views that redraw before the run ends.

:func:`picklescope.run` returns its :class:`RunResult` only when both children are done. A notebook
view (the explorer, the cell magic) wants to redraw the timeline while the run goes, so it passes
:meth:`LiveRun.on_event` and :meth:`LiveRun.on_sample` to ``run`` and asks for :meth:`snapshot`
from another thread. Events are folded by the runner's own bookkeeping, so a partial result has
exactly the shape of a finished one and the same figure code draws both.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

from picklescope.core.result import Process, RunResult, Series
from picklescope.measure.fold import RunFold


class LiveRun:
    """Thread-safe partial :class:`RunResult`: steps from child events, RSS from parent samples."""

    def __init__(self, result: RunResult) -> None:
        self._lock = threading.Lock()
        self._result = result
        self._fold = RunFold(result, None)
        self._timelines: dict[str, Series] = {}
        self.version = 0  # bumped on every change, so a redraw loop can skip idle ticks

    @classmethod
    def for_run(cls, codec: str, transport: str, workload: str, scale: float, payload_bytes: int,
                budgets: dict[str, int | None] | None = None, side_names: tuple[str, ...] = ("sender", "receiver"),
                ) -> LiveRun:
        """An empty live result for the run about to start (budgets per side, when set)."""
        sides = {name: Process(name, budget_bytes=(budgets or {}).get(name)) for name in side_names}
        return cls(RunResult(codec=codec, transport=transport, workload=workload, scale=scale,
                             payload_bytes=payload_bytes, processes=sides))

    def on_event(self, ev: dict[str, Any]) -> None:
        """Fold one child event (called from the thread that called ``run``)."""
        if ev.get("side") not in self._result.processes or ev.get("type") == "ready":
            return  # "ready" carries the manifest, which the runner has already taken
        with self._lock:
            self._fold.handle(dict(ev))
            self.version += 1

    def on_sample(self, side: str, t_s: float, rss_bytes: int) -> None:
        """Record one RSS sample (called from the sampler thread: kept to two appends)."""
        tl = self._timelines.get(side)
        if tl is None:
            tl = self._timelines.setdefault(side, Series())
        with self._lock:
            tl.t_s.append(round(t_s, 6))
            tl.bytes.append(rss_bytes)
            self.version += 1

    def snapshot(self) -> RunResult:
        """A consistent copy of everything seen so far, safe to draw while the run goes on."""
        with self._lock:
            r = copy.deepcopy(self._result)
            for name, tl in self._timelines.items():
                if name in r.processes:
                    n = min(len(tl.t_s), len(tl.bytes))
                    r.processes[name].timeline = Series(tl.t_s[:n], tl.bytes[:n])
        now = max((s.timeline.t_s[-1] for s in r.processes.values() if s.timeline.t_s), default=None)
        for side in r.processes.values():
            for st in side.steps:
                if st.end_s is None and now is not None:
                    st.end_s = max(now, st.start_s)  # still running: drawn up to the latest sample
        return r
