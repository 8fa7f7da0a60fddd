"""The one record of a kill for out-of-memory: whom, when, at what memory, and what it was doing.

Every budget that kills writes this record, whatever it watches: the watchdog of a pair or a cell
(:class:`picklescope.measure.watchdog.Watchdog`, one side against its own budget, or the machine
guard), the session's check of a node's total (:meth:`picklescope.measure.session.Session._kill_victim`),
and the node replay's reading of a kill chosen by the kernel's OOM killer in a cgroup or by Ray's memory
monitor (:mod:`picklescope.investigate.node.enforce`). One record, so the stack dump, the verdict's words
and a saved result's document are written once for all of them.

A field only one kind of budget can know has a default: a side's ``reason``, ``via`` and
``above_baseline_bytes`` come from the watchdog, a node's ``node_bytes``, ``training_step``,
``oom_scores``, ``memory_bytes`` and ``step_of`` from a node replay. ``stack`` and ``sigkill_t_s`` are
set by :func:`picklescope.measure.watchdog.dump_stack_then_kill` as the process dies. ``by`` names who
chose the victim (picklescope's ``watchdog``, the ``kernel``'s OOM killer in a cgroup, or ``ray``'s memory
monitor) and ``message`` keeps the chooser's own words (Ray's).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any


@dataclass
class Kill:
    """Whom a budget killed, when, at what memory, and in which step."""

    process: str  # the killed process by its run's name: a pair's side, "cell", a node's "worker-1"
    t_s: float  # run clock when the budget was seen crossed (seconds since the run started)
    budget_bytes: int | None = None  # the budget crossed: the side's, or the node's
    pid: int | None = None
    reason: str = "budget"  # "budget" | "machine" (the watchdog's guard of the machine's available memory)
    via: str | None = None  # what saw the crossing: sampled RSS, kernel peak, exact step peak, available memory
    above_baseline_bytes: int | None = None  # the killed side's memory above its baseline when seen crossing
    node_bytes: int | None = None  # a node's total above its baseline when the budget was crossed
    training_step: int | None = None  # a node replay's training step at the kill
    step: str | None = None  # the step the kill landed in: the one whose exact peak crossed, or the innermost open
    step_of: str | None = None  # whose step ``step`` is: the killed process's, or "driver" (a worker between steps)
    oom_scores: dict[str, int] = field(default_factory=dict)  # per process, read to choose the victim
    memory_bytes: dict[str, int] = field(default_factory=dict)  # per process (private) and "store", absolute
    stack: str | None = None  # the process's Python stack at death (faulthandler), if it was written
    sigkill_t_s: float | None = None  # run clock when SIGKILL was sent: the process's timeline ends here
    by: str = "watchdog"  # who chose the victim: "watchdog" (picklescope's budget), "kernel" (OOM killer), "ray"
    message: str | None = None  # the chooser's own words, when it wrote any (Ray's OutOfMemoryError message)

    def during(self) -> str:
        """Where the kill landed, in words (:func:`kill_during`)."""
        return kill_during(self.process, self.step, self.step_of)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values, every field by its name: a run's ``kill`` and a node replay's ``killed`` in JSON."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Kill:
        """The record back from :meth:`to_dict`. Keys that are not fields are left out; a field missing takes its
        default (a record saved before ``by`` was one of its fields was the watchdog's, or named its chooser
        beside it, as a node replay's document did)."""
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names and not (k == "by" and v is None)})


def kill_during(process: str, step: str | None, step_of: str | None) -> str:
    """Where a kill landed, in words that never put the driver's step in a worker's mouth: ``during
    consolidate`` for the killed process's own step, ``while the driver was in consolidate`` for a
    worker killed between its steps. Takes plain values, so a saved result's document words it too."""
    if step is None:
        return "between steps"
    if step_of in (None, process):
        return f"during {step}"
    return f"while the {step_of} was in {step}"
