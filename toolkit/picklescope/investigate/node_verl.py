"""The node replay driven by real verl's single controller (``picklescope node --engine verl``).

The replica engine (:mod:`picklescope.investigate.node.replica`) calls each worker itself. This engine
hands the batch to verl's own code instead: a ``RayWorkerGroup`` over a CPU ``RayResourcePool`` creates
the workers (with verl's environment: ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``...), and the worker class's ``compute``
is registered with ``Dispatch.DP_COMPUTE_PROTO``, so the split (``DataProto.chunk``), one actor call
per worker with its chunk as the argument, the ``ray.get`` of the results and their join
(``DataProto.concat``) are verl's code, exactly as a trainer's ``compute_log_prob`` call runs them.

verl is never imported by name here: the codec's loader puts the chosen version on ``sys.path`` (in
the driver and in each worker) and this module reaches verl's single controller through
``importlib`` after that. Ray is handed in by the caller (only the node's processes import it).

What this module adds to verl's code is instrumentation: step markers around ``DataProto.chunk`` and
``DataProto.concat`` and around each actor call of the worker group, with the same store-write steps
the replica engine records. The functions called are verl's, unchanged.
"""

from __future__ import annotations

import importlib
import os
from typing import TYPE_CHECKING, Any

from picklescope.codecs import get_codec
from picklescope.codecs.base import PreparesInChild
from picklescope.core import steps
from picklescope.errors import PicklescopeError
from picklescope.ray import hooks
from picklescope.verl import loader

if TYPE_CHECKING:  # the record is the node replay's, a layer above; only its type is named here
    from picklescope.investigate.node.config import NodeConfig

CODEC_ENV = "PICKLESCOPE_NODE_VERL_CODEC"  # tells a worker which verl to load before its class is unpickled
METHOD = "compute"
CALL_STEP = "worker group call"


def _single_controller() -> tuple[Any, Any, Any]:
    """(verl.single_controller.base, its decorator module, verl.single_controller.ray) of the loaded verl."""
    if loader.loaded() is None:
        raise PicklescopeError("the verl engine needs real verl loaded in this process",
                               "choose a verl-<version>:<mode> codec (picklescope verl list)")
    try:
        base = importlib.import_module("verl.single_controller.base")
        decorator = importlib.import_module("verl.single_controller.base.decorator")
        ray_base = importlib.import_module("verl.single_controller.ray")
    except ImportError as exc:
        raise PicklescopeError(f"verl's single controller does not import here: {type(exc).__name__}: {exc}",
                               "use --engine replica, or a verl version whose single_controller imports") from exc
    return base, decorator, ray_base


def worker_class(node_worker: type, codec: str | None) -> type:
    """The worker actor class: ``node_worker``'s measuring on top of verl's ``Worker``, ``compute``
    registered with ``DP_COMPUTE_PROTO``.

    It is built at run time because its base class is verl's (loaded from picklescope's cache, never
    by name); the caller publishes it under a module attribute so Ray pickles it by reference, and a
    worker process builds the same class on the verl that ``codec`` names (:data:`CODEC_ENV`).
    """
    if codec is None:
        raise AttributeError(f"{CODEC_ENV} is not set: the verl worker class exists only in a verl engine run")
    if loader.loaded() is None:
        verl_codec = get_codec(codec)
        if not isinstance(verl_codec, PreparesInChild):
            raise PicklescopeError(f"--engine verl needs a verl codec, not {codec!r}",
                                   "use e.g. --codec verl-0.9.1:numpy")
        verl_codec.prepare()
    base, decorator, _ = _single_controller()
    worker, register, dispatch = base.Worker, decorator.register, decorator.Dispatch

    class VerlNodeWorker(node_worker, worker):  # type: ignore[misc, valid-type]
        """A verl ``Worker`` (rank and world from the worker group) that measures like a replica worker."""

        def __init__(self, cfg: NodeConfig, width: int, dtype: str) -> None:
            worker.__init__(self)
            node_worker.__init__(self, cfg, f"worker-{self.rank}", width, dtype)

        @register(dispatch_mode=dispatch.ONE_TO_ALL)
        def ready(self) -> int:
            return node_worker.ready(self)

        @register(dispatch_mode=dispatch.ONE_TO_ALL)
        def arm(self) -> None:
            node_worker.arm(self)

        @register(dispatch_mode=dispatch.ONE_TO_ALL)
        def finish(self) -> None:
            node_worker.finish(self)

        @register(dispatch_mode=dispatch.DP_COMPUTE_PROTO)
        def compute(self, data: Any) -> Any:
            return node_worker.compute(self, data)

    VerlNodeWorker.__module__ = node_worker.__module__
    VerlNodeWorker.__qualname__ = VerlNodeWorker.__name__ = "VerlNodeWorker"
    return VerlNodeWorker


