"""The explorer: pick a codec, transport, workload, tracer, scale and budget, press run, watch.

Every run goes through :func:`picklescope.run`, so the batch lives in two child processes and an
out-of-memory kill (a budget, or the real OOM killer) ends a child, never the kernel. The run happens
in a background thread so the kernel stays responsive; a second thread redraws the timeline about
five times a second from what has streamed in (steps from the children's events, RSS from the
parent's samples). Each finished run is appended to a comparison table, so switching codecs builds a
side-by-side.

Why the figure is an ``Output`` widget holding plotly's own output type, not a ``FigureWidget``:
plotly's widget sends each in-place change as a message that only the views alive at that moment
apply, in pieces (delete the old traces, then add the new ones); under load a view could be left with
empty axes under a finished run, and every FigureWidget also ships plotly's whole 5 MB script to the
browser. An ``Output`` widget's state *is* the figure: every frame replaces it in one message, and
any view of it, created then or later, draws the latest one. Lab draws it with the plotly extension
it already uses for the notebooks' figures. Every run is numbered in the status line, the figure's
title and the table, so all three name the same run.
"""

from __future__ import annotations

import html
import threading
import time
from typing import Any

import ipywidgets as widgets

from picklescope.codecs import CODECS
from picklescope.core.result import RunResult
from picklescope.core.units import fmt_bytes, parse_size
from picklescope.errors import PicklescopeError
from picklescope.measure import runner, verdicts
from picklescope.tracers import TRACERS
from picklescope.transports import TRANSPORTS
from picklescope.views import table
from picklescope.views.figures import timeline_figure
from picklescope.views.live import LiveRun
from picklescope.views.richtext import HtmlText, plain_text
from picklescope.workloads.spec import available_workloads, load_workload

# child events that move a side to another step: the status line follows each one as it arrives
STATUS_EVENTS = frozenset({"baseline", "step_start", "step_end"})
REDRAW_S = 0.2
DEFAULT_TRACER = "sampler"


def tracer_names() -> list[str]:
    """Every registered tracer, the always-on sampler first, then "all"."""
    names = list(TRACERS.names())
    return [DEFAULT_TRACER, *(n for n in names if n != DEFAULT_TRACER), "all"]


def figure_output(fig: Any) -> dict[str, Any]:
    """``fig`` as one notebook output of plotly's own type (what an ``Output`` widget holds).

    Arrays go as plain lists, so the browser's plotly holds numbers (not encoded blocks) in its data.
    """
    import json

    from plotly.utils import PlotlyJSONEncoder

    spec = json.loads(json.dumps({"data": [_plain(t.to_plotly_json()) for t in fig.data],
                                  "layout": _plain(fig.layout.to_plotly_json())}, cls=PlotlyJSONEncoder))
    spec["config"] = {"responsive": True, "displaylogo": False}
    title = fig.layout.title.text or "figure"
    return {"output_type": "display_data", "metadata": {},
            "data": {"application/vnd.plotly.v1+json": spec, "text/plain": f"<figure: {title}>"}}


