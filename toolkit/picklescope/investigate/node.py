"""A node replayed: one driver and N worker actors on a Ray cluster, K training steps, one clock.

verl's single controller hands every training step's batch to its workers: the driver chunks the
DataProto into N pieces (``DataProto.chunk``), calls one method per worker with its chunk as the
argument (Ray pickles each chunk in the driver, so the chunk's ``__getstate__`` runs there), each
worker deserializes its chunk and returns a small per-token result, and the driver concatenates the
results (``DataProto.concat``). This module replays that loop with the toolkit's codecs, or with
real verl's ``DataProto`` when a ``verl-<version>:<mode>`` codec is chosen (its own ``chunk`` and
``concat`` then do the splitting and joining).

Three places run code:

- the parent (:func:`node`), which imports neither Ray nor torch: it starts the driver from the warm
  forkserver, adopts every process into one :class:`~picklescope.measure.session.Session` (sampled on one
  clock with the object store counted once), folds the events they stream, enforces the node budget
  and, whatever happens, kills what is left of the cluster it started;
- the driver (:func:`driver_main`), a session leader that starts or joins the cluster, creates the
  workers and runs the training steps with named, exactly measured steps;
- the workers (:class:`NodeWorker`), Ray actors that connect back to the parent and stream their
  own steps.
"""

from __future__ import annotations

import gc
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Listener
from typing import Any

from picklescope.core import procmem, steps
from picklescope.core.events import (
    CodecInfo,
    Event,
    Hello,
    Next,
    RayInfo,
    Ready,
    Release,
)
from picklescope.core.leftovers import temp_name
from picklescope.core.paths import make_temp_dir
from picklescope.core.units import fmt_bytes, parse_size
from picklescope.errors import PicklescopeError
from picklescope.measure import launcher, verdicts
from picklescope.measure.child import arm_stack_dump, begin_measure, end_measure, error_event
from picklescope.measure.session import KillRecord, ProcessRecord, Series, Session, StepRecord, TrainingStep
from picklescope.transports.ray import cluster, startup

DISPATCHES = ("chunk", "broadcast")
GC_MODES = ("default", "off", "each-step")
NODE_TRANSPORTS = ("ray-arg", "ray")
ENGINES = ("replica", "verl")
ENFORCEMENTS = ("watchdog", "cgroup")
RELEASE_WAIT_S = 30.0  # at most; less when the run's --timeout is near
MIN_TIMEOUT_S = 60.0
COMPONENT_POLL_S = 1.0  # how often the parent looks for a dead Ray core process
DRIVER_LOG = "driver.log"  # the driver's stdout and stderr, in the run's folder
DEFAULT_SCALE = 0.25


# -- the result -------------------------------------------------------------------------------------


