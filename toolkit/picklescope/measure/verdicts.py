"""Verdicts on how a run ended when memory ran out, in words an engineer can act on.

Two ways to run out of memory look nothing alike from inside a process:

- ``oom-killed``: the side got SIGKILL (from the watchdog, a cgroup's OOM killer or the kernel's),
  with no Python exception, exactly like the production node. The verdict names the side, the step
  that was running when the budget was crossed, the line where known, the memory at death and the
  Python stack at death (faulthandler, written on SIGUSR1 just before the kill).
- ``memory-error``: an allocation failed inside the process (an address-space limit, ``ulimit -v``)
  and surfaced as an exception. torch words several of these misleadingly (an "enforce fail" in its
  zip writer reads like file corruption), so every known form is classified as out-of-memory and the
  original message is kept beside the explanation.
"""

from __future__ import annotations

import re
import sysconfig
from dataclasses import dataclass
from typing import Any, Protocol

from picklescope.core.kill import Kill
from picklescope.core.result import Process, RunResult, Step
from picklescope.core.units import fmt_bytes


@dataclass(frozen=True)
class Signature:
    """An exception that means "out of memory" whatever it says."""

    exc_types: tuple[str, ...]  # empty: any type
    pattern: str  # regular expression on the message ("" matches any message)
    explanation: str


SIGNATURES: tuple[Signature, ...] = (
    Signature(("RuntimeError",), r"DefaultCPUAllocator: can't allocate memory",
              "torch's CPU allocator could not get memory for a tensor"),
    Signature(("RuntimeError",), r"inline_container\.cc.*unexpected pos",
              "torch.save's zip writer lost bytes because a write into memory failed (\"unexpected pos\" "
              "reads like file corruption, but the archive ran out of memory)"),
    Signature(("MemoryError", "_ArrayMemoryError"), "", "Python or numpy could not get memory for an object"),
    Signature(("RuntimeError",), r"std::bad_alloc|\bbad_alloc\b", "a C++ allocation failed (std::bad_alloc)"),
    Signature((), r"\[Errno 12\]|Cannot allocate memory|Error code 12\b",
              "the operating system refused memory (ENOMEM)"),
    Signature((), r"Unable to allocate [0-9.]+ [KMGT]?i?B", "numpy could not get memory for an array"),
)

_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')
_LIBRARY_PARTS = ("/torch/", "/tensordict/", "/numpy/", "/multiprocessing/", "/picklescope/core/steps.py",
                  "/contextlib.py", "/picklescope/transports/__init__.py", "/picklescope/measure/child.py")
_STDLIB = sysconfig.get_paths()["stdlib"]


def memory_explanation(exc_type: str, message: str, traceback_text: str = "") -> str | None:
    """Why this exception means out-of-memory, or None if it does not look like one."""
    for sig in SIGNATURES:
        if sig.exc_types and exc_type not in sig.exc_types:
            continue
        if not sig.pattern or re.search(sig.pattern, message):
            return sig.explanation
    for sig in SIGNATURES:  # an out-of-memory error raised while handling another one
        if sig.pattern and traceback_text and re.search(sig.pattern, traceback_text):
            return sig.explanation
    if traceback_text and re.search(r"^MemoryError\b", traceback_text, re.MULTILINE):
        return SIGNATURES[2].explanation
    return None


@dataclass(frozen=True)
class Frame:
    file: str
    line: int
    func: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.func}"


