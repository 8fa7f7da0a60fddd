"""The parent's side of a node replay: start the driver, follow the run, leave nothing behind.

The parent never imports Ray and never computes on a batch: it checks the input (:mod:`.checks`),
starts the driver from the warm forkserver, adopts every process into one
:class:`~picklescope.measure.session.Session` per replay (sampled on one clock with the object store
counted once), folds the events they stream (:mod:`.follow`), enforces the node budget and, whatever
happens, kills what is left of the cluster it started and removes the run's temporaries.
"""

from __future__ import annotations

import os
import shutil
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing import forkserver
from typing import Any

from picklescope.core import cgroup
from picklescope.core.events import Next, Release
from picklescope.core.leftovers import sweep_orphans, temp_name
from picklescope.core.paths import make_temp_dir
from picklescope.core.units import seconds
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import enforce, tq_plane
from picklescope.investigate.node.checks import DEFAULT_SCALE, plan
from picklescope.investigate.node.config import NodeConfig
from picklescope.investigate.node.controller import check_controller
from picklescope.investigate.node.driver import DRIVER_LOG, node_driver_main
from picklescope.investigate.node.follow import Accepter, adopt_known, follow, settle
from picklescope.investigate.node.result import NOT_REPLAYED, NodeResult
from picklescope.investigate.node.tracking import Tracking, set_phase, timeout_message
from picklescope.measure import launcher, verdicts
from picklescope.measure.engine import MeasuredRun
from picklescope.ray import cluster
from picklescope.ray.channel import machine_id
from picklescope.ray.driver import object_store_bytes
from picklescope.ray.orchestrate import ray_env

RELEASE_WAIT_S = 30.0  # at most; less when the run's --timeout is near


def node(codec: str = "numpy", workload: str = "flowgrpo", scale: float = DEFAULT_SCALE, workers: int = 4,
         steps: int = 4, *, returns: float | None = None, dispatch: str = "chunk", gc: str = "default",
         transport: str = "ray-arg", node_budget: Any = None, ray_address: str | None = None,
         worker_resources: dict[str, float] | None = None, spread: bool = False, engine: str = "replica",
         enforcement: str = "watchdog", timeout_s: float = 900.0, sample_interval_s: float = 0.001,
         on_event: Any = None, controller: str = "process",
         data_plane: str = "dataproto", store_bytes: int | None = None, step_gap_s: float = 0.0,
         worker_compute_s: float = 0.0) -> NodeResult:
    """Replay ``steps`` training steps of a verl node (a driver and ``workers`` actors); see the package doc.

    ``node_budget`` (bytes, ``"700MiB"`` or a payload multiple such as ``"1.5x"``) caps the node's total
    above its baseline; the process with the highest ``oom_score`` is killed at the crossing. With
    ``enforcement="cgroup"`` the whole cluster runs in one memory cgroup limited to its usage at the
    baseline plus the budget, and the kernel's OOM killer picks and kills the victim itself.
    """
    return node_series((codec,), workload, scale, workers, steps, returns=returns, dispatch=dispatch, gc=gc,
                       transport=transport, node_budget=node_budget, ray_address=ray_address,
                       worker_resources=worker_resources, spread=spread, engine=engine, enforcement=enforcement,
                       timeout_s=timeout_s, sample_interval_s=sample_interval_s, on_event=on_event,
                       controller=controller, data_plane=data_plane, store_bytes=store_bytes,
                       step_gap_s=step_gap_s, worker_compute_s=worker_compute_s)[0]


