"""A confirm report as terminal text: the side-by-side table, the step-through, old blobs, verdict.

Only formatting: every figure comes from the :class:`~picklescope.investigate.confirm.ConfirmReport`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from picklescope.core.units import fmt_bytes
from picklescope.investigate.confirm import ConfirmReport, Role, side_by_side
from picklescope.views import table

_OWN = str(Path(__file__).resolve().parents[1])  # the picklescope package: instrumentation, not the code judged


def _where(row: dict[str, Any]) -> str:
    return f"{Path(row['file']).name}:{row['line']} `{row['source']}`"


def _trace_lines(role: Role, payload: int) -> list[str]:
    t = role.trace
    if not t.get("available"):
        return [f"  {role.name}: line-by-line trace not available ({t.get('reason')})"]
    out = []
    for method, m in t["methods"].items():
        head = f"  {role.name} {method}:"
        if m.get("outcome") != "ok":
            out.append(f"{head} trace {m.get('outcome')}: {m.get('error')}")
            continue
        top = m.get("top_line_in_code")
        peak = fmt_bytes(m.get("peak_bytes"))
        if top is None or top["added_bytes"] < 0.01 * payload:
            out.append(f"{head} no line added 1% of the payload or more (peak {peak}, {m['lines']} lines traced)")
        else:
            out.append(f"{head} {_where(top)} added {fmt_bytes(top['added_bytes'])} "
                       f"({top['added_bytes'] / payload:.2f}x payload; peak {peak})")
            deeper = m.get("culprit")
            moved = deeper and (deeper["file"], deeper["line"]) != (top["file"], top["line"])
            if moved and not deeper["file"].startswith(_OWN):  # our wrappers are not the culprit
                out.append(f"      inside it: {_where(deeper)} +{fmt_bytes(deeper['added_bytes'])}")
    return out


def _blob_lines(rep: ConfirmReport) -> list[str]:
    if rep.blob_error:
        return [f"  not checked: {rep.blob_error}"]
    if not rep.blobs:
        return ["  none checked"]
    out = []
    for b in rep.blobs:
        if b["ok"]:
            state = "loads, contents exact"
        elif b["error"]:
            state = f"FAILS: {b['error']}"
        else:
            state = "loads but differs: " + "; ".join(b["problems"])
        out.append(f"  {b['file']} ({b['mode']} mode, written by verl {b['written_by']}): {state}")
    return out


def render(rep: ConfirmReport, source: bool = False) -> str:
    """The whole report; ``source`` adds each function's listing with the consolidate calls marked."""
    b, c = rep.baseline, rep.candidate
    patched = c.verl_info.get("patched") or []
    what = (f"patch {c.patch} ({', '.join(patched)})" if c.patch else
            f"checkout {c.verl_info.get('verl_source')}")
    lines = [
        f"baseline {b.codec} vs candidate {c.codec} [{what}]",
        f"workload {rep.workload} x{rep.scale:g} (payload {fmt_bytes(rep.payload_bytes)}) over {rep.transport}, "
        "each in fresh sender and receiver processes",
        "",
        table.render(side_by_side(rep)),
        "",
        "step-through (line by line, exact kernel peak per line):",
        *_trace_lines(b, rep.payload_bytes),
        *_trace_lines(c, rep.payload_bytes),
        "",
        f"reference blobs loaded by the candidate's __setstate__ ({len(rep.blobs)}):",
        *_blob_lines(rep),
    ]
    if source:
        for role in (b, c):
            for name, listing in role.sources.items():
                lines += ["", f"{role.name} {name} (>> marks where consolidate ran, measured):", *listing]
    lines += ["", f"verdict: {rep.verdict}"]
    return "\n".join(lines)
