"""The TransferQueue data plane of a node replay: the controller passes metadata, the tensors go through storage.

verl's synchronous TransferQueue trainer (``verl/trainer/main_ppo_sync.py``, verl PR #5401, design in
verl issue #5400) moves a training step's batch without the single controller holding it: the
rollout writes the batch into TransferQueue's storage units and hands the controller a
``KVBatchMeta`` (keys, partition, field names); the controller splits that metadata among the
workers; each worker reads its rows from the storage units, computes and writes its result back
under the same keys; the controller reads only the field it needs (the per-token result) and clears
the step's keys. This module replays that flow with the real ``transfer_queue`` package:

- :class:`TQProducer`, a Ray actor standing for the rollout, builds the workload's batch once at set-up
  and writes it into the storage units at every training step (``kv_batch_put``);
- :class:`TQWorker`, one per worker, reads its shard by metadata (``kv_batch_get_by_meta``), builds the
  small per-token result and writes it back (``kv_batch_put``);
- :class:`TQEngine`, in the driver (the controller), starts TransferQueue's controller actor and its
  storage units, and runs each step on metadata only.

Every one of these processes is measured on the node's clock: the producer and the workers stream
their own steps like the DataProto plane's workers; the storage units (``storage-N``) and
TransferQueue's controller actor (``tq-controller``) are sampled from outside, announced to the parent
by the driver. The codec does not apply to the tensors here (``DataProto.__getstate__`` is never
called on them): Ray pickles only the metadata.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Callable, Sequence
from typing import Any

from picklescope.core import steps
from picklescope.core.events import Hello
from picklescope.errors import PicklescopeError
from picklescope.investigate.node.config import NodeConfig
from picklescope.investigate.node.data import NodeData
from picklescope.investigate.node.replica import ReplicaEngine, worker_placement
from picklescope.investigate.node.worker import NodeWorker
from picklescope.ray import channel
from picklescope.ray import transferqueue as tq
from picklescope.ray.driver import wait_s
from picklescope.workloads.spec import load_workload

DATA_PLANES = ("dataproto", "transferqueue")
STORAGE_UNITS = 2  # TransferQueue's own default for SimpleStorage
PARTITION = "train"
RESULT_FIELD = "old_log_probs"  # what the controller asks the storage for, as the TQ trainer does after compute


def check(data_plane: str, codecs: Sequence[str], *, engine: str, dispatch: str, transport: str) -> None:
    """Refuse a data plane that cannot run here, with one line, before anything starts.

    The TransferQueue plane needs the separately installed package (see
    :data:`~picklescope.ray.transferqueue.INSTALL_HINT`); it chunks metadata among the workers
    (no broadcast), ships only metadata through Ray calls (no ``ray.put`` transport), and moves TensorDict
    fields, never a verl ``DataProto`` (so no verl codec or engine)."""
    if data_plane not in DATA_PLANES:
        raise PicklescopeError(f"--data-plane {data_plane!r} is not one of {', '.join(DATA_PLANES)}",
                               "use --data-plane dataproto (the batch through the controller) or transferqueue")
    if data_plane == "dataproto":
        return
    for what, value, needed in (("--dispatch", dispatch, "chunk"), ("--transport", transport, "ray-arg"),
                                ("--engine", engine, "replica")):
        if value != needed:
            raise PicklescopeError(f"--data-plane transferqueue hands each worker its shard's metadata, which takes "
                                   f"{what} {needed}, not {value!r}",
                                   f"leave {what} out with --data-plane transferqueue")
    verl = [c for c in codecs if c.startswith("verl-")]
    if verl:
        raise PicklescopeError(f"--data-plane transferqueue moves TensorDict fields, never a verl DataProto, so the "
                               f"codec {verl[0]!r} would not apply", "use a built-in codec, e.g. --codec numpy")
    reason = tq.missing()
    if reason:
        raise PicklescopeError(f"--data-plane transferqueue needs TransferQueue {tq.TQ_VERSION}: {reason}",
                               f"install it with {tq.INSTALL_HINT}")


def cpus_needed() -> int:
    """Logical CPUs a cluster of the run's own needs: TransferQueue's controller and each storage unit
    reserve one (the node's own actors reserve none)."""
    return 1 + STORAGE_UNITS


def _as_fields(batch: Any) -> Any:
    """The batch as the producer writes it: its tensors and non-tensor columns as one TensorDict of rows."""
    return tq.fields_of(batch)


class TQProducer(NodeWorker):
    """The rollout: builds the batch once at set-up, writes it into the storage units at every step."""

    node_role = "producer"

    def attach(self, result_shape: Callable[..., tuple[int, Any]]) -> tuple[int, str]:
        """Connect to TransferQueue, build the batch (before the baseline: generating it is the rollout's
        cost, not the data plane's), and return the result row's shape that ``result_shape`` derives."""
        tq.activate().init()
        wl = load_workload(self.cfg.workload)
        batch = wl.build(self.cfg.scale)
        self.fields = _as_fields(batch)
        self.rows = len(batch)
        width, dtype = result_shape(batch, self.rows, wl.payload_bytes(self.cfg.scale), self.cfg.returns)
        del batch
        return width, str(dtype).removeprefix("torch.")

    def produce(self, tag: str, rows: int | None = None) -> Any:
        """Write the batch (or its first ``rows`` rows) under fresh keys; return the metadata (``KVBatchMeta``)."""
        mod = tq.activate()
        fields = self.fields if rows is None else self.fields[:rows]
        keys = [f"{tag}-{i}" for i in range(int(fields.batch_size[0]))]
        with steps.step("kv_batch_put"):
            meta = mod.kv_batch_put(keys=keys, partition_id=PARTITION, fields=fields)
        if self.cfg.gc == "each-step":
            with steps.step("gc"):
                gc.collect()
        return meta


class TQWorker(NodeWorker):
    """A worker of the TransferQueue plane: its shard from the storage units, its result back to them."""

    def attach(self) -> int:
        """Connect this process's TransferQueue client to the driver's controller (unmeasured)."""
        tq.activate().init()
        return os.getpid()

    def compute_meta(self, meta: Any) -> int:
        """Read the shard named by ``meta``, build the per-token result, write it back; returns the rows."""
        import torch  # deferred: heavy, imported by the preload already
        from tensordict import TensorDict  # deferred with torch

        mod = tq.activate()
        with steps.step("kv_batch_get"):
            shard = mod.kv_batch_get_by_meta(meta)
        rows = len(meta.keys)
        with steps.step("compute"):
            out = TensorDict({RESULT_FIELD: torch.full((rows, self.width), 1, dtype=self.dtype)}, batch_size=[rows])
            self.hold()
        del shard
        with steps.step("kv_batch_put"):
            mod.kv_batch_put(keys=list(meta.keys), partition_id=PARTITION, fields=out)
        del out
        if self.cfg.gc == "each-step":
            with steps.step("gc"):
                gc.collect()
        return rows


def _whoami(actor_self: Any) -> tuple[int, str, str]:
    """Run inside one of TransferQueue's actors: its pid, machine and Ray node."""
    import ray  # deferred: Ray is imported only in the node's own processes, never by the parent

    return os.getpid(), channel.machine_id(), ray.get_runtime_context().get_node_id()


class TQEngine(ReplicaEngine):
    """The controller's side: TransferQueue's actors, the producer and the workers, one step on metadata."""

    def __init__(self, ray: Any, cfg: NodeConfig, data: NodeData) -> None:
        """Start TransferQueue (its controller actor and :data:`STORAGE_UNITS` storage units), then the
        producer and the worker actors (``self.workers`` lists the producer first, so that arming,
        finishing and switching codec reach it too)."""
        self.ray, self.cfg, self.data = ray, cfg, data
        cpus = ray.cluster_resources().get("CPU", 0)
        if cpus < cpus_needed():  # TransferQueue's actors would wait for a CPU forever
            raise PicklescopeError(f"TransferQueue's controller and its {STORAGE_UNITS} storage units reserve one "
                                   f"logical CPU each ({cpus_needed()} in all), and the Ray cluster has {cpus:g}",
                                   f"start the cluster with --num-cpus {cpus_needed()} or more, or run without "
                                   "--ray-address (a cluster of the run's own)")
        self.mod = tq.activate()
        self.mod.init({"backend": {"storage_backend": "SimpleStorage",
                                   "SimpleStorage": {"num_data_storage_units": STORAGE_UNITS}}})
        from transfer_queue import interface  # the package's own handles on the actors it started

        storage = list(((interface._TQ_STORAGE or {}).get("SimpleStorage") or {}).values())
        if not storage:  # init found a TransferQueue already running on this cluster and joined it: the replay
            # would write into (and clear keys of) someone else's storage
            raise PicklescopeError("a TransferQueue controller already runs on this Ray cluster; the replay needs "
                                   "one of its own", "run without --ray-address (a cluster of the run's own)")
        self.tq_actors = [(f"storage-{i}", "storage", h) for i, h in enumerate(storage)]
        if interface._TQ_CONTROLLER is not None:
            self.tq_actors.append(("tq-controller", "tq-controller", interface._TQ_CONTROLLER))
        options = worker_placement(ray, cfg)
        self.producer = ray.remote(num_cpus=0, max_restarts=0)(TQProducer).options(**options).remote(cfg, "producer")
        worker_cls = ray.remote(num_cpus=0, max_restarts=0)(TQWorker)
        self.compute_workers = [worker_cls.options(**options).remote(cfg, f"worker-{i}")
                                for i in range(cfg.workers)]
        self.workers = [self.producer, *self.compute_workers]
        self.links: list[Any] = []
        self.counter = 0
        self.info: dict[str, Any] = {
            "engine": "replica", "data_plane": "transferqueue", "transferqueue": tq.TQ_VERSION,
            "storage_units": len(storage), "worker_class": f"{TQWorker.__module__}.{TQWorker.__qualname__}",
            "producer_class": f"{TQProducer.__module__}.{TQProducer.__qualname__}",
            "chunk": "KVBatchMeta.chunk", "concat": f"kv_batch_get(select_fields={RESULT_FIELD!r})",
            "data_class": "tensordict.TensorDict (TransferQueue fields)"}

    def start(self, result_shape: Callable[..., tuple[int, Any]]) -> None:
        """Wait for every actor (within the run's limit), connect each to TransferQueue, give the workers
        the result row's shape, and announce TransferQueue's own actors to the parent to be sampled."""
        wait = wait_s(self.cfg, self.cfg.actor_timeout_s)
        ray = self.ray
        try:
            width, dtype = ray.get(self.producer.attach.remote(result_shape), timeout=wait)
            ray.get([w.attach.remote() for w in self.compute_workers], timeout=wait)
            ray.get([w.ready.remote(width, dtype) for w in self.workers], timeout=wait)
            found = ray.get([h.__ray_call__.remote(_whoami) for _, _, h in self.tq_actors], timeout=wait)
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the producer, the {len(self.compute_workers)} worker actors and TransferQueue's "
                               f"actors did not start within {wait:.0f} s (the run's --timeout was near)") from None
        for (name, role, _), (pid, machine, node_id) in zip(self.tq_actors, found):
            link = channel.connect(self.cfg)  # one connection each: the parent names a process by its hello
            link.send(Hello(type="hello", name=name, role=role, pid=pid, machine=machine, node_id=node_id))
            self.links.append(link)

    def warm(self, whole: Any) -> None:
        """One small step (one row per worker) during set-up: first-call costs land in the baselines."""
        self._run(len(self.compute_workers))

    def step(self, whole: Any) -> None:
        """One training step of the TQ trainer: the rollout writes, the controller passes metadata, the
        workers read, compute and write back, the controller reads the result and clears the step."""
        self._run(None)

    def _run(self, rows: int | None) -> None:
        ray, mod = self.ray, self.mod
        self.counter += 1
        tag = f"s{self.counter}"
        with steps.step("rollout"):  # the producer's kv_batch_put; only its metadata comes back
            meta = ray.get(self.producer.produce.remote(tag, rows))
        with steps.step("chunk"):
            shards = meta.chunk(len(self.compute_workers))
        with steps.step("argument serialization"):
            pending = [w.compute_meta.remote(s) for w, s in zip(self.compute_workers, shards)]
        with steps.step("ray.get"):
            ray.get(pending)
        with steps.step("kv_batch_get"):
            out = mod.kv_batch_get(keys=list(meta.keys), partition_id=PARTITION, select_fields=[RESULT_FIELD])
        with steps.step("kv_clear"):
            mod.kv_clear(keys=list(meta.keys), partition_id=PARTITION)
        del meta, shards, pending, out

    def close(self) -> None:
        """Stop TransferQueue's actors and close the announcements (best effort: the driver's end reaps)."""
        for link in self.links:
            try:
                link.close()
            except OSError:
                pass
        tq.close()