def node_series(codecs: Sequence[str], workload: str = "flowgrpo", scale: float = DEFAULT_SCALE, workers: int = 4,
                steps: int = 4, *, returns: float | None = None, dispatch: str = "chunk",
                gc: str | Sequence[str] = "default",
                transport: str = "ray-arg", node_budget: Any = None, ray_address: str | None = None,
                worker_resources: dict[str, float] | None = None, spread: bool = False, engine: str = "replica",
                enforcement: str = "watchdog", timeout_s: float = 900.0, sample_interval_s: float = 0.001,
                on_event: Any = None, controller: str = "process",
                data_plane: str = "dataproto", store_bytes: int | None = None,
                step_gap_s: float = 0.0, worker_compute_s: float = 0.0) -> list[NodeResult]:
    """One replay per codec, one after the other, on the same driver and worker actors; one result each.

    Starting a node is most of its cost (each worker imports torch, tensordict and Ray), so comparing
    codecs on one set of processes (``reproduce``'s node pair) saves that start for every codec after the
    first. So that every replay starts from the same state, each one is preceded by as many unmeasured
    training steps with its own codec and collector (the store pages and allocator arenas they leave are
    part of every replay's baseline, docs/node.md says what that means for the figures) and a full
    collection with the freed heap given back; then its own baseline, its own clock (``t_s`` from its own
    start) and its own session. A series needs codecs one process can switch between: the built-in ones, or one real
    verl codec repeated (each loads its own verl, so its collector modes can share a node). A replay that
    does not end ``ok`` ends the series; the replays after it say so. Every option applies to each replay, except
    ``gc``, which may also give one collector mode per codec (``codecs=(a, b, a, b), gc=("default", "default",
    "off", "off")``): comparing the collectors then needs no second start of the node either.

    ``data_plane`` is how a training step's batch reaches the workers: ``dataproto`` (through the driver,
    verl's single controller) or ``transferqueue`` (through TransferQueue's storage units, the driver
    passing metadata only; :mod:`.tq_plane`).

    ``store_bytes`` sizes the object store of the cluster the series starts (None: room for the run's sends,
    and with ``gc off`` for the chunks uncollected cycles pin). ``predict`` fits on a store that never
    fills, so that Ray's collections on a full store (it makes every process collect) are no part of the fit.
    A joined cluster (``ray_address``) has its own store, so both together are refused.

    ``step_gap_s`` ends each measured training step with that long an idle wait, a stand-in for the rest of
    the step. Ray frees unpinned objects in batches, by default at most every 1000 ms, and steps run back to
    back on such a cluster allocate the next step's chunks before the last step's are freed: the object store
    then touches a payload of fresh pages per step, which a training step of minutes does not
    (docs/predict.md, "A store that fills"). A cluster the replay starts frees them at once
    (:data:`~picklescope.ray.cluster.OWN_CLUSTER_ENV`); a joined one keeps its own setting, and a gap lets
    its frees land. ``predict`` fits with a gap, on either.

    ``worker_compute_s`` keeps each worker's call open that long after it has read its chunk, holding it, as
    a training step's workers hold theirs through minutes of compute. The replay's own calls only read the
    chunk and return a small result, so the controller's sending of the next chunk often outlasts them and
    few calls are open at once; a production step has every worker's chunk resident together, which the
    workers' sum shows only with a compute longer than the sending (docs/node.md).
    """
    t0 = time.monotonic()  # the run's own clock: it ends by t0 + timeout_s, clean-up included
    tq_plane.check(data_plane, codecs, engine=engine, dispatch=dispatch, transport=transport)
    checked = plan(codecs, workload, scale, workers, steps, returns=returns, dispatch=dispatch, gc=gc,
                   transport=transport, node_budget=node_budget, ray_address=ray_address,
                   worker_resources=worker_resources, spread=spread, engine=engine, enforcement=enforcement,
                   timeout_s=timeout_s)
    check_controller(controller, engine)
    step_gap_s = seconds("step_gap_s", step_gap_s, "--step-gap 2", "idle seconds at the end of each training step")
    worker_compute_s = seconds("worker_compute_s", worker_compute_s, "--worker-compute 2",
                               "seconds each worker holds its chunk, computing")
    if store_bytes is not None and ray_address:
        raise PicklescopeError("a joined cluster's object store is its own: store_bytes sizes a cluster the "
                               "replay starts", "drop store_bytes, or ray_address to start a cluster of its own")
    if controller == "actor" and data_plane != "dataproto":
        raise PicklescopeError(f"--controller actor runs the DataProto plane only, not --data-plane {data_plane}",
                               "drop --controller actor (the TransferQueue plane's controller passes metadata only)")
    codecs, wl, payload, budget = checked.codecs, checked.workload, checked.payload_bytes, checked.budget_bytes
    gc_modes = checked.gc_modes
    sweep_orphans()
    reserve = cleanup_reserve(timeout_s)
    run_dir = make_temp_dir("picklescope-node-", socket="events.sock")  # the workers' events
    ray_tmp = None if ray_address else make_temp_dir("psray-", for_ray=True)
    sends = workers if dispatch == "broadcast" else 2
    room = sends * payload
    if "off" in gc_modes:  # room for the chunks uncollected cycles keep pinned, up to 16 steps' worth: a full
        # store makes Ray call gc.collect() in every process, which --gc off must not get by accident
        # (a series' unmeasured steps before each replay pin as many again until they are collected)
        room = max(room, (min(steps, 16) * (2 if len(codecs) > 1 else 1) + 1) * payload
                   * (workers if dispatch == "broadcast" else 1))
    store = object_store_bytes(payload, store_bytes or int(room + (returns or 0) * payload + 64 * 2**20))
    results = [NodeResult(codec, transport, wl.name, scale, payload, workers=workers, steps=steps, dispatch=dispatch,
                          gc=mode, returns=returns, engine=engine, enforcement=enforcement, budget_bytes=budget,
                          controller=controller, data_plane=data_plane, step_gap_s=step_gap_s,
                          worker_compute_s=worker_compute_s)
               for codec, mode in zip(codecs, gc_modes)]
    accepter = Accepter(run_dir)
    cfg = NodeConfig(codec=codecs[0], workload=wl.source or wl.name, scale=scale, workers=workers, steps=steps,
                     returns=returns, dispatch=dispatch, gc=gc_modes[0], transport=transport, engine=engine,
                     ray_path="arg", ray_address=ray_address, ray_temp_dir=ray_tmp,
                     warm_up="steps" if len(codecs) > 1 else "row", object_store_bytes=store, run_dir=run_dir,
                     t0=t0, t0_wall=time.time() - (time.monotonic() - t0), machine=machine_id(),
                     events_address=accepter.address, events_key=accepter.key.hex(),
                     ray_env=ray_env(bool(ray_address)), parent_pid=os.getpid(),
                     deadline_wall=time.time() + (t0 + timeout_s - reserve - time.monotonic()),
                     worker_resources=dict(worker_resources or {}), spread=bool(spread), controller=controller,
                     data_plane=data_plane, step_gap_s=step_gap_s, worker_compute_s=worker_compute_s)
    if data_plane == "transferqueue":  # Ray's workers find the separately installed TransferQueue (init_args)
        cfg.ray_path = "tq"
    cg_path = start_cg = None
    if checked.cgroup_base is not None:
        name = f"{temp_name('picklescope-')}node{os.urandom(3).hex()}"
        cg_path = cgroup.create(checked.cgroup_base, name)
        cfg.cgroup = cg_path
        for r in results:
            r.cgroup = {"path": cg_path}
        if enforcement == "ray":  # born in a start cgroup, moved into the watched one at the baseline
            start_cg = cfg.cgroup = cgroup.create(checked.cgroup_base, name + "start")
            cfg.ray_view_cgroup = cg_path
            threshold = enforce.ray_threshold(cfg.ray_env)
            limit = enforce.ray_limit(int(budget or 0), threshold)
            cgroup.set_limit(cg_path, limit)
            cfg.ray_env.update(RAY_memory_monitor_refresh_ms=enforce.RAY_REFRESH_MS,
                                  RAY_memory_usage_threshold=f"{threshold:g}", RAY_min_memory_free_bytes="-1")
            for r in results:
                r.cgroup.update(start_path=start_cg, limit_bytes=limit, ray_threshold=threshold,
                                ray_threshold_bytes=int(limit * threshold),
                                ray_refresh_ms=int(enforce.RAY_REFRESH_MS))
        else:
            cfg.ray_env["RAY_memory_monitor_refresh_ms"] = "0"  # the kernel decides, not Ray's monitor
    proc = conn = None
    driver_start = None
    tracking = Tracking(t0, timeout_s, workers, t0 + timeout_s, budget, cg_path, start_cgroup=start_cg)
    set_phase(tracking, "the driver's start (the warm forkserver imports torch first)")
    measured: MeasuredRun | None = None  # the current replay's
    current = results[0]
    try:
        proc, conn = start_driver(cfg, tracking.end_by - reserve)
        driver_start = cluster.start_ticks(proc.pid)
        tracking.driver = (proc.pid, driver_start)
        set_phase(tracking, "Ray start-up")
        for i, result in enumerate(results):
            current = result
            start = t0
            if i:
                start = time.monotonic()
                conn.send(Next(type="next", codec=result.codec, gc=result.gc, t0=start,
                               t0_wall=time.time() - (time.monotonic() - start)))
            measured = MeasuredRun(start, run_dir, sample_interval_s, reading="private",
                                   budget_bytes=None if cg_path else budget).start()
            measured.join("driver", proc, conn, role="driver")  # one driver for the whole series
            session = measured.session
            adopt_known(session, result, tracking)
            tracking.finished = False
            if i:
                tracking.end_by = start + timeout_s  # each later replay of a series has a limit of its own
                set_phase(tracking, "the warm-up steps of the next replay")
            follow(measured, result, accepter, tracking, tracking.end_by - reserve, on_event)
            enforce.record_kill(session, result, tracking)  # a kill whose consequences ended the run first
            measured.stop_sampling()
            settle(session, result)
            measured = None
            result.wall_s = time.monotonic() - start
            if result.outcome != "ok" or not tracking.finished:
                for later in results[i + 1:]:
                    verdicts.conclude(later, "error",
                                      f"{NOT_REPLAYED}: the {result.codec} replay before it ended {result.outcome}")
                break
    except DriverStartTimeout:
        verdicts.conclude(current, "timeout", timeout_message(tracking))
        for later in results[1:]:
            verdicts.conclude(later, "error", f"{NOT_REPLAYED}: the {current.codec} replay before it ended timeout")
    except KeyboardInterrupt:
        verdicts.conclude(current, "interrupted", "interrupted (Ctrl-C); every process was stopped")
        raise
    finally:
        if measured is not None:
            measured.stop_sampling()
            settle(measured.session, current)
        set_phase(tracking, "shutdown")
        _cleanup(current, proc, conn, driver_start, tracking, cfg)
        accepter.close()
        for c in tracking.conns:
            c.close()
        if cg_path is not None:
            enforce.remove(cg_path, current)
        if start_cg is not None:
            cgroup.kill_all(start_cg)
            cgroup.remove(start_cg)
            current.cgroup["start_removed"] = not os.path.exists(start_cg)
        tracking.driver_log = _tail(os.path.join(run_dir, DRIVER_LOG))
        shutil.rmtree(run_dir, ignore_errors=True)
        if ray_tmp:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    for r in results:
        if r.outcome in ("error", "timeout") and tracking.driver_log and r.replayed:
            r.notes.append("the driver's own output ended with:\n" + tracking.driver_log)
        r.cleanup = current.cleanup
    if len(results) == 1:
        results[0].wall_s = time.monotonic() - t0  # set-up, the replay and the clean-up
    if tracking.bad_input:
        raise PicklescopeError(*tracking.bad_input)
    return results


