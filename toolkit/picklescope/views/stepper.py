"""Stepping through a serialization: one named step at a time on the timeline, or line by line.

A finished run already holds every step with its exact peak, so revealing them one at a time needs
no new measurement: :class:`StepReveal` redraws the same result cut off at the end of step *k*, which
is how a reader sees ``consolidate`` add a whole payload before ``pickle.dumps`` even starts. The
per-line view (:func:`stepthrough_target`, behind ``%picklescope_stepthrough``) hands a function to
:mod:`picklescope.investigate.stepthrough`, which runs it under a line tracer in a measured child.
"""

from __future__ import annotations

import copy
import html
import os
from typing import Any

import ipywidgets as widgets

from picklescope.batch import Batch, active_codec_name
from picklescope.codecs import Codec
from picklescope.core.result import RunResult, Step
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError
from picklescope.investigate.stepthrough import METHODS, line_row, stepthrough
from picklescope.views.figures import stepthrough_figure, timeline_figure
from picklescope.views.table import html_table
from picklescope.views.widgets import sync_figure


def step_sequence(result: RunResult) -> list[tuple[str, Step]]:
    """Every finished step of every side, in the order they finished.

    Finishing order is the order a replay can show them in: when ``consolidate`` ends, the
    ``__getstate__`` around it is still running, so the timeline cut there shows the outer step as
    far as it has gone and the inner one complete.
    """
    seq = [(side.name, st) for side in result.processes.values() for st in side.steps if st.end_s is not None]
    return sorted(seq, key=lambda pair: (pair[1].end_s, -pair[1].depth))


def truncated(result: RunResult, t_end: float) -> RunResult:
    """The run as it stood at ``t_end`` (run time): samples and steps after it left out."""
    r = copy.deepcopy(result)
    for side in r.processes.values():
        keep = [i for i, t in enumerate(side.timeline.t_s) if t <= t_end]
        side.timeline.t_s = [side.timeline.t_s[i] for i in keep]
        side.timeline.bytes = [side.timeline.bytes[i] for i in keep]
        side.steps = [st for st in side.steps if st.start_s <= t_end]
        for st in side.steps:
            if st.end_s is not None and st.end_s > t_end:
                st.end_s = t_end
    return r


def describe_step(result: RunResult, side: str, st: Step) -> str:
    """One line: where the step ran, what it added (and as a multiple of the payload), how long."""
    mult = f" ({st.added_bytes / result.payload_bytes:.2f}x payload)" if st.added_bytes is not None and \
        result.payload_bytes else ""
    secs = f", {st.duration_s:.3f} s" if st.duration_s is not None else ""
    err = f"; failed: {st.error}" if st.error else ""
    return (f"{side} · {'  ' * st.depth}{st.name}: added {fmt_bytes(st.added_bytes, signed=True)}{mult}, "
            f"peak {fmt_bytes(st.peak_bytes)} above baseline{secs}{err}")


class StepReveal(widgets.VBox):
    """A timeline with "previous" / "next step" buttons that reveal one step at a time."""

    def __init__(self, result: RunResult) -> None:
        import plotly.graph_objects as go

        self.result = result
        self.sequence = step_sequence(result)
        self.index = -1  # nothing revealed yet
        self.figure = go.FigureWidget()
        self.caption = widgets.HTML()
        self.prev_button = widgets.Button(description="previous", icon="step-backward")
        self.next_button = widgets.Button(description="next step", icon="step-forward", button_style="primary")
        self.all_button = widgets.Button(description="show all", icon="fast-forward")
        self.prev_button.on_click(lambda _b: self.show(self.index - 1))
        self.next_button.on_click(lambda _b: self.show(self.index + 1))
        self.all_button.on_click(lambda _b: self.show(len(self.sequence) - 1))
        super().__init__([widgets.HBox([self.prev_button, self.next_button, self.all_button]), self.caption,
                          self.figure])
        self.show(-1)

    def show(self, index: int) -> None:
        """Reveal steps 0..index (-1: only what happened before the first step)."""
        index = max(-1, min(index, len(self.sequence) - 1))
        self.index = index
        if index < 0:
            t_end = min((st.start_s for _, st in self.sequence), default=0.0)
            t_end = max(t_end - 1e-6, 0.0)
            text = f"{len(self.sequence)} steps to reveal: press <b>next step</b>"
        else:
            side, st = self.sequence[index]
            t_end = st.end_s or st.start_s
            text = f"step {index + 1} of {len(self.sequence)}: {html.escape(describe_step(self.result, side, st))}"
        sync_figure(self.figure, timeline_figure(truncated(self.result, t_end)))
        self.caption.value = text
        self.prev_button.disabled = index < 0
        self.next_button.disabled = self.all_button.disabled = index >= len(self.sequence) - 1


