"""The one fold of a run's events into its result, and the verdict drawn from what arrived.

The pair runner (:mod:`picklescope.measure.runner`), a cell (:mod:`picklescope.measure.cellrun`) and the Ray
pair (:mod:`picklescope.ray.orchestrate`) all fold through :class:`RunFold` and end with
:func:`finish_run`. It sits below all three, with the measuring machinery, so that none of them imports
another to reach it.
"""

from __future__ import annotations

from typing import Any

from picklescope.core.events import Error, Event, EventHook
from picklescope.core.result import RunResult, Step
from picklescope.measure import verdicts


class RunFold:
    """Bookkeeping of one run while its events arrive: the one fold of a run's, a cell's and a Ray run's events."""

    def __init__(self, result: RunResult, on_event: EventHook | None) -> None:
        self.result = result
        self.on_event = on_event
        self.open_steps: dict[str, list[Step]] = {name: [] for name in result.processes}
        self.done: dict[str, bool] = {name: False for name in result.processes}
        self.manifest: dict[str, Any] | None = None
        self.handoff: dict[str, Any] | None = None
        self.errors: list[Error] = []

    def handle(self, ev: Event) -> None:
        """Fold one event of any side into the result (see :mod:`picklescope.core.events`), then pass it on."""
        side = self.result.processes[ev["side"]]
        kind = ev["type"]
        if kind == "ready":
            if "manifest" in ev:  # a run's side: what the batch must look like after the round trip
                self.manifest = ev.pop("manifest")
            if "import_errors" in ev:  # a cell: the kernel's imports that failed in its child
                self.result.import_errors = ev["import_errors"]
        elif kind == "baseline":
            side.baseline_bytes = ev["baseline_bytes"]
            side.baseline_s = ev.get("t_s")
        elif kind == "step_start":
            st = Step(name=ev["name"], start_s=ev["t_s"], depth=ev["depth"])
            side.steps.append(st)
            self.open_steps[ev["side"]].append(st)
        elif kind == "step_end" and self.open_steps[ev["side"]]:
            self.open_steps[ev["side"]].pop().close(ev)
        elif kind == "output":  # a cell's print()s, in order
            self.result.output.append((ev["stream"], ev["text"]))
        elif kind == "error":
            self.errors.append(ev)
        elif kind == "codec_info":  # what a codec loaded in this side (e.g. real verl's version and file)
            side.codec_info = ev["info"]
            self.result.codec_info[ev["side"]] = ev["info"]
        elif kind == "done":
            side.peak_bytes = ev["peak_bytes"]
            side.held_bytes = ev["held_bytes"]
            side.cycle_held_bytes = ev["cycle_held_bytes"]
            side.baseline_bytes = ev["baseline_bytes"]
            self.done[ev["side"]] = True
            if ev["side"] == "sender":
                self.handoff = ev.get("handoff")
            elif ev["side"] == "receiver":
                self.result.roundtrip = {"ok": not ev["mismatches"], "mismatches": ev["mismatches"]}
        if self.on_event:
            self.on_event(ev)


def finish_run(state: RunFold) -> None:
    """Turn what arrived into the verdict and the summary fields."""
    r = state.result
    snd, rcv = r.sender, r.receiver
    if state.handoff:
        r.blob_bytes = state.handoff["blob_bytes"]
        r.inband_bytes = state.handoff["inband_bytes"]
        r.oob_bytes = state.handoff["oob_bytes"]
    dumps, loads = snd.step("pickle.dumps"), rcv.step("pickle.loads")
    r.serialize_s = dumps.duration_s if dumps and dumps.error is None else None
    r.deserialize_s = loads.duration_s if loads and loads.error is None else None
    if r.outcome == "timeout":
        return
    if state.errors:
        first = state.errors[0]
        verdicts.conclude(r, "error", f"{first['side']}: {first['exc_type']}: {first['message']}")
        r.traceback = first.get("traceback")
        return
    for name in ("sender", "receiver"):
        if not state.done[name]:
            side = r.processes[name]
            verdicts.conclude(r, "error", f"{name} process ended without a result (exit code {side.exit_code})")
            return
    if r.roundtrip.get("ok") is False:
        verdicts.conclude(r, "ok")  # the run itself worked; the mismatch is reported in roundtrip
