"""The replica engine: the toolkit's own loop over the node's workers, as verl's single controller runs it.

One training step is verl's ``DP_COMPUTE_PROTO``: split the batch into one chunk per worker (or hand
every worker the whole batch, ``--dispatch broadcast``), call each worker's ``compute`` with its
chunk as the argument (Ray pickles it in the driver) or through ``ray.put`` (``--transport ray``),
``ray.get`` the small results and join them. Each part is a named step of the driver. The other
engine, real verl's ``RayWorkerGroup``, is :class:`~picklescope.investigate.node_verl.VerlEngine`.
"""

from __future__ import annotations

from typing import Any

from picklescope.core import steps
from picklescope.investigate.node import collector
from picklescope.investigate.node.config import NodeConfig
from picklescope.investigate.node.data import NodeData
from picklescope.investigate.node.worker import NodeWorker
from picklescope.ray import hooks
from picklescope.ray.driver import wait_s


def worker_placement(ray: Any, cfg: NodeConfig) -> dict[str, Any]:
    """Where a node's worker actors go: on nodes with ``--worker-resources``, spread with ``--spread``, else
    on the driver's Ray node (a replay is of one node; Ray's default could place them on any node of a joined
    cluster, one being stopped included)."""
    options: dict[str, Any] = {}
    if cfg.worker_resources:
        options["resources"] = dict(cfg.worker_resources)
    if cfg.spread:
        options["scheduling_strategy"] = "SPREAD"
    elif not cfg.worker_resources:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # deferred: Ray's own

        options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
            node_id=ray.get_runtime_context().get_node_id(), soft=False)
    return options


class ReplicaEngine:
    """The node's worker actors, created in the driver, and one training step over them."""

    def __init__(self, ray: Any, cfg: NodeConfig, data: NodeData) -> None:
        """Create the worker actors; this returns at once, while Ray starts their processes (each imports
        torch: seconds), so the driver builds its batch meanwhile and then waits in :meth:`ready`."""
        self.ray, self.cfg, self.data = ray, cfg, data
        actor_cls = ray.remote(num_cpus=0, max_restarts=0)(NodeWorker)
        options = worker_placement(ray, cfg)
        self.workers = [actor_cls.options(**options).remote(cfg, f"worker-{i}") for i in range(cfg.workers)]
        self.info: dict[str, Any] = {"engine": "replica",
                                     "worker_class": f"{NodeWorker.__module__}.{NodeWorker.__qualname__}"}

    def ready(self, width: int, dtype: str) -> None:
        """Wait until every worker actor is up (within what is left of the run's limit), and give each the
        result row's shape (``width`` elements of ``dtype``), known once the batch is built."""
        wait = wait_s(self.cfg, self.cfg.actor_timeout_s)
        try:
            self.ray.get([w.ready.remote(width, dtype) for w in self.workers], timeout=wait)
        except self.ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the {len(self.workers)} worker actors did not start within {wait:.0f} s "
                               "(the run's --timeout was near)") from None

    def _arg(self, piece: Any) -> Any:
        return piece if self.cfg.transport == "ray-arg" else [self.ray.put(piece)]

    def warm(self, whole: Any) -> None:
        """One small call per worker during set-up (first-call costs land in the baselines)."""
        warm = self.data.chunk(whole, len(whole))[0]
        self.data.concat(self.ray.get([w.compute.remote(self._arg(warm)) for w in self.workers]))

    def arm(self) -> None:
        """Every worker takes its baseline and starts its measured phase."""
        self.ray.get([w.arm.remote() for w in self.workers])

    def finish(self) -> None:
        """Every worker ends its measured phase and reports it."""
        self.ray.get([w.finish.remote() for w in self.workers])

    def switch(self, data: NodeData, cfg: NodeConfig) -> None:
        """The next replay of a series: its codec, collector mode and clock, here and in every worker."""
        self.data, self.cfg = data, cfg
        self.ray.get([w.switch.remote(cfg.codec, cfg.t0, cfg.t0_wall, cfg.gc) for w in self.workers])

    def step(self, whole: Any) -> None:
        """One training step as verl's single controller runs it (DP_COMPUTE_PROTO: chunk, call, collect)."""
        ray, data, workers = self.ray, self.data, self.workers
        n = len(workers)
        collector.at_call(0)  # a collection from here on is recorded with the step's calls made so far
        with steps.step("chunk"):
            pieces = data.chunk(whole, n) if self.cfg.dispatch == "chunk" else [whole] * n
        pending = []
        for w, piece in zip(workers, pieces):
            hooks.expect_store_write(piece)
            if self.cfg.transport == "ray":
                with steps.step("ray.put"):
                    try:
                        ref = ray.put(piece)
                    finally:
                        hooks.end_store_write()
                pending.append(w.compute.remote([ref]))
                del ref
            else:
                with steps.step("argument serialization"):
                    try:
                        pending.append(w.compute.remote(piece))
                    finally:
                        hooks.end_store_write()
            collector.at_call(len(pending))
        del pieces, piece
        with steps.step("ray.get"):
            outs = ray.get(pending)
        with steps.step("concat"):
            out = data.concat(outs)
        del pending, outs, out