class DriverStartTimeout(Exception):
    """The run's limit came while the warm forkserver was still starting (see :func:`start_driver`)."""


def start_driver(cfg: NodeConfig, deadline: float) -> tuple[Any, Any]:
    """The driver, from the warm forkserver, within the run's limit (a monotonic ``deadline``).

    The first start of the forkserver waits for it to import torch (a minute or more on a busy machine),
    and that wait cannot be interrupted from inside. When this call is the one that starts the
    forkserver, a timer ends the forkserver at the deadline, which makes the start fail at once; the
    run then ends as a timeout at its limit. A forkserver already running (another run's, in a notebook
    or ``reproduce``) is never touched: its start is immediate."""
    server = forkserver._forkserver
    cold = server._forkserver_pid is None
    fired = threading.Event()

    def expire() -> None:
        pid = server._forkserver_pid
        if pid:
            fired.set()
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass

    timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire) if cold else None
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        return launcher.start(node_driver_main, (cfg,), "picklescope-node-driver")
    except Exception:
        if fired.is_set():
            raise DriverStartTimeout() from None
        raise
    finally:
        if timer is not None:
            timer.cancel()



def cleanup_reserve(timeout_s: float) -> float:
    """Seconds of the run's ``--timeout`` kept for ending it: the driver's ``ray.shutdown``, then the kill
    of whatever of the cluster is left. The replay itself stops this much before the limit, so the
    whole run, clean-up included, ends by ``--timeout``."""
    return min(30.0, max(3.0, 0.1 * timeout_s))


