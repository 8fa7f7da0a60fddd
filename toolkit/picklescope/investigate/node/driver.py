"""A node's driver: a child of ours that starts (or joins) the cluster, creates the workers and runs the steps.

It becomes a session leader first (so every process of the cluster it starts can be found and
killed), sends what it prints to a log in the run's folder, starts Ray, builds the batch, creates
the workers through an engine (:class:`~picklescope.investigate.node.replica.ReplicaEngine`, or
real verl's worker group, :class:`~picklescope.investigate.node_verl.VerlEngine`), then replays the
training steps as named, exactly measured steps. With ``--controller actor`` everything after Ray's
start runs in a :class:`TaskRunner` actor instead, and this process relays (:mod:`.controller`). In
a series it switches codec when the parent says :class:`~picklescope.core.events.Next`. Its end is
the Ray driver's: the parent's death ends the cluster and removes the temporaries at once
(:class:`~picklescope.ray.cluster.ParentWatch`).
"""

from __future__ import annotations

import gc
import os
import signal
import time
from dataclasses import replace
from typing import Any

from picklescope.core import cgroup, procmem, steps
from picklescope.core.events import CodecInfo, Done, Engine, Finished, RayInfo, Ready, TrainStepEnd, TrainStepStart
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import collector, controller
from picklescope.investigate.node.config import NodeConfig
from picklescope.investigate.node.data import NodeData
from picklescope.investigate.node.replica import ReplicaEngine
from picklescope.investigate.node.tq_plane import TQEngine, cpus_needed
from picklescope.investigate.node.worker import verl_worker_class
from picklescope.investigate.node_verl import VerlEngine
from picklescope.measure import launcher
from picklescope.measure.child import arm_stack_dump, begin_measure, end_measure, error_event
from picklescope.ray import channel, hooks
from picklescope.ray.cluster import ParentWatch, cluster_processes, start_ticks, start_watch, stop_all
from picklescope.ray.driver import (
    _exit_on_sigterm,
    cluster_info,
    end_session,
    init_args,
    init_ray,
    restore_priority,
    wait_s,
)
from picklescope.workloads.spec import load_workload

ROUGH_MEMORY_RESOURCE = 2**30  # --enforcement ray: Ray's logical memory resource (no task reserves any)
DRIVER_LOG = "driver.log"  # the driver's stdout and stderr, in the run's folder