def plane_lines(results: Sequence[Any]) -> list[str]:
    """One line per replay (a :class:`~picklescope.investigate.node.result.NodeResult`) for comparing data
    planes on the same workload, codec and budget: the outcome (who was killed first), the node's peak,
    and each kind of process's own peak above its baseline, as multiples of the payload."""
    lines = []
    for r in results:
        p = r.payload_bytes or 1

        def own(prefix: str, r: Any = r, p: int = p) -> str:
            v = r.own_peaks_sum_bytes(prefix)
            return "-" if v is None else f"{v / p:.2f}x"

        outcome = r.outcome if r.killed is None else f"killed {r.killed.process} in training step " \
                                                      f"{r.killed.training_step}"
        node = "-" if r.node_peak_bytes is None else f"{r.node_peak_bytes / p:.2f}x"
        parts = [f"{r.data_plane:<13} {outcome}: node peak {node}", f"driver {own('driver')}"]
        if "producer" in r.processes:
            parts.append(f"producer {own('producer')}")
        parts.append(f"workers {own('worker-')} (sum)")
        if any(n.startswith("storage-") for n in r.processes):
            parts.append(f"storage units {own('storage-')} (sum)")
        if "tq-controller" in r.processes:
            parts.append(f"tq-controller {own('tq-controller')}")
        lines.append(", ".join(parts))
        if r.killed is not None:  # what each process held when the budget was crossed: why that one was picked
            above = {n: r.processes[n].above(v) for n, v in r.killed.memory_bytes.items() if n in r.processes}
            held = {n: v for n, v in above.items() if v is not None}
            top = sorted(held.items(), key=lambda kv: -kv[1])[:4]
            lines.append("  at the kill, above baselines: " + ", ".join(f"{n} {v / p:.2f}x" for n, v in top)
                         + f" (oom_score: {r.killed.process} {r.killed.oom_scores.get(r.killed.process)})")
    return lines


