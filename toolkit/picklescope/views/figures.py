"""Plotly figures of results that were already computed: this module draws, it never measures.

Every function takes plain results (:class:`~picklescope.core.result.RunResult`,
:class:`~picklescope.views.timeline.RunTimeline`, :class:`~picklescope.investigate.stepthrough.StepThrough` or its
rows) and returns a ``plotly.graph_objects.Figure``; notebooks, the HTML report and the widgets
all call these, so a figure looks the same wherever it appears.

- :func:`timeline_figure`: one row per side on a shared time axis, RSS above the baseline in MiB,
  shaded and labelled step bands, the exact peak of each step, a budget line when one is set, and
  each tracer's own view as its own trace. A killed run draws what it has, up to the kill. The
  y axis starts at the baseline: the set-up before it is shaded and greyed, not part of the range.
- :func:`comparison_figure`: peak, held, cycle-held and time per codec, grouped by transport.
- :func:`attribution_figure`: the allocations live at the peak, as a table or an icicle.
- :func:`stepthrough_figure`: the line-by-line step-through as a table with bars.
"""

from __future__ import annotations

import html
import os
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from picklescope.core.result import Process, RunResult, Series
from picklescope.core.units import fmt_bytes
from picklescope.investigate.stepthrough import StepThrough
from picklescope.tracers.compare import attribution_rows
from picklescope.views import label_layout
from picklescope.views.timeline import RunTimeline

MiB = 1024**2
STEP_COLORS = ["#4C78A8", "#F58518", "#54A24B", "#B279A2", "#E45756", "#72B7B2", "#EECA3B", "#9D755D"]
TRACER_STYLE = {"memray": ("#7F3C8D", "dash"), "memray-native": ("#7F3C8D", "dash"),
                "tracemalloc": ("#E68310", "dot"), "torch-profiler": ("#11A579", "dashdot")}
RSS_COLOR = "#222222"
SETUP_COLOR = "#AAAAAA"
SETUP_NAME = "setup (before baseline)"
LABEL_ROW = 0.085  # height of one row of step labels, as a fraction of the subplot's height


def _mib(n: int | float | None) -> float | None:
    return None if n is None else n / MiB


def _step_color(name: str) -> str:
    return STEP_COLORS[zlib.crc32(name.encode()) % len(STEP_COLORS)]


def plain(text: str) -> str:
    """Text from the user (workload, codec and step names, source lines) shown as it is written.

    plotly renders a subset of HTML in every label (``<b>``, ``<a href>``, ``<br>``) and decodes
    entities; escaping makes ``if a<b>c`` or a plugin named ``<b>x</b>`` read literally.
    """
    return html.escape(str(text), quote=False)


def _yref(row: int) -> str:
    return "y domain" if row == 1 else f"y{row} domain"


def _mib_array(values: Sequence[int]) -> np.ndarray:
    """Bytes as MiB in an array: plotly checks a list element by element (0.2 s for a run's 10,000
    samples, paid on every redraw of the explorer), an array as a whole."""
    return np.asarray(values, dtype=float) / MiB


def _pending(fig: go.Figure, kind: str) -> list[dict[str, Any]]:
    """Shapes or annotations waiting to be set on ``fig`` at once by :func:`_flush`: plotly checks
    the whole tuple again on every ``add_shape``/``add_annotation``, 20 ms a call on a timeline."""
    return fig.__dict__.setdefault(f"_picklescope_{kind}", [])


def _flush(fig: go.Figure) -> go.Figure:
    for kind in ("shapes", "annotations"):
        pending = fig.__dict__.pop(f"_picklescope_{kind}", [])
        if pending:
            fig.layout[kind] = [*fig.layout[kind], *pending]
    return fig