def node_driver_main(conn: Any, cfg: NodeConfig) -> None:
    """Run the driver; always ends the Ray session it started and removes the run's temporaries."""
    launcher.collect_like_a_fresh_process()  # the default collector as in verl's long-lived driver
    os.setsid()
    # What Ray prints in this process (its "A worker died ..." notices when a budget kills a worker,
    # its C++ logs at shutdown) goes to a log in the run's folder, not to the user's terminal or
    # notebook, where it would look like picklescope failing; stdout may carry --json. The parent
    # quotes the log's end when the run ends in an error or a timeout.
    log = os.open(os.path.join(cfg.run_dir, DRIVER_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # If the parent dies (SIGKILL, closed terminal) at any moment, Ray's start-up included, a thread
    # removes the run's temporaries and kills the cluster this driver started; the forkserver's death
    # sends SIGTERM, which ends the main thread through the finally below.
    # and the run's memory cgroups (--enforcement cgroup or ray), which the parent would have removed: held
    # by descriptor now, since after view_as_root this process no longer sees them at their paths
    paths = [p for p in (cfg.ray_view_cgroup, cfg.cgroup) if p]
    cgroups = cgroup.Remover(paths)
    if paths:  # and a small process outside this session removes them too: Ray may end this one first
        start_watch(cfg.parent_pid, os.getpid(), start_ticks(os.getpid()), None, paths)
    watch = ParentWatch(cfg.parent_pid, (cfg.ray_temp_dir, cfg.run_dir), cfg.ray_temp_dir,
                        before_exit=cgroups.remove).start()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    launcher.die_with_parent(signal.SIGTERM)
    _stack = arm_stack_dump(cfg, "driver")  # noqa: F841 - kept open for the signal handler
    for key, value in cfg.ray_env.items():
        os.environ.setdefault(key, value)
    try:
        _run_node(conn, cfg)
    except BaseException as exc:  # noqa: BLE001 - reported, the parent decides
        _report(conn, exc)
    finally:
        end_session(watch)
        me = os.getpid()
        stop_all(lambda: cluster_processes(me, None))  # whatever ray.shutdown left of this session


def _report(conn: Any, exc: BaseException) -> None:
    """The controller's failure, to the parent, which decides; then wait for it to let go (a parent already
    gone is not an error here)."""
    try:
        conn.send(error_event("driver", exc))
        _wait(conn)
    except (OSError, BrokenPipeError):
        pass


def _wait(conn: Any) -> Any:
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _result_shape(batch: Any, rows: int, payload: int, returns: float | None) -> tuple[int, Any]:
    """(width, dtype) of each worker's result row: ``returns`` x the chunk's payload, or a per-token float."""
    import torch  # deferred: heavy, and only the node's processes compute

    if returns is not None:
        return max(1, int(round(returns * payload / rows))), torch.uint8
    width = 1
    for value in batch.batch.values():
        if value.dim() == 2 and not value.dtype.is_floating_point and value.dtype != torch.bool:
            width = max(width, int(value.shape[1]))
    return width, torch.float32


def _run_node(conn: Any, cfg: NodeConfig) -> None:
    # the cgroup is joined before Ray starts: every process of the cluster is born inside it
    if cfg.cgroup and not cgroup.add_process(cfg.cgroup, os.getpid()):
        raise PicklescopeError(f"the node's driver cannot join the memory cgroup {cfg.cgroup}",
                               "use --enforcement watchdog")
    if cfg.ray_view_cgroup:  # Ray's monitor reads the watched cgroup as the machine's (see enforce)
        try:
            cgroup.view_as_root(cfg.ray_view_cgroup)
        except OSError as exc:
            raise PicklescopeError(f"--enforcement ray cannot show the run's cgroup to Ray: {exc}",
                                   "use --enforcement cgroup or watchdog") from None
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    import ray  # deferred: Ray is imported only in the node's own processes, never by the parent

    if cfg.ray_view_cgroup:
        _machine_memory_for_ray_start()
    init_ray(conn, cfg, _init_args(cfg))  # the start-up policy of picklescope.ray.startup
    info = cluster_info()
    info["node_id"] = ray.get_runtime_context().get_node_id()
    conn.send(RayInfo(type="ray_info", side="driver", **info))
    restore = None if cfg.ray_address else niceness
    if cfg.controller == "actor":
        _run_actor(ray, conn, cfg, restore)
    else:
        _control(ray, conn, cfg, restore)


def _run_actor(ray: Any, conn: Any, cfg: NodeConfig, restore: int | None) -> None:
    """``--controller actor``: the loop runs in a :class:`TaskRunner` actor; this process only relays."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    relay = controller.Relay(cfg.run_dir)
    runner = ray.remote(num_cpus=1, max_restarts=0)(TaskRunner).options(  # verl's TaskRunner takes one CPU
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=ray.get_runtime_context().get_node_id(),
                                                           soft=False)).remote()
    ref = runner.run.remote(cfg, relay.address, relay.key)

    def seen(msg: Any) -> None:  # the workers are up once the engine is announced: every Ray process back
        if restore is not None and isinstance(msg, dict) and msg.get("type") == "engine":
            restore_priority(restore)

    try:
        relay.run(ray, ref, conn, lambda cap: wait_s(cfg, cap), seen)
    finally:
        relay.close()


class TaskRunner:
    """``--controller actor``: the node's controller as a Ray actor, in the place of verl's ``TaskRunner``
    (named so that Ray's messages name it as verl's users read them: ``ray::TaskRunner.run``)."""

    def run(self, cfg: NodeConfig, address: str, key: bytes) -> None:
        """The whole replay (batch, workers, training steps), talking to the parent through the driver."""
        import ray  # deferred: Ray is imported only in the node's own processes, never by the parent

        conn = controller.connect(address, key)
        _stack = arm_stack_dump(cfg, "driver")  # noqa: F841 - kept open for the signal handler
        try:
            controller.hello(conn)
            _control(ray, conn, cfg, None)
        except BaseException as exc:  # noqa: BLE001 - reported, the parent decides
            _report(conn, exc)
        finally:
            conn.close()


def _control(ray: Any, conn: Any, cfg: NodeConfig, restore: int | None) -> None:
    """The controller: the batch, the workers, the training steps (in the driver, or in its actor)."""
    data = NodeData(cfg.codec)
    if data.info:
        conn.send(CodecInfo(type="codec_info", side="driver", info=data.info))
    wl = load_workload(cfg.workload)
    hooks.install(serialize=True)
    if cfg.data_plane == "transferqueue":  # the controller handles metadata only: no batch here
        tq_engine = _start_tq(conn, cfg, ray, data, restore)
        _loop(conn, cfg, tq_engine, None)
        tq_engine.close()  # the parent let go: TransferQueue's actors end before the Ray session does
        return
    engine: ReplicaEngine | VerlEngine
    replica = cfg.engine != "verl"
    if replica:  # its workers start now (Ray starts their processes in the background) while the batch is built
        engine = ReplicaEngine(ray, cfg, data)
    batch = wl.build(cfg.scale)
    payload = wl.payload_bytes(cfg.scale)
    whole = data.wrap(batch)
    width, dtype = _result_shape(batch, len(batch), payload, cfg.returns)
    del batch
    dtype_name = str(dtype).removeprefix("torch.")
    if replica:
        engine.ready(width, dtype_name)
    else:
        engine = VerlEngine(ray, cfg, verl_worker_class(cfg.codec), width, dtype_name)
        engine.ready()
    conn.send(Engine(type="engine", info={**engine.info, **data.split_join()}))
    if restore is not None:
        restore_priority(restore)
    # A small call per worker during set-up: first-call costs (lazy imports on both ends,
    # Ray's first object-store mapping) land in the baselines, not in training step 1.
    engine.warm(whole)
    _loop(conn, cfg, engine, whole)


def _start_tq(conn: Any, cfg: NodeConfig, ray: Any, data: NodeData, restore: int | None) -> TQEngine:
    """The TransferQueue data plane's set-up (:mod:`.tq_plane`): its actors, the producer and the workers."""
    engine = TQEngine(ray, cfg, data)
    engine.start(_result_shape)
    conn.send(Engine(type="engine", info=engine.info))
    if restore is not None:
        restore_priority(restore)
    engine.warm(None)
    return engine


def _loop(conn: Any, cfg: NodeConfig, engine: ReplicaEngine | VerlEngine, whole: Any) -> None:
    """The replays of a series, one after the other, until the parent lets go."""
    while True:
        if not _replay(conn, cfg, engine, whole):
            return
        msg = _wait(conn)
        if not isinstance(msg, dict) or msg.get("type") != "next":
            return  # the parent's release (or its end): the Ray session ends in node_driver_main
        cfg = replace(cfg, codec=msg["codec"], gc=msg.get("gc", cfg.gc), t0=msg["t0"], t0_wall=msg["t0_wall"])
        if isinstance(engine, ReplicaEngine):  # a series runs on the replica engine only (one verl codec, or
            # built-in codecs: checks.plan)
            engine.switch(NodeData(cfg.codec), cfg)


def _replay(conn: Any, cfg: NodeConfig, engine: ReplicaEngine | VerlEngine, whole: Any) -> bool:
    """One measured replay of ``cfg.steps`` training steps; False if the parent went away before it began."""
    series = cfg.warm_up == "steps"
    if series:  # every replay of a series starts after as many unmeasured training steps of its own codec,
        # under its own collector: the store pages and allocator arenas its pattern needs are in its baseline
        gc.enable()  # the replay before may have turned the collector off; this one's mode decides
        collector.apply_mode(cfg.gc)
        for _ in range(cfg.steps):
            engine.step(whole)
    engine.arm()
    gc.enable()
    gc.collect()
    # and with what set-up (the batch built and split, the warm call), the previous replay or the warm-up freed
    # given back, as in the workers: glibc keeps freed heap pages resident, and a step's allocation that lands
    # on them would not show in RSS (a plain replay's first legacy copy rose 0.26-0.84x of a payload, not 1x)
    procmem.trim_heap()
    collector.apply_mode(cfg.gc)
    collector.count_collections()
    says_calls = isinstance(engine, ReplicaEngine)  # its loop says where each collection ran (real verl's does not)
    if says_calls:  # a collection before step 1's first call (the baseline, the go) has no call of it made
        collector.at_call(0)
    meter = begin_measure(steps.Meter(channel.with_shared(conn.send), cfg.t0, "driver"))
    if says_calls:  # again, now that the meter keeps the codec's steps (where a call stood against its copy)
        collector.at_call(0)
    private_base = procmem.private_rss()  # VmRSS - RssShmem: the session's per-process accounting
    conn.send(Ready(type="ready", side="driver"))
    if _wait(conn) is None:
        return False
    for k in range(1, cfg.steps + 1):
        conn.send(TrainStepStart(type="train_step_start", index=k, t_s=meter.now()))
        engine.step(whole)
        if cfg.step_gap_s:  # the step's compute, during which Ray's frees of its objects land
            time.sleep(cfg.step_gap_s)
        if cfg.gc == "each-step":
            with steps.step("gc"):
                gc.collect()
        conn.send(TrainStepEnd(type="train_step_end", index=k, t_s=meter.now(), private_bytes=procmem.private_rss(),
                               private_baseline_bytes=private_base, full_collections=collector.full_collections(),
                               collections=collector.collections(), allocations=collector.allocations(),
                               runs=collector.take_runs()))
        if says_calls:  # a collection before the next step's first call finds this one's copies garbage
            collector.at_call(0)

    def at_end() -> int:
        engine.finish()  # the workers end their own measured phase
        return collector.full_collections()  # a collection Ray asked for meanwhile changes what is held: counted

    m = end_measure(conn, meter, None, read_at_end=at_end, trim=True)
    conn.send(Done(type="done", side="driver", peak_bytes=m.peak_bytes, held_bytes=m.held_bytes,
                   cycle_held_bytes=m.cycle_held_bytes, t_s=m.end_t, full_collections=m.at_end))
    conn.send(Finished(type="finished"))
    return True


def _machine_memory_for_ray_start() -> None:
    """``--enforcement ray``: Ray's Python start-up (in this process) sizes and checks the object store
    against the machine's memory, which it reads at the same cgroup path as the raylet's monitor; with
    the watched cgroup shown there it would refuse a store larger than the budget. Its checks get the
    machine's memory; the raylet's monitor (C++, its own reading) still sees the watched cgroup."""
    import psutil
    import ray._common.utils as ray_utils  # deferred: Ray is imported only in the node's own processes

    total = int(psutil.virtual_memory().total)
    ray_utils.get_system_memory = lambda *args, **kwargs: total


def _init_args(cfg: NodeConfig) -> dict[str, Any] | None:
    """``ray.init`` arguments of a cluster the run starts: for the verl engine one logical CPU per worker
    (verl's resource pool reserves a CPU bundle per worker), for ``--enforcement ray`` a given memory
    resource; the usual arguments otherwise (None for a joined cluster)."""
    if cfg.ray_address:
        return None
    args = init_args(cfg)
    if cfg.ray_view_cgroup:  # Ray now reads the watched cgroup's small limit as the machine's memory;
        # its logical "memory" resource (what tasks may reserve, none here) is given, not derived from it
        args["_memory"] = ROUGH_MEMORY_RESOURCE
    if cfg.engine == "verl":
        args["num_cpus"] = max(int(args.get("num_cpus") or 1), int(cfg.workers))
        if cfg.controller == "actor":  # and one for the controller actor, as verl's TaskRunner
            args["num_cpus"] += 1
    if cfg.data_plane == "transferqueue":  # TransferQueue's actors each reserve one logical CPU
        args["num_cpus"] = max(int(args.get("num_cpus") or 1), cpus_needed())
    return args
