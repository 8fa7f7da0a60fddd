"""The parent's fold of a node replay: the driver's and the workers' events into the session and the result.

The driver reports on the pipe the launcher gave it; each worker actor connects back once, when it
starts, to a listener in the run's folder (:class:`Accepter`) and names itself in its hello. The
events are folded here into the one :class:`~picklescope.measure.session.Session` (steps, training
steps, peaks) and into the :class:`~picklescope.investigate.node.result.NodeResult` (the Ray cluster,
the engine, the notes, the full collections), and :func:`follow` waits until the replay is decided:
finished, a kill, an error, a dead Ray core process, or the time limit. :func:`settle` then copies
the session's figures into the result.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from picklescope.core import cgroup
from picklescope.core.events import Event, Go, Hello, RayInfo
from picklescope.investigate.node import enforce
from picklescope.investigate.node.result import NodeResult
from picklescope.investigate.node.tracking import Tracking, dead_component, set_phase, timeout_message
from picklescope.measure import verdicts
from picklescope.measure.engine import MeasuredRun
from picklescope.measure.session import Session
from picklescope.ray import cluster, startup
from picklescope.ray.channel import machine_id
from picklescope.ray.orchestrate import _Listener
from picklescope.ray.store import ShmFileReader


class Accepter(_Listener):
    """The Ray run's event listener (:mod:`picklescope.ray.orchestrate`), accepting every
    worker's connection rather than one actor's: each worker connects once, when its actor starts."""

    def __init__(self, run_dir: str) -> None:
        self.conns: list[Any] = []
        self._lock = threading.Lock()
        super().__init__(run_dir, remote=False)

    def _accept(self) -> None:
        while True:
            try:
                c = self.listener.accept()
            except (OSError, EOFError, ValueError):  # closed at clean-up, or a bad auth key
                return
            with self._lock:
                self.conns.append(c)

    def take(self) -> list[Any]:
        """The connections accepted since the last call."""
        with self._lock:
            out, self.conns = self.conns, []
        return out


def follow(measured: MeasuredRun, result: NodeResult, accepter: Accepter, tracking: Tracking, deadline: float,
           on_event: Callable[[Event], None] | None) -> None:
    """Relay the driver's and the workers' events into the session until the replay is decided."""
    session, proc, conn = measured.session, measured.procs["driver"], measured.conns["driver"]
    names = tracking.names  # a worker's pipe -> its name (from its hello), for every replay
    conns: dict[str, Any] = {"driver": conn, **tracking.worker_conns}
    state: dict[str, Any] = {"finished": False, "killed_at": None}

    def handle(key: str, ev: Event) -> None:
        if key == "driver":
            state["finished"] |= on_driver(session, result, conn, ev, tracking)
        else:
            on_worker(session, result, names, conns[key], ev, tracking)
        if on_event is not None:
            on_event(ev)

    def before_wait() -> bool:  # new workers' pipes, a cgroup's kill; True once a kill's aftermath was heard
        for c in accepter.take():
            tracking.conns.append(c)
            names[c] = ""
            key = f"conn{len(tracking.conns)}"  # named by its hello, in names
            conns[key] = tracking.worker_conns[key] = c
        enforce.record_kill(session, result, tracking)
        dead = dead_component(session, tracking)
        if dead is not None:
            verdicts.conclude(result, "error", dead)
            return True
        now = time.monotonic()
        if session.kill is not None and state["killed_at"] is None:
            state["killed_at"] = now
        return state["killed_at"] is not None and now - state["killed_at"] > 1.0  # what the others said

    def decided(dead: list[str], drain: Callable[[str], bool]) -> bool:
        if state["finished"]:
            return True
        if "driver" in dead:
            if session.kill is None:
                verdicts.conclude(result, "error",
                                  result.error or f"the driver exited ({proc.exitcode}) before the last step")
            return True
        if result.outcome == "error" and session.kill is None:
            return True
        return before_wait()

    if time.monotonic() <= deadline and before_wait():
        return
    if not measured.relay(handle, deadline, decided, conns=conns, poll_s=0.05):
        verdicts.conclude(result, "timeout", timeout_message(tracking))


def on_driver(session: Session, result: NodeResult, conn: Any, ev: Event, tracking: Tracking) -> bool:
    """Fold one event of the driver; True once it said every training step and every worker ended."""
    kind = ev.get("type")
    if kind == "train_step_start":
        set_phase(tracking, f"training step {ev.get('index')}")
    elif kind == "train_step_end":
        last = ev.get("index") == result.steps
        set_phase(tracking, "the end of the measured phase" if last else
                  f"training step {int(ev.get('index') or 0) + 1}")
    if kind == "ray_info":
        tracking.cluster_pids = ev.get("pids", {})
        tracking.ray_info = ev
        set_phase(tracking, f"the {tracking.workers or 'worker'} worker actors' start "
                            "(the driver builds its batch meanwhile)")
        if tracking.watch is None and ev.get("pids") and tracking.driver is not None:  # our own cluster is
            # up: from now on a core process that dies ends the run at once, named, instead of a hang
            pid, ticks = tracking.driver
            tracking.watch = startup.ComponentWatch(lambda: cluster.cluster_processes(pid, ticks), t0=tracking.t0)
        attach_store(session, ev, result)
        rec = session.processes.get("driver")
        if rec is not None:
            rec.node_id = ev.get("node_id")
    elif kind == "controller":  # --controller actor: the loop runs in this actor, measured as the driver
        tracking.controller = ev
        adopt_controller(session, result, tracking)
    elif kind == "note":
        result.notes.append(ev["message"])
    elif kind == "engine":
        result.engine_info = tracking.engine_info = ev["info"]
        set_phase(tracking, "the warm-up call to every worker")
    elif kind in ("done", "train_step_end") and ev.get("full_collections") is not None:
        if kind == "done":
            result.full_collections["driver"] = ev["full_collections"]
        else:
            result.driver_full_collections[ev["index"]] = ev["full_collections"]
            if ev.get("collections") is not None:
                result.driver_collections[ev["index"]] = list(ev["collections"])
            if ev.get("allocations") is not None:
                result.driver_allocations[ev["index"]] = ev["allocations"]
            if ev.get("runs") is not None:
                result.driver_runs[ev["index"]] = [list(r) for r in ev["runs"]]
        session.fold("driver", ev)
    elif kind == "ready":
        set_phase(tracking, "the baseline")
        session.take_baseline()
        if tracking.start_cgroup and tracking.cgroup:  # --enforcement ray: from now on the watched cgroup
            # (whose limit Ray's monitor read at start-up) charges what the node allocates above its baseline
            moved = cgroup.move_all(tracking.start_cgroup, tracking.cgroup)
            tracking.limit = {"moved_at_baseline": len(moved)}
            result.cgroup.update(tracking.limit)
        elif tracking.cgroup and tracking.budget is not None:
            tracking.limit = enforce.limit(tracking.cgroup, tracking.budget)
            result.cgroup.update(tracking.limit)
        conn.send(Go(type="go"))
    elif kind == "finished":
        tracking.finished = True
        return True
    elif kind == "error":
        if tracking.start_cgroup and enforce.record_ray_kill(session, result, tracking, ev):
            pass  # Ray's memory monitor killed a worker: the driver's ray.get said so, with Ray's message
        elif session.kill is None:
            verdicts.conclude(result, "error", f"{ev.get('exc_type')}: {ev.get('message')}")
            if ev.get("bad_input"):
                tracking.bad_input = ev["bad_input"]
        session.fold("driver", ev)
    else:
        session.fold("driver", ev)
    return False


def on_worker(session: Session, result: NodeResult, names: dict[Any, str], c: Any, ev: Event,
              tracking: Tracking) -> None:
    """Fold one event of a worker: its hello adopts it into the session, the rest go to its record."""
    if ev.get("type") == "hello":
        names[c] = ev["name"]
        tracking.hellos[ev["name"]] = ev
        adopt_worker(session, ev)
        return
    name = names.get(c)
    if name:
        if ev.get("type") == "done" and ev.get("full_collections") is not None:
            result.full_collections[name] = ev["full_collections"]
        session.fold(name, ev)


def adopt_worker(session: Session, hello: Hello) -> None:
    """Sample a worker that said hello (when it runs on this machine)."""
    session.adopt(hello["name"], hello["pid"], role=hello.get("role") or "worker", node_id=hello.get("node_id"),
                  sampled=hello.get("machine") == machine_id())


def adopt_known(session: Session, result: NodeResult, tracking: Tracking) -> None:
    """A later replay's session: the workers (they said hello to an earlier one) and the object store."""
    for hello in tracking.hellos.values():
        adopt_worker(session, hello)
    if tracking.ray_info is not None:
        attach_store(session, tracking.ray_info, result)
        rec = session.processes.get("driver")
        if rec is not None:
            rec.node_id = tracking.ray_info.get("node_id")
    if tracking.engine_info is not None:
        result.engine_info = tracking.engine_info
    if tracking.controller is not None:
        adopt_controller(session, result, tracking)