@dataclass
class NodeResult:
    """A node replay: every process on one clock, the node total, the training steps, the kill."""

    codec: str
    workload: str
    scale: float
    workers: int
    steps: int
    payload_bytes: int
    dispatch: str
    gc: str
    transport: str
    returns: float | None
    engine: str = "replica"
    enforcement: str = "watchdog"
    cgroup: dict[str, Any] = field(default_factory=dict)  # --enforcement cgroup: path, limit, counters
    engine_info: dict[str, Any] = field(default_factory=dict)  # what split, called and joined (see docs/node.md)
    outcome: str = "ok"  # ok | oom-killed | error | timeout | interrupted
    error: str | None = None
    killed: KillRecord | None = None
    budget_bytes: int | None = None
    node_baseline_bytes: int | None = None
    node_peak_bytes: int | None = None  # node total above its baseline, highest sample
    node_peak_t_s: float | None = None
    at_peak_bytes: dict[str, int] = field(default_factory=dict)  # per process and "store", above baselines
    store_peak_bytes: int | None = None  # store above its baseline
    store_baseline_bytes: int | None = None
    store_source: str | None = None
    node: Series = field(default_factory=Series)  # absolute bytes, one sample per tick
    store: Series = field(default_factory=Series)
    processes: dict[str, ProcessRecord] = field(default_factory=dict)
    training_steps: list[TrainingStep] = field(default_factory=list)
    baseline_s: float | None = None
    max_gap_s: float | None = None
    sampler_priority: str = "normal"
    wall_s: float = 0.0
    cleanup: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    full_collections: dict[str, int] = field(default_factory=dict)  # per process, during the measured steps
    driver_full_collections: dict[int, int] = field(default_factory=dict)  # driver's count at each step's end

    @property
    def driver(self) -> ProcessRecord:
        return self.processes["driver"]

    def process_bytes_at(self, name: str, t: float) -> int | None:
        """Private bytes of ``name`` above its baseline at the first sample at or after ``t``."""
        rec = self.processes[name]
        for tt, v in zip(rec.timeline.t_s, rec.timeline.bytes):
            if tt >= t and rec.baseline_bytes is not None:
                return v - rec.baseline_bytes
        return None

    def to_json_dict(self) -> dict[str, Any]:
        """The ``--json`` document (see docs/node.md for every key)."""
        killed = None
        if self.killed is not None:
            k = self.killed
            killed = {"process": k.process, "training_step": k.training_step, "step": k.step, "step_of": k.step_of,
                      "t_s": k.t_s,
                      "node_bytes": k.node_bytes, "memory_bytes": k.memory_bytes, "oom_scores": k.oom_scores,
                      "stack": k.stack}
        procs = {}
        for name, p in self.processes.items():
            procs[name] = {
                "peak_bytes": p.peak_bytes, "own_peak_bytes": self.own_peak_bytes(name),
                "held_bytes": p.held_bytes, "cycle_held_bytes": p.cycle_held_bytes, "node_id": p.node_id,
                "sampled": p.sampled, "pid": p.pid, "role": p.role, "baseline_bytes": p.baseline_bytes,
                "error": p.error,
                "steps": [asdict(s) for s in p.steps],
                "timeline": {"t_s": list(p.timeline.t_s), "bytes": list(p.timeline.bytes)},
            }
        return {
            "codec": self.codec, "workers": self.workers, "steps": self.steps, "payload_bytes": self.payload_bytes,
            "outcome": self.outcome, "killed": killed,
            "node": {
                "peak_bytes": self.node_peak_bytes, "budget_bytes": self.budget_bytes,
                "store_peak_bytes": self.store_peak_bytes,
                "timeline": {"t_s": list(self.node.t_s), "bytes": list(self.node.bytes)},
                "baseline_bytes": self.node_baseline_bytes, "baseline_s": self.baseline_s,
                "peak_t_s": self.node_peak_t_s, "at_peak_bytes": self.at_peak_bytes,
                "store": {"t_s": list(self.store.t_s), "bytes": list(self.store.bytes),
                          "baseline_bytes": self.store_baseline_bytes, "source": self.store_source},
                "per_ray_node": self.per_ray_node(),
                "max_gap_s": self.max_gap_s, "sampler_priority": self.sampler_priority,
                "error": self.error, "wall_s": round(self.wall_s, 3), "cleanup": self.cleanup,
                "config": {"workload": self.workload, "scale": self.scale, "dispatch": self.dispatch,
                           "gc": self.gc, "transport": self.transport, "returns": self.returns,
                           "engine": self.engine, "enforcement": self.enforcement},
                "cgroup": self.cgroup or None,
                "engine": self.engine_info,
                "full_collections": self.full_collections,
            },
            "processes": procs,
            "training_steps": [{"index": s.index, "start_s": s.start_s, "end_s": s.end_s, "node_bytes": s.node_bytes,
                                "driver_bytes": s.driver_bytes, "per_process_bytes": s.per_process_bytes,
                                "driver_full_collections": self.driver_full_collections.get(s.index)}
                               for s in self.training_steps],
        }

    @classmethod
    def from_json_dict(cls, doc: dict[str, Any]) -> NodeResult:
        """The result back from its ``--json`` document (results.json keeps node replays as documents), so
        the tables and the figure draw a saved replay exactly as a fresh one."""
        n, cfg = doc["node"], doc["node"]["config"]
        r = cls(doc["codec"], cfg["workload"], cfg["scale"], doc["workers"], doc["steps"], doc["payload_bytes"],
                cfg["dispatch"], cfg["gc"], cfg["transport"], cfg["returns"], engine=cfg["engine"],
                enforcement=cfg["enforcement"], cgroup=n.get("cgroup") or {}, engine_info=n.get("engine") or {},
                outcome=doc["outcome"], error=n.get("error"), budget_bytes=n.get("budget_bytes"),
                node_baseline_bytes=n.get("baseline_bytes"), node_peak_bytes=n.get("peak_bytes"),
                node_peak_t_s=n.get("peak_t_s"), at_peak_bytes=n.get("at_peak_bytes") or {},
                store_peak_bytes=n.get("store_peak_bytes"), store_baseline_bytes=n["store"].get("baseline_bytes"),
                store_source=n["store"].get("source"), node=Series(n["timeline"]["t_s"], n["timeline"]["bytes"]),
                store=Series(n["store"]["t_s"], n["store"]["bytes"]), baseline_s=n.get("baseline_s"),
                max_gap_s=n.get("max_gap_s"), sampler_priority=n.get("sampler_priority", "normal"),
                wall_s=n.get("wall_s", 0.0), cleanup=n.get("cleanup") or {},
                full_collections=n.get("full_collections") or {})
        if doc.get("killed"):
            k = doc["killed"]
            r.killed = KillRecord(k["process"], 0, k["t_s"], k["node_bytes"], n.get("budget_bytes") or 0,
                                  k["training_step"], k["step"], k.get("oom_scores") or {}, k.get("memory_bytes") or {},
                                  k.get("stack"), step_of=k.get("step_of"))
        for name, p in doc["processes"].items():
            r.processes[name] = ProcessRecord(
                name, p["pid"], p["role"], p["node_id"], p["sampled"], p["baseline_bytes"], None, p["peak_bytes"],
                p["held_bytes"], p["cycle_held_bytes"], [StepRecord(**s) for s in p["steps"]],
                Series(p["timeline"]["t_s"], p["timeline"]["bytes"]), error=p.get("error"))
        for s in doc["training_steps"]:
            r.training_steps.append(TrainingStep(s["index"], s["start_s"], s["end_s"], s["node_bytes"],
                                                 s["driver_bytes"], s.get("per_process_bytes") or {}))
            if s.get("driver_full_collections") is not None:
                r.driver_full_collections[s["index"]] = s["driver_full_collections"]
        return r

    def trimmed(self, before_s: float = 0.25) -> NodeResult:
        """A copy whose sampled curves start ``before_s`` before the baseline: the set-up (starting
        actors, importing torch) is not measured, and its samples would dwarf a saved report."""
        start = (self.baseline_s or 0.0) - before_s

        def cut(series: Series) -> Series:
            keep = [i for i, t in enumerate(series.t_s) if t >= start]
            return Series([series.t_s[i] for i in keep], [series.bytes[i] for i in keep])

        doc = self.to_json_dict()
        out = NodeResult.from_json_dict(doc)
        out.node, out.store = cut(self.node), cut(self.store)
        for name, p in out.processes.items():
            p.timeline = cut(self.processes[name].timeline)
        return out

    def per_ray_node(self) -> dict[str, dict[str, Any]]:
        """Processes grouped by Ray node id, each group's highest sampled total above its baselines.

        The object store sampled here belongs to the node of the raylet this machine runs for the
        driver, so it is added to the driver's group. A process on another machine is not sampled
        from here (its exact peak still is reported by itself).
        """
        groups: dict[str, dict[str, Any]] = {}
        driver_node = self.processes["driver"].node_id if "driver" in self.processes else None
        for name, p in self.processes.items():
            g = groups.setdefault(p.node_id or "unknown", {"processes": [], "peak_bytes": None, "sampled": True})
            g["processes"].append(name)
            g["sampled"] = g["sampled"] and p.sampled
        start = self.baseline_s if self.baseline_s is not None else 0.0
        ticks = [t for t in self.node.t_s if t >= start]
        for node_id, g in groups.items():
            total = dict.fromkeys(ticks, 0)
            for name in g["processes"]:
                p = self.processes[name]
                base = p.baseline_bytes or 0
                for t, v in zip(p.timeline.t_s, p.timeline.bytes):
                    if t in total:
                        total[t] += v - base
            if node_id == driver_node and self.store_baseline_bytes is not None:
                for t, v in zip(self.store.t_s, self.store.bytes):
                    if t in total:
                        total[t] += v - self.store_baseline_bytes
            g["peak_bytes"] = max(total.values()) if total else None
        return groups

    def own_peak_bytes(self, name: str = "driver") -> int | None:
        """The highest sample of ``name``'s private memory above its baseline (the object store's pages
        apart): sampled at about 1 ms, so it can miss a spike shorter than that, but unlike the exact
        peak it never counts store pages the process maps."""
        rec = self.processes.get(name)
        if rec is None or rec.baseline_bytes is None:
            return None
        start = self.baseline_s if self.baseline_s is not None else float("-inf")
        values = [v for t, v in zip(rec.timeline.t_s, rec.timeline.bytes) if t >= start]
        return max(values) - rec.baseline_bytes if values else None

    @property
    def driver_growth_bytes(self) -> int | None:
        """The driver's memory at the end of the last training step minus at the end of the first: what the
        steps left behind (None with fewer than two ended steps)."""
        ends = [s.driver_bytes for s in self.training_steps]
        return None if len(ends) < 2 or None in (ends[0], ends[-1]) else ends[-1] - ends[0]

    def step_lines(self) -> list[str]:
        """One line per training step: node and driver above baseline at its end, the growth since step 1."""
        lines = []
        first = None
        for s in self.training_steps:
            if s.end_s is None:
                lines.append(f"step {s.index}: started at {s.start_s:.2f} s, never ended")
                continue
            if first is None:
                first = s.driver_bytes
            growth = "" if first is None or s.driver_bytes is None else \
                f", driver {fmt_bytes(s.driver_bytes - first, signed=True)} since step {self.training_steps[0].index}"
            lines.append(f"step {s.index}: {s.start_s:6.2f}-{s.end_s:6.2f} s  node {_above(s.node_bytes)}  "
                         f"driver {_above(s.driver_bytes)}{growth}")
        return lines

    def summary(self) -> str:
        """A few lines: the verdict, the node peak and who held it, then one line per training step."""
        head = (f"{self.codec} on {self.workload} x{self.scale:g} (payload {fmt_bytes(self.payload_bytes)}), "
                f"{self.workers} workers, {self.steps} steps, dispatch {self.dispatch}, gc {self.gc}: {self.outcome}")
        if self.error:
            head += f" - {self.error}"
        out = [head]
        if self.node_peak_bytes is not None:
            top = sorted(self.at_peak_bytes.items(), key=lambda x: -x[1])[:4]
            who = ", ".join(f"{n} {fmt_bytes(v)}" for n, v in top)
            out.append(f"node peak {fmt_bytes(self.node_peak_bytes)} above baseline at {self.node_peak_t_s:.2f} s "
                       f"({who})" + (f"; budget {fmt_bytes(self.budget_bytes)}" if self.budget_bytes else ""))
        if self.killed is not None:
            k = self.killed
            out.append(f"killed {k.process} (highest oom_score {k.oom_scores.get(k.process)}) in training step "
                       f"{k.training_step}, {k.during()}, node {fmt_bytes(k.node_bytes)} above baseline")
        out += self.step_lines()
        return "\n".join(out)


