"""The parent's side of a run over Ray: start the driver, listen to both sides, leave nothing behind.

The in-process transports start a sender and a receiver child; over Ray the receiver is an actor that
the cluster starts, so the transport owns the run (:func:`picklescope.measure.runner.run` hands it over).
The parent still never touches the batch or imports Ray. It starts the driver from the warm
forkserver, opens a listener the actor reports to, samples both sides' RSS and the object store on
one clock, and in every case (clean end, error, timeout, a SIGKILLed driver or actor) kills what is
left of the cluster before it returns a :class:`~picklescope.core.result.RunResult` in the same
``sides`` shape as every other transport.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Listener
from typing import Any

from picklescope.core.childconfig import PairConfig
from picklescope.core.events import Event, Hello, RayInfo, StoreProcess
from picklescope.core.paths import make_temp_dir
from picklescope.core.procmem import StatmReader
from picklescope.core.result import RunResult
from picklescope.errors import PicklescopeError
from picklescope.measure import verdicts
from picklescope.measure.engine import MeasuredRun
from picklescope.measure.fold import RunFold, finish_run
from picklescope.measure.session import Session
from picklescope.ray import cluster, costs
from picklescope.ray.channel import machine_id
from picklescope.ray.config import RayPairConfig
from picklescope.ray.driver import object_store_bytes, pair_driver_main
from picklescope.ray.store import ShmFileReader, store_trace

RELEASE_WAIT_S = 30.0  # ray.shutdown on a busy 2-core machine takes a few seconds
RAY_ENV_DEFAULTS = {"RAY_USAGE_STATS_ENABLED": "0", "RAY_DISABLE_DOCKER_CPU_WARNING": "1"}


def ray_env(joining: bool) -> dict[str, str]:
    """Environment for the driver (and so the cluster it starts): the user's RAY_* plus safe defaults.

    A cluster we start gets :data:`~picklescope.ray.cluster.OWN_CLUSTER_ENV` (token auth off: it is private
    to the run; objects freed as soon as Ray unpins them); joining a real cluster keeps whatever the user's
    environment and that cluster say.
    """
    env = {k: v for k, v in os.environ.items() if k.startswith("RAY_")}
    for k, v in {**RAY_ENV_DEFAULTS, **({} if joining else cluster.OWN_CLUSTER_ENV)}.items():
        env.setdefault(k, v)
    return env


class _Listener:
    """Accepts the actor's event connection in the background (it connects once, when created)."""

    def __init__(self, run_dir: str, remote: bool) -> None:
        self.key = os.urandom(16)
        if remote:
            self.listener = Listener(("0.0.0.0", 0), family="AF_INET", authkey=self.key)
            self.address: Any = ["", self.listener.address[1]]  # the driver fills in its node's address
        else:
            self.listener = Listener(os.path.join(run_dir, "events.sock"), family="AF_UNIX", authkey=self.key)
            self.address = self.listener.address
        self.conn: Any = None
        self._thread = threading.Thread(target=self._accept, name="picklescope-ray-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        try:
            self.conn = self.listener.accept()
        except (OSError, EOFError, ValueError) as exc:  # closed at cleanup, or a bad auth key
            self.error = exc

    def close(self) -> None:
        try:
            self.listener.close()
        except OSError:
            pass
        if self.conn is not None:
            self.conn.close()


class RayRun:
    """One run's state on the parent: processes, event bookkeeping, cleanup record."""

    def __init__(self, state: RunFold, cfg: RayPairConfig) -> None:
        self.state = state
        self.result: RunResult = state.result
        self.cfg = cfg
        self.tracking: dict[str, Any] = {"address": cfg.ray_address or "local", "driver_pid": None,
                                         "cluster_pids": {}, "left_after_driver": [], "killed": [],
                                         "remaining": [], "timing": {}}
        self.shm: dict[str, dict[str, Any]] = {s: {"stack": [], "added": [], "baseline": None, "end": None}
                                               for s in ("sender", "receiver")}
        self.receiver_errors_from_driver = False
        self.driver_start: int | None = None
        self.guard: Any = None
        self.store_source: str | None = None  # how the object store's curve is read, once known

    # -- events -----------------------------------------------------------------------------------
    def mark(self, moment: str) -> None:
        """Record when a phase of the run happened (run clock): where a Ray run's wall time goes."""
        self.tracking["timing"].setdefault(moment, round(time.monotonic() - self.cfg.t0, 3))

    def handle(self, ev: Event, session: Session) -> None:
        """Fold one event of the driver or the actor: Ray's own kinds here, the sides' through the runner's fold."""
        kind, side = ev.get("type"), ev.get("side", "sender")
        if kind in ("ray_info", "hello", "ready", "done"):
            self.mark(f"{side} {kind}" if kind == "done" else kind)
        if kind in ("ray_info", "hello"):  # the cluster is up / the actor is up: live views may show it
            if kind == "ray_info":
                self._on_ray_info(ev, session)
            else:
                self._on_hello(ev, session)
            if self.state.on_event:
                self.state.on_event(ev)
            return
        if kind == "store_process":
            self._on_store_process(ev, session)
            return
        if kind == "note":
            self.tracking.setdefault("notes", []).append(ev["message"])
            return
        if kind == "received":
            self.result.received = ev["report"]
            self.shm["receiver"]["end"] = ev.get("shm_end_bytes")
            return
        rec = self.shm.get(side)
        if rec is not None:
            if kind == "baseline":
                rec["baseline"] = ev.get("shm_bytes")
            elif kind == "step_start":
                rec["stack"].append((len(rec["added"]), ev.get("shm_bytes")))
                rec["added"].append(None)
            elif kind == "step_end" and rec["stack"]:
                i, start = rec["stack"].pop()
                if start is not None and ev.get("shm_bytes") is not None:
                    rec["added"][i] = ev["shm_bytes"] - start
            elif kind == "done" and ev.get("shm_end_bytes") is not None:
                rec["end"] = ev["shm_end_bytes"]
        if kind == "error" and ev.get("reported_by") == "driver":
            self.receiver_errors_from_driver = True
        self.state.handle(ev)

    def _on_ray_info(self, ev: RayInfo, session: Session) -> None:
        self.tracking["cluster_pids"] = ev.get("pids", {})
        self.tracking["session_dir"] = ev.get("session_dir")
        if ev.get("error"):
            self.tracking["info_error"] = ev["error"]
        raylets = ev.get("pids", {}).get("raylet") or []
        if not raylets and ev.get("raylet_socket"):  # joined a cluster: its raylet may still be local
            found = cluster.raylet_serving(ev["raylet_socket"])
            raylets = [found] if found else []
        path = cluster.plasma_file(raylets[0]) if raylets else None
        if path is None:
            self.result.object_store = {"t_s": [], "bytes": [], "source": None, "capacity_bytes":
                                                 self.cfg.object_store_bytes,
                                                 "unavailable": "no local raylet with a plasma file (joined "
                                                                "a remote cluster, or Ray changed its layout)"}
            return
        try:
            session.set_store(ShmFileReader(path), None)
            self.store_source = f"fstat of the plasma file held by raylet {raylets[0]} ({os.readlink(path)})"
        except OSError as exc:
            self.store_source = None
            self.result.object_store = {"unavailable": f"cannot open {path}: {exc}"}

    def _on_store_process(self, ev: StoreProcess, session: Session) -> None:
        """A store that is a process (TransferQueue's storage unit): sample its RSS as the store."""
        pid = ev.get("pid")
        try:
            session.set_store(StatmReader(pid), None)
            self.store_source = f"RSS of the {ev.get('what', 'store')} process {pid}"
        except (OSError, TypeError) as exc:
            self.result.object_store = {"unavailable": f"cannot sample {ev.get('what')} pid {pid}: {exc}"}

    def _on_hello(self, ev: Hello, session: Session) -> None:
        self.result.receiver.pid = ev["pid"]
        if ev.get("machine") == machine_id():
            session.adopt("receiver", ev["pid"], role="receiver")
            if self.guard is not None:
                self.guard.add("receiver", ev["pid"])
            self.tracking["receiver_sampled"] = True
        else:
            self.tracking["receiver_sampled"] = False
            self.result.receiver.note = (f"the actor runs on another machine ({ev.get('machine')}): its "
                                                  "curve is not sampled; its steps and peaks are exact")

    # -- cleanup ----------------------------------------------------------------------------------
    def reap_cluster(self) -> None:
        """Kill every process of a cluster we started that is still alive; record what was found."""
        if self.cfg.ray_address or self.tracking["driver_pid"] is None:
            return
        known = [p for pids in self.tracking["cluster_pids"].values() for p in pids]
        args = (self.tracking["driver_pid"], self.driver_start, known, self.cfg.ray_temp_dir)
        self.tracking["left_after_driver"] = sorted(cluster.cluster_processes(*args))
        killed, remaining = cluster.stop_all(lambda: cluster.cluster_processes(*args))
        self.tracking["killed"], self.tracking["remaining"] = killed, remaining


def _refuse_unsupported(cfg: PairConfig, limits: Any) -> None:
    """Budgets are enforced by the parent's watchdog only; tracers other than the sampler need our children."""
    tracers = [t for t in cfg.tracers if t != "sampler"]
    problem = None
    if tracers:
        problem = f"tracer(s) {', '.join(tracers)} cannot run inside Ray's processes"
    elif limits is not None and limits.any and limits.enforcement != "watchdog":
        problem = f"enforcement {limits.enforcement!r} needs a child of ours on both sides; over Ray only the watchdog"
    if problem:
        shutil.rmtree(cfg.run_dir, ignore_errors=True)
        raise PicklescopeError(problem, "use --tracer sampler / --enforcement watchdog, or an in-process transport")


def run_sides(state: RunFold, pair: PairConfig, *, ray_path: str, timeout_s: float, sample_interval_s: float,
              on_sample: Any = None, options: dict[str, Any] | None = None, guard: Any = None,
              limits: Any = None) -> RunResult:
    """Run one codec over Ray (``ray_path`` "put" or "arg"); see the module docstring.

    ``guard`` is the runner's watchdog (budgets and the machine guard), fed with both sides' samples.
    """
    _refuse_unsupported(pair, limits)
    options = dict(options or {})
    result = state.result
    t0 = pair.t0
    address = options.get("ray_address")
    remote = bool(address)
    listener = _Listener(pair.run_dir, remote)
    ray_tmp = None if remote else make_temp_dir("psray-", for_ray=True)
    fields = {f.name: getattr(pair, f.name) for f in dataclasses.fields(pair)}
    cfg = RayPairConfig(**fields, ray_path=ray_path, ray_address=address, ray_temp_dir=ray_tmp,
                        object_store_bytes=object_store_bytes(result.payload_bytes, options.get("object_store_bytes")),
                        events_address=listener.address, events_key=listener.key.hex(), machine=machine_id(),
                        t0_wall=time.time() - (time.monotonic() - t0), ray_env=ray_env(remote),
                        deadline_wall=time.time() + (t0 + timeout_s - time.monotonic()))  # bounds Ray's start-up
    run = RayRun(state, cfg)
    run.guard = guard
    result.ray = run.tracking
    # the sides' curves are their whole RSS; the store (plasma file or TransferQueue's unit) on the same tick
    measured = MeasuredRun(t0, cfg.run_dir, sample_interval_s, guard=guard, on_sample=on_sample)
    session = measured.session
    try:
        try:
            with measured:
                proc, _conn = measured.launch("sender", pair_driver_main, (cfg,), "picklescope-ray-driver")
                run.tracking["driver_pid"] = result.sender.pid = proc.pid
                run.driver_start = cluster.start_ticks(proc.pid)
                _relay_ray_pair(run, measured, listener, t0 + timeout_s)
                measured.stop_sampling()
                measured.end_children(RELEASE_WAIT_S)
        finally:
            if "sender" in measured.exit_codes:
                result.sender.exit_code = measured.exit_codes["sender"]
                run.mark("driver exited")
            run.reap_cluster()
            run.mark("cluster reaped")
            listener.close()
            if guard is not None:
                guard.close()
            counters = limits.cleanup() if limits is not None else {}
    finally:  # the temporaries go however the run ends, even if a clean-up step above fails
        if ray_tmp and not os.environ.get("PICKLESCOPE_KEEP_RAY_LOGS"):  # set it to read Ray's own logs
            shutil.rmtree(ray_tmp, ignore_errors=True)
        shutil.rmtree(cfg.run_dir, ignore_errors=True)
    for name, tl in session.timelines().items():
        result.processes[name].timeline = tl
    if session.store_attached:
        result.object_store = store_trace(session.store.t_s, session.store.bytes, run.store_source,
                                          cfg.object_store_bytes)
    finish_run(state)
    if guard is not None:
        verdicts.apply_memory_verdict(result, state.errors, state.done, guard.kills, result.enforcement, counters)
    costs.summarize(result, run.shm, ray_path)
    result.wall_s = time.monotonic() - t0
    return result


def _relay_ray_pair(run: RayRun, measured: MeasuredRun, listener: _Listener, deadline: float) -> None:
    """Relay events from the driver and the actor until the run is decided."""
    state = run.state
    conns: dict[str, Any] = {"sender": measured.conns["sender"]}

    def take_actor() -> None:  # the actor connects once, when it is created: wait on its pipe from then on
        if "receiver" not in conns and listener.conn is not None:
            conns["receiver"] = listener.conn

    def decided(dead: list[str], drain: Callable[[str], bool]) -> bool:
        if state.done["sender"] and state.done["receiver"]:
            return True
        if any(e.get("phase") == "setup" for e in state.errors):
            return True
        if state.done["sender"] and any(e["side"] == "sender" for e in state.errors):
            return True  # the driver's own put failed: nothing reaches the actor
        if run.receiver_errors_from_driver and not state.done["receiver"]:
            drain("receiver")
            return True
        if "sender" in dead:
            drain("sender")
            drain("receiver")
            return True
        take_actor()
        return False

    take_actor()
    if not measured.relay(lambda _name, ev: run.handle(ev, measured.session), deadline, decided, conns=conns,
                           poll_s=0.2):
        verdicts.time_out(state.result)
