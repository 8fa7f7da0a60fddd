"""A measured run as plain data: computed first, drawn later, saved as JSON and read back.

One root, :class:`Measured`, holds what every measured run has whatever its topology (a pair over
pickle, a cell, a Ray pair, a node replay): the case, its processes (each a :class:`Process`), the one
kill record and the outcome. :class:`RunResult` (a pair or a cell) and the node replay's ``NodeResult``
extend it with what only their topology knows. Nothing here imports plotly or talks to a process;
figures, tables, widgets and reports are views of these records.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from picklescope.core.kill import Kill

VARIES_FRACTION = 0.01  # a peak whose runs spread by more than this fraction of the payload "varies"

# Results saved before every value had its own field kept some under ``extra``; reading such a file lifts
# each into its field (``headroom`` is now ``headroom_bytes``) and drops what no field holds.
_RENAMED_FROM_EXTRA = {"headroom": "headroom_bytes"}


def lift_old_extra(d: dict[str, Any], known: set[str]) -> dict[str, Any]:
    """``d`` without ``extra``: each of its keys naming a field of ``known`` becomes that field (if unset)."""
    out = {k: v for k, v in d.items() if k != "extra"}
    for key, value in (d.get("extra") or {}).items():
        name = _RENAMED_FROM_EXTRA.get(key, key)
        if name in known and out.get(name) is None:
            out[name] = value
    return out


@dataclass
class Step:
    """One named step of one process, with the kernel's exact peak: the one shape of a step, from the
    session's fold of the streamed events to a node replay's JSON and the figures' shaded intervals.

    Fields other than the name and start have defaults because a step is first known by its start (a
    ``step_start`` event) and filled in at its end; a step that never ended (the process was killed
    inside it) keeps ``end_s = None``."""

    name: str
    start_s: float
    end_s: float | None = None
    peak_bytes: int | None = None  # above the process's baseline
    added_bytes: int | None = None  # above the RSS at the step's start
    retained_bytes: int | None = None  # RSS at the end minus RSS at the start
    depth: int = 0
    error: str | None = None
    line: int | None = None  # the source line the step was entered from (when a tracer knew it)
    training_step: int | None = None  # a node replay: the training step it ran in

    @property
    def duration_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s

    def close(self, ev: dict[str, Any]) -> None:
        """Take a ``step_end`` event's exact figures: the one reading of that event, for a pair's, a cell's and
        a node's fold alike."""
        self.end_s, self.peak_bytes, self.added_bytes = ev["end_s"], ev.get("peak_bytes"), ev.get("added_bytes")
        self.retained_bytes, self.error, self.line = ev.get("retained_bytes"), ev.get("error"), ev.get("line")

    def until(self, fallback: float) -> float:
        """Where to draw the step to: its end, or ``fallback`` if the step never ended (its process died in it)."""
        return self.end_s if self.end_s is not None else max(fallback, self.start_s)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Step:
        """A step from any saved form of one (a run's side, a node replay's process, a saved timeline's band):
        keys this shape does not hold are dropped, missing ones take their defaults."""
        return cls(**{k: v for k, v in d.items() if k in _STEP_FIELDS})


_STEP_FIELDS = frozenset(f.name for f in fields(Step))


@dataclass
class Series:
    """Bytes over run time (seconds since the run started): a process's sampled memory, the node's sum, the
    object store, a tracer's view. The one shape of a curve, from the session's sampling to the figures."""

    t_s: list[float] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)

    @property
    def end_s(self) -> float | None:
        return self.t_s[-1] if self.t_s else None

    def peak(self) -> int | None:
        return max(self.bytes) if self.bytes else None