def compare_drivers(old: NodeResult, new: NodeResult) -> str:
    """Two replays' drivers in one sentence: the driver's own memory with each codec (its peak, and where
    it stood at the last training step's end when that differs), then how much higher its exact peak
    was with ``old``.

    The driver's own (private) memory leads because it is the codec's alone; its exact peak also counts
    the object store's pages it maps, and how many depends on where the store put each chunk, so two
    standalone replays' exact peaks differ by more than their codecs do (docs/node.md)."""
    p = old.payload_bytes
    own = [r.own_peak_bytes() for r in (old, new)]
    exact = [r.driver.peak_bytes if "driver" in r.processes else None for r in (old, new)]
    if None in own or None in exact or not p:
        return f"{old.codec} vs {new.codec}: a driver's peak is missing (a replay that did not end ok has none)"
    text = (f"On a node of a driver and {old.workers} workers over {old.steps} training steps, the driver's own "
            f"memory (the object store apart) peaked at {own[0] / p:.2f}x payload with {old.codec} and "
            f"{own[1] / p:.2f}x with {new.codec}")
    ends = [r.training_steps[-1].driver_bytes if r.training_steps else None for r in (old, new)]
    if None not in ends and any(f"{e / p:.2f}" != f"{o / p:.2f}" for e, o in zip(ends, own)):
        text += f" ({ends[0] / p:.2f}x and {ends[1] / p:.2f}x at the last step's end)"
    return (text + f"; its exact peak, object-store pages included, was {fmt_bytes(exact[0] - exact[1])} "
            f"({(exact[0] - exact[1]) / p:.2f}x payload) higher with {old.codec}.")


def _above(value: int | None) -> str:
    """Bytes above the baseline in words: a process that ends a step under its start (the collector
    freed what set-up had left) reads "2.1 MiB below its start", never as a negative size."""
    if value is None:
        return "-"
    return fmt_bytes(value) if value >= 0 else f"{fmt_bytes(-value)} below its start"


# -- the parent -------------------------------------------------------------------------------------


class _Accepter:
    """Accepts the workers' event connections (each connects once, when its actor starts)."""

    def __init__(self, run_dir: str) -> None:
        self.key = os.urandom(16)
        self.listener = Listener(os.path.join(run_dir, "events.sock"), family="AF_UNIX", authkey=self.key)
        self.conns: list[Any] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="picklescope-node-accept", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                c = self.listener.accept()
            except (OSError, EOFError, ValueError):
                return
            with self._lock:
                self.conns.append(c)

    def take(self) -> list[Any]:
        with self._lock:
            out, self.conns = self.conns, []
        return out

    def close(self) -> None:
        try:
            self.listener.close()
        except OSError:
            pass


def _check(codec: str, workers: int, steps_: int, dispatch: str, gc_mode: str, transport: str,
           returns: float | None, engine: str) -> None:
    from picklescope.codecs import get_codec

    get_codec(codec)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 64:
        raise PicklescopeError(f"--workers {workers!r} must be an integer from 1 to 64", "use e.g. --workers 4")
    if not isinstance(steps_, int) or isinstance(steps_, bool) or not 1 <= steps_ <= 1000:
        raise PicklescopeError(f"--steps {steps_!r} must be an integer from 1 to 1000", "use e.g. --steps 4")
    for what, value, allowed in (("--dispatch", dispatch, DISPATCHES), ("--gc", gc_mode, GC_MODES),
                                 ("--transport", transport, NODE_TRANSPORTS), ("--engine", engine, ENGINES)):
        if value not in allowed:
            raise PicklescopeError(f"{what} {value!r} is not one of {', '.join(allowed)}", f"use {what} {allowed[0]}")
    if engine == "verl":
        if not codec.startswith("verl-"):
            raise PicklescopeError(f"--engine verl drives real verl's DataProto; {codec!r} is not a verl codec",
                                   "use e.g. --codec verl-0.9.1:numpy (picklescope verl list)")
        for what, value, needed in (("--dispatch", dispatch, "chunk"), ("--transport", transport, "ray-arg")):
            if value != needed:
                raise PicklescopeError(f"--engine verl runs verl's DP_COMPUTE_PROTO, which takes {what} {needed}, "
                                       f"not {value!r}", f"leave {what} out with --engine verl")
    if returns is not None and not (isinstance(returns, (int, float)) and 0 <= returns <= 16):
        raise PicklescopeError(f"--returns {returns!r} must be a multiple of the chunk payload from 0 to 16",
                               "use e.g. --returns 0.5, or leave it out for a small per-token result")


def node(codec: str = "numpy", workload: str = "flowgrpo", scale: float = DEFAULT_SCALE, workers: int = 4,
         steps: int = 4, *, returns: float | None = None, dispatch: str = "chunk", gc: str = "default",
         transport: str = "ray-arg", node_budget: Any = None, ray_address: str | None = None,
         worker_resources: dict[str, float] | None = None, spread: bool = False, engine: str = "replica",
         enforcement: str = "watchdog", timeout_s: float = 900.0, sample_interval_s: float = 0.001,
         on_event: Any = None) -> NodeResult:
    """Replay ``steps`` training steps of a verl node (a driver and ``workers`` actors); see the module doc.

    ``node_budget`` (bytes, ``"700MiB"`` or a payload multiple such as ``"1.5x"``) caps the node's total
    above its baseline; the process with the highest ``oom_score`` is killed at the crossing. With
    ``enforcement="cgroup"`` the whole cluster runs in one memory cgroup limited to its usage at the
    baseline plus the budget, and the kernel's OOM killer picks and kills the victim itself.
    """
    return node_series((codec,), workload, scale, workers, steps, returns=returns, dispatch=dispatch, gc=gc,
                       transport=transport, node_budget=node_budget, ray_address=ray_address,
                       worker_resources=worker_resources, spread=spread, engine=engine, enforcement=enforcement,
                       timeout_s=timeout_s, sample_interval_s=sample_interval_s, on_event=on_event)[0]


