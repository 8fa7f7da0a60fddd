"""Headroom: the smallest sender budget a codec survives, as a multiple of the payload.

Searching blindly would cost a dozen budgeted runs per codec. The exact peak (``VmHWM``) of one
unbudgeted run already predicts the answer, because the watchdog kills on that same quantity; so the
prediction is only *confirmed*: one run with a budget just above the peak (it must survive) and one
just below (it must be killed), half the resolution (1% of payload) each side. Only if the run above
is killed, or the one below survives while no measured run peaked higher, does a bisection take over,
down to the same resolution. Every run that decided the answer is kept in :attr:`Headroom.runs`.

Some peaks vary from run to run (in-band pickle: two exact values, see docs/varying_peaks.md). The
headroom is the budget the *worst* run survives: the prediction is the largest exact peak of
``repeat`` unbudgeted runs, and a run just below it that survives because it drew the smaller value
does not lower the answer (a run that peaked higher would have been killed there).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from picklescope.core.result import VARIES_FRACTION, RunResult
from picklescope.core.units import Size, fmt_bytes
from picklescope.measure.runner import run
from picklescope.workloads import spec as workload_spec
from picklescope.workloads.spec import require_tensor_payload

RESOLUTION = 0.02  # of the payload
MAX_RUNS = 16
REPEAT = 3  # unbudgeted runs behind a prediction: the worst of them decides


@dataclass
class Headroom:
    """The answer and the runs behind it; all sizes are bytes above the sender's baseline."""

    codec: str
    transport: str
    workload: str
    scale: float
    payload_bytes: int
    resolution_bytes: int
    predicted_bytes: int | None = None  # the largest exact peak of the unbudgeted runs
    peak_min_bytes: int | None = None  # the smallest, when several were run: the case's range
    varies: bool = False  # the unbudgeted peaks, or a confirmation, showed the peak varies by over 1% of payload
    headroom_bytes: int | None = None  # smallest budget confirmed to survive
    killed_below_bytes: int | None = None  # largest budget confirmed to be killed (None: none tried)
    method: str = ""  # "prediction confirmed" | "bisection" | "" (no answer)
    runs: list[dict[str, Any]] = field(default_factory=list)  # budget, outcome, killed_in_step per run
    error: str | None = None

    @property
    def multiple(self) -> float | None:
        """Headroom as a multiple of the payload (the number the comparison table shows)."""
        return None if self.headroom_bytes is None else self.headroom_bytes / self.payload_bytes

    def describe(self) -> str:
        if self.headroom_bytes is None:
            return f"{self.codec} over {self.transport}: no headroom found ({self.error})"
        below = ("" if self.killed_below_bytes is not None
                 else ", needs less than the resolution: nothing smaller to kill")
        varies = ""
        if self.varies and self.peak_min_bytes is not None and self.predicted_bytes is not None:
            varies = (f"; its peak varies from run to run ({self.peak_min_bytes / self.payload_bytes:.2f}x to "
                      f"{self.predicted_bytes / self.payload_bytes:.2f}x): the headroom covers the worst")
        elif self.varies:
            varies = "; its peak varies from run to run: the headroom covers the worst run seen"
        return (f"{self.codec} over {self.transport}: survives a sender budget of {self.multiple:.2f}x payload "
                f"({fmt_bytes(self.headroom_bytes)}), {self.method}{below}{varies}")

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["multiple"] = self.multiple
        return d


def _summary(r: RunResult, budget: int) -> dict[str, Any]:
    return {"budget_bytes": budget, "outcome": r.outcome, "killed_side": r.killed_side,
            "killed_in_step": r.killed_in_step, "sender_peak_bytes": r.sender.peak_bytes,
            "wall_s": r.wall_s, "error": r.error if r.outcome not in ("ok", "oom-killed") else None}


