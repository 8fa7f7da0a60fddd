"""A node's worker: a Ray actor that receives its chunk, returns a small result, and measures itself.

The driver wraps :class:`NodeWorker` with ``ray.remote`` (importing this module needs no Ray). Each
worker connects back to the parent once, says hello (its pid, machine and Ray node), and from its
:meth:`~NodeWorker.arm` on streams its own named steps (``ray.get``, ``compute``, ``gc``) on the run's
clock. With ``--engine verl`` the worker class is built at run time on real verl's ``Worker``
(:data:`VerlNodeWorker`, see :func:`__getattr__`).
"""

from __future__ import annotations

import gc
import importlib
import os
import time
from dataclasses import replace
from typing import Any

from picklescope.core import procmem, steps
from picklescope.core.events import Done, Event, Hello
from picklescope.investigate.node import collector
from picklescope.investigate.node.config import NodeConfig
from picklescope.investigate.node.data import NodeData
from picklescope.investigate.node_verl import CODEC_ENV, worker_class
from picklescope.measure import launcher
from picklescope.measure.child import arm_stack_dump, begin_measure, end_measure
from picklescope.ray import channel, hooks


class NodeWorker:
    """One worker actor; the driver wraps it with ``ray.remote`` (importing this module needs no Ray)."""

    node_role = "worker"  # the process's role in the result (a subclass may stand for another part of the node)

    def __init__(self, cfg: NodeConfig, name: str, width: int = 1, dtype: str = "float32") -> None:
        import ray  # deferred: Ray is imported only in the node's own processes, never by the parent

        self.cfg, self.name = cfg, name
        self.conn = channel.connect(cfg)
        self.conn.send(Hello(type="hello", name=name, pid=os.getpid(), machine=channel.machine_id(),
                             node_id=ray.get_runtime_context().get_node_id(), role=self.node_role))
        if os.path.isdir(cfg.run_dir):  # the budget check's SIGUSR1 writes our stack there before a kill
            self._stack = arm_stack_dump(cfg, name)
        for module in launcher.PRELOAD:
            importlib.import_module(module)
        import torch  # deferred: heavy, imported by the preload above already

        self.data = NodeData(cfg.codec)
        self.width, self.dtype = width, getattr(torch, dtype)
        hooks.install(deserialize=True)
        self.t0 = channel.local_t0(cfg)
        self.meter: steps.Meter | None = None

    def ready(self, width: int | None = None, dtype: str | None = None) -> int:
        """Up; ``width``/``dtype``: the result row's shape, when the driver learned it after creating us
        (it builds its batch while the workers start)."""
        if width is not None and dtype is not None:
            import torch  # deferred: heavy, imported by the preload in __init__ already

            self.width, self.dtype = width, getattr(torch, dtype)
        return os.getpid()

    def arm(self) -> None:
        """Take the baseline after setup; from now on every step is measured and streamed."""
        gc.enable()
        gc.collect()
        procmem.trim_heap()  # what set-up or the warm-up freed, given back (as the driver)
        collector.apply_mode(self.cfg.gc)
        collector.count_collections()
        self.meter = begin_measure(steps.Meter(channel.with_shared(self._send), self.t0, self.name))

    def _send(self, ev: Event) -> None:
        self.conn.send(ev)

    def switch(self, codec: str, t0: float, t0_wall: float, gc_mode: str | None = None) -> None:
        """The next replay of a series: its codec, its collector mode (the unmeasured steps before it run
        under it already, as in the driver) and its clock (:meth:`arm` then takes the new baseline)."""
        self.cfg = replace(self.cfg, codec=codec, t0=t0, t0_wall=t0_wall, gc=gc_mode or self.cfg.gc)
        self.data = NodeData(codec)
        self.t0 = channel.local_t0(self.cfg)
        gc.enable()
        collector.apply_mode(self.cfg.gc)

    def compute(self, arg: Any) -> Any:
        """Receive a chunk (already deserialized by Ray, or a ref to ``ray.get``), return a small result."""
        if self.cfg.transport == "ray":
            import ray  # deferred: Ray is imported only in the node's own processes, never by the parent

            with steps.step("ray.get"):
                arg = ray.get(arg[0])
        with steps.step("compute"):
            out = self.data.result(len(arg), self.width, self.dtype)
            self.hold()
        del arg
        if self.cfg.gc == "each-step":
            with steps.step("gc"):
                gc.collect()
        return out

    def hold(self) -> None:
        """The worker's compute on its chunk, still held: ``worker_compute_s`` seconds (a training step's
        workers compute for minutes on what they were sent, so every worker holds its chunk at once)."""
        if self.cfg.worker_compute_s:
            time.sleep(self.cfg.worker_compute_s)

    def finish(self) -> None:
        """End the measured phase: the worker's peak, what it holds, what only a collection frees."""
        meter = self.meter
        if meter is None:
            return
        m = end_measure(self.conn, meter, None, read_at_end=collector.full_collections, trim=True)
        self.conn.send(Done(type="done", side=self.name, peak_bytes=m.peak_bytes, held_bytes=m.held_bytes,
                            cycle_held_bytes=m.cycle_held_bytes, t_s=meter.now(), full_collections=m.at_end))


def verl_worker_class(codec: str) -> type:
    """This module's ``VerlNodeWorker``, built here (the driver) on ``codec``'s verl; see :func:`__getattr__`."""
    cls = globals().get("VerlNodeWorker")
    if cls is None:
        cls = globals()["VerlNodeWorker"] = worker_class(NodeWorker, codec)
    return cls


def __getattr__(name: str) -> Any:
    """``VerlNodeWorker``: the verl engine's worker class, built on the verl this process loaded.

    Its base is real verl's ``Worker``, loaded at run time, so it cannot be defined at import. Ray
    pickles it by reference to this attribute; a worker process builds it here on unpickling, on the
    verl its environment names (set by verl's worker group from the engine's ``worker_env``).
    """
    if name != "VerlNodeWorker":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    cls = worker_class(NodeWorker, os.environ.get(CODEC_ENV))
    globals()[name] = cls
    return cls