def node_series(codecs: Sequence[str], workload: str = "flowgrpo", scale: float = DEFAULT_SCALE, workers: int = 4,
                steps: int = 4, *, returns: float | None = None, dispatch: str = "chunk", gc: str = "default",
                transport: str = "ray-arg", node_budget: Any = None, ray_address: str | None = None,
                worker_resources: dict[str, float] | None = None, spread: bool = False, engine: str = "replica",
                enforcement: str = "watchdog", timeout_s: float = 900.0, sample_interval_s: float = 0.001,
                on_event: Any = None) -> list[NodeResult]:
    """One replay per codec, one after the other, on the same driver and worker actors; one result each.

    Starting a node is most of its cost (each worker imports torch, tensordict and Ray), so comparing
    codecs on one set of processes (``reproduce``'s node pair) saves that start for every codec after the
    first. So that every replay starts from the same state, each one is preceded by as many unmeasured
    training steps with its own codec and collector (the store pages and allocator arenas they leave are
    part of every replay's baseline, docs/node.md says what that means for the figures) and a full
    collection with the freed heap given back; then its own baseline, its own clock (``t_s`` from its own
    start) and its own session. A series needs codecs one process can switch between: the built-in ones. A replay that
    does not end ``ok`` ends the series; the replays after it say so. Every option applies to each replay.
    """
    from picklescope.workloads.spec import load_workload

    t0 = time.monotonic()  # the run's own clock: it ends by t0 + timeout_s, clean-up included
    codecs = tuple(codecs)
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
        raise PicklescopeError(f"--timeout {timeout_s!r} must be a positive number of seconds",
                               "use e.g. --timeout 600")
    if timeout_s < MIN_TIMEOUT_S:  # the first child's start (the warm forkserver) cannot be cut short
        raise PicklescopeError(f"--timeout {timeout_s:g} is too short for a node replay: starting its processes "
                               "and Ray's takes tens of seconds on a busy machine",
                               f"use at least --timeout {MIN_TIMEOUT_S:g}")
    if not codecs:
        raise PicklescopeError("a node series needs at least one codec", "name one, e.g. ('numpy-legacy', 'numpy')")
    if len(codecs) > 1 and (engine != "replica" or any(c.startswith("verl-") for c in codecs)):
        raise PicklescopeError("a node series switches codecs inside its processes, which real verl's codecs "
                               "cannot (each loads its own verl)", "run picklescope node once per verl codec")
    for codec in codecs:
        _check(codec, workers, steps, dispatch, gc, transport, returns, engine)
    wl = load_workload(workload)
    payload = wl.payload_bytes(scale)
    rows = wl.rows(scale)
    if dispatch == "chunk" and rows < workers:
        raise PicklescopeError(f"{rows} rows cannot be chunked among {workers} workers",
                               "use fewer workers or a larger --scale")
    if any(c.startswith("verl-") for c in codecs) and dispatch == "chunk" and rows % workers:
        raise PicklescopeError(f"verl's DataProto.chunk needs the {rows} rows to divide among {workers} workers",
                               "choose a worker count that divides the batch")
    if engine == "verl" and (worker_resources or spread):
        raise PicklescopeError("--engine verl places its workers with verl's RayResourcePool (one CPU bundle each)",
                               "leave --worker-resources and --spread out with --engine verl")
    budget = None if node_budget is None else parse_size(node_budget, "--node-budget").resolve(payload)
    if budget is not None and budget <= 0:
        raise PicklescopeError(f"--node-budget {node_budget!r} must be positive", "use e.g. --node-budget 1.5x")
    cgroup_base = _check_enforcement(enforcement, budget, ray_address)
    from picklescope.core.leftovers import sweep_orphans
    from picklescope.transports.ray.driver import object_store_bytes
    from picklescope.transports.ray.events import machine_id

    sweep_orphans()
    reserve = cleanup_reserve(timeout_s)
    run_dir = make_temp_dir("picklescope-node-", socket="events.sock")  # the workers' events
    ray_tmp = None if ray_address else make_temp_dir("psray-", for_ray=True)
    sends = workers if dispatch == "broadcast" else 2
    room = sends * payload
    if gc == "off":  # room for the chunks uncollected cycles keep pinned, up to 16 steps' worth: a full
        # store makes Ray call gc.collect() in every process, which --gc off must not get by accident
        # (a series' unmeasured steps before each replay pin as many again until they are collected)
        room = max(room, (min(steps, 16) * (2 if len(codecs) > 1 else 1) + 1) * payload
                   * (workers if dispatch == "broadcast" else 1))
    store = object_store_bytes(payload, int(room + (returns or 0) * payload + 64 * 2**20))
    results = [NodeResult(codec, wl.name, scale, workers, steps, payload, dispatch, gc, transport, returns,
                          engine=engine, enforcement=enforcement, budget_bytes=budget) for codec in codecs]
    accepter = _Accepter(run_dir)
    from picklescope.transports.ray.orchestrate import ray_env

    cfg = {"codec": codecs[0], "workload": wl.source or wl.name, "scale": scale,
           "workers": workers, "steps": steps, "returns": returns, "dispatch": dispatch, "gc": gc,
           "transport": transport, "engine": engine, "ray_path": "arg", "ray_address": ray_address,
           "ray_temp_dir": ray_tmp, "warm_up": "steps" if len(codecs) > 1 else "row",
           "object_store_bytes": store, "run_dir": run_dir, "t0": t0,
           "t0_wall": time.time() - (time.monotonic() - t0), "machine": machine_id(),
           "events_address": accepter.listener.address, "events_key": accepter.key.hex(),
           "ray_env": ray_env(bool(ray_address)), "parent_pid": os.getpid(),
           "deadline_wall": time.time() + (t0 + timeout_s - reserve - time.monotonic()),
           "parent_ticks": _own_ticks(), "worker_resources": worker_resources or {}, "spread": spread}
    cg_path = None
    if cgroup_base is not None:
        from picklescope.core import cgroup

        cg_path = cgroup.create(cgroup_base, f"{temp_name('picklescope-')}node{os.urandom(3).hex()}")
        cfg["cgroup"] = cg_path
        cfg["ray_env"]["RAY_memory_monitor_refresh_ms"] = "0"  # the kernel decides, not Ray's monitor
        for r in results:
            r.cgroup = {"path": cg_path}
    proc = conn = None
    driver_start = None
    tracking: dict[str, Any] = {"cluster_pids": {}, "cgroup": cg_path, "budget": budget, "hellos": {},
                                "names": {}, "worker_conns": {}, "conns": [], "t0": t0, "timeout_s": timeout_s,
                                "workers": workers, "end_by": t0 + timeout_s}
    _phase(tracking, "the driver's start (the warm forkserver imports torch first)")
    session: Session | None = None
    current = results[0]
    try:
        proc, conn = _start_driver(cfg, tracking["end_by"] - reserve)
        driver_start = cluster.start_ticks(proc.pid)
        tracking["driver"] = (proc.pid, driver_start)
        _phase(tracking, "Ray start-up")
        for i, result in enumerate(results):
            current = result
            start = t0
            if i:
                start = time.monotonic()
                conn.send(Next(type="next", codec=result.codec, t0=start,
                               t0_wall=time.time() - (time.monotonic() - start)))
            session = Session(start, run_dir, sample_interval_s, None if cg_path else budget).start()
            session.adopt("driver", proc.pid, role="driver")
            _adopt_known(session, result, tracking)
            tracking["finished"] = False
            if i:
                tracking["end_by"] = start + timeout_s  # each later replay of a series has a limit of its own
                _phase(tracking, "the warm-up steps of the next replay")
            _follow(session, result, proc, conn, accepter, tracking, tracking["end_by"] - reserve, on_event)
            _check_cgroup_kill(session, result, tracking)  # a kill whose consequences ended the run first
            session.stop()
            _settle(session, result)
            session = None
            result.wall_s = time.monotonic() - start
            if result.outcome != "ok" or not tracking["finished"]:
                for later in results[i + 1:]:
                    verdicts.conclude(later, "error",
                                      f"not replayed: the {result.codec} replay before it ended {result.outcome}")
                break
    except _DriverStartTimeout:
        verdicts.conclude(current, "timeout", _timeout_message(tracking))
        for later in results[1:]:
            verdicts.conclude(later, "error", f"not replayed: the {current.codec} replay before it ended timeout")
    except KeyboardInterrupt:
        verdicts.conclude(current, "interrupted", "interrupted (Ctrl-C); every process was stopped")
        raise
    finally:
        if session is not None:
            session.stop()
            _settle(session, current)
        _phase(tracking, "shutdown")
        _cleanup(current, proc, conn, driver_start, tracking, cfg)
        accepter.close()
        for c in tracking.get("conns", []):
            c.close()
        if cg_path is not None:
            _remove_cgroup(cg_path, current)
        tracking["driver_log"] = _tail(os.path.join(run_dir, DRIVER_LOG))
        shutil.rmtree(run_dir, ignore_errors=True)
        if ray_tmp:
            shutil.rmtree(ray_tmp, ignore_errors=True)
    for r in results:
        if r.outcome in ("error", "timeout") and tracking.get("driver_log") and \
                not (r.error or "").startswith("not replayed"):
            r.notes.append("the driver's own output ended with:\n" + tracking["driver_log"])
        r.cleanup = current.cleanup
    if len(results) == 1:
        results[0].wall_s = time.monotonic() - t0  # set-up, the replay and the clean-up
    if tracking.get("bad_input"):
        raise PicklescopeError(*tracking["bad_input"])
    return results


class _DriverStartTimeout(Exception):
    """The run's limit came while the warm forkserver was still starting (see :func:`_start_driver`)."""


def _start_driver(cfg: dict[str, Any], deadline: float) -> tuple[Any, Any]:
    """The driver, from the warm forkserver, within the run's limit (a monotonic ``deadline``).

    The first start of the forkserver waits for it to import torch (a minute or more on a busy machine),
    and that wait cannot be interrupted from inside. When this call is the one that starts the
    forkserver, a timer ends the forkserver at the deadline, which makes the start fail at once; the
    run then ends as a timeout at its limit. A forkserver already running (another run's, in a notebook
    or ``reproduce``) is never touched: its start is immediate."""
    from multiprocessing import forkserver

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
        return launcher.start(driver_main, (cfg,), "picklescope-node-driver")
    except Exception:
        if fired.is_set():
            raise _DriverStartTimeout() from None
        raise
    finally:
        if timer is not None:
            timer.cancel()


def cleanup_reserve(timeout_s: float) -> float:
    """Seconds of the run's ``--timeout`` kept for ending it: the driver's ``ray.shutdown``, then the kill
    of whatever of the cluster is left. The replay itself stops this much before the limit, so the
    whole run, clean-up included, ends by ``--timeout``."""
    return min(30.0, max(3.0, 0.1 * timeout_s))


def _phase(tracking: dict[str, Any], name: str) -> None:
    """What the run is waiting for now (named by a timeout and by a dead Ray process's message)."""
    tracking["phase"], tracking["phase_since"] = name, time.monotonic()


