"""One run's timeline as plain data: what a figure, a report or a notebook draws, and nothing else.

:class:`RunTimeline` gathers, per side, the RSS curve sampled at about 1 ms (above the side's
baseline), the step intervals with their exact peaks, each tracer's own series, the budget and the
held / cycle-held bytes, plus the run's attribution rows and verdict. It is built from a
:class:`~picklescope.core.result.RunResult` (:meth:`RunTimeline.from_result`), round-trips through JSON
(``to_json`` / ``from_json``) and imports nothing from plotly: figures are views of it.

Each side's steps are the run's own :class:`~picklescope.core.result.Step` records (copies). A step
that never ended (the side was killed inside it) keeps ``end_s = None``;
:meth:`~picklescope.core.result.Step.until` gives the end to draw it to. A timeline saved before the
one step shape kept them under ``bands``; :meth:`RunTimeline.from_dict` still reads that.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from picklescope.core.result import RunResult, Series, Step, series_from_dict
from picklescope.core.units import fmt_bytes


@dataclass
class SideTimeline:
    """Everything on one side's time axis."""

    name: str
    baseline_bytes: int | None = None
    baseline_s: float | None = None  # when the baseline was taken; samples before it are set-up
    rss: Series = field(default_factory=Series)  # sampled RSS minus the baseline
    steps: list[Step] = field(default_factory=list)  # drawn as shaded intervals, with their exact peaks
    peak_bytes: int | None = None
    held_bytes: int | None = None
    cycle_held_bytes: int | None = None
    budget_bytes: int | None = None
    exit_code: int | None = None
    tracers: dict[str, Series] = field(default_factory=dict)  # tracer name -> its own view (not the sampler)

    @property
    def end_s(self) -> float:
        ends = [self.rss.end_s or 0.0] + [s.end_s or s.start_s for s in self.steps]
        ends += [s.end_s or 0.0 for s in self.tracers.values()]
        return max(ends)


@dataclass
class RunTimeline:
    """The timeline of one run, both sides on one time axis."""

    title: str
    payload_bytes: int
    outcome: str = "ok"
    error: str | None = None
    killed_side: str | None = None
    killed_in_step: str | None = None
    sides: dict[str, SideTimeline] = field(default_factory=dict)
    attribution: list[dict[str, Any]] = field(default_factory=list)
    tracers: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> available, reason, peak_bytes, notes

    @classmethod
    def from_result(cls, r: RunResult) -> RunTimeline:
        title = (f"{r.codec} over {r.transport} on {r.workload} x{r.scale:g} "
                 f"(payload {fmt_bytes(r.payload_bytes)}): {r.outcome}")
        tl = cls(title=title, payload_bytes=r.payload_bytes, outcome=r.outcome, error=r.error,
                 killed_side=r.killed_side, killed_in_step=r.killed_in_step,
                 attribution=[dict(row) for row in r.attribution])
        for name, side in r.sides.items():
            st = SideTimeline(name=name, baseline_bytes=side.baseline_bytes, baseline_s=side.baseline_s,
                              rss=side.above_baseline(),
                              peak_bytes=side.peak_bytes, held_bytes=side.held_bytes,
                              cycle_held_bytes=side.cycle_held_bytes, budget_bytes=side.budget_bytes,
                              exit_code=side.exit_code, steps=[replace(s) for s in side.steps])
            for tracer, entry in r.tracers.items():
                view = (entry.get("sides") or {}).get(name) or {}
                series = view.get("series")
                if tracer != "sampler" and series and series.get("t_s"):
                    st.tracers[tracer] = Series(list(series["t_s"]), list(series["bytes"]))
            tl.sides[name] = st
        for tracer, entry in r.tracers.items():
            tl.tracers[tracer] = {k: entry.get(k) for k in ("available", "reason", "peak_bytes", "notes", "sees")}
        return tl

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunTimeline:
        kw = {k: v for k, v in d.items() if k in {f.name for f in fields(cls)}}
        kw["sides"] = {n: _side_from_dict(s) for n, s in d.get("sides", {}).items()}
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> RunTimeline:
        return cls.from_dict(json.loads(text))


def _side_from_dict(d: dict[str, Any]) -> SideTimeline:
    kw = {k: v for k, v in d.items() if k in {f.name for f in fields(SideTimeline)}}
    kw["rss"] = series_from_dict(d.get("rss") or {})
    kw["steps"] = [Step.from_dict(s) for s in d.get("steps", d.get("bands", []))]  # "bands": saved before
    kw["tracers"] = {n: Series(**s) for n, s in d.get("tracers", {}).items()}
    return SideTimeline(**kw)
