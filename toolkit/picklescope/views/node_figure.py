"""The node's memory as one figure: a stacked area per process plus the object store, on one clock.

Each layer is a process's private resident memory above its own baseline (the store's pages are one
layer of their own, counted once), so the top of the stack is the node's total above its baseline,
the figure a node budget is compared with. Training steps are shaded bands, the budget is a line,
and a kill is a marker at the moment and height of the crossing, where the curves end (what the
other processes did while the cluster was being stopped is not the node's story). After the last
training step of a run that was not killed, a grey band marks what is still held and then freed by
the final ``gc.collect()``: the legacy codec's copies fall there, the memory only the cyclic
collector frees. With many workers the workers are drawn as one layer (their sum), so the driver's
growth stays readable.
"""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go

from picklescope.core.kill import kill_during
from picklescope.core.result import Process
from picklescope.core.units import fmt_bytes
from picklescope.investigate.node.result import NodeResult
from picklescope.views import label_layout

GROUP_WORKERS_ABOVE = 6
COLORS = {"driver": "#d62728", "store": "#7f7f7f", "workers": "#1f77b4"}
# every other process: twelve colours none of which is the driver's red or the store's grey, handed out in
# order, so a node of up to twelve such processes (workers, the TransferQueue plane's own) never repeats one
WORKER_COLORS = ("#1f77b4", "#2ca02c", "#9467bd", "#17becf", "#bcbd22", "#8c564b", "#e377c2", "#ff7f0e",
                 "#393b79", "#637939", "#8c6d31", "#7b4173")


def _mib(v: float) -> float:
    return v / 2**20


def _drawn_ticks(doc: dict[str, Any]) -> list[float]:
    """The node's sample times the figure draws: from the node baseline on, up to a kill."""
    t0, end = doc["node"].get("baseline_s") or 0.0, (doc.get("killed") or {}).get("t_s")
    return [t for t in doc["node"]["timeline"]["t_s"] if t >= t0 and (end is None or t <= end)]


def _layers(doc: dict[str, Any], group: bool) -> list[tuple[str, list[float], list[float]]]:
    """(name, t_s, bytes above baseline) per layer, samples from the node baseline on (up to a kill)."""
    node = doc["node"]
    t0 = node.get("baseline_s") or 0.0
    ticks = _drawn_ticks(doc)
    layers: list[tuple[str, list[float], list[float]]] = []

    def above(series: dict[str, Any], base: int | None) -> dict[float, float]:
        b = base or 0
        return {t: max(0, v - b) for t, v in zip(series["t_s"], series["bytes"]) if t >= t0}

    def above_process(d: dict[str, Any]) -> dict[float, float]:
        curve = Process.from_dict(d).above_baseline(t0, unknown_baseline=0)
        return {t: max(0, v) for t, v in zip(curve.t_s, curve.bytes)}

    procs = {n: {"name": n, **p} for n, p in doc["processes"].items()}
    workers = sorted((n for n in procs if n != "driver"), key=lambda n: int(n.split("-")[-1]) if n[-1].isdigit() else 0)
    others = sorted(n for n in workers if not n.startswith("worker-"))  # the TransferQueue plane's producer and storage
    workers = [n for n in workers if n not in others]
    if "driver" in procs:
        d = above_process(procs["driver"])
        layers.append(("driver", ticks, [d.get(t, 0) for t in ticks]))
    if group and workers:
        total = {t: 0.0 for t in ticks}
        for n in workers:
            for t, v in above_process(procs[n]).items():
                if t in total:
                    total[t] += v
        layers.append((f"workers ({len(workers)})", ticks, [total[t] for t in ticks]))
    else:
        for n in workers:
            w = above_process(procs[n])
            layers.append((n, ticks, [w.get(t, 0) for t in ticks]))
    for n in others:  # drawn one by one, never summed with the workers
        o = above_process(procs[n])
        layers.append((n, ticks, [o.get(t, 0) for t in ticks]))
    store = node.get("store") or {}
    if store.get("t_s"):
        s = above(store, store.get("baseline_bytes"))
        layers.append(("store", ticks, [s.get(t, 0) for t in ticks]))
    return layers


def _plane_words(doc: dict[str, Any]) -> str:
    """The data plane in the title where it is not verl's usual one (the batch through the driver)."""
    plane = doc["node"].get("config", {}).get("data_plane", "dataproto")  # where --json keeps it
    return "" if plane == "dataproto" else " on the TransferQueue data plane" if plane == "transferqueue" \
        else f" on the {plane} data plane"