def find_headroom(
    codec: str,
    transport: str = "pickle5-oob",
    workload: str = "flowgrpo",
    scale: float = 0.25,
    *,
    peak_bytes: int | None = None,
    peak_min_bytes: int | None = None,
    repeat: int = REPEAT,
    resolution: float = RESOLUTION,
    on_run: Callable[[str], None] | None = None,
    **run_kw: Any,
) -> Headroom:
    """Smallest sender budget ``codec`` survives over ``transport``, to ``resolution`` x payload.

    ``peak_bytes`` is the largest exact sender peak of unbudgeted runs of the same case if they were
    already measured (``reproduce`` passes it, and ``peak_min_bytes`` the smallest); otherwise
    ``repeat`` of them are run first. ``on_run`` is told before each run.
    """


    payload = workload_spec.load_workload(workload).payload_bytes(scale)
    require_tensor_payload(payload, "a headroom (a budget as a multiple of the payload)")
    res = max(1, math.ceil(resolution * payload))
    h = Headroom(codec, transport, workload_spec.load_workload(workload).name, scale, payload, res)

    def budgeted(budget: int) -> str:
        if on_run:
            on_run(f"{codec} over {transport} at {fmt_bytes(budget)}")
        r = run(codec, transport, workload, scale, budget=Size(bytes=budget), **run_kw)
        h.runs.append(_summary(r, budget))
        if r.outcome == "ok":
            return "survived"
        if r.outcome == "oom-killed" and r.killed_side == "sender":
            return "killed"
        h.error = f"a run at {fmt_bytes(budget)} ended {r.outcome}: {r.error}"
        return "failed"

    if peak_bytes is None:
        if on_run:
            on_run(f"{codec} over {transport} (exact peak, {repeat} run{'s' if repeat != 1 else ''})")
        first = run(codec, transport, workload, scale, repeat=repeat, **run_kw)
        if first.outcome != "ok" or first.sender.peak_bytes is None:
            h.error = f"the unbudgeted run ended {first.outcome}: {first.error}"
            return h
        peak_bytes = first.sender.peak_bytes  # the worst of the runs
        seen = first.variation.peak("sender") if first.variation is not None else None
        peak_min_bytes = seen.min if seen is not None else peak_bytes
    h.predicted_bytes = peak_bytes
    h.peak_min_bytes = peak_min_bytes
    if peak_min_bytes is not None and peak_bytes - peak_min_bytes > VARIES_FRACTION * payload:
        h.varies = True
    above = max(peak_bytes, 0) + res // 2
    below = peak_bytes - res // 2 if peak_bytes - res // 2 > 0 else None
    hi_ok = budgeted(above)
    if hi_ok == "failed":
        return h
    lo_ok = budgeted(below) if below is not None else "killed"
    if lo_ok == "failed":
        return h
    if hi_ok == "survived" and lo_ok == "killed":
        h.headroom_bytes, h.killed_below_bytes, h.method = above, below, "prediction confirmed"
        return h
    if hi_ok == "survived" and lo_ok == "survived":
        # A budget below a measured exact peak was survived: this run drew a smaller peak than the
        # worst measured one (a budget only kills, it changes no allocation), so the peak varies even
        # if the unbudgeted runs drew one value. The worst run needs `above`; lower would not cover it.
        drawn = h.runs[-1].get("sender_peak_bytes")
        h.varies = True
        if drawn is not None:
            h.peak_min_bytes = min(h.peak_min_bytes if h.peak_min_bytes is not None else drawn, drawn)
        h.headroom_bytes, h.method = above, "worst run confirmed"
        return h
    return _bisect(h, budgeted, above, hi_ok, below, lo_ok, res)


def _bisect(h: Headroom, budgeted: Callable[[int], str], above: int, hi_ok: str, below: int | None,
            lo_ok: str, res: int) -> Headroom:
    """The prediction was wrong: bracket the answer, then halve the bracket down to the resolution."""
    h.method = "bisection"
    lo: int | None = below if lo_ok == "killed" else None
    hi: int | None = above if hi_ok == "survived" else None
    if hi is None:  # even above the peak it was killed: widen upwards
        lo, step = above, res
        while hi is None and len(h.runs) < MAX_RUNS:
            outcome = budgeted(lo + step)
            if outcome == "failed":
                return h
            if outcome == "survived":
                hi = lo + step
            else:
                lo, step = lo + step, step * 2
    if lo is None:  # it survived below the peak: widen downwards
        assert hi is not None
        step = res
        while lo is None and len(h.runs) < MAX_RUNS:
            cand = hi - step
            if cand <= 0:
                break
            outcome = budgeted(cand)
            if outcome == "failed":
                return h
            if outcome == "killed":
                lo = cand
            else:
                hi, step = cand, step * 2
    while hi is not None and lo is not None and hi - lo > res and len(h.runs) < MAX_RUNS:
        mid = (lo + hi) // 2
        outcome = budgeted(mid)
        if outcome == "failed":
            return h
        if outcome == "survived":
            hi = mid
        else:
            lo = mid
    if hi is None:
        h.error = f"still killed at {fmt_bytes(lo)} after {len(h.runs)} runs"
        return h
    if lo is not None and hi - lo > res:
        h.error = f"bracket {fmt_bytes(lo)}..{fmt_bytes(hi)} still wider than the resolution after {len(h.runs)} runs"
    h.headroom_bytes, h.killed_below_bytes = hi, lo
    return h
