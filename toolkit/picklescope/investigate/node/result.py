"""A node replay's result: every process on one clock, the node total, the training steps, the kill.

Plain data (:class:`NodeResult`) with its ``--json`` document both ways, and the words drawn from it
(its summary, one line per training step, two replays' drivers compared). The figure and the tables
are drawn from it in ``views/``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from picklescope.core.kill import Kill
from picklescope.core.result import Measured, Process, Series
from picklescope.core.units import fmt_bytes
from picklescope.measure.session import TrainingStep

NOT_REPLAYED = "not replayed"  # how the error of a series' replay that never ran begins (see NodeResult.replayed)


@dataclass
class NodeResult(Measured):
    """A node replay: every process on one clock, the node total, the training steps, the kill.

    The case, the processes, the kill record and the outcome are the run's root (:class:`Measured`);
    what follows is what only a node knows: its shape, its total and object store over time, its training
    steps and how its budget was enforced."""

    workers: int = field(kw_only=True)
    steps: int = field(kw_only=True)
    dispatch: str = field(kw_only=True)
    gc: str = field(kw_only=True)
    returns: float | None = field(kw_only=True)
    engine: str = "replica"
    enforcement: str = "watchdog"
    controller: str = "process"  # where the training loop ran: the driver process, or a Ray actor (verl's TaskRunner)
    cgroup: dict[str, Any] = field(default_factory=dict)  # --enforcement cgroup: path, limit, counters
    engine_info: dict[str, Any] = field(default_factory=dict)  # what split, called and joined (see docs/node.md)
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
    training_steps: list[TrainingStep] = field(default_factory=list)
    baseline_s: float | None = None
    max_gap_s: float | None = None
    sampler_priority: str = "normal"
    cleanup: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    full_collections: dict[str, int] = field(default_factory=dict)  # per process, during the measured steps
    driver_full_collections: dict[int, int] = field(default_factory=dict)  # driver's count at each step's end
    driver_collections: dict[int, list[int]] = field(default_factory=dict)  # ... of generations 0, 1, 2 (all)
    driver_allocations: dict[int, int] = field(default_factory=dict)  # its container allocations so far
    # its collections in each step: [generation, the step's worker calls made when it ran] (calls None where the
    # engine's loop does not say, real verl's)
    driver_runs: dict[int, list[list[int | str | None]]] = field(default_factory=dict)
    data_plane: str = "dataproto"  # how the batch reaches the workers: through the driver, or TransferQueue's storage
    step_gap_s: float = 0.0  # idle seconds at the end of each training step (the rest of a training step)
    worker_compute_s: float = 0.0  # seconds each worker's call held its chunk after reading it (its compute)

    @property
    def driver(self) -> Process:
        return self.processes["driver"]

    @property
    def replayed(self) -> bool:
        """False for a replay of a series that never ran because the one before it ended early (its error,
        beginning "not replayed", names that one): it has no measurement, no wall time and no driver log."""
        return not (self.outcome == "error" and (self.error or "").startswith(NOT_REPLAYED))

    def to_json_dict(self) -> dict[str, Any]:
        """The ``--json`` document (see docs/node.md for every key)."""
        killed = None if self.killed is None else self.killed.to_dict()
        procs = {name: {**asdict(p), "own_peak_bytes": self.own_peak_bytes(name)}
                 for name, p in self.processes.items()}
        return {
            "codec": self.codec, "workers": self.workers, "steps": self.steps, "payload_bytes": self.payload_bytes,
            "controller": self.controller, "outcome": self.outcome, "killed": killed,
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
                "error": self.error, "wall_s": round(self.wall_s or 0.0, 3), "cleanup": self.cleanup,
                "config": {"workload": self.workload, "scale": self.scale, "dispatch": self.dispatch,
                           "gc": self.gc, "transport": self.transport, "returns": self.returns,
                           "engine": self.engine, "enforcement": self.enforcement, "controller": self.controller,
                           "data_plane": self.data_plane, "step_gap_s": self.step_gap_s,
                           "worker_compute_s": self.worker_compute_s},
                "cgroup": self.cgroup or None,
                "engine": self.engine_info,
                "full_collections": self.full_collections,
            },
            "processes": procs,
            "training_steps": [{"index": s.index, "start_s": s.start_s, "end_s": s.end_s, "node_bytes": s.node_bytes,
                                "driver_bytes": s.driver_bytes, "per_process_bytes": s.per_process_bytes,
                                "driver_full_collections": self.driver_full_collections.get(s.index),
                                "driver_collections": self.driver_collections.get(s.index),
                                "driver_allocations": self.driver_allocations.get(s.index),
                                "driver_runs": self.driver_runs.get(s.index)}
                               for s in self.training_steps],
        }

    @classmethod
    def from_json_dict(cls, doc: dict[str, Any]) -> NodeResult:
        """The result back from its ``--json`` document (results.json keeps node replays as documents), so
        the tables and the figure draw a saved replay exactly as a fresh one."""
        n, config = doc["node"], doc["node"]["config"]
        r = cls(doc["codec"], config["transport"], config["workload"], config["scale"], doc["payload_bytes"],
                workers=doc["workers"], steps=doc["steps"], dispatch=config["dispatch"], gc=config["gc"],
                returns=config["returns"], engine=config["engine"],
                enforcement=config["enforcement"], controller=doc.get("controller", "process"),
                cgroup=n.get("cgroup") or {}, engine_info=n.get("engine") or {},
                outcome=doc["outcome"], error=n.get("error"), budget_bytes=n.get("budget_bytes"),
                node_baseline_bytes=n.get("baseline_bytes"), node_peak_bytes=n.get("peak_bytes"),
                node_peak_t_s=n.get("peak_t_s"), at_peak_bytes=n.get("at_peak_bytes") or {},
                store_peak_bytes=n.get("store_peak_bytes"), store_baseline_bytes=n["store"].get("baseline_bytes"),
                store_source=n["store"].get("source"), node=Series(n["timeline"]["t_s"], n["timeline"]["bytes"]),
                store=Series(n["store"]["t_s"], n["store"]["bytes"]), baseline_s=n.get("baseline_s"),
                max_gap_s=n.get("max_gap_s"), sampler_priority=n.get("sampler_priority", "normal"),
                wall_s=n.get("wall_s", 0.0), cleanup=n.get("cleanup") or {},
                full_collections=n.get("full_collections") or {}, data_plane=config.get("data_plane", "dataproto"),
                step_gap_s=config.get("step_gap_s", 0.0), worker_compute_s=config.get("worker_compute_s", 0.0))
        if doc.get("killed"):
            k = doc["killed"]
            # a document without the record's own budget has the node's
            r.killed = Kill.from_dict({"budget_bytes": n.get("budget_bytes"), **k})
        for name, p in doc["processes"].items():
            r.processes[name] = Process.from_dict({"name": name, **p})
        for s in doc["training_steps"]:
            r.training_steps.append(TrainingStep(s["index"], s["start_s"], s["end_s"], s["node_bytes"],
                                                 s["driver_bytes"], s.get("per_process_bytes") or {}))
            if s.get("driver_full_collections") is not None:
                r.driver_full_collections[s["index"]] = s["driver_full_collections"]
            if s.get("driver_collections") is not None:
                r.driver_collections[s["index"]] = list(s["driver_collections"])
            if s.get("driver_allocations") is not None:
                r.driver_allocations[s["index"]] = s["driver_allocations"]
            if s.get("driver_runs") is not None:
                r.driver_runs[s["index"]] = [list(x) for x in s["driver_runs"]]
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
                above = self.processes[name].above_baseline(unknown_baseline=0)
                for t, v in zip(above.t_s, above.bytes):
                    if t in total:
                        total[t] += v
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
        until = None if self.killed is None else self.killed.t_s  # the replay ends at a kill, as its node total does
        return None if rec is None else rec.own_peak_bytes(since_s=self.baseline_s, until_s=until)

    def own_peaks_sum_bytes(self, prefix: str) -> int | None:
        """The sum of the own peaks of every process whose name starts with ``prefix`` (``storage-``,
        ``worker-``): what a kind of process held at most, counted per process; None when none has one."""
        vals = [v for v in (self.own_peak_bytes(n) for n in sorted(self.processes) if n.startswith(prefix))
                if v is not None]
        return sum(vals) if vals else None

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
                f"{self.workers} workers, {self.steps} steps, dispatch {self.dispatch}, gc {self.gc}"
                + ("" if self.data_plane == "dataproto" else f", data plane {self.data_plane}")
                + (f", each worker computing {self.worker_compute_s:g} s on its chunk" if self.worker_compute_s else "")
                + (f", {self.step_gap_s:g} s idle after each step" if self.step_gap_s else "") + f": {self.outcome}")
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
            chooser = {"ray": "by Ray's memory monitor", "kernel": "by the kernel's OOM killer"}.get(
                k.by, f"(highest oom_score {k.oom_scores.get(k.process)})")
            out.append(f"killed {k.process} {chooser} in training step "
                       f"{k.training_step}, {k.during()}, node {fmt_bytes(k.node_bytes)} above baseline")
            if k.message:
                lines = [ln.strip() for ln in k.message.splitlines() if ln.strip()]
                said = next((ln for ln in lines if "Memory on the node" in ln), lines[0] if lines else "")
                out.append("Ray said: " + said[:400])
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
