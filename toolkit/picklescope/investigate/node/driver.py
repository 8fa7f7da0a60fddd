"""A node's driver: a child of ours that starts (or joins) the cluster, creates the workers and runs the steps.

It becomes a session leader first (so every process of the cluster it starts can be found and
killed), sends what it prints to a log in the run's folder, builds the batch, starts Ray, creates
the workers through an engine (:class:`~picklescope.investigate.node.replica.ReplicaEngine`, or
real verl's worker group, :class:`~picklescope.investigate.node_verl.VerlEngine`), then replays the
training steps as named, exactly measured steps. In a series it switches codec when the parent
says :class:`~picklescope.core.events.Next`. Its end is the Ray driver's: the parent's death ends
the cluster and removes the temporaries at once (:class:`~picklescope.transports.ray.cluster.ParentWatch`).
"""

from __future__ import annotations

import gc
import os
import signal
from typing import Any

from picklescope.core import cgroup, procmem, steps
from picklescope.core.events import CodecInfo, Done, Engine, Finished, RayInfo, Ready, TrainStepEnd, TrainStepStart
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import collector
from picklescope.investigate.node.data import NodeData
from picklescope.investigate.node.replica import ReplicaEngine
from picklescope.investigate.node.tq_plane import TQEngine, cpus_needed
from picklescope.investigate.node.worker import verl_worker_class
from picklescope.investigate.node_verl import VerlEngine
from picklescope.measure import launcher
from picklescope.measure.child import arm_stack_dump, begin_measure, end_measure, error_event
from picklescope.transports.ray import events, hooks
from picklescope.transports.ray.cluster import ParentWatch, cluster_processes, stop_all
from picklescope.transports.ray.driver import (
    _exit_on_sigterm,
    cluster_info,
    end_session,
    init_args,
    init_ray,
    restore_priority,
)
from picklescope.workloads.spec import load_workload

ROUGH_MEMORY_RESOURCE = 2**30  # --enforcement ray: Ray's logical memory resource (no task reserves any)
DRIVER_LOG = "driver.log"  # the driver's stdout and stderr, in the run's folder