def _vrect(fig: go.Figure, row: int, x0: float, x1: float, **style: Any) -> None:
    """A full-height shaded interval on one row. ``fig.add_vrect(row=...)`` does the same through
    plotly's axis-spanning search, 40 ms a call; a shape with its axes named, set at once, far less."""
    _pending(fig, "shapes").append({"type": "rect", "x0": x0, "x1": x1, "y0": 0, "y1": 1,
                                    "xref": f"x{row if row > 1 else ''}", "yref": _yref(row), **style})


def _note(fig: go.Figure, **annotation: Any) -> None:
    """An annotation set with the others at the end of the figure (see :func:`_pending`)."""
    _pending(fig, "annotations").append(annotation)


def timeline_figure(result: RunResult | RunTimeline, *, show_tracers: bool = True) -> go.Figure:
    """Both sides' memory over time with the steps drawn on it (see the module docstring)."""
    tl = result if isinstance(result, RunTimeline) else RunTimeline.from_result(result)
    names = list(tl.sides) or ["(no side)"]
    p = tl.payload_bytes
    death = result.memory_at_death_bytes if isinstance(result, RunResult) else None  # a RunTimeline has no death
    titles = [plain(side_title(tl, n, death if n == tl.killed_side else None)) for n in names]
    fig = make_subplots(rows=len(names), cols=1, shared_xaxes=True, vertical_spacing=0.12, subplot_titles=titles)
    x0, x1 = measured_range(tl)
    for i, name in enumerate(names, start=1):
        side = tl.sides.get(name)
        if side is None:
            continue
        end = tl.end_s(name)
        label_rows = draw_bands(fig, side, i, end, window=(x0, x1))
        draw_rss(fig, side, i, (x0, x1))
        draw_step_peaks(fig, side, i, end)
        if show_tracers:
            for tracer, series in tl.tracer_series.get(name, {}).items():
                color, dash = TRACER_STYLE.get(tracer, ("#888888", "dash"))
                fig.add_trace(go.Scatter(x=np.asarray(series.t_s, dtype=float), y=_mib_array(series.bytes),
                                         mode="lines",
                                         line={"color": color, "dash": dash, "width": 1.5, "shape": "hv"},
                                         name=f"what {tracer} saw", legendgroup=tracer,
                                         showlegend=not any(tracer in tl.tracer_series.get(n, {})
                                                            for n in list(tl.sides)[:i - 1]),
                                         hovertemplate="%{x:.3f} s: %{y:.1f} MiB<extra>" + tracer + "</extra>"),
                              row=i, col=1)
        if side.budget_bytes:
            fig.add_hline(y=_mib(side.budget_bytes), line={"color": "#D62728", "dash": "dash", "width": 1.5},
                          annotation_text=budget_text(side.budget_bytes, p),
                          annotation_position="top right", row=i, col=1, exclude_empty_subplots=False)
        if tl.killed_side == name:
            # the kill lands after the last sign of life: a step event can come after the last RSS
            # sample, so the line goes at the side's end, never before a step it drew
            fig.add_vline(x=end, line={"color": "#D62728", "width": 2},
                          annotation_text=killed_where(tl, side),
                          annotation_position="bottom right", row=i, col=1, exclude_empty_subplots=False)
        if tl.killed_side and tl.killed_side != name and side.peak_bytes is None and not side.steps:
            # a side that never got the bytes has no curve: say so in the panel, not with an empty 0-1 MiB axis
            fig.update_yaxes(showticklabels=False, showgrid=False, title_text="", row=i, col=1)
            fig.add_annotation(text=f"nothing to draw: the {name} never received the bytes", showarrow=False,
                               x=0.5, y=0.5, xref=f"x{i if i > 1 else ''} domain", yref=_yref(i),
                               font={"size": 12, "color": "#777777"})
            continue
        fig.update_yaxes(title_text="MiB above baseline", range=y_range(tl, side, x0, x1, label_rows),
                         row=i, col=1)
    fig.update_xaxes(range=[x0, x1])
    fig.update_xaxes(title_text="seconds since the run started (zoom out to see set-up)", row=len(names), col=1)
    fig.update_layout(title={"text": plain(run_title(result, tl)), "font": {"size": 14}}, height=260 + 230 * len(names),
                      template="plotly_white", hovermode="x unified",
                      legend={"orientation": "h", "yanchor": "top", "y": -0.2 if len(names) < 2 else -0.15})
    return fig


