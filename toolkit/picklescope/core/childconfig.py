"""What a measured child is told when it starts: one typed record per topology, handed over once.

A child (a forkserver child, a Ray driver, a Ray actor) gets its whole configuration as one argument,
pickled by the forkserver or by Ray. A dict would leave every reader to know its keys; these
dataclasses name every value once, with its type, so a missing or misspelt one fails where the
record is built instead of deep inside a child. The base, :class:`ChildConfig`, is what every measured
child reads (its run folder, the run's clock, its tracers, budgets and environment); each topology
adds its own fields in a subclass (:class:`PairConfig` here, the Ray fields in
:mod:`picklescope.ray.config`, the node replay's in :mod:`picklescope.investigate.node.config`). A
changed copy is made with :func:`dataclasses.replace`, never by editing one a child may share.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(kw_only=True)
class ChildLimits:
    """What a child needs to apply its own memory limit from inside (cgroup and address-space modes);
    the watchdog mode needs nothing here. Made by :meth:`picklescope.measure.budget.Limits.for_child`."""

    enforcement: str = "watchdog"
    budgets: dict[str, int | None] = field(default_factory=dict)  # side -> bytes above its baseline
    cgroups: dict[str, str] = field(default_factory=dict)  # side -> its cgroup folder (cgroup mode)
    totals: dict[str, int | None] = field(default_factory=dict)  # side -> whole-process bytes (``total:2GiB``)


@dataclass(kw_only=True)
class ChildConfig:
    """What every measured child reads: where its run's files go, the run's clock, and how it is watched."""

    run_dir: str  # the run's temporary folder: hand-off files, stack dumps, tracer output
    t0: float  # the parent's time.monotonic() at the run's start: every event is on this clock
    tracers: list[str] = field(default_factory=list)  # tracer names (picklescope.tracers)
    probe: dict[str, bool] = field(default_factory=dict)  # side -> record every payload-sized copy
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # side -> environment variables to set
    plugins: list[str] = field(default_factory=list)  # modules that register codecs or transports
    limits: ChildLimits = field(default_factory=ChildLimits)


@dataclass(kw_only=True)
class PairConfig(ChildConfig):
    """A sender and a receiver: one codec over one transport on one workload."""

    codec: str
    transport: str
    workload: str  # a preset's name or a workload file's path, loaded again in the child
    scale: float
    receiver_codec: str | None = None  # a different codec on the receiving side (a mixed-version run)