def mark_chunk_and_concat(data_proto: type) -> None:
    """Step markers ``DataProto.chunk`` / ``DataProto.concat`` on verl's own functions (either engine).

    They show that the split and the join that ran were verl's: a replica run with a verl codec
    records them inside its ``chunk`` and ``concat`` steps, a verl-engine run inside the worker group's call.
    """
    loader.mark_step(data_proto, "chunk", "DataProto.chunk", where="definition")
    loader.mark_step(data_proto, "concat", "DataProto.concat", where="definition")


class VerlEngine:
    """verl's ``RayWorkerGroup`` over a CPU ``RayResourcePool``, one worker per bundle, driven per step."""

    def __init__(self, ray: Any, cfg: NodeConfig, worker_cls: type, width: int, dtype: str) -> None:
        self.ray, self.cfg, self.hooks = ray, cfg, hooks
        n = cfg.workers
        have = float(ray.cluster_resources().get("CPU", 0))
        if have < n:
            raise PicklescopeError(
                f"verl's RayResourcePool reserves one CPU per worker: {n} workers need {n} CPUs, "
                f"the cluster has {have:g}", f"start the cluster with --num-cpus {n} or more, or use fewer workers")
        _, _, ray_base = _single_controller()
        pool = ray_base.RayResourcePool(process_on_nodes=[n], use_gpu=False, max_colocate_count=1,
                                        name_prefix=f"picklescope{os.getpid()}")
        actor_cls = ray.remote(max_restarts=0)(worker_cls)
        with_init = ray_base.RayClassWithInitArgs(actor_cls, cfg=cfg, width=width, dtype=dtype)
        self.group = ray_base.RayWorkerGroup(resource_pool=pool, ray_cls_with_init=with_init, device_name="cpu",
                                             worker_env={CODEC_ENV: cfg.codec})
        self._trace_calls()
        self.info = {
            "engine": "verl",
            "worker_group": f"{type(self.group).__module__}.{type(self.group).__qualname__}",
            "worker_group_file": importlib.import_module(type(self.group).__module__).__file__,
            "resource_pool": f"{type(pool).__module__}.{type(pool).__qualname__}",
            "dispatch_mode": "DP_COMPUTE_PROTO", "method": METHOD,
            "world_size": self.group.world_size, "worker_names": list(self.group.worker_names),
        }

    def _trace_calls(self) -> None:
        """An ``argument serialization`` step around each of the group's actor calls of ``compute``."""
        original = self.group._execute_remote_single_worker
        hooks = self.hooks

        def traced(worker: Any, method_name: str, *args: Any, **kwargs: Any) -> Any:
            if method_name != METHOD:
                return original(worker, method_name, *args, **kwargs)
            hooks.expect_store_write(args[0] if args else None)
            with steps.step("argument serialization"):
                try:
                    return original(worker, method_name, *args, **kwargs)
                finally:
                    hooks.end_store_write()

        self.group._execute_remote_single_worker = traced

    def ready(self) -> list[int]:
        return self.group.ready()

    def warm(self, whole: Any) -> None:
        """One small call through the group during set-up (first-call costs land in the baselines)."""
        n = self.cfg.workers
        self.group.compute(whole.slice(0, n))

    def arm(self) -> None:
        self.group.arm()

    def step(self, whole: Any) -> None:
        """One training step: the trainer's ``worker_group.compute(batch)``, all of it verl's code."""
        with steps.step(CALL_STEP):
            out = self.group.compute(whole)
        del out

    def finish(self) -> None:
        self.group.finish()

