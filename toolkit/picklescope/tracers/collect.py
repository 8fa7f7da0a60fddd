"""The tracers' parent half: gather what the children streamed, read capture files, fill the result.

:class:`Collector` sits on the run's event stream (it wraps the ``on_event`` hook, so the runner's
own bookkeeping is untouched). After both sides ended, and before the run folder with the capture
files is removed, :meth:`Collector.collect` fills ``RunResult.tracers`` (per tracer: available,
reason, the peak it saw, what it saw in each step, a per-side series) and ``RunResult.attribution``
(memray's allocations live at the peak). It never raises: a tracer that failed says so in
``reason``, with no numbers.
"""

from __future__ import annotations

import ast
import bisect
import functools
from typing import Any

from picklescope.core.events import Event, EventHook, chain
from picklescope.core.result import RunResult, Series, Step
from picklescope.tracers.base import ParentContext, SideData, Tracer
from picklescope.tracers.catalog import TRACERS
from picklescope.tracers.compare import add_notes

TAIL_S = 0.005


@functools.lru_cache(maxsize=128)
def _with_blocks(filename: str) -> tuple[tuple[int, int], ...]:
    """(first line, last line) of every ``with`` statement in a source file."""
    try:
        with open(filename, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return ()
    return tuple((n.lineno, n.end_lineno or n.lineno) for n in ast.walk(tree)
                 if isinstance(n, (ast.With, ast.AsyncWith)))


def with_block(filename: str, line: int) -> tuple[int, int]:
    """The lines of the innermost ``with`` statement around ``line`` (just that line if none)."""
    inside = [b for b in _with_blocks(filename) if b[0] <= line <= b[1]]
    return max(inside) if inside else (line, line)


def per_step(series: dict[str, list], steps: list[Step], sampled: bool) -> dict[str, int | None]:
    """What a series says each step added: its highest value inside the step minus its value at the start.

    Uses each step name's first occurrence. A sampled series with no point inside a step gives
    None (it did not look); an event series with none gives 0 (nothing happened). A sampled series
    also counts its first sample after the step if it comes within ``TAIL_S``: the reading that was
    due when the step ended belongs to it (a copy still filling pages at its last millisecond).
    A sampled series with no reading within ``TAIL_S`` of the step's end, on either side, did not look
    at that step either: a copy the step keeps shows at its end, and a sampling thread that was not
    scheduled while the step copied (memray's runs inside the measured process; on a busy machine it
    missed whole steps of tens of ms) would report as the step's rise what it saw before the copy.
    """
    t_s, values = series.get("t_s") or [], series.get("bytes") or []
    out: dict[str, int | None] = {}
    for st in steps:
        if st.name in out:
            continue
        end = float("inf") if st.end_s is None else st.end_s
        base = None
        inside = []
        for t, v in zip(t_s, values):
            if t <= st.start_s:
                base = v
            elif t <= end:
                inside.append(v)
            else:
                if sampled and t <= end + TAIL_S:
                    inside.append(v)
                break
        if base is None:
            base = values[0] if values else 0
        near = bisect.bisect_left(t_s, end - TAIL_S)
        looked_at_end = not sampled or st.end_s is None or (near < len(t_s) and t_s[near] <= end + TAIL_S)
        if not inside or not looked_at_end:
            out[st.name] = None if sampled else 0
        else:
            out[st.name] = max(max(inside), base) - base
    return out


class Collector:
    """Everything the tracers of one run sent, keyed by (tracer, side)."""

    def __init__(self, names: list[str]) -> None:
        self.names = names
        self.data: dict[tuple[str, str], SideData] = {}
        self.blocks: dict[str, dict[tuple, dict[str, Any]]] = {}

    def _side_data(self, tracer: str, side: str) -> SideData:
        return self.data.setdefault((tracer, side), SideData())

    def observe(self, ev: Event) -> None:
        kind, side = ev.get("type"), ev.get("side")
        if kind == "tracer":
            d = self._side_data(ev["tracer"], side)
            if ev["phase"] == "start":
                d.started, d.reason = bool(ev["ok"]), ev.get("reason")
            else:
                d.final, d.reason = ev.get("data"), ev.get("reason") or d.reason
            return
        if kind == "step_start" and ev.get("where"):
            w = ev["where"]
            first, last = with_block(w["file"], w["line"])
            key = (w["file"], w["function"], first, last)
            block = self.blocks.setdefault(side, {}).setdefault(
                key, {"file": w["file"], "function": w["function"], "first": first, "last": last, "names": []})
            if ev["name"] not in block["names"]:
                block["names"].append(ev["name"])
        for tracer, points in (ev.get("tracer_points") or {}).items():
            self._side_data(tracer, side).points.extend(tuple(p) for p in points)

    def hook(self, on_event: EventHook | None) -> EventHook:
        """An event hook that records tracer data, then calls ``on_event``."""
        return chain(self.observe, on_event)

    def collect(self, result: RunResult, run_dir: str, t0: float, timelines: dict[str, Series]) -> None:
        """Fill ``result.tracers`` and ``result.attribution``; never raises."""
        ctx = ParentContext(result, run_dir, t0, timelines,
                            {side: list(b.values()) for side, b in self.blocks.items()})
        for name in self.names:
            cls: type[Tracer] = TRACERS.get(name)
            ok, reason = cls.availability()
            entry: dict[str, Any] = {"available": ok, "reason": reason, "description": cls.description,
                                     "sees": cls.sees, "peak_bytes": None, "per_step": {}, "sides": {}}
            result.tracers[name] = entry
            if ok:
                self._collect_one(cls(), ctx, entry)
        try:
            add_notes(result)
        except Exception as exc:  # noqa: BLE001 - words are a bonus; the numbers stand without them
            result.tracer_notes_error = f"{type(exc).__name__}: {exc}"

    def _collect_one(self, tracer: Tracer, ctx: ParentContext, entry: dict[str, Any]) -> None:
        result = ctx.result
        reasons = []
        for side_name, side in result.processes.items():
            d = self.data.get((tracer.name, side_name), SideData())
            if tracer.in_child and not d.started:
                why = d.reason or "this side never reached its measured phase, so the tracer never started"
                entry["sides"][side_name] = {"reason": why}
                reasons.append(f"{side_name}: {why}")
                continue
            try:
                view = tracer.collect(ctx, side_name, d)
            except Exception as exc:  # noqa: BLE001
                view = {"reason": f"could not be read: {type(exc).__name__}: {exc}"}
            if d.reason and "reason" not in view:
                view["reason"] = d.reason
            rows = view.pop("attribution", None)
            if rows:
                result.attribution.extend(rows)
            if "series" in view:
                view["per_step"] = per_step(view["series"], side.steps, tracer.sampled)
            entry["sides"][side_name] = view
            if view.get("reason"):
                reasons.append(f"{side_name}: {view['reason']}")
        views = [v for v in entry["sides"].values() if v.get("peak_bytes") is not None]
        if not views:
            entry["available"] = False
            entry["reason"] = "; ".join(reasons) or "no side reported"
            return
        entry["reason"] = "; ".join(reasons) or None
        entry["peak_bytes"] = max(v["peak_bytes"] for v in views)
        for side_name, v in entry["sides"].items():
            for step, added in (v.get("per_step") or {}).items():
                key = step if step not in entry["per_step"] else f"{side_name}:{step}"
                entry["per_step"][key] = added
        if entry["sides"] and all("exact_peak_bytes" in v for v in views):
            entry["exact_peak_bytes"] = max(v["exact_peak_bytes"] or 0 for v in views)
        result.attribution.sort(key=lambda r: r["bytes"], reverse=True)
