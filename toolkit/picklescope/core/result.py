"""A measured run as plain data: computed first, drawn later, saved as JSON and read back.

Nothing here imports plotly or talks to a process; figures, tables, widgets and reports are views of
a :class:`RunResult`.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from typing import Any

VARIES_FRACTION = 0.01  # a peak whose runs spread by more than this fraction of the payload "varies"

# Typed fields that used to be ``extra`` keys (field name -> old key). Saved results still carry the old
# key too, for one release, so readers of results.json keep working; old files load into the fields.
RUN_FIELDS_ONCE_IN_EXTRA = {"killed_at": "killed_at", "role": "role", "headroom_bytes": "headroom",
                            "headroom_detail": "headroom_detail"}
SIDE_FIELDS_ONCE_IN_EXTRA = {"private_peak_bytes": "private_peak_bytes"}


def _mirror_into_extra(d: dict[str, Any], moved: dict[str, str]) -> None:
    """Also write each moved field under its old ``extra`` key (when it has a value)."""
    for name, old in moved.items():
        if d.get(name) is not None:
            d["extra"].setdefault(old, d[name])


def _from_extra(d: dict[str, Any], moved: dict[str, str]) -> dict[str, Any]:
    """``d`` with each moved field taken from its old ``extra`` key when the field itself is absent."""
    out = dict(d)
    extra = dict(d.get("extra") or {})
    for name, old in moved.items():
        if old in extra:
            value = extra.pop(old)
            if out.get(name) is None:
                out[name] = value
    out["extra"] = extra
    return out


@dataclass
class Step:
    """One named step on one side, with its exact kernel peak."""

    name: str
    start_s: float
    end_s: float | None
    peak_bytes: int | None  # above the side's baseline
    added_bytes: int | None  # above the RSS at the step's start
    retained_bytes: int | None = None  # RSS at the end minus RSS at the start
    depth: int = 0
    error: str | None = None
    line: int | None = None

    @property
    def duration_s(self) -> float | None:
        return None if self.end_s is None else self.end_s - self.start_s


@dataclass
class Timeline:
    """RSS of one process sampled from another process at about 1 ms."""

    t_s: list[float] = field(default_factory=list)
    rss_bytes: list[int] = field(default_factory=list)


@dataclass
class Side:
    """What one process (sender or receiver) spent."""

    name: str
    pid: int | None = None
    baseline_bytes: int | None = None
    baseline_s: float | None = None  # run time the baseline was taken: before it, set-up (not measured)
    peak_bytes: int | None = None  # exact (VmHWM) above baseline over the measured phase
    held_bytes: int | None = None  # still resident when the side finished
    cycle_held_bytes: int | None = None  # of which gc.collect() then freed (reference cycles)
    steps: list[Step] = field(default_factory=list)
    timeline: Timeline = field(default_factory=Timeline)
    exit_code: int | None = None
    budget_bytes: int | None = None
    private_peak_bytes: int | None = None  # Ray sides: the exact peak minus the object-store pages it mapped
    extra: dict[str, Any] = field(default_factory=dict)

    def step(self, name: str) -> Step | None:
        """The first step called ``name`` (None if the side never reached it)."""
        return next((s for s in self.steps if s.name == name), None)

    @property
    def sampled_peak_bytes(self) -> int | None:
        if not self.timeline.rss_bytes or self.baseline_bytes is None:
            return None
        return max(self.timeline.rss_bytes) - self.baseline_bytes


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
            for side_name, side in r.sides.items():
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
class RunResult:
    """One codec x transport x workload run, both sides, with verdict and round trip."""

    codec: str
    transport: str
    workload: str
    scale: float
    payload_bytes: int
    outcome: str = "ok"  # ok | error | oom-killed | memory-error | timeout
    error: str | None = None
    blob_bytes: int | None = None
    inband_bytes: int | None = None
    oob_bytes: int | None = None
    serialize_s: float | None = None
    deserialize_s: float | None = None
    roundtrip: dict[str, Any] = field(default_factory=lambda: {"ok": None, "mismatches": []})
    sides: dict[str, Side] = field(default_factory=dict)
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
    wall_s: float | None = None
    command: str | None = None
    environment: dict[str, Any] = field(default_factory=dict)
    variation: Variation | None = None  # run(..., repeat=N): this is the worst run, this the spread of all N
    killed_at: str | None = None  # where the killed side was: "path:line in function" (its innermost own frame)
    role: str | None = None  # in an investigation: "matrix", "traced" or "budgeted"
    headroom_bytes: int | None = None  # in an investigation: the smallest sender budget this case survives
    headroom_detail: dict[str, Any] | None = None  # ... and how it was found (Headroom.to_dict: the runs, the method)
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        """Values given under their old ``extra`` keys go to their fields (for one release)."""
        for name, old in RUN_FIELDS_ONCE_IN_EXTRA.items():
            if old in self.extra and getattr(self, name) is None:
                setattr(self, name, self.extra.pop(old))

    @property
    def sender(self) -> Side:
        return self.sides["sender"]

    @property
    def receiver(self) -> Side:
        return self.sides["receiver"]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.variation is not None:
            d["variation"] = self.variation.to_dict()
        _mirror_into_extra(d, RUN_FIELDS_ONCE_IN_EXTRA)
        for side in d["sides"].values():
            _mirror_into_extra(side, SIDE_FIELDS_ONCE_IN_EXTRA)
        return d

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RunResult:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in _from_extra(d, RUN_FIELDS_ONCE_IN_EXTRA).items() if k in known}
        kw["sides"] = {name: _side_from_dict(s) for name, s in d.get("sides", {}).items()}
        if kw.get("variation") is not None:
            kw["variation"] = Variation.from_dict(kw["variation"])
        return cls(**kw)

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        return cls.from_dict(json.loads(text))


def _side_from_dict(d: dict[str, Any]) -> Side:
    known = {f.name for f in fields(Side)}
    kw = {k: v for k, v in _from_extra(d, SIDE_FIELDS_ONCE_IN_EXTRA).items() if k in known}
    step_fields = {f.name for f in fields(Step)}
    kw["steps"] = [Step(**{k: v for k, v in s.items() if k in step_fields}) for s in d.get("steps", [])]
    kw["timeline"] = Timeline(**d.get("timeline", {}))
    return Side(**kw)