def adopt_controller(session: Session, result: NodeResult, tracking: Tracking) -> None:
    """``--controller actor``: measure the actor as ``driver`` (the loop runs there) and the process that
    started Ray, which now only relays, as ``script``."""
    ev = tracking.controller or {}
    node_id = tracking.ray_info.get("node_id") if tracking.ray_info is not None else ev.get("node_id")
    try:
        session.hand_over("driver", int(ev["pid"]), "script", role="driver", node_id=ev.get("node_id"))
    except OSError as exc:
        result.notes.append(f"the controller actor (pid {ev.get('pid')}) cannot be sampled: {exc}")
        return
    script = session.processes.get("script")
    if script is not None:
        script.node_id = node_id


def attach_store(session: Session, ev: RayInfo, result: NodeResult) -> None:
    """Sample the object store: the plasma file of our raylet (or of the joined cluster's local raylet)."""
    raylets = ev.get("pids", {}).get("raylet") or []
    if not raylets and ev.get("raylet_socket"):
        found = cluster.raylet_serving(ev["raylet_socket"])
        raylets = [found] if found else []
    path = cluster.plasma_file(raylets[0]) if raylets else None
    if path is None:
        result.notes.append("object store not sampled: no local raylet with a plasma file")
        return
    try:
        session.set_store(ShmFileReader(path), f"fstat of the plasma file held by raylet {raylets[0]}")
        result.store_source = session.store_source
    except OSError as exc:
        result.notes.append(f"object store not sampled: {exc}")


