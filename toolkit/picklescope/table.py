"""Plain-text tables for the terminal: rows of dicts in, aligned text out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .result import RunResult
from .units import fmt_bytes


def render(rows: Sequence[dict[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Align ``rows`` under their keys (or ``columns``), numbers right-aligned."""
    if not rows:
        return "(no rows)"
    cols = list(columns or rows[0].keys())
    cells = [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(row[i]) for row in cells)) for i, c in enumerate(cols)]

    def line(values: Sequence[str]) -> str:
        out = []
        for v, w in zip(values, widths):
            numeric = v[:1].isdigit() or v[:1] in "+-" and v[1:2].isdigit()
            out.append(v.rjust(w) if numeric else v.ljust(w))
        return "  ".join(out).rstrip()

    return "\n".join([line(cols), line(["-" * w for w in widths])] + [line(r) for r in cells])


def _mult(n: int | None, payload: int) -> str:
    return "-" if n is None or not payload else f"{n / payload:.2f}x"


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
        s, v = r.sides.get("sender"), r.sides.get("receiver")
        p = r.payload_bytes
        row = {
            "codec": r.codec,
            "transport": r.transport,
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
        if "headroom" in r.extra:
            h = r.extra["headroom"]
            row["sender headroom"] = "-" if h is None else f"{h / p:.2f}x"
        rows.append(row)
    return rows


def steps_rows(r: RunResult) -> list[dict[str, Any]]:
    """One row per step of both sides, indented by nesting depth."""
    rows = []
    for side in r.sides.values():
        for st in side.steps:
            rows.append({
                "side": side.name,
                "step": "  " * st.depth + st.name,
                "peak": fmt_bytes(st.peak_bytes),
                "added": fmt_bytes(st.added_bytes, signed=True),
                "x payload": _mult(st.added_bytes, r.payload_bytes),
                "seconds": _secs(st.duration_s),
                "error": st.error or "",
            })
    return rows


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