def run_title(result: Any, tl: RunTimeline) -> str:
    """The figure's title: what ran and how it ended, in words (a measured cell has no codec,
    transport or payload, so it is named as what it is)."""
    outcome = {"ok": "finished", "oom-killed": "killed: out of memory", "running": "running",
               "memory-error": "ran out of memory (MemoryError)", "error": "failed",
               "timeout": "ran out of time"}.get(tl.outcome, tl.outcome)
    if isinstance(result, RunResult) and (result.transport in (None, "none") or not result.payload_bytes):
        return f"a notebook cell, run in its own process: {outcome}"
    if isinstance(result, RunResult):
        return (f"{result.codec} over {result.transport} on {result.workload} x{result.scale:g} "
                f"(payload {fmt_bytes(result.payload_bytes)}): {outcome}")
    return tl.title


def killed_where(tl: RunTimeline, side: Any) -> str:
    """Where a killed side died, in words. The budget is crossed in one step (``killed_in_step``),
    but the kill lands a moment later: on a small batch the side may have finished that step and
    begun the next, which is still open."""
    crossed = tl.killed_in_step
    still_open = [st.name for st in side.steps if st.end_s is None]
    died_in = still_open[-1] if still_open else crossed
    if crossed and died_in and died_in != crossed:
        return f"killed in {died_in} (over its budget since {crossed})"
    return f"killed in {died_in or crossed or 'its set-up'}"


def side_title(tl: RunTimeline, name: str, death_bytes: int | None = None) -> str:
    """What happened to one side, in words: its peak, where it was killed, or why it has no curve."""
    s = tl.sides.get(name)
    p = tl.payload_bytes

    def amount(n: int) -> str:
        return f"{fmt_bytes(n)}" + (f" ({n / p:.2f}x payload)" if p else "")

    if s is None:
        return f"{name}: nothing was recorded"
    if tl.killed_side == name:
        top = death_bytes if death_bytes is not None else s.own_peak_bytes()
        text = f"{name} {killed_where(tl, s)}"
        extra = []
        if top is not None:
            text += f" at {fmt_bytes(top)}"
            extra.append(f"{top / p:.2f}x payload" if p else "")
        if s.budget_bytes:
            extra.append(f"budget {fmt_bytes(s.budget_bytes)}")
        extra = [x for x in extra if x]
        return text + (f" ({'; '.join(extra)})" if extra else "")
    if tl.killed_side and s.peak_bytes is None and not s.steps:
        return f"{name} never started: the {tl.killed_side} was killed first"
    if tl.outcome == "running":
        open_steps = [st.name for st in s.steps if st.peak_bytes is None]
        now = s.above(s.timeline.bytes[-1]) if s.timeline.bytes else None
        where = f", in {open_steps[-1]}" if open_steps else (", done" if s.peak_bytes is not None else ", setting up")
        return f"{name}: running{where}" + (f", {fmt_bytes(now)} above its start" if now is not None else "")
    if s.peak_bytes is not None:
        return f"{name}: peaked at {amount(s.peak_bytes)} above its start"
    if not s.steps and not s.above_baseline().bytes:
        return f"{name} did not start ({tl.outcome})"
    return f"{name}: stopped before its peak could be read ({tl.outcome})"