def _waiting_for(tracking: dict[str, Any]) -> str:
    since = startup.clock(tracking["phase_since"] - tracking["t0"])
    return f"{tracking['phase']} (since {since})"


def _timeout_message(tracking: dict[str, Any]) -> str:
    """One line: how far the run got, what it was waiting for, how busy the machine was."""
    now = time.monotonic() - tracking["t0"]
    load = startup.load_average()
    return (f"stopped at {now:.0f} s of its {tracking['timeout_s']:g} s --timeout (the rest ends every process) "
            f"while waiting for {_waiting_for(tracking)}"
            + (f"; the machine's load average was {load:.1f}" if load is not None else ""))


def _dead_component(session: Session, tracking: dict[str, Any]) -> str | None:
    """After start-up: one line naming a core process of our cluster that died ("the raylet (with the
    object store) died 1:40 into the run, during training step 2"), else None. At most once a second.

    Not while a budget's kill is being settled: the kernel's OOM killer may pick a Ray process itself."""
    if tracking.get("watch") is None or session.kill is not None:
        return None
    now = time.monotonic()
    if now - tracking.get("watch_polled", 0.0) < COMPONENT_POLL_S:
        return None
    tracking["watch_polled"] = now
    if tracking["watch"].poll() is None:
        return None
    return f"{tracking['watch'].sentence('the run')}, during {_waiting_for(tracking)}"


def _adopt_known(session: Session, result: NodeResult, tracking: dict[str, Any]) -> None:
    """A later replay's session: the workers (they said hello to an earlier one) and the object store."""
    for name, hello in tracking["hellos"].items():
        from picklescope.transports.ray.events import machine_id

        session.adopt(name, hello["pid"], role="worker", node_id=hello.get("node_id"),
                      sampled=hello.get("machine") == machine_id())
    if tracking.get("ray_info") is not None:
        _attach_store(session, tracking["ray_info"], result)
        rec = session.processes.get("driver")
        if rec is not None:
            rec.node_id = tracking["ray_info"].get("node_id")
    if tracking.get("engine_info") is not None:
        result.engine_info = tracking["engine_info"]


def _tail(path: str, limit: int = 3000) -> str:
    """The last ``limit`` characters of a text file ("" when there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - limit))
            return f.read().decode("utf-8", "replace").strip()
    except OSError:
        return ""


def _check_enforcement(enforcement: str, budget: int | None, ray_address: str | None) -> str | None:
    """The cgroup directory to create the run's memory cgroup in (``cgroup``), else None; bad input raises."""
    if enforcement not in ENFORCEMENTS:
        raise PicklescopeError(f"--enforcement {enforcement!r} is not one of {', '.join(ENFORCEMENTS)}",
                               "use --enforcement watchdog (the oom_score check) or cgroup (the kernel)")
    if enforcement == "watchdog":
        return None
    if budget is None:
        raise PicklescopeError("--enforcement cgroup needs a --node-budget (the cgroup's limit above the baseline)",
                               "add e.g. --node-budget 2x")
    if ray_address:
        raise PicklescopeError("--enforcement cgroup puts the cluster it starts in one cgroup; a joined cluster's "
                               "processes are not its children", "leave --ray-address out with --enforcement cgroup")
    from picklescope.core import cgroup

    cgroup.remove_stale_everywhere()
    base, why = cgroup.support()
    if base is None:
        raise PicklescopeError(f"--enforcement cgroup is unavailable here: {why}",
                               "use --enforcement watchdog (picklescope kills the highest oom_score itself)")
    return base


def _limit_cgroup(path: str, budget: int) -> dict[str, Any]:
    """Cap the cgroup at what it holds now (the node's baseline) plus ``budget``; swap counted too."""
    with open(os.path.join(path, "memory.usage_in_bytes")) as f:
        usage = int(f.read().split()[0])
    limit = usage + budget
    with open(os.path.join(path, "memory.limit_in_bytes"), "w") as f:
        f.write(str(limit))
    memsw = os.path.join(path, "memory.memsw.limit_in_bytes")
    if os.path.exists(memsw):  # with swap, the limit alone would swap instead of kill
        try:
            with open(memsw, "w") as f:
                f.write(str(limit))
        except OSError:
            pass
    return {"baseline_usage_bytes": usage, "limit_bytes": limit}


def _check_cgroup_kill(session: Session, result: NodeResult, tracking: dict[str, Any]) -> None:
    """After the kernel's OOM killer fired in the run's cgroup: record which process it killed, and when."""
    from picklescope.core import cgroup

    path = tracking.get("cgroup")
    if path is None or session.kill is not None or tracking.get("limit") is None:
        return
    if cgroup.counters(path).get("oom_kill", 0) <= 0:
        return
    t = round(time.monotonic() - session.t0, 6)
    inside = set(cgroup.procs(path))
    named = {name: rec.pid for name, rec in session.processes.items()}
    for role, pids in tracking.get("cluster_pids", {}).items():
        for pid in pids:
            named.setdefault(f"{role} ({pid})" if len(pids) > 1 else role, pid)
    dead = [name for name, pid in named.items() if pid not in inside and not _running(pid)]
    if not dead:
        return
    victim = dead[0]
    rec = session.processes.get(victim)
    step, step_of = session.step_at_kill(victim)
    # what the node held on the victim's last sample (once it is gone, its memory is gone from the total)
    last = rec.timeline.t_s[-1] if rec is not None and rec.timeline.t_s else (session.node.t_s or [t])[-1]
    memory = {}
    for name, r in session.processes.items():
        if r.timeline.t_s and r.timeline.t_s[-1] >= last:
            memory[name] = session.value_at(r.timeline, last) or 0
    memory["store"] = session.value_at(session.store, last) or 0
    node_now = (session.value_at(session.node, last) or 0) - (session.node_baseline or 0)
    session.kill = KillRecord(victim, named[victim], t, node_now, int(tracking.get("budget") or 0),
                              session.current_training_step(), step, {}, memory, step_of=step_of)
    result.cgroup["killed_by"] = "the kernel's OOM killer in the run's memory cgroup"
    if len(dead) > 1:
        result.notes.append(f"also gone when the cgroup's OOM killer fired: {', '.join(dead[1:])}")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


def _remove_cgroup(path: str, result: NodeResult) -> None:
    from picklescope.core import cgroup

    result.cgroup.update(cgroup.counters(path))
    left = cgroup.kill_all(path)
    if left:
        result.cgroup["killed_at_end"] = left
    cgroup.remove(path)
    result.cgroup["removed"] = not os.path.exists(path)


def _own_ticks() -> int | None:
    from picklescope.transports.ray.cluster import start_ticks

    return start_ticks(os.getpid())


def _follow(session: Session, result: NodeResult, proc: Any, conn: Any, accepter: _Accepter,
            tracking: dict[str, Any], deadline: float, on_event: Callable[[Event], None] | None) -> None:
    """Relay the driver's and the workers' events into the session until the replay is decided."""
    names: dict[Any, str] = tracking["names"]  # a worker's pipe -> its name (from its hello), for every replay
    conns: dict[str, Any] = {"driver": conn, **tracking["worker_conns"]}
    state: dict[str, Any] = {"finished": False, "killed_at": None}

    def handle(key: str, ev: Event) -> None:
        if key == "driver":
            state["finished"] |= _on_driver(session, result, conn, ev, tracking)
        else:
            _on_worker(session, result, names, conns[key], ev, tracking)
        if on_event is not None:
            on_event(ev)

    def before_wait() -> bool:  # new workers' pipes, a cgroup's kill; True once a kill's aftermath was heard
        for c in accepter.take():
            tracking["conns"].append(c)
            names[c] = ""
            key = f"conn{len(tracking['conns'])}"  # named by its hello, in names
            conns[key] = tracking["worker_conns"][key] = c
        _check_cgroup_kill(session, result, tracking)
        dead = _dead_component(session, tracking)
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
    if not session.follow(conns, {"driver": proc}, handle, deadline, decided, poll_s=0.05):
        verdicts.conclude(result, "timeout", _timeout_message(tracking))


