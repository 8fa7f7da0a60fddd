"""Say in words what each tracer saw of the steps that cost memory, next to the kernel's exact figure.

A number next to a number is easy to misread; "tracemalloc saw 0.0% of the payload in consolidate,
where the kernel measured 1.02x" is not. Each note compares a tracer's view of one step (what its
series rose by inside the step) with the exact ``added_bytes`` of that step from ``VmHWM``.
"""

from __future__ import annotations

from typing import Any

from picklescope.core.result import RunResult
from picklescope.core.units import fmt_bytes

BIG_STEP = 0.10  # steps adding at least this fraction of the payload get a note
BLIND = 0.01  # a tracer that saw less than this fraction of the payload is blind to the step
PARTIAL = 0.5  # ... and one that saw less than half of the exact figure saw only part of it


def _first_steps(result: RunResult, side: str) -> list[Any]:
    seen, out = set(), []
    for st in result.processes[side].steps:
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
        return (f"{tracer} took no reading inside {where} or at its end, where {truth}: it did not look at the step "
                "(one shorter than its sampling interval, or a sampling thread not scheduled on a busy machine).")
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
            if side_name not in result.processes or not payload:
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
    attributed = attribution_rows(result)
    if attributed:
        lines.append(f"largest allocations live at the peak ({attributed[0].get('tracer') or 'memray'}):")
        for r in attributed[:rows]:
            ratio = f" ({r['bytes'] / p:.2f}x payload)" if p else ""
            where = f" {r['side']} in step {r['step']}" if r.get("step") else ""
            lines.append(f"  {fmt_bytes(r['bytes'])}{ratio}{where}")
            lines += [f"      {frame}" for frame in r["stack"][:4]]
    return "\n".join(lines)


# -- tables for reading ------------------------------------------------------------------------------
# frames of the toolkit's own instrumentation (step markers, tracer plumbing, the child runner) and
# of the profilers: an allocation made only there is the measurement's cost, not the serialization's
OWN_FRAMES = ("picklescope/core/steps.py", "picklescope/tracers/", "picklescope/measure/child.py",
              "picklescope/measure/launcher.py",
              "picklescope/verl/envs.py", "multiprocessing/", "torch/profiler/", "torch/autograd/profiler.py",
              "memray/", "<frozen importlib")
ATTRIBUTION_SHARE = 0.01  # allocations of at least this share of the payload get a row of their own
COVER = 0.99  # without a payload: the largest rows that together cover this share of the bytes


def _own(frame: str) -> bool:
    return any(mark in frame for mark in OWN_FRAMES)


def attribution_rows(result: RunResult) -> list[dict[str, Any]]:
    """The allocations live at the peak worth reading: each of at least 1% of the payload (or,
    without a payload, the largest covering 99% of the bytes), the rest summed as one "other" row.

    Allocations made outside any step (imports, a profiler starting) or only by the toolkit's own
    instrumentation are left out, and so are those frames inside a stack: what remains is the code
    that serialized the batch.
    """
    p = result.payload_bytes
    kept: list[dict[str, Any]] = []
    for r in result.attribution or []:
        stack = [f for f in r.get("stack", []) if not _own(f)]
        if not r.get("step") or not stack:
            continue
        kept.append({**r, "stack": stack})
    kept.sort(key=lambda r: -int(r["bytes"]))
    total = sum(int(r["bytes"]) for r in kept)
    if p:
        big = [r for r in kept if r["bytes"] >= ATTRIBUTION_SHARE * p]
    else:
        big, covered = [], 0
        for r in kept:
            if covered >= COVER * total:
                break
            big.append(r)
            covered += int(r["bytes"])
    rest = kept[len(big):]
    if rest:
        big.append({"bytes": sum(int(r["bytes"]) for r in rest), "side": "", "step": "",
                    "stack": [f"other: {len(rest)} smaller allocations"], "tracer": rest[0].get("tracer", "")})
    return big


def tracker_table(result: RunResult) -> list[dict[str, Any]]:
    """One row per costly step (side x step): the kernel's exact figure next to what each tracker saw.

    Costly means adding at least 10% of the payload; the cells are multiples of the payload, "-"
    where a tracker took no reading inside the step.
    """
    p = result.payload_bytes
    if not p:
        return []
    names = [n for n, e in result.tracers.items() if e.get("available")]
    rows = []
    for side_name in result.processes:
        for st in _first_steps(result, side_name):
            if st.added_bytes is None or st.added_bytes < BIG_STEP * p:
                continue
            row: dict[str, Any] = {"side": side_name, "step": st.name,
                                   "kernel (exact)": f"{st.added_bytes / p:.2f}x"}
            for n in names:
                per = (result.tracers[n].get("sides", {}).get(side_name) or {}).get("per_step") or {}
                seen = per.get(st.name)
                row[n] = "-" if seen is None else f"{seen / p:.2f}x"
            rows.append(row)
    return rows


def blind_spots(result: RunResult) -> list[str]:
    """One sentence per tracker that missed a costly step: which steps, and why it cannot see them."""
    p = result.payload_bytes
    out = []
    for n, entry in result.tracers.items():
        if not entry.get("available"):
            out.append(f"{n} could not run here: {entry.get('reason')}.")
            continue
        missed = []
        for side_name in result.processes:
            per = (entry.get("sides", {}).get(side_name) or {}).get("per_step") or {}
            for st in _first_steps(result, side_name):
                if st.added_bytes is None or not p or st.added_bytes < BIG_STEP * p or st.name not in per:
                    continue
                seen = per[st.name]
                if seen is not None and seen < BLIND * p:
                    missed.append(f"the {side_name}'s {st.name}, which added {st.added_bytes / p:.2f}x payload "
                                  f"(it saw {seen / p:.2f}x)")
        if missed:
            why = entry.get("sees") or "it does not see this kind of memory"
            out.append(f"{n} saw almost nothing of {'; '.join(missed)}: it sees {why}.")
    return out