def measured_range(tl: RunTimeline) -> tuple[float, float]:
    """The time span worth looking at first: the steps (and the kill), with a margin on each side.

    The samples also cover the set-up (building the batch, mapping the hand-off), which is not
    what the run measures; the figure opens on the steps and the user can zoom out.
    """
    starts, ends = [], []
    for side in tl.sides.values():
        end = tl.end_s(side.name)
        for st in side.steps:
            starts.append(st.start_s)
            ends.append(st.until(end))
        curve = side.above_baseline()
        if tl.killed_side == side.name and curve.end_s is not None:
            ends.append(curve.end_s)
    if not starts:
        ts = [t for s in tl.sides.values() for t in s.above_baseline().t_s]
        return (min(ts), max(ts)) if ts else (0.0, 1.0)
    lo, hi = min(starts), max(ends)
    pad = 0.15 * (hi - lo) + 0.02
    return lo - pad, hi + pad


def budget_text(budget_bytes: int, payload_bytes: int | None) -> str:
    """The budget line's label: the size in a unit that fits it, and the payload multiple."""
    text = f"budget {fmt_bytes(budget_bytes)}"
    return text + (f" ({budget_bytes / payload_bytes:.2f}x payload)" if payload_bytes else "")


def y_range(tl: RunTimeline, side: Process, x0: float, x1: float, label_rows: int = 3) -> list[float]:
    """MiB range of the measured phase in the visible window, with room above for the step labels.

    Samples before the side's baseline (set-up: the child still importing, building the batch or
    mapping the hand-off) sit hundreds of MiB below zero; letting them set the range would squash
    the steps into a sliver, so the axis starts at the baseline (or the measured phase's minimum,
    when it dips below) and the set-up curve is clipped at the bottom. ``label_rows`` rows of step
    labels get their own space above the highest value.
    """
    since = side.baseline_s if side.baseline_s is not None else float("-inf")
    curve = side.above_baseline()
    values = [v for t, v in zip(curve.t_s, curve.bytes) if x0 <= t <= x1 and t >= since]
    for series in tl.tracer_series.get(side.name, {}).values():
        values += [v for t, v in zip(series.t_s, series.bytes) if x0 <= t <= x1 and t >= since]
    values += [st.peak_bytes for st in side.steps if st.peak_bytes is not None]
    if side.budget_bytes:
        values.append(side.budget_bytes)
    lo, hi = (min(values), max(values)) if values else (0, MiB)
    lo_m, hi_m = min(0.0, lo / MiB), max(hi / MiB, 1.0)
    span = hi_m - lo_m
    labels = LABEL_ROW * label_rows + 0.02 if label_rows else 0.0
    head = max(0.12, 1.05 * labels / (1.0 - labels))  # the labels' share of the axis, above the data
    return [lo_m - 0.05 * span, hi_m + head * span]


def _setup_cut(side: Process, curve: Series) -> int:
    """Index of the first sample of ``curve`` (``side``'s, above its baseline) taken at or after the
    baseline (0 when its time is unknown)."""
    if side.baseline_s is None:
        return 0
    return next((k for k, t in enumerate(curve.t_s) if t >= side.baseline_s), len(curve.t_s))


