"""A prediction as one figure: the node's total, the controller and the object store per training step,
one colour per codec.

Drawn from the plain data of :class:`~picklescope.investigate.predict.answer.CodecPrediction`
(or its ``--json`` document), never measured here. Ray's threshold and the store's capacity are
horizontal lines; a predicted kill is a marker at the step and height of the crossing, labelled with
the process Ray would kill; a line far above every curve (a node that stays far under Ray's threshold)
is named above the chart instead of drawn, so the curves keep their height. The store is drawn because a
store at its capacity explains a node total that stops rising (Ray spills the rest to disk).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go

from picklescope.core.units import fmt_bytes

COLORS = ("#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#17becf")


def _gib(v: float) -> float:
    return v / 2**30


def predict_figure(predictions: Sequence[Any]) -> go.Figure:
    """Node total (solid), controller (dotted) and object store (dashed) per training step for each codec,
    Ray's threshold, the store's capacity, kills."""
    docs = [p if isinstance(p, dict) else p.to_json_dict() for p in predictions]
    fig = go.Figure()
    for i, doc in enumerate(docs):
        color = COLORS[i % len(COLORS)]
        steps = [s["index"] for s in doc["training_steps"]]
        plane = doc.get("data_plane", "dataproto")  # both planes of one codec side by side stay apart
        label = doc["codec"] + ("" if plane == "dataproto" else f" ({plane})")
        fig.add_trace(go.Scatter(x=steps, y=[_gib(s["node_bytes"]) for s in doc["training_steps"]],
                                 mode="lines+markers", name=f"{label}: node", line={"color": color}))
        fig.add_trace(go.Scatter(x=steps, y=[_gib(s["controller_bytes"]) for s in doc["training_steps"]],
                                 mode="lines", name=f"{label}: controller",
                                 line={"color": color, "dash": "dot"}))
        store = [s.get("store_bytes") for s in doc["training_steps"]]
        if any(v is not None for v in store):  # documents saved before the store was kept per step have none
            fig.add_trace(go.Scatter(x=steps, y=[None if v is None else _gib(v) for v in store], mode="lines",
                                     name=f"{label}: object store", line={"color": color, "dash": "dash",
                                                                          "width": 1}))
        k = doc.get("killed")
        if k:
            fig.add_trace(go.Scatter(x=[k["training_step"]], y=[_gib(k["node_bytes"])], mode="markers+text",
                                     marker={"symbol": "x", "size": 14, "color": color}, showlegend=False,
                                     text=[f"Ray kills {k['process']}"], textposition="top left", cliponaxis=False))
    first = docs[0] if docs else {}
    lines: list[tuple[float, str, dict[str, Any]]] = []  # (GiB, label, line style): drawn, or said off the chart
    if first.get("node_memory_bytes"):
        limit = first["threshold"] * first["node_memory_bytes"]
        lines.append((_gib(limit), f"Ray's threshold, {fmt_bytes(limit)} ({first['threshold']:g} of the node)",
                      {"color": "#000000", "width": 1.5}))
    caps = {d["store_capacity_bytes"]: d.get("store_capacity_source") for d in docs if d.get("store_capacity_bytes")}
    for cap, source in caps.items():
        lines.append((_gib(cap), f"object store's capacity, {fmt_bytes(cap)} ({source})",
                      {"color": "#7f7f7f", "dash": "dashdot", "width": 1}))
    top = _data_top(fig)
    shown = [ln for ln in lines if top is None or ln[0] <= OFF_CHART * top]
    off = [ln for ln in lines if ln not in shown]
    for y, text, style in shown:
        fig.add_hline(y=y, line=style, annotation_position="top left", annotation_text=text)
    if off and top is not None:  # lines far above every curve would squeeze the curves flat: said, not drawn
        fig.update_yaxes(range=[0, 1.15 * max([top] + [y for y, _, _ in shown])])
        fig.add_annotation(xref="paper", yref="paper", x=0, y=1.0, xanchor="left", yanchor="bottom", showarrow=False,
                           align="left", text="<br>".join(f"above this chart: {t}" for _, t, _ in off))
    last = max((s["index"] for d in docs for s in d["training_steps"]), default=1)
    # whole training steps only: plotly's own ticks would label 1.5 on a four-step prediction
    fig.update_xaxes(tick0=0, dtick=next((t for t in (1, 2, 5, 10, 20, 50, 100, 200, 500) if last / t <= 12), None))
    fig.update_layout(title="Predicted node memory per training step", xaxis_title="training step",
                      yaxis_title="GiB (peak during the step)", template="plotly_white", height=440,
                      margin={"t": 60 + 18 * len(off)})
    return fig


OFF_CHART = 2.0  # a line more than this many times the highest curve is said above the chart, not drawn


def _data_top(fig: go.Figure) -> float | None:
    """The highest value any curve or marker of ``fig`` reaches (None: nothing drawn)."""
    values = [v for trace in fig.data for v in (trace.y or ()) if v is not None]
    return max(values) if values else None
