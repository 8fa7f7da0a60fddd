"""One run's timeline as plain data: what a figure, a report or a notebook draws, and nothing else.

:class:`RunTimeline` gathers, per side, a copy of the run's :class:`~picklescope.core.result.Process`
record (the RSS curve sampled at about 1 ms, drawn above the side's baseline through
:meth:`~picklescope.core.result.Process.above_baseline`, the step intervals with their exact peaks, the
budget and the held / cycle-held bytes) and each tracer's own series of it, plus the run's attribution
rows and verdict. It is built from a :class:`~picklescope.core.result.RunResult`
(:meth:`RunTimeline.from_result`), round-trips through JSON (``to_json`` / ``from_json``) and imports
nothing from plotly: figures are views of it. A side is the run's own record, so the curve a figure
draws is the one the record computes, never a second reckoning of the baseline.

Each side's steps are the run's own :class:`~picklescope.core.result.Step` records (copies). A step
that never ended (the side was killed inside it) keeps ``end_s = None``;
:meth:`~picklescope.core.result.Step.until` gives the end to draw it to. A timeline saved before the
one step shape kept them under ``bands``, and one saved before the one process shape kept each side as a
record of its own (the curve above the baseline as ``rss``, the tracers' series beside it);
:meth:`RunTimeline.from_dict` still reads both.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from picklescope.core.result import Process, RunResult, Series, series_from_dict
from picklescope.core.units import fmt_bytes


@dataclass
class RunTimeline:
    """The timeline of one run, both sides on one time axis."""

    title: str
    payload_bytes: int
    outcome: str = "ok"
    error: str | None = None
    killed_side: str | None = None
    killed_in_step: str | None = None
    sides: dict[str, Process] = field(default_factory=dict)  # copies of the run's records
    attribution: list[dict[str, Any]] = field(default_factory=list)
    tracers: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> available, reason, peak_bytes, notes
    tracer_series: dict[str, dict[str, Series]] = field(default_factory=dict)  # side -> tracer -> its own view

    def end_s(self, side: str) -> float:
        """Where ``side``'s time axis ends: its last sample above the baseline, step or tracer reading (0 with
        none)."""
        s = self.sides[side]
        ends = [s.above_baseline().end_s or 0.0] + [st.end_s or st.start_s for st in s.steps]
        ends += [series.end_s or 0.0 for series in self.tracer_series.get(side, {}).values()]
        return max(ends)

    @classmethod
    def from_result(cls, r: RunResult) -> RunTimeline:
        title = (f"{r.codec} over {r.transport} on {r.workload} x{r.scale:g} "
                 f"(payload {fmt_bytes(r.payload_bytes)}): {r.outcome}")
        tl = cls(title=title, payload_bytes=r.payload_bytes, outcome=r.outcome, error=r.error,
                 killed_side=r.killed_side, killed_in_step=r.killed_in_step,
                 attribution=[dict(row) for row in r.attribution])
        for name, side in r.processes.items():
            tl.sides[name] = replace(side, steps=[replace(s) for s in side.steps],
                                     timeline=Series(list(side.timeline.t_s), list(side.timeline.bytes)))
            for tracer, entry in r.tracers.items():
                view = (entry.get("sides") or {}).get(name) or {}
                series = view.get("series")
                if tracer != "sampler" and series and series.get("t_s"):
                    tl.tracer_series.setdefault(name, {})[tracer] = Series(list(series["t_s"]), list(series["bytes"]))
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
        kw["sides"], kw["tracer_series"] = {}, {}
        for n, s in d.get("sides", {}).items():
            kw["sides"][n], series = _side_from_dict(s)
            if series:
                kw["tracer_series"][n] = series
        for n, series in (d.get("tracer_series") or {}).items():
            kw["tracer_series"][n] = {tracer: Series(**one) for tracer, one in series.items()}
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> RunTimeline:
        return cls.from_dict(json.loads(text))


def _side_from_dict(d: dict[str, Any]) -> tuple[Process, dict[str, Series]]:
    """A side of a saved timeline and its tracers' series. A timeline saved before the one process shape kept
    each side as its own record: the curve above the baseline (``rss``), the steps (or ``bands``, older
    still) and the tracers' series beside them; the absolute curve is that plus the baseline."""
    if "rss" not in d:
        return Process.from_dict(d), {}
    rss, base = series_from_dict(d["rss"]), d.get("baseline_bytes")
    timeline = Series(rss.t_s, [v + base for v in rss.bytes]) if base is not None else Series()
    side = Process.from_dict({**{k: v for k, v in d.items() if k not in ("rss", "tracers", "bands")},
                              "steps": d.get("steps", d.get("bands", [])), "timeline": asdict(timeline)})
    return side, {n: Series(**s) for n, s in d.get("tracers", {}).items()}