def reveal(result: RunResult) -> StepReveal:
    """A :class:`StepReveal` for a finished run (display it as a cell's last expression)."""
    return StepReveal(result)


def target_spec(target: Any) -> dict[str, str]:
    """How :func:`picklescope.investigate.stepthrough.stepthrough` should find ``target`` in a fresh child.

    A codec's method becomes ``codec=NAME``; a :class:`~picklescope.batch.Batch` method steps through
    the codec that process would use; any other function or method is named ``module:qualname`` so
    the child can import it. A function defined in the notebook itself cannot be imported by another
    process, so it is refused with the way out.
    """
    owner = getattr(target, "__self__", None)
    func = getattr(target, "__func__", target)
    name = getattr(func, "__name__", "")
    method = METHODS.get(name, "__getstate__")
    if isinstance(owner, Codec):
        return {"codec": owner.name, "method": method}
    if isinstance(owner, Batch):
        return {"codec": active_codec_name(), "method": method}
    cls = owner if isinstance(owner, type) else (type(owner) if owner is not None else None)
    module = getattr(func, "__module__", None) or ""
    qualname = getattr(func, "__qualname__", "")
    if cls is not None and owner is not None:
        module, qualname = cls.__module__, f"{cls.__qualname__}.{name}"
    if not module or module == "__main__" or "<locals>" in qualname:
        raise PicklescopeError(
            f"{qualname or target!r} is defined in this notebook, so a child process cannot import it",
            "put it in a .py file (or a %%picklescope_codec cell) and step through that")
    return {"function": f"{module}:{qualname}", "method": method}


def stepthrough_html(st: Any, limit: int = 40) -> str:
    """The per-line table of a step-through: costly lines first (by the memory their own code
    added, ties by time), each with the lines that called it; quiet lines folded below."""
    p = st.payload_bytes or 0
    culprit = st.culprit()
    verb = {"ok": "finished", "error": "failed", "timeout": "ran out of time"}.get(st.outcome, st.outcome)
    head = (f"<p><b>{html.escape(st.target)}</b> {html.escape(st.method)} on {html.escape(st.workload)} "
            f"x{st.scale:g} (payload {fmt_bytes(p)}) {html.escape(verb)}; the whole call rose "
            f"{fmt_bytes(st.peak_bytes)} above where it started at its highest")
    quiet_share = 0.01
    if culprit is not None and culprit.self_bytes >= quiet_share * p:
        mult = f" ({culprit.self_bytes / p:.2f}x payload)" if p else ""
        head += (f". The costliest line is {html.escape(os.path.basename(culprit.filename))}:{culprit.lineno} in "
                 f"{html.escape(culprit.function)}: <code>{html.escape(culprit.source.strip())}</code>, which "
                 f"added {fmt_bytes(culprit.self_bytes)}{mult} by itself")
    elif culprit is not None:
        head += (f". No line added 1% of the payload by itself (the most any line added was "
                 f"{fmt_bytes(culprit.self_bytes)})")
    else:
        head += ". No line added memory of its own"
    head += ".</p>"
    if st.error:
        head += f"<pre>{html.escape(st.error)}</pre>"
    costly, quiet = st.ranked()
    rows = [line_row(st, r) for r in costly[:limit]]
    quiet_rows = [line_row(st, r) for r in (costly[limit:] + quiet)]
    return head + html_table(rows,  # with no costly row the sentence above already says so
                             folded=quiet_rows,
                             folded_label=f"{len(quiet_rows)} quiet lines, each under 1% of the payload by itself "
                                          "(execution order; click to open)")


def show_stepthrough(st: Any, scale_bytes: int | None = None) -> None:
    """Display a step-through: the per-line table, then the figure with a bar per costly line.

    ``scale_bytes`` (:func:`picklescope.views.figures.stepthrough_scale`) puts several step-throughs
    shown one after another on one absolute scale."""
    from IPython.display import display


    display({"text/html": stepthrough_html(st), "text/plain": f"{st.target} {st.method}: {st.outcome}"}, raw=True)
    display(stepthrough_figure(st, scale_bytes=scale_bytes))


def stepthrough_target(target: Any, **options: Any) -> Any:
    """Step through ``target`` (a function or bound method) in a child and display its per-line table."""
    st = stepthrough(**target_spec(target), **options)
    show_stepthrough(st)
    return st