def plane_verdict(dataproto: Any, transferqueue: Any) -> str:
    """One sentence that answers "would the TransferQueue plane have saved this node?" from two replays of the
    same workload, codec and node budget, one per data plane (each a
    :class:`~picklescope.investigate.node.result.NodeResult`): yes, no, or that the question did not arise,
    with the training step each replay lost a process in, which is the evidence."""
    def lost(r: Any) -> str:
        return f"lost its {r.killed.process} in training step {r.killed.training_step}"

    dp, tq_ = dataproto, transferqueue
    dp_ok, tq_ok = dp.killed is None and dp.outcome == "ok", tq_.killed is None and tq_.outcome == "ok"
    if tq_.killed is None and not tq_ok:
        return f"Not known: the TransferQueue replay ended {tq_.outcome} ({tq_.error or 'no detail'})."
    if dp.killed is None and not dp_ok:
        return f"Not known: the DataProto replay ended {dp.outcome} ({dp.error or 'no detail'})."
    if tq_ok and dp_ok:
        return "The question did not arise: under this budget both data planes completed every training step."
    if tq_ok:
        return (f"Yes: under the same node budget the TransferQueue plane completed every training step, where "
                f"the DataProto plane {lost(dp)}.")
    if dp_ok:
        return (f"No: under the same node budget the TransferQueue plane {lost(tq_)}, where the DataProto plane "
                "completed every training step.")
    when = tq_.killed.training_step - dp.killed.training_step
    return (f"No: under the same node budget the TransferQueue plane {lost(tq_)}, "
            f"{'later' if when > 0 else 'earlier'} than the DataProto plane, which {lost(dp)}." if when else
            f"No: under the same node budget both planes lost a process in training step {tq_.killed.training_step} "
            f"(TransferQueue its {tq_.killed.process}, DataProto its {dp.killed.process}).")