def _on_driver(session: Session, result: NodeResult, conn: Any, ev: Event, tracking: dict[str, Any]) -> bool:
    kind = ev.get("type")
    if kind == "train_step_start":
        _phase(tracking, f"training step {ev.get('index')}")
    elif kind == "train_step_end":
        last = ev.get("index") == result.steps
        _phase(tracking, "the end of the measured phase" if last else f"training step {int(ev.get('index') or 0) + 1}")
    if kind == "ray_info":
        tracking["cluster_pids"] = ev.get("pids", {})
        tracking["ray_info"] = ev
        _phase(tracking, f"the {tracking.get('workers', 'worker')} worker actors' start")
        if tracking.get("watch") is None and ev.get("pids"):  # our own cluster is up: from now on a
            # core process that dies ends the run at once, named, instead of a hang until the limit
            pid, ticks = tracking["driver"]
            tracking["watch"] = startup.ComponentWatch(lambda: cluster.cluster_processes(pid, ticks),
                                                       t0=tracking["t0"])
        _attach_store(session, ev, result)
        rec = session.processes.get("driver")
        if rec is not None:
            rec.node_id = ev.get("node_id")
    elif kind == "note":
        result.notes.append(ev["message"])
    elif kind == "engine":
        result.engine_info = tracking["engine_info"] = ev["info"]
        _phase(tracking, "the warm-up call to every worker")
    elif kind in ("done", "train_step_end") and ev.get("full_collections") is not None:
        if kind == "done":
            result.full_collections["driver"] = ev["full_collections"]
        else:
            result.driver_full_collections[ev["index"]] = ev["full_collections"]
        session.fold("driver", ev)
    elif kind == "ready":
        _phase(tracking, "the baseline")
        session.take_baseline()
        if tracking.get("cgroup"):
            tracking["limit"] = _limit_cgroup(tracking["cgroup"], tracking["budget"])
            result.cgroup.update(tracking["limit"])
        conn.send({"type": "go"})
    elif kind == "finished":
        tracking["finished"] = True
        return True

    elif kind == "error":
        if session.kill is None:
            verdicts.conclude(result, "error", f"{ev.get('exc_type')}: {ev.get('message')}")
            if ev.get("bad_input"):
                tracking["bad_input"] = ev["bad_input"]
        session.fold("driver", ev)
    else:
        session.fold("driver", ev)
    return False


def _on_worker(session: Session, result: NodeResult, names: dict[Any, str], c: Any, ev: dict[str, Any],
               tracking: dict[str, Any]) -> None:
    if ev.get("type") == "hello":
        from picklescope.transports.ray.events import machine_id

        names[c] = ev["name"]
        tracking["hellos"][ev["name"]] = ev
        session.adopt(ev["name"], ev["pid"], role="worker", node_id=ev.get("node_id"),
                      sampled=ev.get("machine") == machine_id())
        return
    name = names.get(c)
    if name:
        if ev.get("type") == "done" and ev.get("full_collections") is not None:
            result.full_collections[name] = ev["full_collections"]
        session.fold(name, ev)


def _attach_store(session: Session, ev: RayInfo, result: NodeResult) -> None:
    from picklescope.transports.ray.store import ShmFileReader

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


def _cleanup(result: NodeResult, proc: Any, conn: Any, driver_start: int | None, tracking: dict[str, Any],
             cfg: dict[str, Any]) -> None:
    """Let the driver end its Ray session, then kill whatever of the cluster we started is still alive.

    The driver gets what is left of the run's limit for its ``ray.shutdown`` (at most
    :data:`RELEASE_WAIT_S`, and a few seconds are kept for the kill that follows), so the run ends by
    its ``--timeout`` whatever the driver is stuck in."""
    if proc is None:
        return
    if tracking.get("finished"):  # the driver waits for this to end its Ray session
        try:
            conn.send(Release(type="release"))
        except (OSError, BrokenPipeError):
            pass
    elif proc.is_alive():  # mid-step (killed worker, error, timeout, Ctrl-C): SIGTERM ends it through its finally
        proc.terminate()
    left_s = tracking.get("end_by", float("inf")) - time.monotonic() - 3.0
    proc.join(timeout=max(1.0, min(RELEASE_WAIT_S, left_s)))
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)
    conn.close()
    if result.processes.get("driver") is not None:
        result.processes["driver"].exit_code = proc.exitcode
    if cfg.get("ray_address"):
        result.cleanup = {"joined": cfg["ray_address"], "note": "the actors end with their driver"}
        return
    known = [p for pids in tracking.get("cluster_pids", {}).values() for p in pids]
    args = (proc.pid, driver_start, known, cfg.get("ray_temp_dir"))
    left = sorted(cluster.cluster_processes(*args))
    killed, remaining = cluster.stop_all(lambda: cluster.cluster_processes(*args))
    result.cleanup = {"left_after_driver": left, "killed": killed, "remaining": remaining}


def _settle(session: Session, result: NodeResult) -> None:
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
        pairs = [(t, v) for t, v in zip(session.node.t_s, session.node.bytes) if t >= session.baseline_s]
        if pairs:
            t_peak, v_peak = max(pairs, key=lambda p: p[1])
            result.node_peak_bytes, result.node_peak_t_s = v_peak - base, t_peak
            for name, rec in session.processes.items():
                v = session.value_at(rec.timeline, t_peak) if rec.timeline.t_s and rec.timeline.t_s[-1] >= t_peak \
                    else None
                if v is not None and rec.baseline_bytes is not None:
                    result.at_peak_bytes[name] = v - rec.baseline_bytes
            sv = session.value_at(session.store, t_peak)
            if sv is not None and session.store_baseline is not None:
                result.at_peak_bytes["store"] = sv - session.store_baseline
        stores = [v for t, v in zip(session.store.t_s, session.store.bytes) if t >= session.baseline_s]
        if stores and session.store_baseline is not None:
            result.store_peak_bytes = max(stores) - session.store_baseline
        result.max_gap_s = round(session.max_gap_s(), 6)


# -- the driver (a child of ours) ---------------------------------------------------------------------


def _private_bytes() -> int:
    """This process's ``VmRSS - RssShmem`` (the session's per-process accounting)."""
    return procmem.private_rss()


def _apply_gc(mode: str) -> None:
    if mode == "off":
        gc.disable()


_full_collections = [0]


def _count_full_collections() -> None:
    """Count every full (generation 2) collection from now on, whoever asked for it.

    ``gc.disable()`` stops only Python's automatic collector: an explicit ``gc.collect()`` still runs,
    and Ray's core worker calls it when the raylet asks every worker to collect (object store under
    pressure). The count says whether a run's memory was shaped by such collections.
    """
    _full_collections[0] = 0
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        _full_collections[0] += 1


def _instrument_verl(cls: type) -> None:
    """Step markers around a real ``DataProto``'s ``__getstate__``/``__setstate__`` (instrumentation only)."""
    for name in ("__getstate__", "__setstate__"):
        original = cls.__dict__.get(name)
        if original is None or getattr(original, "_picklescope_original", None) is not None:
            continue

        def wrapped(self: Any, *a: Any, _orig: Any = original, _name: str = name) -> Any:
            with steps.step(_name):
                return _orig(self, *a)

        wrapped._picklescope_original = original  # type: ignore[attr-defined]
        setattr(cls, name, wrapped)