def driver_main(conn: Any, cfg: dict[str, Any]) -> None:
    """Run the driver; always ends the Ray session it started and removes the run's temporaries."""
    launcher.collect_like_a_fresh_process()  # the default collector as in verl's long-lived driver
    os.setsid()
    # What Ray prints in this process (its "A worker died ..." notices when a budget kills a worker,
    # its C++ logs at shutdown) goes to a log in the run's folder, not to the user's terminal or
    # notebook, where it would look like picklescope failing; stdout may carry --json. The parent
    # quotes the log's end when the run ends in an error or a timeout.
    log = os.open(os.path.join(cfg["run_dir"], DRIVER_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    # If the parent dies (SIGKILL, closed terminal) at any moment, Ray's start-up included, a thread
    # removes the run's temporaries and kills the cluster this driver started; the forkserver's death
    # sends SIGTERM, which ends the main thread through the finally below.
    watch = ParentWatch(cfg["parent_pid"], (cfg.get("ray_temp_dir"), cfg["run_dir"]), cfg.get("ray_temp_dir")).start()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    launcher.die_with_parent(signal.SIGTERM)
    _stack = arm_stack_dump(cfg, "driver")  # noqa: F841 - kept open for the signal handler
    for key, value in (cfg.get("ray_env") or {}).items():
        os.environ.setdefault(key, value)
    try:
        _drive(conn, cfg)
    except BaseException as exc:  # noqa: BLE001 - reported, the parent decides
        try:
            conn.send(error_event("driver", exc))
            _wait(conn)
        except (OSError, BrokenPipeError):
            pass
    finally:
        end_session(watch)
        me = os.getpid()
        stop_all(lambda: cluster_processes(me, None))  # whatever ray.shutdown left of this session


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


def _drive(conn: Any, cfg: dict[str, Any]) -> None:
    # the cgroup is joined before Ray starts: every process of the cluster is born inside it
    if cfg.get("cgroup") and not cgroup.add_process(cfg["cgroup"], os.getpid()):
        raise PicklescopeError(f"the node's driver cannot join the memory cgroup {cfg['cgroup']}",
                               "use --enforcement watchdog")
    if cfg.get("ray_view_cgroup"):  # Ray's monitor reads the watched cgroup as the machine's (see enforce)
        try:
            cgroup.view_as_root(cfg["ray_view_cgroup"])
        except OSError as exc:
            raise PicklescopeError(f"--enforcement ray cannot show the run's cgroup to Ray: {exc}",
                                   "use --enforcement cgroup or watchdog") from None
    data = NodeData(cfg["codec"])
    if data.info:
        conn.send(CodecInfo(type="codec_info", side="driver", info=data.info))
    wl = load_workload(cfg["workload"])
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    import ray  # deferred: Ray is imported only in the node's own processes, never by the parent

    if cfg.get("ray_view_cgroup"):
        _machine_memory_for_ray_start()
    init_ray(conn, cfg, _init_args(cfg))  # the start-up policy of transports.ray.startup
    info = cluster_info()
    info["node_id"] = ray.get_runtime_context().get_node_id()
    conn.send(RayInfo(type="ray_info", side="driver", **info))
    hooks.install(serialize=True)
    if cfg.get("data_plane") == "transferqueue":  # the controller handles metadata only: no batch here
        tq_engine = _start_tq(conn, cfg, ray, data, niceness)
        _loop(conn, cfg, tq_engine, None)
        tq_engine.close()  # the parent let go: TransferQueue's actors end before the Ray session does
        return
    engine: ReplicaEngine | VerlEngine
    replica = cfg.get("engine") != "verl"
    if replica:  # its workers start now (Ray starts their processes in the background) while the batch is built
        engine = ReplicaEngine(ray, cfg, data)
    batch = wl.build(cfg["scale"])
    payload = wl.payload_bytes(cfg["scale"])
    whole = data.wrap(batch)
    width, dtype = _result_shape(batch, len(batch), payload, cfg["returns"])
    del batch
    dtype_name = str(dtype).removeprefix("torch.")
    if replica:
        engine.ready(width, dtype_name)
    else:
        engine = VerlEngine(ray, cfg, verl_worker_class(cfg["codec"]), width, dtype_name)
        engine.ready()
    conn.send(Engine(type="engine", info={**engine.info, **data.split_join()}))
    if not cfg.get("ray_address"):
        restore_priority(niceness)
    # A small call per worker during set-up: first-call costs (lazy imports on both ends,
    # Ray's first object-store mapping) land in the baselines, not in training step 1.
    engine.warm(whole)
    _loop(conn, cfg, engine, whole)


def _start_tq(conn: Any, cfg: dict[str, Any], ray: Any, data: NodeData, niceness: int) -> TQEngine:
    """The TransferQueue data plane's set-up (:mod:`.tq_plane`): its actors, the producer and the workers."""
    engine = TQEngine(ray, cfg, data)
    engine.start(_result_shape)
    conn.send(Engine(type="engine", info=engine.info))
    if not cfg.get("ray_address"):
        restore_priority(niceness)
    engine.warm(None)
    return engine


def _loop(conn: Any, cfg: dict[str, Any], engine: ReplicaEngine | VerlEngine, whole: Any) -> None:
    """The replays of a series, one after the other, until the parent lets go."""
    while True:
        if not _replay(conn, cfg, engine, whole):
            return
        msg = _wait(conn)
        if not isinstance(msg, dict) or msg.get("type") != "next":
            return  # the parent's release (or its end): the Ray session ends in driver_main
        cfg = {**cfg, "codec": msg["codec"], "gc": msg.get("gc", cfg["gc"]), "t0": msg["t0"], "t0_wall": msg["t0_wall"]}
        if isinstance(engine, ReplicaEngine):  # a series runs the built-in codecs on the replica engine only
            engine.switch(NodeData(cfg["codec"]), cfg)


def _replay(conn: Any, cfg: dict[str, Any], engine: ReplicaEngine | VerlEngine, whole: Any) -> bool:
    """One measured replay of ``cfg["steps"]`` training steps; False if the parent went away before it began."""
    series = cfg.get("warm_up") == "steps"
    if series:  # every replay of a series starts after as many unmeasured training steps of its own codec,
        # under its own collector: the store pages and allocator arenas its pattern needs are in its baseline
        gc.enable()  # the replay before may have turned the collector off; this one's mode decides
        collector.apply_mode(cfg["gc"])
        for _ in range(cfg["steps"]):
            engine.step(whole)
    engine.arm()
    gc.enable()
    gc.collect()
    if series:  # and with what the previous replay (or the warm-up) freed given back, as in the workers
        procmem.trim_heap()
    collector.apply_mode(cfg["gc"])
    collector.count_full_collections()
    meter = begin_measure(steps.Meter(events.with_shared(conn.send), cfg["t0"], "driver"))
    private_base = procmem.private_rss()  # VmRSS - RssShmem: the session's per-process accounting
    conn.send(Ready(type="ready", side="driver"))
    if _wait(conn) is None:
        return False
    for k in range(1, cfg["steps"] + 1):
        conn.send(TrainStepStart(type="train_step_start", index=k, t_s=meter.now()))
        engine.step(whole)
        if cfg["gc"] == "each-step":
            with steps.step("gc"):
                gc.collect()
        conn.send(TrainStepEnd(type="train_step_end", index=k, t_s=meter.now(), private_bytes=procmem.private_rss(),
                               private_baseline_bytes=private_base, full_collections=collector.full_collections()))

    def at_end() -> int:
        engine.finish()  # the workers end their own measured phase
        return collector.full_collections()  # a collection Ray asked for meanwhile changes what is held: counted

    m = end_measure(conn, meter, None, read_at_end=at_end, trim=series)
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


def _init_args(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """``ray.init`` arguments of a cluster the run starts: for the verl engine one logical CPU per worker
    (verl's resource pool reserves a CPU bundle per worker), for ``--enforcement ray`` a given memory
    resource; the usual arguments otherwise (None for a joined cluster)."""
    if cfg.get("ray_address"):
        return None
    args = init_args(cfg)
    if cfg.get("ray_view_cgroup"):  # Ray now reads the watched cgroup's small limit as the machine's memory;
        # its logical "memory" resource (what tasks may reserve, none here) is given, not derived from it
        args["_memory"] = ROUGH_MEMORY_RESOURCE
    if cfg.get("engine") == "verl":
        args["num_cpus"] = max(int(args.get("num_cpus") or 1), int(cfg["workers"]))
    if cfg.get("data_plane") == "transferqueue":  # TransferQueue's actors each reserve one logical CPU
        args["num_cpus"] = max(int(args.get("num_cpus") or 1), cpus_needed())
    return args
