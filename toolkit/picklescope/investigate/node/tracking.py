"""What the parent knows about a node replay as it goes, and the words for where it got to.

:class:`Tracking` is the parent's own record of one run (or series): the cluster's processes, the
workers that said hello and their pipes, the phase it is waiting for, the watch on Ray's core
processes, the cgroup's limit. The phase names what a timeout or a dead Ray process interrupted
("stopped at 300 s of its 300 s --timeout ... while waiting for training step 3 (since 4:10)").
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from picklescope.core.events import Hello, RayInfo
from picklescope.measure.session import Session
from picklescope.ray import startup

COMPONENT_POLL_S = 1.0  # how often the parent looks for a dead Ray core process


@dataclass
class Tracking:
    """The parent's record of one node run: processes, pipes, phase, watch and limits (one per series)."""

    t0: float  # the run's clock starts here (monotonic)
    timeout_s: float = 0.0
    workers: int = 0
    end_by: float = float("inf")  # monotonic: the replay under way ends by then, clean-up included
    budget: int | None = None
    cgroup: str | None = None  # --enforcement cgroup or ray: the run's (watched) memory cgroup
    start_cgroup: str | None = None  # --enforcement ray: where the cluster is born, left at the baseline
    limit: dict[str, Any] | None = None  # the cgroup's limit, set at the baseline
    driver: tuple[int, int | None] | None = None  # (pid, start ticks)
    cluster_pids: dict[str, list[int]] = field(default_factory=dict)  # Ray's own processes, by role
    ray_info: RayInfo | None = None
    engine_info: dict[str, Any] | None = None
    hellos: dict[str, Hello] = field(default_factory=dict)  # a worker's name -> its hello
    controller: dict[str, Any] | None = None  # --controller actor: the actor's event (its pid, its Ray node)
    names: dict[Any, str] = field(default_factory=dict)  # a worker's pipe -> its name ("" before its hello)
    worker_conns: dict[str, Any] = field(default_factory=dict)  # "connN" -> a worker's pipe
    conns: list[Any] = field(default_factory=list)  # every pipe accepted, closed at the end
    phase: str = ""
    phase_since: float = 0.0
    watch: startup.ComponentWatch | None = None  # Ray's core processes, once our cluster is up
    watch_polled: float = 0.0
    finished: bool = False  # the driver said every training step and every worker's done were sent
    bad_input: list[str] | None = None  # the driver's one-line refusal (problem, way out)
    driver_log: str = ""


def set_phase(tracking: Tracking, name: str) -> None:
    """What the run is waiting for now (named by a timeout and by a dead Ray process's message)."""
    tracking.phase, tracking.phase_since = name, time.monotonic()


def waiting_for(tracking: Tracking) -> str:
    """The phase and since when, on the run's clock: "training step 2 (since 1:05)"."""
    since = startup.clock(tracking.phase_since - tracking.t0)
    return f"{tracking.phase} (since {since})"


def timeout_message(tracking: Tracking) -> str:
    """One line: how far the run got, what it was waiting for, how busy the machine was."""
    now = time.monotonic() - tracking.t0
    load = startup.load_average()
    return (f"stopped at {now:.0f} s of its {tracking.timeout_s:g} s --timeout (the rest ends every process) "
            f"while waiting for {waiting_for(tracking)}"
            + (f"; the machine's load average was {load:.1f}" if load is not None else ""))


def dead_component(session: Session, tracking: Tracking) -> str | None:
    """After start-up: one line naming a core process of our cluster that died ("the raylet (with the
    object store) died 1:40 into the run, during training step 2"), else None. At most once a second.

    Not while a budget's kill is being settled: the kernel's OOM killer may pick a Ray process itself."""
    if tracking.watch is None or session.kill is not None:
        return None
    now = time.monotonic()
    if now - tracking.watch_polled < COMPONENT_POLL_S:
        return None
    tracking.watch_polled = now
    if tracking.watch.poll() is None:
        return None
    return f"{tracking.watch.sentence('the run')}, during {waiting_for(tracking)}"