class _Data:
    """The codec's side of the loop: real verl's DataProto with a verl codec, else our Batch."""

    def __init__(self, codec_name: str) -> None:
        from picklescope.batch import set_active_codec
        from picklescope.codecs import get_codec

        self.codec = get_codec(codec_name)
        self.info = None
        prepare = getattr(self.codec, "prepare", None)
        if prepare is not None:
            self.info = prepare()
        set_active_codec(codec_name)
        self.verl_cls = None
        if hasattr(self.codec, "to_dataproto"):
            from picklescope.investigate.node_verl import mark_chunk_and_concat
            from picklescope.verl import loader

            self.verl_cls = loader.loaded().DataProto
            _instrument_verl(self.verl_cls)
            mark_chunk_and_concat(self.verl_cls)

    def split_join(self) -> dict[str, Any]:
        """Whose functions split the batch and join the results (the ``engine`` entry of the result)."""
        if self.verl_cls is None:
            return {"chunk": "TensorDict.chunk", "concat": "torch.cat", "data_class": "picklescope.batch.Batch"}
        import inspect

        return {"chunk": f"{self.verl_cls.__module__}.DataProto.chunk",
                "concat": f"{self.verl_cls.__module__}.DataProto.concat",
                "data_class": f"{self.verl_cls.__module__}.DataProto", "data_file": inspect.getfile(self.verl_cls)}

    def wrap(self, b: Any) -> Any:
        return self.codec.to_dataproto(b) if self.verl_cls is not None else b

    def chunk(self, data: Any, n: int) -> list[Any]:
        if self.verl_cls is not None:
            return data.chunk(n)
        import numpy as np

        from picklescope.batch import Batch

        tds = data.batch.chunk(n, dim=0)
        sizes = [int(t.batch_size[0]) for t in tds]
        cuts = list(np.cumsum(sizes)[:-1])
        nts = [{} for _ in tds]
        for key, arr in data.non_tensor_batch.items():
            for i, part in enumerate(np.split(arr, cuts)):
                nts[i][key] = part
        return [Batch(td, nts[i], dict(data.meta_info)) for i, td in enumerate(tds)]

    def concat(self, parts: list[Any]) -> Any:
        if self.verl_cls is not None:
            return self.verl_cls.concat(parts)
        import torch

        from picklescope.batch import Batch

        return Batch(torch.cat([p.batch for p in parts], dim=0), {}, dict(parts[0].meta_info))

    def result(self, rows: int, width: int, dtype: Any) -> Any:
        import torch
        from tensordict import TensorDict

        td = TensorDict({"old_log_probs": torch.full((rows, width), 1, dtype=dtype)}, batch_size=[rows])
        if self.verl_cls is not None:
            return self.verl_cls(batch=td, non_tensor_batch={}, meta_info={})
        from picklescope.batch import Batch

        return Batch(td, {}, {})


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
        started = _descendants()  # the Ray processes this driver started (GCS, raylet, workers)
        if _parent_alive(cfg):  # the parent reports the run and removes the temporaries
            ray = sys.modules.get("ray")
            if ray is not None:
                _shutdown_quietly(ray)
            _kill_all(started)  # whatever ray.shutdown left
        else:
            # The parent is gone (SIGKILL): nobody reads this run any more. Remove the temporaries first,
            # then kill the cluster: once its raylet is gone, Ray's core worker ends this process at once
            # (no Python code runs after that), so a graceful ray.shutdown would never get to them.
            _remove_temporaries(cfg)
            _kill_all(started)
            _remove_temporaries(cfg)


def _remove_temporaries(cfg: dict[str, Any]) -> None:
    for path in (cfg.get("ray_temp_dir"), cfg.get("run_dir")):
        if path and os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)


def _shutdown_quietly(ray: Any) -> None:
    try:
        ray.shutdown()
    except BaseException:  # noqa: BLE001 - a Ray error while stopping: the kill that follows still runs
        pass


def _descendants() -> list[Any]:
    """Every process below this one (psutil handles), read before Ray is shut down."""
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def _kill_all(procs: list[Any], wait_s: float = 5.0) -> None:
    """SIGKILL the processes that are still running and wait for them (bounded)."""
    import psutil

    alive = []
    for proc in procs:
        try:
            proc.kill()
            alive.append(proc)
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=wait_s)


def _parent_alive(cfg: dict[str, Any]) -> bool:
    """Whether the measuring process still runs (it removes the temporaries itself when it does). A
    parent killed with SIGKILL stays a zombie until its own parent reaps it: that is not running."""
    from picklescope.transports.ray.cluster import start_ticks

    if start_ticks(cfg["parent_pid"]) != cfg["parent_ticks"]:
        return False
    try:
        with open(f"/proc/{cfg['parent_pid']}/stat") as f:
            state = f.read().rpartition(")")[2].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _wait(conn: Any) -> Any:
    try:
        return conn.recv()
    except (EOFError, OSError):
        return None


def _result_shape(batch: Any, rows: int, payload: int, returns: float | None) -> tuple[int, Any]:
    """(width, dtype) of each worker's result row: ``returns`` x the chunk's payload, or a per-token float."""
    import torch

    if returns is not None:
        return max(1, int(round(returns * payload / rows))), torch.uint8
    width = 1
    for value in batch.batch.values():
        if value.dim() == 2 and not value.dtype.is_floating_point and value.dtype != torch.bool:
            width = max(width, int(value.shape[1]))
    return width, torch.float32


def _drive(conn: Any, cfg: dict[str, Any]) -> None:
    from picklescope.transports.ray import hooks
    from picklescope.transports.ray.driver import cluster_info, init_ray, restore_priority
    from picklescope.workloads.spec import load_workload

    if cfg.get("cgroup"):  # before Ray starts: every process of the cluster is born inside it
        from picklescope.core import cgroup

        if not cgroup.add_process(cfg["cgroup"], os.getpid()):
            raise PicklescopeError(f"the node's driver cannot join the memory cgroup {cfg['cgroup']}",
                                   "use --enforcement watchdog")
    data = _Data(cfg["codec"])
    if data.info:
        conn.send(CodecInfo(type="codec_info", side="driver", info=data.info))
    wl = load_workload(cfg["workload"])
    batch = wl.build(cfg["scale"])
    payload = wl.payload_bytes(cfg["scale"])
    whole = data.wrap(batch)
    width, dtype = _result_shape(batch, len(batch), payload, cfg["returns"])
    del batch
    niceness = os.getpriority(os.PRIO_PROCESS, 0)
    import ray

    verl_engine = cfg.get("engine") == "verl"
    init_ray(conn, cfg, _init_args(cfg))  # the start-up policy of transports.ray.startup
    info = cluster_info()
    info["node_id"] = ray.get_runtime_context().get_node_id()
    conn.send(RayInfo(type="ray_info", side="driver", **info))
    hooks.install(serialize=True)
    dtype_name = str(dtype).removeprefix("torch.")
    if verl_engine:
        from picklescope.investigate.node_verl import VerlEngine

        engine: Any = VerlEngine(ray, cfg, _verl_worker_class(cfg["codec"]), width, dtype_name)
    else:
        engine = _ReplicaEngine(ray, cfg, data, width, dtype_name)
    engine.ready()
    conn.send({"type": "engine", "info": {**engine.info, **data.split_join()}})
    if not cfg.get("ray_address"):
        restore_priority(niceness)
    # A small call per worker during set-up: first-call costs (lazy imports on both ends,
    # Ray's first object-store mapping) land in the baselines, not in training step 1.
    engine.warm(whole)
    while True:
        if not _replay(conn, cfg, engine, whole):
            return
        msg = _wait(conn)
        if not isinstance(msg, dict) or msg.get("type") != "next":
            return  # the parent's release (or its end): the Ray session ends in driver_main
        cfg = {**cfg, "codec": msg["codec"], "t0": msg["t0"], "t0_wall": msg["t0_wall"]}
        engine.switch(_Data(cfg["codec"]), cfg)


