"""The sender side over Ray: the driver, a child of ours from the warm forkserver.

It becomes a session leader first (so every process of the cluster it starts can be found and killed
by the parent, see :mod:`.cluster`), builds the batch and its manifest, starts or joins the cluster,
creates the receiver actor, and only then takes its baseline. Its measured phase is what a verl
driver does: ``ray.put(batch)`` (put path) or ``actor.method.remote(batch)`` (argument path), with
Ray's serialize and the object-store write as separate steps (:mod:`.hooks`). After reporting its own
side it hands the object to the actor and waits, alive and sampled, until the parent lets go; then
it shuts the cluster down.
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import threading
import time
from dataclasses import replace
from typing import Any

from picklescope.batch import set_active_codec
from picklescope.codecs import get_codec
from picklescope.codecs.verify import manifest
from picklescope.core import steps
from picklescope.core.events import Done, Error, Handoff, Note, RayInfo, Ready, StoreProcess
from picklescope.core.leftovers import creator_pid
from picklescope.core.plugins import load_plugins
from picklescope.measure import launcher
from picklescope.measure.child import arm_stack_dump, begin_measure, end_measure, error_event
from picklescope.ray import channel, hooks, startup
from picklescope.ray import transferqueue as tq
from picklescope.ray.actor import ReceiverActor
from picklescope.ray.cluster import ParentWatch, cluster_processes, kill, parent_of
from picklescope.ray.config import RayConfig, RayPairConfig
from picklescope.ray.transferqueue import tq_dir
from picklescope.workloads.spec import load_workload

SIDE = "sender"
OBJECT_STORE_MINIMUM = 80 * 1024 * 1024  # Ray refuses less than 75 MiB
STARTUP_NICE = -10


def object_store_bytes(payload: int, requested: int | None = None) -> int:
    """A bounded store: room for the object twice (a put plus a call argument) and some slack."""
    if requested:
        return max(OBJECT_STORE_MINIMUM, int(requested))
    return max(OBJECT_STORE_MINIMUM, 2 * payload + 64 * 1024 * 1024)


def init_args(cfg: RayConfig) -> dict[str, Any]:
    """``ray.init`` arguments: our own small local cluster, or a connection to the given one."""
    common: dict[str, Any] = {"logging_level": "WARNING", "log_to_driver": False}
    num_cpus = 1
    if cfg.ray_path == "tq":  # TransferQueue's controller and storage unit each reserve one CPU

        common["runtime_env"] = {"env_vars": {"PYTHONPATH": str(tq_dir())}}
        num_cpus = 3
    if cfg.ray_address:
        return {"address": cfg.ray_address, **common}
    return {"address": "local", "include_dashboard": False, "num_cpus": num_cpus,
            "object_store_memory": cfg.object_store_bytes, "_temp_dir": cfg.ray_temp_dir,
            "_node_ip_address": "127.0.0.1", **common}


def cluster_info() -> dict[str, Any]:
    """Pids and paths of the local node's processes (empty when we only joined a cluster)."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    info: dict[str, Any] = {"pids": {}, "session_dir": None, "node_ip": None}
    if node is None:
        return info
    try:
        for name, procs in node.all_processes.items():
            info["pids"][name] = [p.process.pid for p in procs if p.process is not None]
        info["session_dir"] = node.get_session_dir_path()
        info["raylet_socket"] = node.raylet_socket_name
        info["node_ip"] = node.node_ip_address
    except Exception as exc:  # noqa: BLE001 - internals of one Ray version; the session scan still works
        info["error"] = f"{type(exc).__name__}: {exc}"
    return info


def init_ray(conn: Any, cfg: RayConfig, args: dict[str, Any] | None = None) -> None:
    """``ray.init`` of our own cluster (or a join of the given one) under the start-up policy of
    :mod:`.startup`: a few tries, all of them bounded by what is left of the run's limit (``cfg.deadline_wall``,
    a ``time.time()``), the core processes watched while it runs; a failure is a :class:`RayStartError`.

    ``args`` replaces :func:`init_args` (the node's verl engine asks for more logical CPUs). Only the
    start-up runs at a raised priority (see :func:`restore_priority`).
    """
    import ray

    args = init_args(cfg) if args is None else args
    if cfg.ray_address:
        ray.init(**args)
        return
    try:
        os.nice(STARTUP_NICE)
    except OSError as exc:
        conn.send(Note(type="note", side=SIDE, message=f"cannot raise start-up priority: {exc}"))
    deadline = cfg.deadline_wall
    left = None if deadline is None else deadline - time.time() - cfg.cleanup_reserve_s
    t0 = time.monotonic()
    reasons: list[str] = []
    me = os.getpid()
    for i, budget in enumerate(startup.try_budgets(left)):
        watch = startup.ComponentWatch(lambda: cluster_processes(me, None))
        try:
            with _StartupGuard(budget, watch):
                ray.init(**args)
            return
        except _StartupInterrupt as exc:
            reasons.append(exc.reason)
        except Exception as exc:  # noqa: BLE001 - Ray's start-up raises many kinds; each becomes one reason
            watch.poll()
            reasons.append(watch.sentence("start-up") or startup.short_reason(exc))
        said = startup.raylet_said(cfg.ray_temp_dir)
        if said and "raylet" in reasons[-1]:
            reasons[-1] += f" ({said})"
        conn.send(Note(type="note", side=SIDE, message=f"Ray start-up try {i + 1} failed after "
                       f"{time.monotonic() - t0:.0f} s: {reasons[-1]}"))
        try:
            ray.shutdown()
        except Exception:  # noqa: BLE001 - a half-started session; the kill below ends it
            pass
        kill(cluster_processes(os.getpid(), None))  # what the failed try left, before the next one
    raise startup.RayStartError(time.monotonic() - t0, reasons or ["no time was left to try"],
                                startup.load_average())


