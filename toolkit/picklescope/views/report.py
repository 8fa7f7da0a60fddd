"""The postmortem: one self-contained HTML file an engineer can attach to a ticket and open offline
(``reproduce``'s and ``postmortem``'s report, and ``predict --out``'s).

Everything is inside the file: plotly.js itself (inlined once), each figure's data as an inline JSON
block, the tables, the stacks, the environment and the command that reproduces it. Nothing is
fetched from the network, so it opens on an air-gapped laptop years later. Figures come from
:mod:`picklescope.views.figures` (drawn from the results, never recomputed here); if a figure cannot be
drawn the report says so where it would have been instead of leaving a silent gap. Every string that
came from the user (workload, codec and file names, error messages, the command) is HTML-escaped.
"""

from __future__ import annotations

import html
import json
import os
import re
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from picklescope.core.result import RunResult
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError
from picklescope.investigate.predict.answer import NO_BASELINES, CodecPrediction
from picklescope.investigate.predict.prediction import fit_modes
from picklescope.investigate.reproduce import (
    Investigation,
    budgeted_results,
    matrix_results,
    node_pair_sentence,
    ray_lane_sentence,
)
from picklescope.measure import verdicts
from picklescope.views import figures, table
from picklescope.views.predict_figure import predict_figure

OWN_FILES = ("report.html", "results.json")

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:2rem auto;max-width:1200px;
color:#1d1d1f;padding:0 1rem}
h1{font-size:1.5rem}h2{font-size:1.2rem;margin-top:2rem;border-bottom:1px solid #ddd;padding-bottom:.2rem}
.headline{font-size:1.15rem;background:#f5f7fa;border-left:4px solid #c0392b;padding:.7rem 1rem}
table{border-collapse:collapse;font-size:.85rem;margin:.5rem 0}th,td{border:1px solid #ddd;padding:.25rem .5rem;
text-align:left}th{background:#f0f0f0}td.num{text-align:right;font-variant-numeric:tabular-nums}
pre{background:#f7f7f7;padding:.6rem;overflow-x:auto;font-size:.8rem}
.note{color:#666;font-style:italic}.missing{color:#a15c00;border:1px dashed #d9a441;padding:.5rem}
.oom-killed,.memory-error{color:#c0392b;font-weight:600}.ok{color:#1e8449;font-weight:600}
.opt{white-space:nowrap}
"""

_LOADER = """
document.querySelectorAll('script[type="application/json"][data-figure]').forEach(function (el) {
  var fig = JSON.parse(el.textContent);
  var cfg = Object.assign({responsive: true, displaylogo: false}, fig.config || {});
  Plotly.newPlot(document.getElementById(el.getAttribute('data-figure')), fig.data, fig.layout || {}, cfg);
});
"""


def e(value: Any) -> str:
    """HTML-escape anything (None shows as a dash)."""
    return "-" if value is None else html.escape(str(value), quote=True)


_OPTION = re.compile(r"--[a-z][a-z-]*")


def sentence(text: str) -> str:
    """A sentence of the answer, escaped, with each command-line option it names kept on one line: a browser may
    break a line after a hyphen, and ``(--`` at one line's end with ``worker-compute`` at the next reads as two
    words."""
    return _OPTION.sub(lambda m: f'<span class="opt">{m.group(0)}</span>', e(text))


def prepare_out_dir(path: str, force: bool = False) -> str:
    """Create ``path`` or check it may be written; a folder holding other files needs ``force``.

    Called before any run, so a refusal costs nothing. Only ``report.html`` and ``results.json`` of a
    previous run are ever replaced.
    """
    if os.path.exists(path) and not os.path.isdir(path):
        raise PicklescopeError(f"--out {path!r} exists and is not a folder", "give a folder path")
    if os.path.isdir(path):
        others = sorted(set(os.listdir(path)) - set(OWN_FILES))
        if others and not force:
            shown = ", ".join(others[:3]) + (" ..." if len(others) > 3 else "")
            raise PicklescopeError(f"--out {path!r} already holds other files ({shown})",
                                   "choose an empty or new folder, or pass --force to write beside them")
    os.makedirs(path, exist_ok=True)
    return path


def _json_for_script(obj: Any) -> str:
    """JSON that cannot end the ``<script>`` element it sits in, whatever strings it holds."""
    text = obj if isinstance(obj, str) else json.dumps(obj)
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


class _Figures:
    """Numbered figure blocks; a figure that fails to draw becomes a visible note with the reason."""

    def __init__(self) -> None:
        self.count = 0

    def block(self, draw: Callable[..., Any], *args: Any, caption: str = "", **kw: Any) -> str:
        why = ""
        fig = None
        try:
            fig = draw(*args, **kw)
        except Exception as exc:  # noqa: BLE001 - any drawing failure becomes a visible note
            why = f"{draw.__name__}() failed: {type(exc).__name__}: {exc}"
        cap = f"<p class='note'>{e(caption)}</p>" if caption else ""
        if fig is None:
            return f"<div class='missing'>Figure unavailable: {e(why)}</div>{cap}"
        self.count += 1
        fid = f"figure-{self.count}"
        return (f"<div id='{fid}' class='figure' style='width:100%;min-height:420px'></div>"
                f"<script type='application/json' data-figure='{fid}'>{_json_for_script(fig.to_json())}</script>"
                f"{cap}")


def _table(rows: list[dict[str, Any]], columns: Iterable[str] | None = None) -> str:
    if not rows:
        return "<p class='note'>(no rows)</p>"
    cols = list(columns or table.columns_of(rows))
    head = "".join(f"<th>{e(c)}</th>" for c in cols)
    body = []
    for r in rows:
        cells = []
        for c in cols:
            v = r.get(c, "")
            s = "" if v is None else str(v)
            # a figure is right-aligned; a sentence that starts with one ("1.000 x payload ...") reads from the left
            figure = len(s) <= 24 and (s[:1].isdigit() or (s[:1] in "+-" and s[1:2].isdigit()))
            cls = " class='num'" if figure else ""
            cells.append(f"<td{cls}>{e(s)}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _label(r: RunResult) -> str:
    b = r.processes["sender"].budget_bytes if "sender" in r.processes else None
    return f"{r.codec} over {r.transport}" + (f" at sender budget {fmt_bytes(b)}" if b else "")


def _readable_path(where: str | None) -> str | None:
    """"picklescope/codecs/numpy_codec.py:51 in encode", not the reporting machine's absolute path: a
    report is read on other machines (the result's JSON keeps the full path)."""
    if not where:
        return where
    for marker in ("/site-packages/", "/toolkit/"):
        if marker in where:
            return where.rsplit(marker, 1)[1]
    return where


def _verdict_block(r: RunResult) -> str:
    out = [f"<h3>{e(_label(r))}: <span class='{e(r.outcome)}'>{e(r.outcome)}</span></h3>"]
    death = fmt_bytes(r.memory_at_death_bytes) if r.memory_at_death_bytes is not None else None
    rows = [("killed side", r.killed_side), ("step", r.killed_in_step),
            ("line", _readable_path(r.killed_at)), ("memory at death (above baseline)", death),
            ("enforcement", r.enforcement), ("why this enforcement", r.enforcement_note)]
    if r.outcome in ("oom-killed", "memory-error"):
        out.append("<table>" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows) + "</table>")
    out.append(f"<p>{e(verdicts.run_sentence(r))}.</p>")
    if r.original_error:
        out.append(f"<p><b>Original error</b> (classified as out-of-memory): <code>{e(r.original_error)}</code></p>")
    if r.stack_note:
        out.append(f"<p class='note'>{e(r.stack_note)}</p>")
    if r.stack_at_death:
        out.append(f"<details><summary>Python stack at death</summary><pre>{e(r.stack_at_death)}</pre></details>")
    return "\n".join(out)


def _headroom_rows(results: list[RunResult]) -> list[dict[str, Any]]:
    rows = []
    for r in results:
        h = r.headroom_detail
        if not h:
            continue
        p = r.payload_bytes
        runs = "; ".join(f"{fmt_bytes(x['budget_bytes'])}: {x['outcome']}"
                         + (f" in {x['killed_in_step']}" if x.get("killed_in_step") else "") for x in h["runs"])
        rows.append({"codec": r.codec, "transport": r.transport,
                     "exact peak": f"{(h['predicted_bytes'] or 0) / p:.3f}x" if h.get("predicted_bytes") is not None
                     else "-",
                     "headroom": "-" if h.get("headroom_bytes") is None else f"{h['headroom_bytes'] / p:.2f}x",
                     "killed at": "-" if h.get("killed_below_bytes") is None else f"{h['killed_below_bytes'] / p:.2f}x",
                     "method": h.get("method") or h.get("error") or "-", "confirming runs": runs})
    return rows


def _tracer_rows(r: RunResult) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per tracer of a traced run (what it saw, overall and in the biggest steps), and its notes."""
    p = r.payload_bytes
    big = sorted((s for s in r.sender.steps if s.added_bytes is not None), key=lambda s: -(s.added_bytes or 0))[:3]
    rows, notes = [], []
    for name, entry in (r.tracers or {}).items():
        if not isinstance(entry, dict):
            continue
        peak = entry.get("peak_bytes")
        row: dict[str, Any] = {"tracer": name, "available": "yes" if entry.get("available") else "no",
                               "peak seen": "-" if peak is None else f"{fmt_bytes(peak)} ({peak / p:.2f}x)" if p
                               else fmt_bytes(peak)}
        seen = entry.get("per_step") or {}
        for st in big:
            v = seen.get(st.name)
            row[f"{st.name} (exact {st.added_bytes / p:.2f}x)" if p else st.name] = (
                "-" if v is None else f"{v / p:.2f}x" if p else fmt_bytes(v))
        row["sees"] = entry.get("sees") or entry.get("description")
        row["why not / caveats"] = entry.get("reason")
        rows.append(row)
        notes += [str(n) for n in entry.get("notes") or []]
    return rows, notes


def run_count_text(inv: Investigation) -> str:
    """How many measured runs the report stands on, by kind: every process pair started counts (the
    repeats of each case and the headroom search's confirming runs too), as the progress bar did."""
    matrix = matrix_results(inv)
    repeats = sum(r.variation.runs if r.variation is not None else 1 for r in matrix)
    headroom = sum(len((r.headroom_detail or {}).get("runs") or []) for r in matrix)
    kinds = [(repeats, f"{len(matrix)} cases" + (f" run {repeats} times in all" if repeats != len(matrix) else "")),
             (headroom, f"{headroom} headroom runs"),
             (len([r for r in inv.results if r.role == "traced"]), "{} with every tracker"),
             (len(budgeted_results(inv)), "{} under the budget"),
             (len(inv.nodes), "{} node replays")]
    total = sum(n for n, _ in kinds)
    shown = [text.format(n) for n, text in kinds if n]
    return f"{total} runs ({', '.join(shown)})" if shown else "no runs"


def _notes_table(notes: list[str]) -> str:
    """The trackers' notes, each said once, folded: the same caveat comes from every traced step."""
    counts: dict[str, int] = {}
    for n in notes:
        counts[n] = counts.get(n, 0) + 1
    rows = [{"note": n, "times": k} for n, k in counts.items()]
    return (f"<details><summary>{len(rows)} notes from the trackers (each once)</summary>"
            f"{_table(rows)}</details>")


def _environment(env: dict[str, Any]) -> str:
    if not env:
        return "<p class='note'>No environment was recorded with these results.</p>"
    rows = [("python", env.get("python"))]
    rows += [(name, v or "not installed") for name, v in (env.get("packages") or {}).items()]
    rows += [("machine memory", fmt_bytes(env.get("machine_memory_bytes"))),
             ("available when run", fmt_bytes(env.get("available_memory_bytes"))),
             ("CPUs", env.get("cpus")), ("platform", env.get("platform")),
             ("exact per-step peaks (VmHWM reset)", env.get("kernel_peak_reset")),
             ("memory cgroup", env.get("memory_cgroup"))]
    return "<table>" + "".join(f"<tr><th>{e(k)}</th><td>{e(v)}</td></tr>" for k, v in rows) + "</table>"


def _node_section(inv: Investigation, figs: _Figures) -> str:
    """The node pair: what the incident looked like (a driver handing every training step's batch to
    worker actors), for the legacy and the fixed codec, on the Ray rows' cluster."""
    sentence = node_pair_sentence(inv)
    if not inv.nodes:
        failed = ray_lane_sentence(inv)
        if failed:
            return f"<p class='missing'>No node replay: {e(failed)}.</p>"
        return f"<p class='note'>{e(sentence or 'No node replay in these results (it runs with the ray rows).')}</p>"
    out = ["<p>A driver splits each training step's batch into one chunk per worker actor and sends each chunk as "
           "a Ray call argument (the chunk's <code>__getstate__</code> runs in the driver); the workers answer with a "
           "small result that the driver joins back together. Both codecs replay on the same driver and workers, "
           "each after as many unmeasured training steps of its own. Memory is above each process's own baseline, as a "
           "multiple of the whole batch's payload. The driver's <i>own</i> memory is what only it holds (the object "
           "store apart); a <i>driver peak</i> is the kernel's exact high-water mark, which also counts object-store "
           "pages the driver maps, and how many depends on where the store places each chunk. The figures stack "
           "each process's own memory and the store, counted once.</p>"]
    if sentence:
        out.append(f"<p class='headline'>{e(sentence)}</p>")
    out.append(_table(table.node_rows(inv.nodes)))
    for r in inv.nodes:
        out.append(figs.block(figures.node_figure, r, caption=f"{r.codec}: the node's memory by process, stacked, "
                              "with the object store and one band per training step; the grey band after the "
                              "steps is what stayed held until the final gc.collect()."))
    return "\n".join(out)


def render(inv: Investigation) -> str:
    """The whole report as one HTML string (plotly.js inlined)."""
    figs = _Figures()
    matrix = matrix_results(inv)
    budgeted = budgeted_results(inv)
    kind = "postmortem" if (inv.command or "").startswith("picklescope postmortem") else "reproduce"
    title = f"picklescope {kind} report: {inv.workload} x{inv.scale:g}"
    payload = inv.payload_bytes or (inv.results[0].payload_bytes if inv.results else None)
    parts = [f"<h1>{e(title)}</h1>",
             f"<p class='note'>Payload {e(fmt_bytes(payload))}; {e(run_count_text(inv))}; written "
             f"{e(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p>",
             f"<p class='headline'>{e(inv.headline or 'No headline was computed for these results.')}</p>"]

    parts.append("<h2>Under a memory budget</h2>")
    if budgeted:
        parts.append(f"<p>Sender budget {e(inv.budget)} payload "
                     f"({e(fmt_bytes(inv.budget_bytes))}) over {e(inv.budget_transport)}"
                     f"{' (given on the command line)' if inv.budget_given else ''}.</p>")
        for r in budgeted:
            parts.append(_verdict_block(r))
            parts.append(figs.block(figures.timeline_figure, r, caption=f"Timeline of {_label(r)}: RSS of both sides, "
                                    "step bands and the budget line; a killed side's curve ends at the kill."))
    else:
        parts.append(f"<p class='note'>{e(inv.budget_note or 'No budgeted run in these results.')}</p>")

    parts.append("<h2>Comparison</h2>")
    ray_failed = ray_lane_sentence(inv)
    if ray_failed:
        parts.append(f"<p class='missing'>{e(ray_failed[:1].upper() + ray_failed[1:])}.</p>")
    parts.append(_table(table.comparison_rows(matrix)))
    repeated = [r for r in matrix if r.variation is not None]
    if repeated:
        runs = max(r.variation.runs for r in repeated)
        varying = [r for r in repeated if r.variation.varies]
        parts.append(f"<p>Each case ran {runs} times in fresh processes; the table shows its worst run. "
                     + ("No exact peak spread by more than 1% of the payload." if not varying else
                        "Some exact peaks took different values from run to run (every reading is exact: the "
                        "allocator's behaviour varies; a budget must cover the largest):") + "</p>")
        if varying:
            parts.append("<ul>" + "".join(f"<li>{e(_label(r))}: {e(table.variation_summary(r))}</li>"
                                          for r in varying) + "</ul>")
    parts.append(figs.block(figures.comparison_figure, matrix, caption="Peak, held and cycle-held memory and time, "
                                                                  "by codec and transport."))
    hr = _headroom_rows(matrix)
    if hr:
        parts.append("<h3>Sender headroom</h3><p>The smallest sender budget each case survives, predicted from "
                     "its worst exact peak and confirmed by one run just above (survives) and one just below (killed, "
                     "unless that run drew a smaller value of a varying peak), to 2% of the payload.</p>")
        parts.append(_table(hr))

    parts.append("<h2>A whole node over training steps</h2>")
    parts.append(_node_section(inv, figs))

    parts.append("<h2>Timelines of the unbudgeted runs</h2>")
    for r in matrix:
        parts.append(f"<details><summary>{e(_label(r))}: {e(r.outcome)}</summary>")
        parts.append(figs.block(figures.timeline_figure, r))
        parts.append(_table(table.steps_rows(r)))
        parts.append("</details>")

    parts.append("<h2>Attribution</h2>")
    attributed = [r for r in inv.results if r.attribution]
    if attributed:
        for r in attributed:
            parts.append(figs.block(figures.attribution_figure, r, caption=f"Where the peak of {_label(r)} came from."))
    else:
        parts.append("<p class='note'>No run in this investigation carried an attribution (it needs an allocation "
                     "tracer such as memray; the default sampler sees totals only). The per-step exact peaks above "
                     "attribute memory to steps.</p>")

    parts.append("<h2>What each tracker saw</h2>")
    traced = [r for r in inv.results if r.role == "traced"]
    for r in traced:
        rows, notes = _tracer_rows(r)
        parts.append(f"<p>{e(_label(r))}, unbudgeted, with every tracker attached. Each tracker's view of the "
                     "whole run and of the biggest steps, as a multiple of the payload, beside the exact kernel "
                     "numbers:</p>")
        parts.append(_table(rows))
        if notes:
            parts.append(_notes_table(notes))
        parts.append(figs.block(figures.timeline_figure, r, show_tracers=True,
                                caption="Each tracker's view drawn over the sampled RSS and the exact step peaks."))
    if not traced:
        parts.append("<p class='note'>Only the default tracker ran: RSS sampled by the parent at about 1 ms plus "
                     "exact per-step kernel peaks (VmHWM). No in-process tracker (tracemalloc, torch.profiler, memray) "
                     "was attached to these runs.</p>")

    parts.append("<h2>Environment</h2>")
    parts.append(_environment(inv.environment or {}))
    parts.append("<h2>Reproduce</h2>")
    cmd = inv.command or reproduce_command(inv)
    parts.append(f"<pre>{e(cmd)}</pre>")

    return _page(title, parts)


def _page(title: str, parts: list[str]) -> str:
    """One self-contained HTML page: plotly.js inlined once, each figure drawn from its inline JSON."""
    from plotly.offline import get_plotlyjs

    body = "\n".join(parts)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{e(title)}</title>"
            f"<style>{_CSS}</style><script>{get_plotlyjs()}</script></head><body>\n{body}\n"
            f"<script>{_LOADER}</script></body></html>")


def reproduce_command(inv: Investigation) -> str:
    """The CLI command that repeats an investigation that was started from Python."""
    import shlex

    workload = inv.workload_source or inv.workload
    args = ["picklescope", "reproduce", "--workload", workload, "--scale", f"{inv.scale:g}"]
    if inv.budget_given and inv.budget:
        args += ["--budget", str(inv.budget)]
    return shlex.join(args)


def write_report(inv: Investigation, path: str) -> str:
    """Write :func:`render` of ``inv`` to ``path``; returns the path."""
    text = render(inv)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


# -- picklescope predict --out ---------------------------------------------------------------------


def prediction_sentence(p: CodecPrediction) -> str:
    """One codec's answer in words: where Ray's monitor would kill and whom, or that the node survives, and the
    largest payload that survives."""
    plane = "" if p.data_plane == "dataproto" else f" (data plane {p.data_plane})"
    text = f"{p.codec}{plane}: {p.verdict_text()}"
    largest = p.largest_text()
    if largest:
        text += f". {largest[0].upper()}{largest[1:]} (this batch: {fmt_bytes(p.payload_bytes)})"
    return text + "."


# the fit's second set of replays under a collector that runs (fit_modes), in the report's header
OFF_TOO = " (each size also with the collector off, for what a training step keeps)"


def _per_codec(preds: Sequence[CodecPrediction], texts: Sequence[str | None]) -> list[str]:
    """One list item per codec that has something to say (``texts``, by prediction), or nothing at all."""
    items = "".join(f"<li>{e(_column(p))}: {sentence(t)}</li>" for p, t in zip(preds, texts) if t)
    return [f"<ul>{items}</ul>"] if items else []


def render_predictions(preds: Sequence[CodecPrediction], workload: str, command: str) -> str:
    """``picklescope predict --out``'s report: the answer per codec in words, the figure, every training step,
    each process's peak, the object store, the model's terms, the checks, and the command."""
    figs = _Figures()
    first = preds[0]
    title = f"picklescope predict report: {workload}"
    node = "no node memory given" if first.node_memory_bytes is None else \
        f"a node of {fmt_bytes(first.node_memory_bytes)}, Ray's threshold {first.threshold:g}"
    parts = [f"<h1>{e(title)}</h1>",
             f"<p class='note'>Payload {e(fmt_bytes(first.payload_bytes))} = {first.payload_bytes / 1e9:.2f} GB "
             f"(batch size {first.rows}), {first.workers} "
             f"workers, {first.steps} training steps, collector {e(first.gc)}; {e(node)}. Predicted by a model "
             f"fitted on node replays at {e(', '.join(first.fitted_on))}"
             f"{OFF_TOO if len(fit_modes(first.gc, first.data_plane)) > 1 else ''}, not measured; written "
             f"{e(time.strftime('%Y-%m-%d %H:%M:%S'))}.</p>",
             "<p class='headline'>" + "<br>".join(e(prediction_sentence(p)) for p in preds) + "</p>",
             *([f"<p class='note'>{e(NO_BASELINES[:1].upper() + NO_BASELINES[1:])}.</p>"]
               if not first.baselines else []),
             figs.block(predict_figure, list(preds),
                        caption="Per codec: the node's total (solid), the controller (dotted) and the object store "
                                "(dashed) at each training step's peak; Ray's threshold and the store's capacity as "
                                "lines; a cross where Ray would kill.")]
    parts.append("<h2>Each process's peak</h2><p class='note'>The controller runs the training loop and holds the "
                 "batch (verl's single controller, its TaskRunner); worker-N are the Ray actors it sends a chunk of "
                 "the batch to at each training step; the store is Ray's object store on the node, which holds the "
                 "chunks on their way.</p>")
    names = list(dict.fromkeys(n for p in preds for n in p.processes))
    parts.append("<ul>" + "".join(
        f"<li>{e(n)}: " + ", ".join(f"{e(_column(p))} {e(fmt_bytes(p.processes[n]))}" for p in preds
                                     if n in p.processes) + "</li>" for n in names) + "</ul>")
    parts += _per_codec(preds, [p.calls_text() for p in preds])
    parts.append("<h2>The object store</h2>")
    parts += _per_codec(preds, [p.store_text().removeprefix("object store: ") for p in preds])
    parts.append("<h2>Every training step</h2><p class='note'>The node's total and the controller at each step's "
                 "peak; a step after Ray's kill is not predicted.</p>")
    steps = sorted({s["index"] for p in preds for s in p.training_steps})
    rows = []
    for k in steps:
        row: dict[str, Any] = {"step": k}
        for p in preds:
            s = next((s for s in p.training_steps if s["index"] == k), None)
            row[f"{_column(p)}: node"] = fmt_bytes(s["node_bytes"]) if s else ""
            row[f"{_column(p)}: controller"] = fmt_bytes(s["controller_bytes"]) if s else ""
        rows.append(row)
    parts.append(_table(rows))
    parts.append("<h2>The model's terms</h2>")
    for p in preds:
        parts.append(f"<h3>{e(_column(p))}</h3>")
        # a table, not preformatted text: a term's value is a sentence, which wraps within the page's width
        parts.append(_table([{"fitted term": f"{r}: {t}", "fitted as": v} for r, t, v in p.terms]))
    checked = [p for p in preds if p.check is not None]
    if checked:
        parts.append("<h2>Checked against a real replay</h2>")
        parts.append("<ul>" + "".join(f"<li>{sentence(p.check_text())} ({e(_column(p))})</li>"
                                      for p in checked) + "</ul>")
    parts.append("<h2>What the model cannot know</h2><p>Everything on the node that is not the batch (model "
                 "weights, optimizer state, rollout engines: give them with --process-baseline), what the workers "
                 "compute, and when Python's collector runs in a process that does more than the replay: see "
                 "docs/predict.md.</p>")
    parts += _per_codec(preds, [p.allocator_text() for p in preds])
    parts += _per_codec(preds, [p.copy_text() for p in preds])
    parts.append("<h2>Reproduce</h2>")
    parts.append(f"<pre>{e(command)}</pre>")
    return _page(title, parts)


def _column(p: CodecPrediction) -> str:
    return p.codec + ("" if p.data_plane == "dataproto" else f" ({p.data_plane})")


def write_predictions(preds: Sequence[CodecPrediction], workload: str, command: str, folder: str) -> str:
    """``report.html`` and ``results.json`` (the ``--json`` list) of a prediction in ``folder``; returns the
    report's path."""
    path = os.path.join(folder, "report.html")
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_predictions(preds, workload, command))
    with open(os.path.join(folder, "results.json"), "w", encoding="utf-8") as f:
        json.dump([p.to_json_dict() for p in preds], f, indent=1)
    return path
