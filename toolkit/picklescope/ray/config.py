"""What a Ray driver of ours and its actors are told: the measured child's record plus the cluster's.

:class:`RayConfig` adds to :class:`~picklescope.core.childconfig.ChildConfig` what starting or joining
a cluster and reporting back from its actors need; :class:`RayPairConfig` is a pair over Ray (the
runner's :class:`~picklescope.core.childconfig.PairConfig` with these fields filled by
:func:`picklescope.ray.orchestrate.run_sides`). The node replay's record extends :class:`RayConfig`
(:mod:`picklescope.investigate.node.config`). Ray pickles the record into each actor, so it holds
plain values only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from picklescope.core.childconfig import ChildConfig, PairConfig


@dataclass(kw_only=True)
class RayConfig(ChildConfig):
    """A cluster of our own (``ray_address`` None) or a joined one, and the way back to the parent."""

    ray_path: str = "arg"  # how the batch travels: "put", "arg" (a call's argument) or "tq" (TransferQueue)
    ray_address: str | None = None  # a cluster to join; None: start our own local one
    ray_temp_dir: str | None = None  # our own cluster's session folder (short: AF_UNIX paths)
    object_store_bytes: int | None = None  # our own cluster's store size
    ray_env: dict[str, str] = field(default_factory=dict)  # Ray's settings (RAY_*) for the driver's cluster
    events_address: Any = None  # the parent's listener: a socket path, or (host, port) for another node
    events_key: str = ""  # its authentication key, hex
    machine: str = ""  # the parent's machine (picklescope.ray.channel.machine_id): is t0 usable as is?
    t0_wall: float = 0.0  # t0 on the wall clock, for an actor on another node
    deadline_wall: float | None = None  # the run's own limit (time.time()): bounds Ray's start-up and waits
    cleanup_reserve_s: float = 0.0  # kept from the deadline for the clean-up after a failed start
    actor_timeout_s: float = 300.0  # the longest wait for an actor to come up


@dataclass(kw_only=True)
class RayPairConfig(RayConfig, PairConfig):
    """A sender (the driver) and a receiver (an actor) over Ray."""