def main_thread_frames(stack: str) -> list[Frame]:
    """Frames of the measured thread (faulthandler: most recent call first).

    That is the thread running the child's main function; the signal may have landed on another
    thread (a tracer's), which faulthandler then calls the "Current thread".
    """
    blocks = re.split(r"\n\s*\n?(?=(?:Current thread|Thread) 0x)", stack.strip())
    chosen = next((b for b in blocks if re.search(r" in (?:sender|receiver)_main\b", b)), None)
    if chosen is None:
        chosen = next((b for b in blocks if b.startswith("Current thread")), blocks[-1] if blocks else "")
    return [Frame(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(chosen)]


def traceback_frames(tb: str) -> list[Frame]:
    """Frames of a formatted Python traceback, most recent call first (like faulthandler)."""
    return [Frame(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(tb)][::-1]


def culprit(frames: list[Frame]) -> Frame | None:
    """The innermost frame in the code under test (a codec, verl, the user's), not in a library."""
    for fr in frames:
        stdlib = (fr.file.startswith(_STDLIB) and "site-packages" not in fr.file) or fr.file == "<string>" \
            or fr.file.startswith("<frozen")  # the forkserver's bootstrap, not code under test
        if not stdlib and not any(part in fr.file for part in _LIBRARY_PARTS):
            return fr
    return frames[0] if frames else None


def step_at(side: Process, t_s: float) -> Step | None:
    """The innermost step of ``side`` that was running at time ``t_s`` (an unfinished step never ended)."""
    best = None
    for st in side.steps:
        if st.start_s <= t_s and (st.end_s is None or st.end_s >= t_s) and (best is None or st.depth >= best.depth):
            best = st
    return best


def first_over(side: Process, budget: int | None) -> Step | None:
    """The step where the budget was crossed, by its exact peak: the first to end above the budget.

    Exact peaks beat the time of the sample that noticed: on a busy machine the sampler may notice
    only after the step that crossed has ended. An inner step ends before the step around it, so the
    first to end above the budget is the innermost, earliest one.
    """
    if budget is None:
        return None
    over = [s for s in side.steps if s.end_s is not None and s.peak_bytes is not None and s.peak_bytes > budget]
    return min(over, key=lambda s: s.end_s) if over else None


def innermost_open(side: Process) -> Step | None:
    """The deepest step that never ended (the process died inside it)."""
    open_steps = [s for s in side.steps if s.end_s is None]
    return max(open_steps, key=lambda s: s.depth) if open_steps else None


def innermost_failed(side: Process) -> Step | None:
    """The deepest step that ended with an error (where the exception started)."""
    failed = [s for s in side.steps if s.error]
    return max(failed, key=lambda s: s.depth) if failed else None


def _memory_at_death(side: Process, since_s: float | None, fallback: int | None) -> int | None:
    """The side's RSS above baseline when it died: the highest sample from the kill decision on.

    Not the last sample: a killed process's pages are freed over a few milliseconds, and the parent
    keeps sampling a shrinking process until it is gone.
    """
    since = since_s if since_s is not None else -1.0
    best = side.own_peak_bytes(since_s=since - 0.002)
    if fallback is not None and (best is None or fallback > best):
        return fallback
    return best


def _trim(side: Process, until_s: float | None) -> None:
    """End a killed side's timeline at its death.

    After SIGKILL the kernel frees the process's pages over a few milliseconds while the parent can
    still read its ``statm``; those samples are the teardown, not the work, so they are dropped.
    """
    tl = side.timeline
    if until_s is None or not tl.t_s:
        return
    keep = sum(1 for t in tl.t_s if t <= until_s)
    del tl.t_s[keep:], tl.bytes[keep:]


def _trim_at_peak(side: Process, since_s: float | None) -> None:
    """For a kill whose moment is unknown (the kernel's): the side died at its last high point."""
    tl = side.timeline
    idx = [i for i, t in enumerate(tl.t_s) if since_s is None or t >= since_s]
    if idx:
        top = max(idx, key=lambda i: (tl.bytes[i], i))
        del tl.t_s[top + 1:], tl.bytes[top + 1:]


def apply_kill(r: RunResult, kill: Kill, enforcement: str) -> None:
    """Turn a watchdog kill (see :class:`picklescope.core.kill.Kill`) into the run's verdict."""
    side = r.processes[kill.process]
    _trim(side, kill.sigkill_t_s)
    step = side.step(kill.step) if kill.step else None
    if step is None and kill.reason == "budget":
        step = first_over(side, kill.budget_bytes)
    if step is None:
        step = step_at(side, kill.t_s) or innermost_open(side)
    conclude(r, "oom-killed")
    r.killed_side = kill.process
    r.killed_in_step = step.name if step else None
    r.enforcement = enforcement
    r.memory_at_death_bytes = _memory_at_death(side, kill.t_s, kill.above_baseline_bytes)
    r.stack_at_death = kill.stack
    frame = culprit(main_thread_frames(kill.stack)) if kill.stack else None
    r.killed_at_line = frame.line if frame else None
    r.killed_at = str(frame) if frame else None
    r.killed = kill
    if step is not None and step.end_s is not None and step.end_s < kill.t_s:
        r.stack_note = (f"the budget was crossed in step {step.name} (its exact peak), which had ended "
                                 "by the time the watchdog saw it; the stack shows where the side was when killed")
    where = f" in step {r.killed_in_step}" if r.killed_in_step else " before its first step"
    if kill.reason == "machine":
        r.error = (f"{kill.process} killed{where}: the machine's available memory fell under the reserve picklescope "
                   f"keeps for the parent (SIGKILL from the machine guard)")
    else:
        r.error = (f"{kill.process} killed{where}: its memory reached {fmt_bytes(kill.above_baseline_bytes)} above "
                   f"baseline, over its budget of {fmt_bytes(kill.budget_bytes)} (seen by {kill.via}; "
                   f"SIGKILL, no Python exception, like the kernel's OOM killer)")
    side.killed = True


def apply_external_kill(r: RunResult, side_name: str, enforcement: str, counters: dict[str, int]) -> None:
    """A side died of SIGKILL that the watchdog did not send: a cgroup's or the kernel's OOM killer."""
    side = r.processes[side_name]
    step = innermost_open(side)
    _trim_at_peak(side, step.start_s if step else None)
    conclude(r, "oom-killed")
    r.killed_side = side_name
    r.killed_in_step = step.name if step else None
    r.enforcement = enforcement
    sampled = _memory_at_death(side, None, None)
    charged = cgroup_charge(counters)
    r.memory_at_death_bytes = sampled
    by = "the memory cgroup's OOM killer" if counters.get("oom_kill") else "SIGKILL from outside picklescope " \
        "(most likely the kernel's OOM killer)"
    what = ""
    if charged is not None:
        # What the killer saw is the cgroup's charge, not the RSS the parent sampled: a /dev/shm file the
        # side wrote is charged to it too, and stays charged after it dies, while the file exists.
        r.memory_at_death_bytes = max(charged["above_baseline_bytes"], sampled or 0)
        r.charged_at_death = charged
        what = (f" when the memory charged to its cgroup reached {fmt_bytes(charged['above_baseline_bytes'])} above "
                f"its baseline")
        if charged.get("budget_bytes") is not None:
            what += f" (budget {fmt_bytes(charged['budget_bytes'])})"
        if charged.get("shmem_bytes"):
            what += (f": {fmt_bytes(charged['shmem_bytes'])} of it shared memory (a /dev/shm file this side wrote, "
                     f"which the kernel charges to the writer), {fmt_bytes(charged['other_bytes'])} its own "
                     f"memory (RSS sampled at death {fmt_bytes(sampled or 0)} above baseline)")
    r.error = (f"{side_name} killed in step {r.killed_in_step or '?'} by {by}{what}; no Python stack is available "
               "because that killer sends no signal a process can handle")
    r.cgroup = counters or None
    side.killed = True


def cgroup_charge(counters: dict[str, int]) -> dict[str, int] | None:
    """What a side's memory cgroup had charged at its peak, above the point where the side joined it.

    The side sets its limit to "charged when it joined + budget", so the charge at join is the limit
    minus the budget, and the peak above it is ``max_usage - (limit - budget)``. ``shmem_bytes`` is
    the shared memory still charged after the side died (its /dev/shm files); the rest of the peak
    was the side's own memory. None when the counters lack a peak (no cgroup, or another kernel).
    """
    peak, limit, budget = counters.get("max_usage_bytes"), counters.get("limit_bytes"), counters.get("budget_bytes")
    if peak is None:
        return None
    base = limit - budget if limit is not None and budget is not None and limit >= budget else 0
    above = max(0, peak - base)
    shmem = min(counters.get("shmem_bytes") or 0, above)
    out = {"above_baseline_bytes": above, "peak_charge_bytes": peak, "charge_at_join_bytes": base,
           "shmem_bytes": shmem, "other_bytes": above - shmem}
    if limit is not None:
        out["limit_bytes"] = limit
    if budget is not None:
        out["budget_bytes"] = budget
    return out


def apply_memory_error(r: RunResult, err: dict[str, Any], explanation: str) -> None:
    """An allocation failed inside a side and surfaced as an exception: out of memory, explained."""
    side = r.processes[err["side"]]
    step = innermost_failed(side)
    original = f"{err['exc_type']}: {err['message']}"
    conclude(r, "memory-error")
    r.killed_side = err["side"]
    r.killed_in_step = step.name if step else None
    r.original_error = original
    frame = culprit(traceback_frames(err.get("traceback") or ""))
    r.killed_at_line = frame.line if frame else None
    r.killed_at = str(frame) if frame else None
    r.memory_at_death_bytes = step.peak_bytes if step else None
    where = f" in step {r.killed_in_step}" if r.killed_in_step else ""
    r.error = f"{err['side']} ran out of memory{where}: {explanation}. Original error: {original}"


OUTCOMES = ("ok", "error", "timeout", "interrupted", "oom-killed", "memory-error")
_UNCHANGED: Any = object()


class HasOutcome(Protocol):
    """Any result with a verdict: a run, a measured cell, a node replay, a step-through."""

    outcome: str
    error: str | None


def conclude(r: HasOutcome, outcome: str, error: str | None = _UNCHANGED) -> None:
    """Set ``r``'s outcome, and its error when one is given: the one place any result's outcome is set.

    Every kind of result goes through here (the runner, the cell magic, the Ray orchestration, the node
    replay, the step-through and the kill verdicts below), so an outcome is always one of ``OUTCOMES``
    and every view can word it (:func:`verdict`)."""
    if outcome not in OUTCOMES:
        raise ValueError(f"outcome {outcome!r} is not one of {', '.join(OUTCOMES)}")
    r.outcome = outcome
    if error is not _UNCHANGED:
        r.error = error


def time_out(r: HasOutcome, what: str = "the run") -> None:
    """``r`` ran past its wall-clock limit."""
    conclude(r, "timeout", f"{what} exceeded its wall-clock limit")


def apply_memory_verdict(r: RunResult, errors: list[dict[str, Any]], done: dict[str, bool], kills: dict[str, Kill],
                         enforcement: str | None, counters: dict[str, dict[str, int]]) -> None:
    """Override the run's generic verdict when memory ran out; leave every other outcome alone.

    A kill by the watchdog wins (it is the first thing that happened); then a SIGKILL nobody in
    picklescope sent to a side that had not finished; then an exception that means out-of-memory.
    """
    if kills:
        apply_kill(r, min(kills.values(), key=lambda k: k.t_s), enforcement or "watchdog")
        return
    if r.outcome != "timeout":
        for name, side in r.processes.items():
            if not done.get(name) and side.exit_code == -9:
                apply_external_kill(r, name, enforcement or "kernel", counters.get(name, {}))
                return
    for err in errors:
        explanation = memory_explanation(err["exc_type"], err["message"], err.get("traceback") or "")
        if explanation:
            apply_memory_error(r, err, explanation)
            return


# -- the verdict in words: every view (CLI, report, explorer, magic, confirm, reproduce) says it this way ------

_ENDED = {"ok": "finished", "oom-killed": "was killed for using too much memory",
          "memory-error": "ran out of memory (MemoryError)", "error": "failed", "timeout": "ran out of time"}


def death_text(r: RunResult) -> str | None:
    """"killed in consolidate at 31.2 MiB (0.66x payload), budget 23.6 MiB" for a killed run, else None."""
    if not r.killed_side or r.killed_side not in r.processes:
        return None
    side = r.processes[r.killed_side]
    text = f"killed in {r.killed_in_step or 'its set-up'}"
    death = r.memory_at_death_bytes
    if death is not None:
        text += f" at {fmt_bytes(death)}" + (f" ({death / r.payload_bytes:.2f}x payload)" if r.payload_bytes else "")
    if side.budget_bytes is not None:
        text += f", budget {fmt_bytes(side.budget_bytes)}"
    return text


@dataclass(frozen=True)
class Verdict:
    """How one run ended, in plain words: ``ended`` ("finished") and what proves it (``detail``)."""

    ended: str
    detail: str

    def sentence(self, subject: str) -> str:
        """"numpy over pickle finished: the sender peaked at 12.0 MiB (1.00x payload) above its start"."""
        return f"{subject} {self.ended}" + (f": {self.detail}" if self.detail else "")


def verdict(r: RunResult) -> Verdict:
    """The one verdict of a run, from its measured numbers only (the only place these words are made)."""
    ended = _ENDED.get(r.outcome, f"ended {r.outcome}")
    death = death_text(r)
    if death is not None:
        return Verdict(ended, f"the {r.killed_side} was {death}")
    peak = r.sender.peak_bytes if "sender" in r.processes else None
    detail = ""
    if r.outcome == "ok" and peak is not None:
        mult = f" ({peak / r.payload_bytes:.2f}x payload)" if r.payload_bytes else ""
        detail = f"the sender peaked at {fmt_bytes(peak)}{mult} above its start"
    if r.error:
        detail = f"{detail}; {r.error}" if detail else r.error
    return Verdict(ended, detail)


def run_sentence(r: RunResult) -> str:
    """``verdict(r)`` as one sentence about "<codec> over <transport>"."""
    return verdict(r).sentence(f"{r.codec} over {r.transport}")


def outcome_clause(r: RunResult) -> str:
    """The verdict as a short clause for comparing runs: "survived", "was OOM-killed on the sender in step X"."""
    if r.outcome == "ok":
        return "survived"
    if r.outcome in ("oom-killed", "memory-error"):
        step = f" in step {r.killed_in_step}" if r.killed_in_step else ""
        return f"was {'OOM-killed' if r.outcome == 'oom-killed' else 'out of memory'} on the {r.killed_side}{step}"
    return f"ended {r.outcome}"