def draw_rss(fig: go.Figure, side: Process, row: int, window: tuple[float, float]) -> None:
    """The sampled RSS in black, its set-up part (before the baseline) shaded and drawn over in grey.

    The set-up is named so that a curve climbing from far below zero reads as the child starting
    up rather than as memory the steps gave back; it never sets the y range (see :func:`y_range`).
    The black trace keeps every sample, so the figure's data is the run's timeline as sampled.
    """
    curve = side.above_baseline()
    t_s, ys = np.asarray(curve.t_s, dtype=float), _mib_array(curve.bytes)
    fig.add_trace(go.Scatter(x=t_s, y=ys, mode="lines", line={"color": RSS_COLOR, "width": 1.5},
                             name="RSS, sampled every ~1 ms", legendgroup="rss", showlegend=row == 1,
                             hovertemplate="%{x:.3f} s: %{y:.1f} MiB<extra>" + side.name + " RSS</extra>"),
                  row=row, col=1)
    cut = _setup_cut(side, curve)
    if cut == 0:
        return
    _vrect(fig, row, t_s[0], side.baseline_s, fillcolor=SETUP_COLOR, opacity=0.12, line_width=0, layer="below",
           name=SETUP_NAME)
    fig.add_trace(go.Scatter(x=t_s[:cut], y=ys[:cut], mode="lines", name=SETUP_NAME,
                             line={"color": SETUP_COLOR, "width": 2.5}, legendgroup="setup", hoverinfo="skip",
                             showlegend=not any(tr.name == SETUP_NAME for tr in fig.data)),
                  row=row, col=1)
    x0, x1 = window
    if side.baseline_s - max(x0, t_s[0]) >= label_layout.text_width(SETUP_NAME, x1 - x0):
        _note(fig, x=side.baseline_s, y=0.02, xref=f"x{row if row > 1 else ''}", yref=_yref(row),
              text=SETUP_NAME, showarrow=False, xanchor="right", yanchor="bottom",
              font={"size": 10, "color": "#777777"})
    _flush(fig)


def draw_bands(fig: go.Figure, side: Any, row: int, end: float, min_width: float = 0.0,
                window: tuple[float, float] | None = None) -> int:
    """Shade each step and label it; returns how many rows of labels it used.

    Labels are laid out by :func:`picklescope.views.label_layout.place` so that short consecutive steps
    (``pickle.dumps`` then ``handoff``) do not print over each other. Bands narrower than
    ``min_width`` are not labelled (their names are in the hover of their exact-peak lines).
    """
    labels = []
    for st in side.steps:
        x1 = st.until(end)
        _vrect(fig, row, st.start_s, max(x1, st.start_s + 1e-4), fillcolor=_step_color(st.name),
               opacity=0.10 + 0.06 * min(st.depth, 3), line_width=0, layer="below")
        if x1 - st.start_s >= min_width:
            labels.append(label_layout.Label(st.name + (" (killed here)" if st.end_s is None else ""),
                                           st.start_s, x1, st.depth, key=st.name))
    if window is None:
        window = (min((lab.start for lab in labels), default=0.0), max((lab.end for lab in labels), default=1.0))
    placed = label_layout.place(labels, *window)
    for p in placed:
        _note(fig, x=p.x, y=1.0 - LABEL_ROW * p.row, xref=f"x{row if row > 1 else ''}", yref=_yref(row),
              text=plain(p.label.text), showarrow=False, yanchor="top",
              font={"size": 10, "color": _step_color(p.label.key)})
    _flush(fig)
    return label_layout.rows_used(placed)


def draw_step_peaks(fig: go.Figure, side: Any, row: int, end: float) -> None:
    xs: list[float | None] = []
    ys: list[float | None] = []
    text: list[str | None] = []
    for st in side.steps:
        if st.peak_bytes is None:
            continue
        x1 = st.until(end)
        xs += [st.start_s, x1, None]
        ys += [_mib(st.peak_bytes)] * 2 + [None]
        text += [plain(st.name)] * 2 + [None]
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=ys, text=text, mode="lines", name="exact step peak (VmHWM)",
                                 line={"color": "#D62728", "width": 1, "dash": "dot"}, legendgroup="exact",
                                 showlegend=row == 1,
                                 hovertemplate="%{text}: exact peak %{y:.1f} MiB<extra></extra>"),
                      row=row, col=1)


TIME_PANEL = "serialize + deserialize (s)"