def _replay(conn: Any, cfg: dict[str, Any], engine: Any, whole: Any) -> bool:
    """One measured replay of ``cfg["steps"]`` training steps; False if the parent went away before it began."""
    from picklescope.transports.ray import events

    series = cfg.get("warm_up") == "steps"
    if series:  # every replay of a series starts after as many unmeasured training steps of its own codec,
        # under its own collector: the store pages and allocator arenas its pattern needs are in its baseline
        _apply_gc(cfg["gc"])
        for _ in range(cfg["steps"]):
            engine.step(whole)
    engine.arm()
    gc.enable()
    gc.collect()
    if series:  # and with what the previous replay (or the warm-up) freed given back, as in the workers
        procmem.trim_heap()
    _apply_gc(cfg["gc"])
    _count_full_collections()
    meter = begin_measure(steps.Meter(events.with_shared(conn.send), cfg["t0"], "driver"))
    private_base = _private_bytes()
    conn.send(Ready(type="ready", side="driver"))
    if _wait(conn) is None:
        return False
    for k in range(1, cfg["steps"] + 1):
        conn.send({"type": "train_step_start", "index": k, "t_s": meter.now()})
        engine.step(whole)
        if cfg["gc"] == "each-step":
            with steps.step("gc"):
                gc.collect()
        conn.send({"type": "train_step_end", "index": k, "t_s": meter.now(), "private_bytes": _private_bytes(),
                   "private_baseline_bytes": private_base, "full_collections": _full_collections[0]})

    def at_end() -> int:
        engine.finish()  # the workers end their own measured phase
        return _full_collections[0]  # a collection Ray asked for meanwhile changes what is held: counted

    m = end_measure(conn, meter, None, read_at_end=at_end, trim=series)
    conn.send({"type": "done", "side": "driver", "peak_bytes": m.peak_bytes, "held_bytes": m.held_bytes,
               "cycle_held_bytes": m.cycle_held_bytes, "t_s": m.end_t, "full_collections": m.at_end})
    conn.send({"type": "finished"})
    return True


def _init_args(cfg: dict[str, Any]) -> dict[str, Any] | None:
    """``ray.init`` arguments for the verl engine's own cluster: one logical CPU per worker (verl's
    resource pool reserves a CPU bundle per worker); None (the usual arguments) otherwise."""
    from picklescope.transports.ray.driver import init_args

    if cfg.get("engine") != "verl" or cfg.get("ray_address"):
        return None
    args = init_args(cfg)
    args["num_cpus"] = max(int(args.get("num_cpus") or 1), int(cfg["workers"]))
    return args


def _verl_worker_class(codec: str) -> type:
    """This module's ``VerlNodeWorker``, built here (the driver) on ``codec``'s verl; see :func:`__getattr__`."""
    cls = globals().get("VerlNodeWorker")
    if cls is None:
        from picklescope.investigate.node_verl import worker_class

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
    from picklescope.investigate.node_verl import CODEC_ENV, worker_class

    cls = worker_class(NodeWorker, os.environ.get(CODEC_ENV))
    globals()[name] = cls
    return cls


class _ReplicaEngine:
    """The replica engine: the toolkit's own loop, following verl's single controller (DP_COMPUTE_PROTO)."""

    def __init__(self, ray: Any, cfg: dict[str, Any], data: _Data, width: int, dtype: str) -> None:
        from picklescope.transports.ray import hooks

        self.ray, self.cfg, self.data, self.hooks = ray, cfg, data, hooks
        actor_cls = ray.remote(num_cpus=0, max_restarts=0)(NodeWorker)
        options: dict[str, Any] = {}
        if cfg.get("worker_resources"):
            options["resources"] = dict(cfg["worker_resources"])
        if cfg.get("spread"):
            options["scheduling_strategy"] = "SPREAD"
        self.workers = [actor_cls.options(**options).remote(cfg, f"worker-{i}", width, dtype)
                        for i in range(cfg["workers"])]
        self.info: dict[str, Any] = {"engine": "replica", "worker_class": f"{__name__}.NodeWorker"}

    def ready(self) -> None:
        from picklescope.transports.ray.driver import wait_s

        wait = wait_s(self.cfg, self.cfg.get("actor_timeout_s", 300))
        try:
            self.ray.get([w.ready.remote() for w in self.workers], timeout=wait)
        except self.ray.exceptions.GetTimeoutError:
            raise RuntimeError(f"the {len(self.workers)} worker actors did not start within {wait:.0f} s "
                               "(the run's --timeout was near)") from None

    def _arg(self, piece: Any) -> Any:
        return piece if self.cfg["transport"] == "ray-arg" else [self.ray.put(piece)]

    def warm(self, whole: Any) -> None:
        warm = self.data.chunk(whole, len(whole))[0]
        self.data.concat(self.ray.get([w.compute.remote(self._arg(warm)) for w in self.workers]))

    def arm(self) -> None:
        self.ray.get([w.arm.remote() for w in self.workers])

    def finish(self) -> None:
        self.ray.get([w.finish.remote() for w in self.workers])

    def switch(self, data: _Data, cfg: dict[str, Any]) -> None:
        """The next replay of a series: its codec and clock, here and in every worker."""
        self.data, self.cfg = data, cfg
        self.ray.get([w.switch.remote(cfg["codec"], cfg["t0"], cfg["t0_wall"]) for w in self.workers])

    def step(self, whole: Any) -> None:
        """One training step as verl's single controller runs it (DP_COMPUTE_PROTO: chunk, call, collect)."""
        ray, hooks, data, workers = self.ray, self.hooks, self.data, self.workers
        n = len(workers)
        with steps.step("chunk"):
            pieces = data.chunk(whole, n) if self.cfg["dispatch"] == "chunk" else [whole] * n
        pending = []
        for w, piece in zip(workers, pieces):
            hooks.expect_store_write(piece)
            if self.cfg["transport"] == "ray":
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
        del pieces, piece
        with steps.step("ray.get"):
            outs = ray.get(pending)
        with steps.step("concat"):
            out = data.concat(outs)
        del pending, outs, out


# -- the workers (Ray actors) -------------------------------------------------------------------------


class NodeWorker:
    """One worker actor; the driver wraps it with ``ray.remote`` (importing this module needs no Ray)."""

    def __init__(self, cfg: dict[str, Any], name: str, width: int, dtype: str) -> None:
        import importlib

        import ray

        from picklescope.transports.ray import events, hooks

        self.cfg, self.name = cfg, name
        self.conn = events.connect(cfg)
        self.conn.send(Hello(type="hello", name=name, pid=os.getpid(), machine=events.machine_id(),
                             node_id=ray.get_runtime_context().get_node_id()))
        if os.path.isdir(cfg["run_dir"]):  # the budget check's SIGUSR1 writes our stack there before a kill
            self._stack = arm_stack_dump(cfg, name)
        for module in launcher.PRELOAD:
            importlib.import_module(module)
        import torch

        self.data = _Data(cfg["codec"])
        self.width, self.dtype = width, getattr(torch, dtype)
        hooks.install(deserialize=True)
        self.t0 = events.local_t0(cfg)
        self.meter: steps.Meter | None = None

    def ready(self) -> int:
        return os.getpid()

    def arm(self) -> None:
        """Take the baseline after setup; from now on every step is measured and streamed."""
        from picklescope.transports.ray import events

        gc.enable()
        gc.collect()
        if self.cfg.get("warm_up") == "steps":  # a series: what the warm-up freed, given back (as the driver)
            procmem.trim_heap()
        _apply_gc(self.cfg["gc"])
        _count_full_collections()
        self.meter = begin_measure(steps.Meter(events.with_shared(self._send), self.t0, self.name))

    def _send(self, ev: Event) -> None:
        self.conn.send(ev)

    def switch(self, codec: str, t0: float, t0_wall: float) -> None:
        """The next replay of a series: its codec and its clock (:meth:`arm` then takes the new baseline)."""
        from picklescope.transports.ray import events

        self.cfg = {**self.cfg, "codec": codec, "t0": t0, "t0_wall": t0_wall}
        self.data = _Data(codec)
        self.t0 = events.local_t0(self.cfg)

    def compute(self, arg: Any) -> Any:
        """Receive a chunk (already deserialized by Ray, or a ref to ``ray.get``), return a small result."""
        if self.cfg["transport"] == "ray":
            import ray

            with steps.step("ray.get"):
                arg = ray.get(arg[0])
        with steps.step("compute"):
            out = self.data.result(len(arg), self.width, self.dtype)
        del arg
        if self.cfg["gc"] == "each-step":
            with steps.step("gc"):
                gc.collect()
        return out

    def finish(self) -> None:
        meter = self.meter
        if meter is None:
            return
        m = end_measure(self.conn, meter, None, read_at_end=lambda: _full_collections[0],
                        trim=self.cfg.get("warm_up") == "steps")
        self.conn.send({"type": "done", "side": self.name, "peak_bytes": m.peak_bytes, "held_bytes": m.held_bytes,
                        "cycle_held_bytes": m.cycle_held_bytes, "t_s": meter.now(), "full_collections": m.at_end})