@dataclass
class Process:
    """One measured process: a pair's sender or receiver, a cell, a Ray pair's side, a node replay's
    driver, worker or storage unit. The one shape of a process, from the run's fold to its JSON and views.

    Two baselines, each with one meaning. ``baseline_bytes`` is what the process itself reported at its
    baseline (its exact ``VmRSS``); ``sampled_baseline_bytes`` is its ``timeline``'s sample at the
    session's baseline tick (a node replay takes one tick for every process, so their curves add up to
    the node's). Curves and sampled peaks above the baseline come from :meth:`above` alone, which
    subtracts :attr:`timeline_baseline_bytes`: the baseline in the timeline's own reading."""

    name: str
    pid: int | None = None
    role: str | None = None  # a node's process: driver, worker, producer, storage, ... (None: a pair's side, a cell)
    node_id: str | None = None  # the Ray node it ran on (None: not in a Ray cluster, or not known)
    sampled: bool = True  # its memory was sampled from here (False: on another machine, exact figures only)
    reading: str = "rss"  # what timeline's bytes are: "rss" (VmRSS) or "private" (VmRSS - RssShmem, a node's)
    baseline_bytes: int | None = None  # exact: the VmRSS the process reported at its own baseline
    baseline_s: float | None = None  # run time it reported it: before it, set-up (not measured)
    sampled_baseline_bytes: int | None = None  # timeline's sample at the session's baseline tick (a node's)
    peak_bytes: int | None = None  # exact (VmHWM) above baseline over the measured phase
    held_bytes: int | None = None  # still resident when the process finished
    cycle_held_bytes: int | None = None  # of which gc.collect() then freed (reference cycles)
    steps: list[Step] = field(default_factory=list)
    timeline: Series = field(default_factory=Series)  # sampled from the parent at about 1 ms (absolute, in `reading`)
    exit_code: int | None = None
    error: str | None = None  # a node's process: the first error it reported
    budget_bytes: int | None = None
    private_peak_bytes: int | None = None  # Ray sides: the exact peak minus the object-store pages it mapped
    killed: bool = False  # the budget's enforcer (or the kernel, in a cgroup) killed this process
    peak_source: str | None = None  # when the peak is not the kernel's VmHWM: where it came from
    codec_info: dict[str, Any] | None = None  # what the codec's prepare() reported in this process
    store_pages_bytes: int | None = None  # Ray sides: object-store pages this process mapped at its peak
    store_pages_by_step: dict[str, Any] | None = None  # Ray sides: the same, per step
    note: str | None = None  # what limits this process's figures (e.g. an actor on another machine)

    def step(self, name: str) -> Step | None:
        """The first step called ``name`` (None if the process never reached it)."""
        return next((s for s in self.steps if s.name == name), None)

    @property
    def timeline_baseline_bytes(self) -> int | None:
        """The baseline in the timeline's reading: the sample at the session's baseline tick when one was
        taken, else, for an RSS curve, the VmRSS the process reported (the same reading); None when the
        curve has no baseline (a node's process adopted after the baseline tick)."""
        if self.sampled_baseline_bytes is not None:
            return self.sampled_baseline_bytes
        return self.baseline_bytes if self.reading == "rss" else None

    def above(self, value: int) -> int | None:
        """One sample of this process's reading above its baseline (None without a baseline): the one
        place a baseline is subtracted from this process's memory as sampled."""
        base = self.timeline_baseline_bytes
        return None if base is None else value - base

    def above_baseline(self, since_s: float | None = None, *, until_s: float | None = None,
                       unknown_baseline: int | None = None) -> Series:
        """The timeline above its baseline, from ``since_s`` on and up to ``until_s`` (default: all of it).
        Without a baseline the curve is empty, or counted from ``unknown_baseline`` when the caller gives one
        (a node's sum above baselines counts such a process from zero)."""
        base = self.timeline_baseline_bytes
        if base is None:
            if unknown_baseline is None:
                return Series()
            base = unknown_baseline
        keep = [i for i, t in enumerate(self.timeline.t_s)
                if (since_s is None or t >= since_s) and (until_s is None or t <= until_s)]
        return Series([self.timeline.t_s[i] for i in keep], [self.timeline.bytes[i] - base for i in keep])

    def own_peak_bytes(self, since_s: float | None = None, until_s: float | None = None) -> int | None:
        """The highest sample above the baseline (from ``since_s`` up to ``until_s``): sampled at about 1 ms,
        so it can miss a spike shorter than that, but in the private reading it never counts object-store
        pages, which the exact peak does."""
        return self.above_baseline(since_s, until_s=until_s).peak()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Process:
        """A process from any saved form of one: a run's side, a node replay's process (``--json``), or either
        saved before this shape. Those had no ``reading`` and one ``baseline_bytes``, the baseline of their
        timeline: a side's was its reported VmRSS (an RSS curve), a node process's (it had ``sampled``) its
        private bytes at the baseline tick. Keys this shape does not hold (``own_peak_bytes``) are dropped."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in lift_old_extra(d, known).items() if k in known}
        if "reading" not in d and "sampled" in d:  # a node replay's process saved before
            kw["reading"], kw["sampled_baseline_bytes"], kw["baseline_bytes"] = "private", d.get("baseline_bytes"), None
        kw["steps"] = [Step.from_dict(s) for s in d.get("steps", [])]
        kw["timeline"] = series_from_dict(d.get("timeline") or {})
        return cls(**kw)


@dataclass
class PeakRange:
    """One peak (a side's, or one of its steps') over repeated runs of the same case, in bytes."""

    name: str  # "sender", "receiver", "sender: consolidate", ...
    values: list[int]  # one per run that reached it, in run order
    varies: bool = False  # max - min exceeds VARIES_FRACTION of the payload

    @property
    def min(self) -> int:
        return min(self.values)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def max(self) -> int:
        return max(self.values)


@dataclass
class Variation:
    """How much the exact peaks of one case changed from run to run (``run(..., repeat=N)``).

    Every reading is exact; what varies is the phenomenon itself (for in-band pickle, whether glibc's
    ``realloc`` grows pickle's output buffer in place or by a copy; see docs/varying_peaks.md). A budget,
    a headroom or a test that compares with one run must use the range, not one value.
    """

    runs: int
    payload_bytes: int
    outcomes: list[str]
    peaks: list[PeakRange] = field(default_factory=list)
    forkserver_pids: list[int | None] = field(default_factory=list)  # one fresh forkserver per run

    @property
    def varies(self) -> bool:
        return any(p.varies for p in self.peaks)

    def peak(self, name: str) -> PeakRange | None:
        return next((p for p in self.peaks if p.name == name), None)

    @classmethod
    def of(cls, results: Sequence[RunResult]) -> Variation:
        """Min / median / max of every side's and every step's exact peak over ``results``."""
        payload = results[0].payload_bytes
        values: dict[str, list[int]] = {}
        for r in results:
            for side_name, side in r.processes.items():
                if side.peak_bytes is not None:
                    values.setdefault(side_name, []).append(side.peak_bytes)
                seen: set[str] = set()
                for st in side.steps:
                    key = f"{side_name}: {st.name}"
                    if st.peak_bytes is None or key in seen:  # a repeated step name: its first occurrence
                        continue
                    seen.add(key)
                    values.setdefault(key, []).append(st.peak_bytes)
        limit = VARIES_FRACTION * payload
        peaks = [PeakRange(k, v, varies=(max(v) - min(v)) > limit) for k, v in values.items()]
        return cls(len(results), payload, [r.outcome for r in results], peaks)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["varies"] = self.varies
        for p, out in zip(self.peaks, d["peaks"]):
            out.update(min_bytes=p.min, median_bytes=p.median, max_bytes=p.max)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Variation:
        return cls(d["runs"], d["payload_bytes"], list(d["outcomes"]),
                   [PeakRange(p["name"], list(p["values"]), bool(p["varies"])) for p in d.get("peaks", [])],
                   list(d.get("forkserver_pids", [])))


@dataclass
class Measured:
    """The one root of a measured run: the case, every measured process, the kill and the outcome.

    A pair's sender and receiver, a cell, a Ray pair's driver and actor and a node replay's driver,
    workers and storage units are all :class:`Process` records under ``processes``, killed or not by one
    :class:`~picklescope.core.kill.Kill` record, so a view that draws processes, peaks or a kill reads
    any run the same way. Only the case is positional (``codec, transport, workload, scale,
    payload_bytes``); everything else is named, and a topology's own fields follow in its subclass."""

    codec: str
    transport: str
    workload: str
    scale: float
    payload_bytes: int
    outcome: str = field(default="ok", kw_only=True)  # ok | error | oom-killed | memory-error | timeout | interrupted
    error: str | None = field(default=None, kw_only=True)
    processes: dict[str, Process] = field(default_factory=dict, kw_only=True)
    killed: Kill | None = field(default=None, kw_only=True)  # whom a budget (or the kernel, or Ray) killed
    wall_s: float | None = field(default=None, kw_only=True)


@dataclass
class RunResult(Measured):
    """One codec x transport x workload run (a pair's two sides, or a cell), with verdict and round trip.

    In JSON its processes are ``sides`` and its kill record ``kill`` (the ``--json`` schema)."""

    blob_bytes: int | None = None
    inband_bytes: int | None = None
    oob_bytes: int | None = None
    serialize_s: float | None = None
    deserialize_s: float | None = None
    roundtrip: dict[str, Any] = field(default_factory=lambda: {"ok": None, "mismatches": []})
    receiver_codec: str | None = None
    tracer: str = "sampler"
    tracers: dict[str, Any] = field(default_factory=dict)
    attribution: list[dict[str, Any]] = field(default_factory=list)
    killed_side: str | None = None
    killed_in_step: str | None = None
    killed_at_line: int | None = None
    memory_at_death_bytes: int | None = None  # the killed side's RSS above its baseline when it died
    stack_at_death: str | None = None  # its Python stack (faulthandler on SIGUSR1 before SIGKILL)
    original_error: str | None = None  # a memory-error's own message, kept beside the explanation
    enforcement: str | None = None  # watchdog | cgroup | address-space (None: no budget)
    enforcement_note: str | None = None  # why that enforcement ran (e.g. why not a cgroup)
    command: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    variation: Variation | None = None  # run(..., repeat=N): this is the worst run, this the spread of all N
    killed_at: str | None = None  # where the killed side was: "path:line in function" (its innermost own frame)
    role: str | None = None  # in an investigation: "matrix", "traced" or "budgeted"
    headroom_bytes: int | None = None  # in an investigation: the smallest sender budget this case survives
    headroom_detail: dict[str, Any] | None = None  # ... and how it was found (Headroom.to_dict: the runs, the method)
    # what the run's processes said beside their measurements
    codec_info: dict[str, Any] = field(default_factory=dict)  # per side: what the codec's prepare() reported
    codec_note: str | None = None  # why the codec did not act as named (e.g. TransferQueue moves fields itself)
    traceback: str | None = None  # the first failing side's traceback
    output: list[tuple[str, str]] = field(default_factory=list)  # a cell's printed (stream, text), in order
    import_errors: list[str] | None = None  # a cell's imports that failed in the child
    tracer_notes_error: str | None = None  # why the tracers' notes could not be read
    # how the run was enforced and cleaned up
    stack_note: str | None = None  # how the stack at death relates to the step that crossed the budget
    charged_at_death: int | None = None  # cgroup: the memory charged to the killed side when it died
    cgroup: dict[str, Any] | None = None  # cgroup: the kernel's memory.events counters at the end
    run_dir: str | None = None  # the run's own folder (removed when the run ends)
    killed_descendants: list[int] = field(default_factory=list)  # processes a side started and left running
    sampler_priority: str | None = None  # realtime / raised / normal: see measure/sampler.py
    # Ray and TransferQueue runs
    ray: dict[str, Any] | None = None  # the cluster: address, its processes, what was stopped and what remains
    object_store: dict[str, Any] | None = None  # the store's allocated pages over time (ray/store.py)
    received: dict[str, Any] | None = None  # how the receiver got the tensors: copied, shared, read-only
    sender_cost: dict[str, Any] | None = None  # serialize and store-write costs, with their explanation
    receiver_cost: dict[str, Any] | None = None  # the receiver's cost, by kind (zero-copy, copy, ...)

    @property
    def sender(self) -> Process:
        return self.processes["sender"]

    @property
    def receiver(self) -> Process:
        return self.processes["receiver"]

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: the processes as ``sides`` and the kill record as ``kill``."""
        d = asdict(self)
        d["sides"], d["kill"] = d.pop("processes"), d.pop("killed")
        if self.variation is not None:
            d["variation"] = self.variation.to_dict()
        return d

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in lift_old_extra(d, known).items() if k in known}
        kw["processes"] = {name: Process.from_dict(s) for name, s in d.get("sides", {}).items()}
        kw["killed"] = Kill.from_dict(d["kill"]) if d.get("kill") else None
        if kw.get("variation") is not None:
            kw["variation"] = Variation.from_dict(kw["variation"])
        kw["output"] = [tuple(o) for o in kw.get("output") or []]
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        return cls.from_dict(json.loads(text))


def series_from_dict(d: dict[str, Any]) -> Series:
    """A :class:`Series` from its JSON: ``{t_s, bytes}``, or a run's side saved before the one series shape,
    whose timeline named its bytes ``rss_bytes``."""
    values = d.get("bytes", d.get("rss_bytes", []))
    return Series(list(d.get("t_s", [])), list(values))
