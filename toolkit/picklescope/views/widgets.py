"""The explorer: pick a codec, transport, workload, tracer, scale and budget, press run, watch.

Every run goes through :func:`picklescope.run`, so the batch lives in two child processes and an
out-of-memory kill (a budget, or the real OOM killer) ends a child, never the kernel. The run happens
in a background thread so the kernel stays responsive; a second thread redraws the timeline about
five times a second from what has streamed in (steps from the children's events, RSS from the
parent's samples), updating the one :class:`plotly.graph_objects.FigureWidget` in place. Each
finished run is appended to a comparison table, so switching codecs builds a side-by-side.
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
from picklescope.measure import verdicts
from picklescope.transports import TRANSPORTS
from picklescope.views import table
from picklescope.views.live import LiveRun
from picklescope.views.richtext import HtmlText
from picklescope.workloads.spec import available_workloads, load_workload

# child events that move a side to another step: the status line follows each one as it arrives
STATUS_EVENTS = frozenset({"baseline", "step_start", "step_end"})
REDRAW_S = 0.2
DEFAULT_TRACER = "sampler"


def tracer_names() -> list[str]:
    """Every registered tracer, the always-on sampler first, then "all"."""
    from picklescope.tracers import TRACERS

    names = list(TRACERS.names())
    return [DEFAULT_TRACER, *(n for n in names if n != DEFAULT_TRACER), "all"]


def sync_figure(target: Any, source: Any) -> None:
    """Make the FigureWidget ``target`` show ``source`` by updating it in place.

    Traces keep their identity when the new figure has the same traces (names and types), so the
    browser restyles instead of re-creating the plot; otherwise they are replaced.
    """
    same = [(t.type, t.name) for t in target.data] == [(t.type, t.name) for t in source.data]
    if same:
        with target.batch_update():
            for old, new in zip(target.data, source.data):
                old.update(new.to_plotly_json(), overwrite=True)
            target.update_layout(source.layout.to_plotly_json(), overwrite=True)
        return
    target.data = ()
    target.add_traces(list(source.data))
    target.update_layout(source.layout.to_plotly_json(), overwrite=True)


def results_html(results: list[RunResult], budgets: list[str]) -> str:
    """The comparison table of every finished run, newest last, as an HTML table.

    A killed side has no peak (the kernel's mark dies with the process), so its peak cell says where
    it was killed, the memory it had reached and the budget instead of a dash."""
    if not results:
        return "<i>No runs yet: press run.</i>"
    rows = table.comparison_rows(results)
    for i, (row, r, b) in enumerate(zip(rows, results, budgets), start=1):
        row_head = {"#": i, "workload": f"{r.workload} x{r.scale:g}", "payload": fmt_bytes(r.payload_bytes),
                    "budget": b, "tracer": r.tracer}
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
        self.figure = go.FigureWidget()
        self.table = widgets.HTML(results_html([], []))
        self.results: list[RunResult] = []
        self._budgets: list[str] = []
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
            self.figure,
            self.table,
        ])

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
        try:
            spec = load_workload(s["workload"])
            payload = spec.payload_bytes(s["scale"])
            kw = self._run_kwargs(s)
            budget = parse_size(kw["budget"]).resolve(payload) if "budget" in kw else None
            live = LiveRun.for_run(s["codec"], s["transport"], spec.name, s["scale"], payload,
                                   budgets={"sender": budget})
            redraw = threading.Thread(target=self._redraw_loop, args=(live, stop, s), daemon=True)
            redraw.start()
            from picklescope.measure.runner import run

            def on_event(ev: dict[str, Any]) -> None:
                live.on_event(ev)
                if ev.get("type") in STATUS_EVENTS:  # a step starts or ends: say so now, not at the next redraw
                    snap = live.snapshot()
                    self.status.value = self._progress(snap, s)

            result = run(s["codec"], s["transport"], s["workload"], s["scale"], on_event=on_event,
                         on_sample=live.on_sample, **kw)
            stop.set()
            redraw.join()
            self.results.append(result)
            self._budgets.append(kw.get("budget", "none"))
            self._draw(result, final=True)
            self.table.value = results_html(self.results, self._budgets)
            self.last_error = None
            self.status.value = self._verdict(result)
        except PicklescopeError as exc:
            self.last_error = str(exc)
            self.status.value = f"<b>cannot run</b>: {html.escape(str(exc))}"
        except Exception as exc:  # noqa: BLE001 - a widget callback must report, not vanish into a log
            self.last_error = f"{type(exc).__name__}: {exc}"
            self.status.value = f"<b>error</b>: {html.escape(self.last_error)}"
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
        drawing in place, so the figure is never blank while a run starts."""
        from picklescope.views.figures import timeline_figure

        if not final and not any(side.timeline.t_s and side.baseline_bytes is not None
                                 for side in result.sides.values()):
            return
        sync_figure(self.figure, timeline_figure(result))

    def _set_busy(self, busy: bool, s: dict[str, Any] | None = None) -> None:
        for c in self._controls:
            c.disabled = busy
        self.button.description = "running..." if busy else "run"
        self.button.icon = "spinner" if busy else "play"
        if busy and s:
            if self.figure.data:  # keep the last drawing, but never under its old verdict
                self.figure.layout.title.text = (f"running {html.escape(s['codec'])}: the last run stays drawn "
                                                 "until the first samples of this one arrive")
            self.status.value = (f"<b>running</b> {html.escape(s['codec'])} over {html.escape(s['transport'])} on "
                                 f"{html.escape(s['workload'])} x{s['scale']:g}: starting the two processes")

    @staticmethod
    def _progress(r: RunResult, s: dict[str, Any]) -> str:
        """"running numpy-legacy · sender: consolidate, 31.0 MiB · receiver: waiting for the bytes"."""
        parts = []
        for side in r.sides.values():
            open_steps = [st.name for st in side.steps if st.end_s is None or st.peak_bytes is None]
            rss = side.timeline.rss_bytes[-1] - side.baseline_bytes if side.timeline.rss_bytes and \
                side.baseline_bytes is not None else None
            if open_steps:
                where = open_steps[-1]
            elif side.peak_bytes is not None:
                where = "done"
            elif side.baseline_bytes is None:
                where = "building the batch" if side.name == "sender" else "waiting for the bytes"
            else:
                where = "between steps"
            parts.append(f"{side.name}: {where}" + (f", {fmt_bytes(max(rss, 0))}" if rss is not None else ""))
        return f"<b>running</b> {html.escape(s['codec'])} · {html.escape(' · '.join(parts))}"

    @staticmethod
    def _verdict(r: RunResult) -> str:
        """The finished run in one sentence (:func:`picklescope.measure.verdicts.verdict`)."""
        v = verdicts.verdict(r)
        text = f"<b>{html.escape(r.codec)} {html.escape(v.ended)}</b>"
        if v.detail:
            text += f": {html.escape(v.detail)}"
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
        self.table.value = results_html([], [])