def _step_labels(ended: list[dict[str, Any]], axis: list[float]) -> dict[str, str]:
    """Each training step's label, by its index: ``step k`` where every one finds room in the one row above the
    bands (label_layout, the run timeline's placement), else the numbers alone where that labels more steps
    (a narrow figure of short steps; a band left unlabelled between two labelled ones reads as a missing
    step). Steps whose label finds no room either way keep their band only."""
    if not axis:
        return {}
    best: dict[str, str] = {}
    for form in ("step {}", "{}"):
        placed = label_layout.place([label_layout.Label(form.format(s["index"]), s["start_s"], s["end_s"],
                                                        key=str(s["index"])) for s in ended],
                                    axis[0], axis[-1], max_rows=1)
        found = {p.label.key: p.label.text for p in placed}
        if len(found) > len(best):
            best = found
        if len(best) == len(ended):
            break
    return best


def node_figure(result: NodeResult | dict[str, Any], *, group_workers: bool | None = None,
                title: str | None = None) -> go.Figure:
    """Stacked node memory of a :class:`~picklescope.investigate.node.NodeResult` (or its ``--json`` document)."""
    doc = result.to_json_dict() if isinstance(result, NodeResult) else result
    n_workers = sum(1 for n in doc["processes"] if n.startswith("worker-"))
    group = n_workers > GROUP_WORKERS_ABOVE if group_workers is None else group_workers
    fig = go.Figure()
    others = 0
    for name, ts, vals in _layers(doc, group):
        color = COLORS.get(name.split(" ")[0])
        if color is None:
            color, others = WORKER_COLORS[others % len(WORKER_COLORS)], others + 1
        fig.add_trace(go.Scatter(x=ts, y=[_mib(v) for v in vals], name=name, mode="lines", stackgroup="node",
                                 line={"width": 0.5, "color": color},
                                 hovertemplate=f"{name}: %{{y:.1f}} MiB at %{{x:.3f}} s<extra></extra>"))
    ended = [s for s in doc.get("training_steps", []) if s.get("end_s") is not None]
    axis = _drawn_ticks(doc)
    labelled = _step_labels(ended, axis)
    for s in ended:  # a band without a label gets no annotation at all (plotly would print "new text")
        text = labelled.get(str(s["index"]))
        label = {"annotation_text": text, "annotation_position": "top left"} if text else {}
        fig.add_vrect(x0=s["start_s"], x1=s["end_s"], fillcolor="#ffbf00" if s["index"] % 2 else "#ffe08a",
                      opacity=0.15, line_width=0, **label)
    killed = doc.get("killed")
    if killed:  # the step the kill landed in never ended: its band runs to the kill, so the label has a band
        for s in doc.get("training_steps", []):
            if s.get("end_s") is None and s.get("start_s") is not None and s["start_s"] <= killed["t_s"]:
                fig.add_vrect(x0=s["start_s"], x1=killed["t_s"], fillcolor="#ffbf00" if s["index"] % 2 else "#ffe08a",
                              opacity=0.15, line_width=0, annotation_text=f"step {s['index']} (killed)",
                              annotation_position="top left")
    ticks = doc["node"]["timeline"]["t_s"]
    if ended and not killed and ticks and ticks[-1] > ended[-1]["end_s"]:
        fig.add_vrect(x0=ended[-1]["end_s"], x1=ticks[-1], fillcolor="#bbbbbb", opacity=0.15, line_width=0,
                      annotation_text="after the steps: held, then gc.collect()", annotation_position="top right")
    node = doc["node"]
    budget = node.get("budget_bytes")
    if budget:
        # labelled at the left: a kill is marked at the right end of the curves, at this line
        fig.add_hline(y=_mib(budget), line_dash="dash", line_color="black",
                      annotation_text=f"node budget {fmt_bytes(budget)}", annotation_position="bottom left")
    if killed:
        label = (f"killed {killed['process']} (training step {killed['training_step']}, "
                 f"{kill_during(killed['process'], killed['step'], killed.get('step_of'))})")
        fig.add_trace(go.Scatter(x=[killed["t_s"]], y=[_mib(killed["node_bytes"])], mode="markers", name="kill",
                                 marker={"symbol": "x", "size": 14, "color": "black"}, hovertext=[label],
                                 hoverinfo="text"))
        # the curves end at the kill, so the mark sits at their right end, at the budget line: the label
        # goes below and to its left, on a white box, clear of the step labels and the budget's own
        fig.add_annotation(x=killed["t_s"], y=_mib(killed["node_bytes"]), text=label, showarrow=True, ax=-30, ay=40,
                           xanchor="right", bgcolor="rgba(255,255,255,0.9)", bordercolor="black", borderwidth=1)
    payload = doc.get("payload_bytes")
    fig.update_layout(
        title=title or (f"{doc['codec']}{_plane_words(doc)}: {doc['workers']} workers, {doc['steps']} steps, payload "
                        f"{fmt_bytes(payload)}: {doc['outcome']}"),
        xaxis_title="seconds (one clock for every process)", yaxis_title="MiB above the node's baseline",
        legend={"orientation": "h", "y": -0.2}, template="plotly_white", height=420)
    return fig