def comparison_figure(results: Sequence[RunResult | dict[str, Any]]) -> go.Figure:
    """Peak (sender, receiver), held, cycle-held and time per codec, one bar colour per transport."""
    runs = [r if isinstance(r, RunResult) else RunResult.from_dict(r) for r in results]
    panels = [("sender peak", lambda r: _side(r, "sender", "peak_bytes")),
              ("receiver peak", lambda r: _side(r, "receiver", "peak_bytes")),
              ("held", lambda r: _side(r, "sender", "held_bytes")),
              ("cycle-held", lambda r: _side(r, "sender", "cycle_held_bytes")),
              (TIME_PANEL, lambda r: None if r.serialize_s is None and r.deserialize_s is None
               else (r.serialize_s or 0.0) + (r.deserialize_s or 0.0))]
    fig = make_subplots(rows=1, cols=len(panels), subplot_titles=[t for t, _ in panels])
    transports = list(dict.fromkeys(r.transport for r in runs))
    for ti, transport in enumerate(transports):
        mine = [r for r in runs if r.transport == transport]
        for ci, (title, get) in enumerate(panels, start=1):
            values = [get(r) for r in mine]
            is_time = title == TIME_PANEL
            y = values if is_time else [_mib(v) for v in values]
            custom = [f"{v / r.payload_bytes:.2f}x payload" if (v is not None and not is_time and r.payload_bytes)
                      else r.outcome for v, r in zip(values, mine)]
            fig.add_trace(go.Bar(x=[plain(r.codec) for r in mine], y=y, name=plain(transport), legendgroup=transport,
                                 showlegend=ci == 1, marker_color=STEP_COLORS[ti % len(STEP_COLORS)],
                                 customdata=custom, cliponaxis=False, textposition="outside",
                                 # side by side, grouped bars' labels would run into each other: upright
                                 textangle=0 if len(transports) == 1 else -90,
                                 # every bar carries its value, so a 0 reads as measured zero, not as missing
                                 text=["-" if v is None else (f"{v:.3f} s" if is_time else fmt_bytes(v))
                                       for v in values], textfont={"size": 10},
                                 hovertemplate="%{x}: %{y:.2f}" + ("" if is_time else " MiB") +
                                 " (%{customdata})<extra>" + transport + "</extra>"),
                          row=1, col=ci)
        fig.update_yaxes(title_text="MiB", row=1, col=1)
    one = len(transports) == 1
    title = ("memory and time of each codec, sent " + (f"over {plain(transports[0])}" if one else
             "over each transport (bar colour)") + "; memory is the sender's unless the panel says receiver")
    fig.update_layout(barmode="group", template="plotly_white", height=380, showlegend=not one,
                      legend_title_text="sent over", title={"text": title, "font": {"size": 14}})
    return fig


def _side(r: RunResult, side: str, attr: str) -> Any:
    s = r.processes.get(side)
    return None if s is None else getattr(s, attr)


def attribution_figure(result: RunResult | RunTimeline, *, kind: str = "table", max_rows: int = 20) -> go.Figure:
    """memray's allocations live at the peak: ``kind="table"`` (largest first) or ``"icicle"``.

    Rows are those of :func:`picklescope.tracers.compare.attribution_rows`: at least 1% of the
    payload each, the rest as "other", no allocation of the toolkit's own or outside the steps."""
    rows = attribution_rows(result)  # type: ignore[arg-type]  # reads only attribution and payload_bytes
    payload = result.payload_bytes
    if not rows:
        fig = go.Figure()
        fig.add_annotation(text="no attribution rows: run with tracer='memray' to see who allocated the peak",
                           showarrow=False, x=0.5, y=0.5, xref="paper", yref="paper")
        fig.update_layout(template="plotly_white", height=200, xaxis_visible=False, yaxis_visible=False)
        return fig
    if kind == "icicle":
        return _icicle(rows)
    rows = rows[:max_rows]
    cells = [[f"{r['bytes'] / MiB:.1f}" for r in rows],
             [f"{r['bytes'] / payload:.2f}x" if payload else "-" for r in rows],
             [r.get("side", "") for r in rows], [r.get("step") or "" for r in rows],
             ["<br>".join(r.get("stack", [])[:4]) for r in rows]]
    fig = go.Figure(go.Table(columnwidth=[60, 60, 70, 100, 420],
                             header={"values": ["MiB", "x payload", "side", "step", "stack (innermost first)"],
                                     "align": "left", "fill_color": "#EEEEEE"},
                             cells={"values": cells, "align": "left", "height": 24}))
    # a row is as tall as its stack (up to four lines): sized so that no row is cut off at the bottom
    body = sum(20 * max(1, min(4, len(r.get("stack", [])))) + 12 for r in rows)
    fig.update_layout(template="plotly_white", height=110 + body, margin={"t": 50, "l": 10, "r": 10, "b": 10},
                      title={"text": "allocations live at the peak (memray)", "font": {"size": 14}})
    return fig