def _plain(value: Any) -> Any:
    """``value`` with every numpy array turned into a list (plotly would encode it as base64)."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) and hasattr(value, "dtype") else value


def go_figure(fig: Any) -> Any:
    """A copy of ``fig`` to change without touching the one drawn."""
    import plotly.graph_objects as go

    return go.Figure(fig)


def same_traces(target: Any, source: Any) -> bool:
    """Whether ``source`` has the traces of ``target`` (types and names, in order)."""
    return [(t.type, t.name) for t in target.data] == [(t.type, t.name) for t in source.data]


def sync_figure(target: Any, source: Any) -> None:
    """Make the FigureWidget ``target`` show ``source`` by updating it in place.

    Traces keep their identity when the new figure has the same traces (names and types), so the
    browser restyles instead of re-creating the plot; otherwise they are replaced.
    """
    if same_traces(target, source):
        with target.batch_update():
            for old, new in zip(target.data, source.data):
                old.update(new.to_plotly_json(), overwrite=True)
            target.update_layout(source.layout.to_plotly_json(), overwrite=True)
        return
    target.data = ()
    target.add_traces(list(source.data))
    target.update_layout(source.layout.to_plotly_json(), overwrite=True)


def results_html(results: list[RunResult], budgets: list[str], numbers: list[int] | None = None) -> str:
    """The comparison table of every finished run, newest last, as an HTML table.

    ``numbers`` are the runs' numbers in the status line and the figure's title (default 1, 2, ...).
    A killed side has no peak (the kernel's mark dies with the process), so its peak cell says where
    it was killed, the memory it had reached and the budget instead of a dash."""
    if not results:
        return "<i>No runs yet: press run.</i>"
    rows = table.comparison_rows(results)
    numbers = numbers or list(range(1, len(results) + 1))
    for i, (row, r, b, n) in enumerate(zip(rows, results, budgets, numbers), start=1):
        # one cell for the workload and its payload, the tracer only when some run chose one: the
        # table fits a notebook beside Lab's file browser
        row_head = {"#": n, "workload": f"{r.workload} x{r.scale:g} ({fmt_bytes(r.payload_bytes)})", "budget": b}
        if any(x.tracer not in (None, DEFAULT_TRACER) for x in results):
            row_head["tracer"] = r.tracer
        death = verdicts.death_text(r)
        if death is not None:
            row[f"{r.killed_side} peak"] = death
        rows[i - 1] = {**row_head, **{k: v for k, v in row.items() if k != "budget"}}  # the budget as set
    return table.html_table(rows, css_class="picklescope-runs")


class Explorer(widgets.VBox):
    """Controls, a live timeline and a growing comparison table for isolated runs."""

    def __init__(self, codec: str = "numpy", transport: str = "pickle5-oob", workload: str = "flowgrpo",
                 scale: float = 0.1, budget: float = 0.0, tracer: str = DEFAULT_TRACER,
                 plugins: list[str] | None = None) -> None:
        import plotly.graph_objects as go

        style = {"description_width": "185px"}  # wide enough for "sender budget (x payload)"
        wide = widgets.Layout(width="470px")
        self.codec = widgets.Dropdown(options=CODECS.names(), value=codec, description="codec", style=style,
                                       layout=wide)
        self.transport = widgets.Dropdown(options=TRANSPORTS.names(), value=transport, description="transport",
                                          style=style, layout=wide)
        self.workload = widgets.Dropdown(options=available_workloads(), description="workload", style=style,
                                         layout=wide)
        self.offer_workload(workload)
        self.tracer = widgets.Dropdown(options=tracer_names(), value=tracer, description="tracer", style=style,
                                        layout=wide)
        self.scale = widgets.FloatLogSlider(value=scale, base=10, min=-3, max=0, step=0.05, description="scale",
                                            readout_format=".3g", style=style, layout=wide)
        self.budget = widgets.FloatSlider(value=budget, min=0.0, max=4.0, step=0.05,
                                          description="sender budget (x payload)", readout_format=".2f", style=style,
                                          layout=wide,
                                          tooltip="sender budget as a multiple of the payload; 0 = none")
        self.button = widgets.Button(description="run", button_style="primary", icon="play")
        self.clear_button = widgets.Button(description="clear table", icon="trash")
        self.status = widgets.HTML("<i>ready</i>")
        # the drawing, as one output of plotly's own type (module docstring); ``figure`` is what it shows
        self.plot = widgets.Output(layout=widgets.Layout(width="100%"))
        self.figure = go.Figure()
        self.table = widgets.HTML(results_html([], []))
        self.results: list[RunResult] = []
        self._budgets: list[str] = []
        self._numbers: list[int] = []  # each finished run's number, as the status and the title give it
        self.runs_started = 0
        self.plugins = plugins  # codec files from %%picklescope_codec cells, loaded in every run's children
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.last_error: str | None = None
        self.button.on_click(lambda _b: self.start())
        self.clear_button.on_click(lambda _b: self.clear())
        controls = [self.codec, self.transport, self.workload, self.tracer, self.scale, self.budget]
        self._controls = [*controls, self.button, self.clear_button]
        super().__init__([
            widgets.HBox([widgets.VBox(controls[:3]), widgets.VBox(controls[3:])]),
            widgets.HBox([self.button, self.clear_button, self.status]),
            self.plot,
            self.table,
        ])

    def _show(self, fig: Any) -> None:
        """Show ``fig`` in place of the last drawing, in one state change of the ``Output`` widget.

        The output keeps the figure's height as its minimum, so the page does not jump while the
        browser draws the new frame."""
        self.plot.outputs = (figure_output(fig),)
        height = fig.layout.height
        if height:
            self.plot.layout.min_height = f"{int(height)}px"
        self.figure = fig

    # -- running ---------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> threading.Thread | None:
        """Start a run with the current settings in the background; None if one is already going."""
        with self._lock:
            if self.running:
                self.status.value = "<b>a run is already going</b>: wait for it to finish"
                return None
            self.refresh_codecs()
            settings = self.settings()
            self.runs_started += 1
            settings["run"] = self.runs_started
            self._set_busy(True, settings)
            self._thread = threading.Thread(target=self._run, args=(settings,), name="picklescope-explorer",
                                            daemon=True)
            self._thread.start()
            return self._thread

    def offer_workload(self, workload: str) -> None:
        """Select ``workload``: a preset, or the path of a workload file (one written by ``picklescope
        workload from`` or ``picklescope.investigate.capture``), which joins the menu after it is checked."""
        if workload not in self.workload.options:
            spec = load_workload(workload)  # a bad path or file: its one-line error, before the menu changes
            workload = spec.source or workload
            if workload not in self.workload.options:
                self.workload.options = [*self.workload.options, workload]
        self.workload.value = workload

    def run_with(self, **settings: Any) -> threading.Thread | None:
        """Set controls by name (``codec="numpy-legacy"``, ``budget=0.5``, ``workload="my.yaml"``...) and
        press run."""
        if "workload" in settings:
            self.offer_workload(settings.pop("workload"))
        for name, value in settings.items():
            control = getattr(self, name, None)
            if not isinstance(control, widgets.ValueWidget) or control not in self._controls:
                raise PicklescopeError(f"the explorer has no control {name!r}",
                                       "use codec, transport, workload, tracer, scale or budget")
            control.value = value
        return self.start()

    def refresh_codecs(self) -> None:
        """Offer codecs registered since the explorer was made (a %%picklescope_codec cell)."""
        names = CODECS.names()
        if list(self.codec.options) != names:
            value = self.codec.value
            self.codec.options = names
            self.codec.value = value if value in names else names[0]

    def wait(self, timeout: float | None = None) -> RunResult | None:
        """Block until the current run (if any) finishes; returns the newest finished result."""
        t = self._thread
        if t is not None:
            t.join(timeout)
        return self.results[-1] if self.results else None

    def settings(self) -> dict[str, Any]:
        return {"codec": self.codec.value, "transport": self.transport.value, "workload": self.workload.value,
                "scale": float(self.scale.value), "budget": float(self.budget.value), "tracer": self.tracer.value}

    def _run_kwargs(self, s: dict[str, Any]) -> dict[str, Any]:
        """Keyword arguments for ``run`` beyond codec, transport, workload and scale."""
        kw: dict[str, Any] = {}
        if s["budget"] > 0:
            kw["budget"] = f"{s['budget']:g}x"
        if s["tracer"] != DEFAULT_TRACER:
            kw["tracer"] = s["tracer"]
        if self.plugins:
            kw["plugins"] = list(self.plugins)
        return kw

    def _run(self, s: dict[str, Any]) -> None:
        stop = threading.Event()
        redraw: threading.Thread | None = None

        def end_redraws() -> None:
            """Stop the redraw thread and wait for it, so no "running" frame lands after the verdict."""
            stop.set()
            if redraw is not None:
                redraw.join()

        try:
            spec = load_workload(s["workload"])
            payload = spec.payload_bytes(s["scale"])
            kw = self._run_kwargs(s)
            budget = parse_size(kw["budget"]).resolve(payload) if "budget" in kw else None
            live = LiveRun.for_run(s["codec"], s["transport"], spec.name, s["scale"], payload,
                                   budgets={"sender": budget})
            redraw = threading.Thread(target=self._redraw_loop, args=(live, stop, s), daemon=True)
            redraw.start()

            def on_event(ev: dict[str, Any]) -> None:
                live.on_event(ev)
                if ev.get("type") in STATUS_EVENTS:  # a step starts or ends: say so now, not at the next redraw
                    snap = live.snapshot()
                    self.status.value = self._progress(snap, s)

            result = runner.run(s["codec"], s["transport"], s["workload"], s["scale"], on_event=on_event,
                         on_sample=live.on_sample, **kw)
            end_redraws()
            self.results.append(result)
            self._budgets.append(kw.get("budget", "none"))
            self._numbers.append(s["run"])
            if self.run_end_s(result) is None:  # nothing was sampled (it failed to start): say so, no empty axes
                self._say_in_figure(plain_text(self._verdict(result, s["run"])))
            else:
                self._draw(result, final=True)
            self.table.value = results_html(self.results, self._budgets, self._numbers)
            self.last_error = None
            self.status.value = self._verdict(result, s["run"])
        except PicklescopeError as exc:
            end_redraws()
            self.last_error = str(exc)
            self.status.value = f"<b>run {s['run']} could not run</b>: {html.escape(str(exc))}"
            self._say_in_figure(f"run {s['run']} could not run: {exc}")
        except Exception as exc:  # noqa: BLE001 - a widget callback must report, not vanish into a log
            end_redraws()
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
            self.last_error = f"{type(exc).__name__}: {first[:300]}"
            self.status.value = f"<b>run {s['run']} failed</b>: {html.escape(self.last_error)}"
            self._say_in_figure(f"run {s['run']} failed: {self.last_error}")
        finally:
            stop.set()
            self._set_busy(False)

    def _redraw_loop(self, live: LiveRun, stop: threading.Event, s: dict[str, Any]) -> None:
        """Redraw while the run goes. Building a figure costs 0.1-0.4 s of CPU, and on a two-core
        machine the two measured children need both cores, so the pause between redraws is at
        least twice the last redraw's cost: the status line stays current, the run is not slowed."""
        seen = -1
        pause = REDRAW_S
        while not stop.wait(pause):
            if live.version == seen:
                continue
            seen = live.version
            snap = live.snapshot()
            snap.outcome = "running"  # never "ok" before the run has ended
            self.status.value = self._progress(snap, s)
            t0 = time.monotonic()
            try:
                self._draw(snap)
            except Exception:  # noqa: BLE001 - a partial frame that cannot be drawn waits for the next one
                continue
            pause = max(REDRAW_S, 2 * (time.monotonic() - t0))

    def _draw(self, result: RunResult, final: bool = False) -> None:
        """Redraw the figure from ``result``; a partial one with no samples yet leaves the last
        drawing in place, so the figure is never blank while a run starts. The title names the run's
        number, as the status line does."""
        if not final and not any(side.timeline.t_s and side.timeline_baseline_bytes is not None
                                 for side in result.processes.values()):
            return
        fig = timeline_figure(result)
        number = self.runs_started
        if number:
            fig.update_layout(title_text=f"run {number} · {fig.layout.title.text}")
        self._show(fig)

    def _say_in_figure(self, text: str) -> None:
        """Replace the drawing by ``text`` when a run could not run: the figure never shows an older
        run under this run's failure."""
        import plotly.graph_objects as go

        fig = go.Figure(layout={"template": "plotly_white", "height": 200, "xaxis": {"visible": False},
                                "yaxis": {"visible": False},
                                "title": {"text": html.escape(text[:140]), "font": {"size": 14}}})
        self._show(fig)

    def _set_busy(self, busy: bool, s: dict[str, Any] | None = None) -> None:
        if busy and s:  # the status first: it is what the user looks at after pressing run
            self.status.value = (f"<b>running</b> run {s['run']} · {html.escape(s['codec'])} over "
                                 f"{html.escape(s['transport'])} on {html.escape(s['workload'])} x{s['scale']:g}: "
                                 "starting the two processes")
        self.button.description = "running..." if busy else "run"
        self.button.icon = "spinner" if busy else "play"
        for c in self._controls:
            c.disabled = busy
        if busy and s and self.figure.data:  # keep the last drawing, but never under its old verdict
            fig = go_figure(self.figure)
            fig.layout.title.text = (f"running run {s['run']} ({html.escape(s['codec'])}): the last run "
                                     "stays drawn until the first samples of this one arrive")
            self._show(fig)

    @staticmethod
    def _progress(r: RunResult, s: dict[str, Any]) -> str:
        """"running numpy-legacy · sender: consolidate, 31.0 MiB · receiver: waiting for the bytes"."""
        parts = []
        for side in r.processes.values():
            open_steps = [st.name for st in side.steps if st.end_s is None or st.peak_bytes is None]
            rss = side.above(side.timeline.bytes[-1]) if side.timeline.bytes else None
            if open_steps:
                where = open_steps[-1]
            elif side.peak_bytes is not None:
                where = "done"
            elif side.baseline_bytes is None:
                where = "building the batch" if side.name == "sender" else "waiting for the bytes"
            else:
                where = "between steps"
            parts.append(f"{side.name}: {where}" + (f", {fmt_bytes(max(rss, 0))}" if rss is not None else ""))
        return f"<b>running</b> run {s['run']} · {html.escape(s['codec'])} · {html.escape(' · '.join(parts))}"

    @staticmethod
    def run_end_s(r: RunResult) -> float | None:
        """Where the run's timeline ends: its last RSS sample, in seconds since the run started."""
        return max((side.timeline.t_s[-1] for side in r.processes.values() if side.timeline.t_s), default=None)

    @classmethod
    def _verdict(cls, r: RunResult, number: int) -> str:
        """The finished run in one sentence (:func:`picklescope.measure.verdicts.verdict`), with its
        number and where its timeline ends, as the figure draws them."""
        v = verdicts.verdict(r)
        end = cls.run_end_s(r)
        after = f" after {end:.2f} s" if end is not None else ""
        text = f"<b>run {number} · {html.escape(r.codec)} {html.escape(v.ended)}{after}</b>"
        if v.detail:  # the first line: an error from Ray or a library runs to many lines of advice
            first = next((line.strip() for line in v.detail.splitlines() if line.strip()), "")
            text += f": {html.escape(first[:300])}"
        if r.killed_side:
            text += "; this kernel is still running"
        return text

    def summary(self) -> HtmlText:
        """The status line (the last verdict, or why a run could not start) for a cell to show.

        The status widget holds HTML; as a cell's value this renders in Jupyter and prints as plain
        text in a terminal, where printing ``status.value`` would show the tags.
        """
        return HtmlText(self.status.value)

    def clear(self) -> None:
        """Forget finished runs (the figure keeps showing the last one)."""
        if self.running:
            return
        self.results.clear()
        self._budgets.clear()
        self._numbers.clear()
        self.table.value = results_html([], [])
