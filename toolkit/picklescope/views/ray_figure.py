"""The two-sided timeline of a run across a cluster: driver above, object store between, worker below.

The same drawing as :func:`picklescope.views.figures.timeline_figure` (its step bands and exact-peak
lines are reused, so both figures read alike), with a middle row for the store every byte passes
through: the plasma file's allocated pages for ``ray`` / ``ray-arg``, the storage unit's RSS for
``transferqueue``. Reading down one instant shows who holds the payload: the driver's serialize, the
store write that moves it into the store, the worker's read and its copy.
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from picklescope.core.result import RunResult
from picklescope.views.figures import draw_bands, draw_rss, draw_step_peaks, measured_range, side_title, y_range
from picklescope.views.timeline import RunTimeline

MiB = 1024**2
STORE_COLOR = "#2CA02C"
ROWS = (("sender", "driver (sender)"), (None, "object store"), ("receiver", "worker (receiver)"))


def _store_series(result: RunResult) -> tuple[list[float], list[float], str]:
    store = result.object_store or {}
    t, b = list(store.get("t_s") or []), list(store.get("bytes") or [])
    if not t:
        return [], [], store.get("unavailable") or "not sampled"
    source = store.get("source") or ""
    if source.startswith("RSS"):  # a process: show what it gained, like the sides
        first = b[0]
        return t, [(v - first) / MiB for v in b], "memory of the storage process, above its first sample"
    # the source names the store's backing file (a deleted /dev/shm temp file): say what it is instead
    return t, [v / MiB for v in b], "shared-memory pages in use"


def failed_sentence(result: RunResult) -> str:
    """A run over Ray that did not end ``ok``, in one sentence: its first line of error, whole words
    (Ray's start-up errors run to many lines of advice about log files a run has removed)."""
    err = result.error or ""
    first = next((line.strip() for line in err.splitlines() if line.strip()), "")
    first = first.removeprefix("sender: ").removeprefix("receiver: ")
    if len(first) > 240:
        first = first[:240].rsplit(" ", 1)[0] + " ..."
    ended = {"error": "failed", "timeout": "ran out of time"}.get(result.outcome, f"ended {result.outcome}")
    return (f"The Ray section did not run: {result.codec} over {result.transport} {ended}"
            + (f" ({first})" if first else "") + "; nothing is drawn for it.")


def ray_timeline_figure(result: RunResult) -> go.Figure:
    """Driver, object store and worker memory over one time axis, with both sides' steps."""
    tl = RunTimeline.from_result(result)
    t_store, y_store, store_note = _store_series(result)
    titles = []
    for side_name, label in ROWS:
        if side_name is None:
            peak = max(y_store) if y_store else None
            titles.append(f"{label}: " + (f"peak {peak:.1f} MiB" if peak is not None else store_note))
            continue
        said = side_title(tl, side_name)
        txt = said[len(side_name) + 2:] if said.startswith(f"{side_name}: ") else said
        private = result.processes[side_name].private_peak_bytes if side_name in result.processes else None
        if private is not None:
            txt += f", private {private / MiB:.1f} MiB"
        titles.append(f"{label}: {txt}")
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.09, subplot_titles=titles,
                        row_heights=[0.4, 0.2, 0.4])
    x0, x1 = measured_range(tl)
    for row, (side_name, _) in enumerate(ROWS, start=1):
        if side_name is None:
            fig.add_trace(go.Scatter(x=t_store, y=y_store, mode="lines", line={"color": STORE_COLOR, "width": 1.5},
                                     name=f"object store ({store_note})",
                                     hovertemplate="%{x:.3f} s: %{y:.1f} MiB<extra>object store</extra>"),
                          row=row, col=1)
            fig.update_yaxes(title_text="MiB", row=row, col=1)
            continue
        side = tl.sides.get(side_name)
        if side is None:
            continue
        end = tl.end_s(side_name)
        label_rows = draw_bands(fig, side, row, end, window=(x0, x1))
        draw_rss(fig, side, row, (x0, x1))  # the set-up before the baseline greyed, off the y range
        draw_step_peaks(fig, side, row, end)
        fig.update_yaxes(title_text="MiB above baseline", range=y_range(tl, side, x0, x1, label_rows),
                         row=row, col=1)
    fig.update_xaxes(range=[x0, x1])
    fig.update_xaxes(title_text="seconds since the run started (zoom out to see the cluster start)", row=3, col=1)
    fig.update_layout(title={"text": tl.title, "font": {"size": 14}}, height=820, template="plotly_white",
                      hovermode="x unified", margin={"b": 140},
                      legend={"orientation": "h", "yanchor": "top", "y": -0.09})
    return fig