def _icicle(rows: list[dict[str, Any]], frames: int = 6) -> go.Figure:
    """peak -> side -> step -> the innermost ``frames`` frames (outer to inner), sized by bytes."""
    totals: dict[tuple[str, ...], int] = {}
    for r in rows:
        path = ["live at the peak", r.get("side") or "other", r.get("step") or "smaller allocations"]
        path += list(reversed(r.get("stack", [])[:frames]))
        for k in range(1, len(path) + 1):
            totals[tuple(path[:k])] = totals.get(tuple(path[:k]), 0) + int(r["bytes"])
    ids = ["/".join(p) for p in totals]
    parents = ["/".join(p[:-1]) for p in totals]
    fig = go.Figure(go.Icicle(ids=ids, labels=[p[-1] for p in totals], parents=parents,
                              values=list(totals.values()), branchvalues="total", tiling={"orientation": "v"},
                              hovertemplate="%{label}<br>%{value:,} bytes<extra></extra>"))
    fig.update_layout(template="plotly_white", height=520, margin={"t": 40, "l": 10, "r": 10, "b": 10},
                      title={"text": "allocations live at the peak, by step and stack (memray)", "font": {"size": 14}})
    return fig


QUIET_COLOR = "#BBBBBB"  # lines under 1% of the payload: drawn neutral, never in the alarm colour
ALARM_COLOR = "#E45756"
QUIET_SHARE = 0.01


def _row_dict(r: Any) -> dict[str, Any]:
    d = dict(r) if isinstance(r, dict) else dict(vars(r))
    d.setdefault("self_added_bytes", d.get("added_bytes", 0))
    d.setdefault("self_retained_bytes", d.get("retained_bytes", 0))
    d.setdefault("caller", -1)
    d["self_bytes"] = max(d["self_added_bytes"], d["self_retained_bytes"], 0)
    return d


def _clip(text: str, n: int) -> str:
    """``text`` cut to ``n`` characters, with an ellipsis when cut."""
    text = text.strip()
    return text if len(text) <= n else text[: n - 1] + "…"


def stepthrough_scale(throughs: Sequence[Any]) -> int:
    """One absolute scale (bytes) for step-throughs drawn side by side: the largest line of any."""
    top = 0
    for st in throughs:
        for r in (st.rows if isinstance(st, StepThrough) else st):
            d = _row_dict(r)
            top = max(top, d["self_bytes"], d.get("added_bytes", 0))
    return top