def wait_s(cfg: RayConfig, cap: float) -> float:
    """How long one wait in the driver may take: ``cap``, or less when the run's own limit
    (``cfg.deadline_wall``) is nearer, so no single wait carries the run past it."""
    deadline = cfg.deadline_wall
    return cap if deadline is None else max(1.0, min(cap, deadline - time.time()))


class _StartupInterrupt(BaseException):
    """Raised in the main thread by :class:`_StartupGuard` (a BaseException, so Ray's own ``except
    Exception`` blocks inside ``ray.init`` cannot swallow it)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class _StartupGuard:
    """Interrupts ``ray.init`` when its try runs out of time or a core process dies.

    A thread checks every half second; only when it finds one of the two does it send ``SIGALRM`` to
    the main thread, whose handler raises between Python statements of ``ray.init``'s own waiting loops
    (a thread could see the death but could not stop the call). A start-up that goes well gets no signal.
    """

    def __init__(self, budget_s: float, watch: startup.ComponentWatch) -> None:
        self.budget_s, self.watch = budget_s, watch
        self.t0 = time.monotonic()
        self.previous: Any = None
        self.reason: str | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._check, name="picklescope-ray-startup-guard", daemon=True)

    def _check(self) -> None:
        while not self.stop.wait(0.5):
            if self.watch.poll() is not None:
                self.reason = self.watch.sentence("start-up") or "a Ray process died during start-up"
            elif time.monotonic() - self.t0 > self.budget_s:
                self.reason = f"no answer within {self.budget_s:.0f} s"
            if self.reason is not None:
                signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)
                return

    def _interrupt(self, signum: int, frame: Any) -> None:
        if self.reason is not None and not self.stop.is_set():
            raise _StartupInterrupt(self.reason)

    def __enter__(self) -> _StartupGuard:
        self.previous = signal.signal(signal.SIGALRM, self._interrupt)
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop.set()
        self.thread.join()
        signal.signal(signal.SIGALRM, self.previous or signal.SIG_DFL)


def restore_priority(niceness: int) -> None:
    """Put the driver and every process of our cluster back to the priority we started with.

    The agents a raylet starts must write their port files within Ray's fixed 15 s, which a busy
    2-core machine does not always allow; a raised priority (inherited by every Ray process) gets the
    cluster up, and dropping it again before the measured phase keeps the measurement ordinary.
    """
    for pid in cluster_processes(os.getpid(), None) | {os.getpid()}:
        try:
            os.setpriority(os.PRIO_PROCESS, pid, niceness)
        except OSError:
            pass


def pair_driver_main(conn: Any, cfg: RayPairConfig) -> None:
    """Run the sender side; always ends the Ray session it started."""
    os.setsid()
    os.dup2(2, 1)  # what Ray prints here ("A worker died ...") goes to stderr: stdout may carry --json
    # If the run's parent dies (SIGKILL, closed terminal) at any moment, ray.init included, a thread
    # removes the run's temporaries and kills the cluster this driver started (see ParentWatch). The
    # forkserver's death also sends SIGTERM, which ends the main thread through the finally below
    # rather than by the launcher's default SIGKILL, which would leave the watch no time.
    watch = ParentWatch(run_parent(cfg), (cfg.ray_temp_dir, cfg.run_dir), cfg.ray_temp_dir).start()
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    launcher.die_with_parent(signal.SIGTERM)
    arm_stack_dump(cfg, SIDE)
    for key, value in cfg.env.get(SIDE, {}).items():
        os.environ[key] = value
    for key, value in cfg.ray_env.items():
        os.environ.setdefault(key, value)
    try:
        _run(conn, cfg)
    finally:
        end_session(watch)


def end_session(watch: ParentWatch) -> None:
    """How a Ray driver of ours ends (a pair's and a node's): with its parent gone, nobody reads the run
    any more, so the cluster and the temporaries go at once (no graceful shutdown); else ``ray.shutdown``,
    and the parent kills whatever is left.

    The watch is not stopped: a parent SIGKILLed closes its end of the run's channels before the kernel
    shows it gone, so a run that ended on its closed channel often finds its parent still there (for tens
    of milliseconds on a loaded machine). The watch sees the parent go during the shutdown, and the parent
    is looked at again after it, so the files and the cluster go as if it had been seen gone at once."""
    if not watch.parent_alive():
        watch.end_orphaned()
    ray = sys.modules.get("ray")
    if ray is not None:
        try:
            ray.shutdown()
        except BaseException:  # noqa: BLE001 - a Ray error (or the SIGTERM's exit) while stopping: the kill follows
            pass
    if not watch.parent_alive():
        watch.end_orphaned()


def run_parent(cfg: RayConfig) -> int:
    """The process that runs the measurement: the creator named in the run directory's name, else the
    forkserver's parent (the driver's own parent is the forkserver, which outlives it by a moment)."""
    pid = creator_pid(cfg.run_dir or "")
    if pid is None:
        pid = parent_of(os.getppid()) or os.getppid()
    return pid


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _run(conn: Any, cfg: RayPairConfig) -> None:
    try:
        load_plugins(cfg.plugins)
        set_active_codec(cfg.codec)
        get_codec(cfg.codec)
        niceness = os.getpriority(os.PRIO_PROCESS, 0)
        batch = load_workload(cfg.workload).build(cfg.scale)
        expected = manifest(batch)
        import ray

        init_ray(conn, cfg)
        if isinstance(cfg.events_address, list) and not cfg.events_address[0]:
            cfg = replace(cfg, events_address=[ray.util.get_node_ip_address(), cfg.events_address[1]])
        conn.send(RayInfo(type="ray_info", side=SIDE, **cluster_info()))
        hooks.install(serialize=True)
        if cfg.ray_path == "tq":
            conn.send(StoreProcess(type="store_process", side=SIDE, pid=tq.start(conn),
                                   what="TransferQueue storage unit"))
        actor_cls = ray.remote(num_cpus=0, max_restarts=0)(ReceiverActor)
        actor = actor_cls.remote(cfg)
        ray.get(actor.ready.remote(), timeout=wait_s(cfg, cfg.actor_timeout_s))
        if not cfg.ray_address:
            restore_priority(niceness)
        if cfg.ray_path == "arg":
            ray.get(actor.arm.remote(expected))
        elif cfg.ray_path == "tq":
            ray.get(actor.attach_tq.remote())
        gc.collect()
        conn.send(Ready(type="ready", side=SIDE, pid=os.getpid(), manifest=expected))
    except BaseException as exc:  # noqa: BLE001 - any setup failure is reported, not raised
        conn.send({**error_event(SIDE, exc), "phase": "setup"})
        _wait_release(conn)
        return
    meter = begin_measure(steps.Meter(channel.with_shared(conn.send), cfg.t0, SIDE))
    error: Error | None = None
    pending, ref = None, None
    try:
        hooks.expect_store_write(None if cfg.ray_path == "tq" else batch)
        if cfg.ray_path == "tq":
            with steps.step("tq.put"):
                keys = tq.put(batch)
        elif cfg.ray_path == "arg":
            with steps.step("actor.call"):
                try:
                    pending = actor.receive_arg.remote(batch)
                finally:
                    hooks.end_store_write()
        else:
            with steps.step("ray.put"):
                try:
                    ref = ray.put(batch)
                finally:
                    hooks.end_store_write()
    except BaseException as exc:  # noqa: BLE001
        error = error_event(SIDE, exc)
    m = end_measure(conn, meter, error, read_at_end=channel.shared_bytes)
    last = hooks.last_serialized() or {}
    blob = last.get("total_bytes")
    handoff = Handoff(path=cfg.ray_path, blob_bytes=blob, inband_bytes=None, oob_bytes=None)
    conn.send(Done(type="done", side=SIDE, peak_bytes=m.peak_bytes, held_bytes=m.held_bytes,
                   cycle_held_bytes=m.cycle_held_bytes, handoff=handoff, baseline_bytes=m.baseline_bytes,
                   t_s=m.end_t, shm_end_bytes=m.at_end))
    if error is None:
        try:
            if cfg.ray_path == "tq":
                pending = actor.receive_tq.remote(keys, tq.layout_of(batch), batch.meta_info, expected)
            elif pending is None:
                pending = actor.receive.remote([ref], expected)
            ray.get(pending)
        except BaseException as exc:  # noqa: BLE001 - the actor died or its deserialize failed
            conn.send({**error_event("receiver", exc), "phase": "measure", "reported_by": "driver"})
    del batch, ref, pending
    _wait_release(conn)
    if cfg.ray_path == "tq":
        tq.close()


def _wait_release(conn: Any) -> None:
    """Stay alive (the object and the actor live as long as the driver) until the parent lets go."""
    try:
        conn.recv()
    except (EOFError, OSError):
        pass


# Old private names, kept while the modules named below still import them; use the public names.
