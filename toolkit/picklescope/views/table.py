"""Tables of rows (dicts): aligned text for the terminal, HTML for a notebook (:class:`Table` does both)."""

from __future__ import annotations

import html
import re
from collections.abc import Sequence
from typing import Any

from picklescope.core.result import RunResult
from picklescope.core.units import fmt_bytes


def render(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Align ``rows`` under their keys (or ``columns``), numbers right-aligned.

    Without ``columns`` the columns are the union of every row's keys, in first-seen order, so a
    key only some rows have (``sender headroom``) is never dropped because the first row lacks it.
    """
    if not rows:
        return "(no rows)"
    cols = list(columns) if columns else columns_of(rows)
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]

    def line(values: Sequence[str]) -> str:
        out = []
        for v, w in zip(values, widths):
            numeric = v[:1].isdigit() or v[:1] in "+-" and v[1:2].isdigit()
            out.append(v.rjust(w) if numeric else v.ljust(w))
        return "  ".join(out).rstrip()

    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


def columns_of(rows: Sequence[dict[str, Any]]) -> list[str]:
    """The union of the rows' keys, in the order they are first seen."""
    return list(dict.fromkeys(k for r in rows for k in r))


def _mult(n: int | None, payload: int) -> str:
    if n is None or not payload:
        return "-"
    text = f"{n / payload:.2f}x"
    return "0.00x" if text == "-0.00x" else text  # a few pages under the baseline is none, not a negative size


def _secs(s: float | None) -> str:
    return "-" if s is None else f"{s:.3f}"


def _range(r: RunResult, name: str) -> str:
    """' (varies 2.64-3.00x)' when repeated runs of the case spread by over 1% of the payload."""
    pk = r.variation.peak(name) if r.variation is not None else None
    if pk is None or not pk.varies:
        return ""
    return f" (varies {pk.min / r.payload_bytes:.2f}-{pk.max / r.payload_bytes:.2f}x)"


def comparison_rows(results: Sequence[RunResult]) -> list[dict[str, Any]]:
    """One row per run: the numbers an engineer compares across codecs and transports."""
    rows = []
    for r in results:
        s, v = r.processes.get("sender"), r.processes.get("receiver")
        p = r.payload_bytes
        budget = next((x.budget_bytes for x in (s, v) if x is not None and x.budget_bytes), None)
        row = {
            "codec": r.codec,
            "transport": r.transport,
            "budget": "none" if budget is None else _mult(budget, p),  # bytes: in the figure's budget line
            "outcome": r.outcome + (f" ({r.killed_side}:{r.killed_in_step})" if r.killed_side else ""),
            "sender peak": f"{fmt_bytes(s.peak_bytes) if s else '-'} {_mult(s.peak_bytes if s else None, p)}"
                           + _range(r, "sender"),
            "held": _mult(s.held_bytes if s else None, p),
            "cycle-held": _mult(s.cycle_held_bytes if s else None, p),
            "receiver peak": f"{fmt_bytes(v.peak_bytes) if v else '-'} {_mult(v.peak_bytes if v else None, p)}",
            "serialize s": _secs(r.serialize_s),
            "deserialize s": _secs(r.deserialize_s),
            "round trip": {True: "exact", False: "MISMATCH", None: "-"}[r.roundtrip.get("ok")],
        }
        if r.killed_side in ("sender", "receiver") and r.memory_at_death_bytes is not None:
            # a killed side has no peak (its mark died with it): say what it had reached instead of "-"
            row[f"{r.killed_side} peak"] = f"killed at {fmt_bytes(r.memory_at_death_bytes)} " \
                                           f"{_mult(r.memory_at_death_bytes, p)}"
        if r.killed_side == "sender" and (v is None or v.peak_bytes is None):
            row["receiver peak"] = "never started"
        if r.headroom_detail is not None:  # a case whose headroom was searched
            h = r.headroom_bytes
            row["sender headroom"] = "-" if h is None else f"{h / p:.2f}x"
        rows.append(row)
    return rows


def steps_rows(r: RunResult) -> list[dict[str, Any]]:
    """One row per step of both sides, indented by nesting depth."""
    rows = []
    for side in r.processes.values():
        for st in side.steps:
            rows.append({
                "side": side.name,
                "step": "  " * st.depth + st.name,
                "peak": fmt_bytes(st.peak_bytes),
                "added": fmt_bytes(st.added_bytes, signed=True),
                "x payload": _mult(st.added_bytes, r.payload_bytes),
                "seconds": _secs(st.duration_s),
                **({"error": st.error} if st.error else {}),  # a column only when some step failed
            })
    return rows


def _at_end(n: int | None, payload: int) -> str:
    """Memory at a step's end above the baseline, or "below start" when the process held less than at
    its baseline (it freed set-up memory); a size is never negative."""
    if n is not None and payload and n < 0 and _mult(n, payload) != "0.00x":
        return "below start"
    return _mult(n, payload)


def _signed_mult(n: int | None, payload: int) -> str:
    return "-" if n is None or not payload else f"{n / payload:+.2f}x"


def node_rows(results: Sequence[Any]) -> list[dict[str, Any]]:
    """One row per node replay (a :class:`~picklescope.investigate.node.NodeResult`): what an engineer
    compares across codecs and collector settings. Multiples are of the batch's payload; the driver's
    peak is its exact one (object-store pages it maps included), its own peak the highest sample of its
    private memory; its memory at each training step's end is above its baseline, its growth from the
    first step's end to the last one's."""
    rows = []
    for r in results:
        p = r.payload_bytes
        ends = [s.driver_bytes for s in r.training_steps]
        outcome = r.outcome
        if r.killed is not None:
            k = r.killed
            outcome = f"killed {k.process} in training step {k.training_step}, {k.during()}"
        elif r.outcome != "ok" and r.error:  # a failed run says why, in its own row
            outcome = f"{r.outcome}: {r.error.splitlines()[0][:160]}"
        driver = r.processes.get("driver")
        row = {"codec": r.codec, "gc": r.gc, "outcome": outcome,
               "driver peak": _mult(driver.peak_bytes if driver else None, p),
               "driver own peak": _mult(r.own_peak_bytes("driver") if driver else None, p),
               "node peak": _mult(r.node_peak_bytes, p)}
        if r.budget_bytes:
            row["node budget"] = _mult(r.budget_bytes, p)
        # a driver can end a step a few pages under its baseline (it gave back what set-up had made):
        # that is said as such, never as a negative size
        row["driver at each step's end"] = ", ".join(_at_end(e, p) for e in ends) or "-"
        row["growth"] = _signed_mult(r.driver_growth_bytes, p)
        rows.append(row)
    if any(r.data_plane != "dataproto" for r in results):  # planes side by side
        rows = [{"codec": row["codec"], "data plane": r.data_plane, **row} for row, r in zip(rows, results)]
    return rows


def _natural(name: str) -> tuple[str, int]:
    """worker-2 before worker-10, whatever order the workers connected in."""
    stem = name.rstrip("0123456789")
    return stem, int(name[len(stem):] or -1)


def node_step_rows(r: Any) -> list[dict[str, Any]]:
    """One row per training step of one node replay: the node and every process at the step's end,
    above their baselines, as multiples of the payload (more than 8 workers are summed as one column)."""
    p = r.payload_bytes
    workers = sorted((n for n in r.processes if n != "driver"), key=_natural)
    rows = []
    for s in r.training_steps:
        row: dict[str, Any] = {"training step": s.index,
                               "ended at": "never" if s.end_s is None else f"{s.end_s:.2f} s",
                               "node": _mult(s.node_bytes, p), "driver": _mult(s.driver_bytes, p)}
        held = s.per_process_bytes
        if len(workers) > 8:
            vals = [held[w] for w in workers if w in held]
            row["workers (sum)"] = _mult(sum(vals), p) if vals else "-"
        else:
            for w in workers:
                row[w] = _mult(held.get(w), p)
        row["object store"] = _mult(held.get("store"), p)
        rows.append(row)
    return rows


_NUM_RE = re.compile(r"^[+-]?[\d.,]+(\s?(B|KiB|MiB|GiB|TiB|x|%|s|ms))?(\s\S+)?$")
_CELL = "padding:2px 5px;border-bottom:1px solid #e5e5e5;vertical-align:top"
_UNIT = re.compile(r"(\d) (B|KiB|MiB|GiB|TiB|s|ms)\b")
_NBSP = r"\1&nbsp;\2"


def _numeric(s: str) -> bool:
    return bool(s) and (s[:1].isdigit() or (s[:1] in "+-" and s[1:2].isdigit())) and bool(_NUM_RE.match(s))


def html_table(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, *, caption: str = "",
               folded: Sequence[dict[str, Any]] = (), folded_label: str = "", css_class: str = "") -> str:
    """``rows`` as an HTML table a notebook renders: columns are the union of the rows' keys, numbers
    right-aligned, no cell wraps mid-number; ``folded`` rows go in a collapsed ``<details>`` below.

    Inline styles only, so it reads the same in JupyterLab, an exported notebook and the report.
    """
    esc = html.escape
    if not rows and not folded:
        return f"<p><i>{esc(caption or '(no rows)')}</i></p>"
    cols = list(columns) if columns else columns_of(list(rows) + list(folded))

    def text(v: Any) -> str:
        return "" if v is None else str(v)

    # a column is right-aligned only when every filled cell of it is a number, so a column of text
    # with one number-like value ("python 3.11.7", "cpus 2") does not zig-zag
    every = list(rows) + list(folded)
    filled = {c: [text(r.get(c)) for r in every if text(r.get(c)) not in ("", "-")] for c in cols}
    numeric_cols = {c for c in cols if filled[c] and all(_numeric(v) for v in filled[c])}

    def body(rs: Sequence[dict[str, Any]]) -> str:
        out = []
        for r in rs:
            cells = []
            for c in cols:
                s = text(r.get(c, ""))
                # a number never wraps inside itself ("47.3 MiB" stays whole) but a cell holding two
                # ("47.3 MiB 1.00x") may break between them; long text wraps, so a table fits the page
                align = "right" if c in numeric_cols else ("left;white-space:nowrap" if len(s) <= 16 else "left")
                font = ";font-family:monospace" if c in ("code", "source", "line", "stack") else ""
                if c == cols[0]:
                    font += ";position:sticky;left:0;background:#ffffff"
                shown = _UNIT.sub(_NBSP, esc(s)) if c in numeric_cols else esc(s)  # text stays as written
                cells.append(f"<td style='{_CELL};text-align:{align}{font}'>{shown}</td>")
            out.append("<tr>" + "".join(cells) + "</tr>")
        return "".join(out)

    # headers wrap between words ("serialize s" over two lines) so that many columns fit Lab's width;
    # the first column (what the row is) stays in view if the table still has to scroll sideways
    key = ";position:sticky;left:0;z-index:1"
    head = "".join(f"<th style='{_CELL};text-align:left;background:#f3f3f3;white-space:normal;"
                   f"min-width:3em{key if i == 0 else ''}'>{esc(c)}</th>" for i, c in enumerate(cols))
    cap = f"<caption style='caption-side:top;text-align:left;padding:4px 0'>{esc(caption)}</caption>" if caption else ""
    # JupyterLab's own CSS lays tables out fixed, which clips the last columns of a wide table: auto
    # layout lets long text wrap instead, and the scrolling wrapper keeps every column reachable
    style = "border-collapse:collapse;font-size:12px;margin:4px 0;table-layout:auto"
    cls = f" class='{esc(css_class)}'" if css_class else ""
    # with every row folded, the caption says why; an empty table of headers would say nothing
    table = f"<table{cls} style='{style}'>{cap}<thead><tr>{head}</tr></thead><tbody>{body(rows)}</tbody></table>" \
        if rows else (f"<p style='margin:4px 0'>{esc(caption)}</p>" if caption else "")
    if folded:
        label = folded_label or f"{len(folded)} more rows"
        table += (f"<details><summary>{esc(label)}</summary><table style='{style}'><thead><tr>{head}</tr>"
                  f"</thead><tbody>{body(folded)}</tbody></table></details>")
    return f"<div style='overflow-x:auto;max-width:100%'>{table}</div>"


class Table:
    """Rows that display as an HTML table in a notebook and as aligned text anywhere else."""

    def __init__(self, rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None, *, caption: str = "",
                 folded: Sequence[dict[str, Any]] = (), folded_label: str = "") -> None:
        self.rows, self.columns, self.caption = list(rows), columns, caption
        self.folded, self.folded_label = list(folded), folded_label

    def _repr_html_(self) -> str:
        return html_table(self.rows, self.columns, caption=self.caption, folded=self.folded,
                          folded_label=self.folded_label)

    def __str__(self) -> str:
        text = (self.caption + "\n" if self.caption else "") + render(self.rows, self.columns)
        if self.folded:
            text += f"\n({self.folded_label or f'{len(self.folded)} more rows'} folded)"
        return text

    def __repr__(self) -> str:
        return str(self)


def variation_rows(r: RunResult) -> list[dict[str, Any]]:
    """One row per exact peak of a repeated case (``run --repeat N``): min / median / max over the runs."""
    v = r.variation
    if v is None:
        return []
    p = v.payload_bytes
    return [{
        "peak": pk.name,
        "runs": len(pk.values),
        "min": _mult(pk.min, p),
        "median": _mult(round(pk.median), p),
        "max": _mult(pk.max, p),
        "spread": _mult(pk.max - pk.min, p),
        "varies": "VARIES" if pk.varies else "",
    } for pk in v.peaks]


def variation_summary(r: RunResult) -> str:
    """One sentence on a repeated case: does its sender peak vary, and between which values."""
    v = r.variation
    if v is None:
        return ""
    pk = v.peak("sender")
    if pk is None:
        return f"{v.runs} runs; no sender peak was measured ({', '.join(v.outcomes)})"
    p = v.payload_bytes
    counts: dict[str, int] = {}
    for value in pk.values:
        key = _mult(value, p)
        counts[key] = counts.get(key, 0) + 1
    seen = ", ".join(f"{k} in {n} of {len(pk.values)}" for k, n in sorted(counts.items()))
    if not pk.varies:
        return (f"sender peak {_mult(pk.max, p)} payload in all {len(pk.values)} runs "
                f"(spread {_mult(pk.max - pk.min, p)}, under 1% of the payload)")
    return (f"sender peak VARIES from run to run: {seen} (min {_mult(pk.min, p)}, max {_mult(pk.max, p)}); "
            f"every reading is exact, the phenomenon varies: budget for the max (docs/varying_peaks.md)")