def stepthrough_figure(rows: Any, *, payload_bytes: int | None = None, scale_bytes: int | None = None,
                       title: str | None = None, max_quiet: int = 0) -> go.Figure:
    """The lines of a step-through as bars, costly lines first.

    ``rows`` is a :class:`~picklescope.investigate.stepthrough.StepThrough`, its ``rows``, or their dicts. Each
    line's bar is its *self* cost (its own code's allocation), with the inclusive cost (callees
    included) as a pale bar behind it; lines are ranked by self cost, ties by time, and indented
    by call depth. Lines whose own cost is under 1% of the payload are folded into one neutral
    bar (``max_quiet`` of them are listed first), so 8 KiB never looks as alarming as 47 MiB.
    ``scale_bytes`` (see :func:`stepthrough_scale`) gives figures drawn side by side one x range.
    """
    label = title
    if isinstance(rows, StepThrough):
        payload_bytes = payload_bytes or rows.payload_bytes
        label = label or f"{rows.target} {rows.method}"
        rows = rows.rows
    items = [_row_dict(r) for r in rows]
    limit = QUIET_SHARE * (payload_bytes or 0)
    costly = sorted((r for r in items if r["self_bytes"] > 0 and r["self_bytes"] >= limit),
                    key=lambda r: (-r["self_bytes"], -r["time_s"], r.get("order", 0)))
    quiet = [r for r in items if r not in costly]
    shown = costly + quiet[:max_quiet]
    folded = quiet[max_quiet:]
    # short enough for the label column to leave the bars their room in a notebook beside Lab's file
    # browser (the hover and the table beside the figure give the whole line)
    labels = [plain(f"{os.path.basename(r['filename'])}:{r['lineno']}  {'· ' * r['depth']}{_clip(r['source'], 42)}")
              for r in shown]
    labels = [f"{lab} [{i}]" if labels.count(lab) > 1 else lab for i, lab in enumerate(labels)]
    selfs = [_mib(r["self_bytes"]) for r in shown]
    incl = [_mib(max(r.get("added_bytes", 0), 0)) for r in shown]
    times = [r["time_s"] * 1000 for r in shown]
    colors = [ALARM_COLOR if r in costly else QUIET_COLOR for r in shown]
    if folded:
        labels.append(f"{len(folded)} quiet lines (each < 1% of payload)")
        selfs.append(_mib(sum(r["self_bytes"] for r in folded)))
        incl.append(0.0)
        times.append(sum(r["time_s"] for r in folded if r["depth"] == 0) * 1000)
        colors.append(QUIET_COLOR)
        shown = shown + [{"hits": sum(r["hits"] for r in folded), "peak_bytes": 0}]
    text = [f"{v * MiB / payload_bytes:.2f}x" if payload_bytes and c == ALARM_COLOR else ""
            for v, c in zip(selfs, colors)]
    fig = make_subplots(rows=1, cols=2, shared_yaxes=True, horizontal_spacing=0.06, column_widths=[0.65, 0.35],
                        subplot_titles=["own code added (MiB)", "time (ms)"])
    fig.add_trace(go.Bar(y=labels, x=incl, orientation="h", marker_color="rgba(0,0,0,0.08)",
                         name="with the functions it called", hovertemplate="%{y}<br>with the functions it called: "
                         "%{x:.1f} MiB<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(y=labels, x=selfs, orientation="h", marker_color=colors, text=text, name="its own code",
                         textposition="auto", customdata=[[r.get("hits", 0), _mib(r.get("peak_bytes", 0))]
                                                          for r in shown],
                         hovertemplate="%{y}<br>its own code added %{x:.1f} MiB, ran %{customdata[0]} times, "
                                       "peak %{customdata[1]:.1f} MiB<extra></extra>"), row=1, col=1)
    fig.add_trace(go.Bar(y=labels, x=times, orientation="h", name="time",
                         marker_color="#4C78A8", hovertemplate="%{y}<br>%{x:.2f} ms<extra></extra>"), row=1, col=2)
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(labels)), tickfont={"family": "monospace"},
                     row=1, col=1)
    if scale_bytes:
        fig.update_xaxes(range=[0, scale_bytes / MiB * 1.05], row=1, col=1)
    fig.update_layout(template="plotly_white", showlegend=False, height=160 + 24 * len(labels), barmode="overlay",
                      margin={"l": 10},
                      title={"text": plain(label or "line by line") + ": costliest lines first", "font": {"size": 14}})
    return fig


from picklescope.views.node_figure import node_figure  # noqa: E402,F401 - figures.node_figure(result): the node replay's view
from picklescope.views.predict_figure import predict_figure  # noqa: E402,F401 - figures.predict_figure(predictions): predict's view
