"""Say in words what each tracer saw of the steps that cost memory, next to the kernel's exact figure.

A number next to a number is easy to misread; "tracemalloc saw 0.0% of the payload in consolidate,
where the kernel measured 1.02x" is not. Each note compares a tracer's view of one step (what its
series rose by inside the step) with the exact ``added_bytes`` of that step from ``VmHWM``.
"""

from __future__ import annotations

from typing import Any

from ..result import RunResult
from ..units import fmt_bytes

BIG_STEP = 0.10  # steps adding at least this fraction of the payload get a note
BLIND = 0.01  # a tracer that saw less than this fraction of the payload is blind to the step
PARTIAL = 0.5  # ... and one that saw less than half of the exact figure saw only part of it


def _first_steps(result: RunResult, side: str) -> list[Any]:
    seen, out = set(), []
    for st in result.sides[side].steps:
        if st.name not in seen:
            seen.add(st.name)
            out.append(st)
    return out


def step_note(tracer: str, entry: dict[str, Any], side: str, step: str, seen: int | None, exact: int,
              payload: int) -> str:
    """One sentence: what ``tracer`` saw in ``step`` against the exact figure."""
    where = f"{side} step '{step}'"
    truth = f"the kernel measured {fmt_bytes(exact, signed=True)} ({exact / payload:.2f}x payload)"
    if seen is None:
        return f"{tracer} took no reading inside {where}, where {truth}: the step is shorter than its sampling."
    pct = 100.0 * seen / payload
    said = f"{tracer} saw {fmt_bytes(seen, signed=True)} ({pct:.1f}% of payload) in {where}, where {truth}"
    if seen < BLIND * payload:
        return f"{said}: it is blind to this memory ({entry.get('sees', '')})."
    if seen < PARTIAL * exact:
        return f"{said}: it saw only part of it."
    return f"{said}: it saw it."


def add_notes(result: RunResult) -> None:
    """Put ``notes`` (a list of sentences) into every available tracer's entry."""
    payload = result.payload_bytes
    for name, entry in result.tracers.items():
        notes: list[str] = []
        if not entry.get("available"):
            notes.append(f"{name} is not available here: {entry.get('reason')}")
            entry["notes"] = notes
            continue
        for side_name, view in entry.get("sides", {}).items():
            if side_name not in result.sides or not payload:
                continue
            steps_seen = view.get("per_step") or {}
            for st in _first_steps(result, side_name):
                if st.added_bytes is None or st.added_bytes < BIG_STEP * payload or st.name not in steps_seen:
                    continue
                notes.append(step_note(name, entry, side_name, st.name, steps_seen[st.name], st.added_bytes,
                                       payload))
        entry["notes"] = notes


def report_lines(result: RunResult) -> list[str]:
    """The tracer section of a text report: availability, peak seen, then the notes."""
    lines = []
    p = result.payload_bytes
    for name, entry in result.tracers.items():
        if entry.get("available"):
            peak = entry.get("peak_bytes")
            ratio = f" ({peak / p:.2f}x payload)" if peak is not None and p else ""
            extra = f"; {entry['reason']}" if entry.get("reason") else ""
            lines.append(f"{name}: peak seen {fmt_bytes(peak)}{ratio}{extra}")
        else:
            lines.append(f"{name}: not available - {entry.get('reason')}")
        lines += [f"  - {n}" for n in entry.get("notes", []) if entry.get("available")]
    return lines


def tracer_report(result: RunResult, rows: int = 5) -> str:
    """Text for the terminal: each tracer's view and notes, then the largest attribution rows."""
    lines = ["tracers:"] + ["  " + line for line in report_lines(result)]
    p = result.payload_bytes
    if result.attribution:
        lines.append(f"largest allocations live at the peak ({result.attribution[0].get('tracer', 'memray')}):")
        for r in result.attribution[:rows]:
            ratio = f" ({r['bytes'] / p:.2f}x payload)" if p else ""
            lines.append(f"  {fmt_bytes(r['bytes'])}{ratio} {r['side']} step {r['step'] or '(outside steps)'}")
            lines += [f"      {frame}" for frame in r["stack"][:4]]
    return "\n".join(lines)
