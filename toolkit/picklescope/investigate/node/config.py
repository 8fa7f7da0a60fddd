"""What the node replay's driver and its actors are told: one record, built by the parent.

The driver (:mod:`.driver`), the worker actors (:mod:`.worker`, real verl's worker group in
:mod:`picklescope.investigate.node_verl`) and the TransferQueue plane's actors (:mod:`.tq_plane`)
all read this one :class:`NodeConfig`; Ray pickles it into each actor. A series switches codec and
collector between replays with :func:`dataclasses.replace`, so an actor's copy is never edited under it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from picklescope.ray.config import RayConfig


@dataclass(kw_only=True)
class NodeConfig(RayConfig):
    """One node replay: the batch, the loop (workers, steps, dispatch, collector), where it runs."""

    codec: str
    workload: str  # a preset's name or a workload file's path, loaded again in the driver
    scale: float
    workers: int
    steps: int
    returns: float | None  # the workers' result per row, as a fraction of the payload (None: a small one)
    dispatch: str  # "chunk" (verl's DataProto.chunk) or "broadcast" (the whole batch to every worker)
    gc: str  # the collector mode (picklescope.investigate.node.collector)
    transport: str  # "ray" (ray.put, then the reference) or "ray-arg" (the chunk as the call's argument)
    engine: str = "replica"  # "replica" (the toolkit's loop) or "verl" (real verl's worker group)
    warm_up: str = "row"  # "row" (one row through the loop) or "steps" (a series: a whole replay first)
    parent_pid: int = 0  # the parent to watch: the cluster ends if it dies
    worker_resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per worker
    spread: bool = False  # place the workers on every node of a joined cluster
    controller: str = "process"  # the training loop in the driver process, or in a Ray actor ("actor")
    data_plane: str = "dataproto"  # "dataproto" or "transferqueue"
    step_gap_s: float = 0.0  # an idle wait at the end of each measured training step (node_series' doc)
    worker_compute_s: float = 0.0  # how long each worker's call holds its chunk after reading it (node_series' doc)
    cgroup: str | None = None  # the memory cgroup the driver (and so the cluster) is born in
    ray_view_cgroup: str | None = None  # the cgroup Ray's memory monitor is made to read as the machine