def _tail(path: str, limit: int = 3000) -> str:
    """The last ``limit`` characters of a text file ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _cleanup(result: NodeResult, proc: Any, conn: Any, driver_start: int | None, tracking: Tracking,
             cfg: NodeConfig) -> None:
    """Let the driver end its Ray session, then kill whatever of the cluster we started is still alive.

    The driver gets half of what is left of the run's limit for its ``ray.shutdown`` (at most
    :data:`RELEASE_WAIT_S`; the other half is kept for the kills that follow), so the run ends by its
    ``--timeout`` whatever the driver is stuck in."""
    if proc is None:
        return
    if tracking.finished:  # the driver waits for this to end its Ray session
        try:
            conn.send(Release(type="release"))
        except (OSError, BrokenPipeError):
            pass
    elif proc.is_alive():  # mid-step (killed worker, error, timeout, Ctrl-C): SIGTERM ends it through its finally
        proc.terminate()
    # the driver's ray.shutdown gets at most half of what is left: on a busy machine the kill of the driver
    # and of whatever of the cluster remains needs the rest (seconds of kills and /proc scans at load average 25)
    left_s = tracking.end_by - time.monotonic()
    proc.join(timeout=max(1.0, min(RELEASE_WAIT_S, left_s / 2, left_s - 3.0)))
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=max(0.5, min(5.0, tracking.end_by - time.monotonic() - 2.0)))
    conn.close()
    if result.processes.get("driver") is not None:
        result.processes["driver"].exit_code = proc.exitcode
    if cfg.ray_address:
        result.cleanup = {"joined": cfg.ray_address, "note": "the actors end with their driver"}
        return
    known = [p for pids in tracking.cluster_pids.values() for p in pids]
    args = (proc.pid, driver_start, known, cfg.ray_temp_dir)
    left = sorted(cluster.cluster_processes(*args))
    killed, remaining = cluster.stop_all(lambda: cluster.cluster_processes(*args))
    result.cleanup = {"left_after_driver": left, "killed": killed, "remaining": remaining}