def settle(session: Session, result: NodeResult) -> None:
    """Copy the session's records into the result and compute the node's figures."""
    for rec in session.processes.values():
        for s in rec.steps:
            s.training_step = session.current_training_step(s.start_s)
    session.settle_training_steps()
    result.processes = session.processes
    result.training_steps = session.training_steps
    result.node, result.store = session.node, session.store
    result.node_baseline_bytes, result.baseline_s = session.node_baseline, session.baseline_s
    result.store_baseline_bytes = session.store_baseline
    result.sampler_priority = session.priority
    result.killed = session.kill
    if session.kill is not None:
        verdicts.conclude(result, "oom-killed", None)
    base = session.node_baseline
    if base is not None and session.baseline_s is not None:
        end = None if session.kill is None else session.kill.t_s  # the replay's story ends at a kill (the figure's too)
        pairs = [(t, v) for t, v in zip(session.node.t_s, session.node.bytes)
                 if t >= session.baseline_s and (end is None or t <= end)]
        if pairs:
            t_peak, v_peak = max(pairs, key=lambda p: p[1])
            result.node_peak_bytes, result.node_peak_t_s = v_peak - base, t_peak
            for name, rec in session.processes.items():
                v = session.value_at(rec.timeline, t_peak) if rec.timeline.t_s and rec.timeline.t_s[-1] >= t_peak \
                    else None
                above = None if v is None else rec.above(v)
                if above is not None:
                    result.at_peak_bytes[name] = above
            sv = session.value_at(session.store, t_peak)
            if sv is not None and session.store_baseline is not None:
                result.at_peak_bytes["store"] = sv - session.store_baseline
        stores = [v for t, v in zip(session.store.t_s, session.store.bytes) if t >= session.baseline_s]
        if stores and session.store_baseline is not None:
            result.store_peak_bytes = max(stores) - session.store_baseline
        result.max_gap_s = round(session.max_gap_s(), 6)
