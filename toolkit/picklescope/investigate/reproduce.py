"""The standard investigation: every codec x transport on one workload, as one data object.

Computed here, printed by the CLI, drawn by figures and reports later. The default scale keeps the
whole investigation quick and within the machine's free memory.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from picklescope.codecs import CODECS
from picklescope.core import envinfo
from picklescope.core.procmem import machine_memory
from picklescope.core.result import RunResult, lift_old_extra
from picklescope.core.units import Size, fmt_bytes, parse_size
from picklescope.errors import PicklescopeError
from picklescope.investigate import ray_matrix
from picklescope.investigate.headroom import find_headroom
from picklescope.investigate.node import NodeResult, compare_drivers, node_series
from picklescope.measure import launcher, verdicts
from picklescope.measure.budget import plan as plan_limits
from picklescope.measure.runner import check_repeat, fresh_forkserver, run, worst_of
from picklescope.measure.session import Cancelled, cancellable, raise_if_cancelled
from picklescope.ray import ray_available
from picklescope.ray.startup import RayStartError
from picklescope.transports import TRANSPORTS
from picklescope.workloads.spec import DEFAULT_WORKLOAD, load_workload

DEFAULT_SCALE = 0.25
IN_PROCESS_TRANSPORTS = ("pickle", "pickle5-oob")
BUILTIN_CODECS = ("torch", "numpy-legacy", "numpy")
LEGACY, FIXED = "numpy-legacy", "numpy"
BUDGET_TRANSPORT = "pickle5-oob"  # what Ray does: the transport of the production failure
NODE_WORKERS, NODE_STEPS = 4, 4  # the node pair: a driver and 4 worker actors over 4 training steps
RAY_LANE = "picklescope-ray"  # the name of the thread that runs the Ray rows and the node pair
IN_PROCESS_DONE = "in-process runs done"  # the progress label once only the Ray lane is left (not a run)
REPEAT = 2  # runs of each unbudgeted case: enough to flag a peak that takes two values, see docs/varying_peaks.md


def default_scale(workload: str = DEFAULT_WORKLOAD) -> float:
    """0.25, or less if a payload would exceed 1/16 of the memory available now."""
    spec = load_workload(workload)
    avail = machine_memory()["available"] or 1 << 34
    full = spec.payload_bytes(1.0)
    return min(DEFAULT_SCALE, max(0.01, avail / 16 / full))


@dataclass
class Investigation:
    """All runs of one investigation, in the order they ran, and what the investigation decided."""

    workload: str
    scale: float
    results: list[RunResult] = field(default_factory=list)
    nodes: list[NodeResult] = field(default_factory=list)  # the node pair: legacy, then fixed codec
    payload_bytes: int | None = None
    budget: str | None = None  # the budgeted runs' sender budget as given or chosen ("0.5x", "60MiB")
    budget_bytes: int | None = None
    budget_given: bool = False  # on the command line (else chosen between the fixed and the legacy codec)
    budget_transport: str | None = None
    budget_note: str | None = None  # why there is no budgeted comparison
    headline: str | None = None  # the verdict in one sentence
    ray_cluster: dict[str, Any] | None = None  # where the Ray rows ran, its clean-up, or why they did not
    node_note: str | None = None  # why there is no node pair
    environment: dict[str, Any] = field(default_factory=dict)
    command: str | None = None
    workload_source: str | None = None  # the workload's file, or its preset name

    def to_dict(self) -> dict[str, Any]:
        d = {"workload": self.workload, "scale": self.scale,
             "results": [r.to_dict() for r in self.results], "nodes": [n.to_json_dict() for n in self.nodes]}
        d.update({name: getattr(self, name) for name in _INVESTIGATION_FIELDS})
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Investigation:
        typed = {k: v for k, v in lift_old_extra(d, set(_INVESTIGATION_FIELDS)).items()
                 if k in _INVESTIGATION_FIELDS and v is not None}
        return cls(d["workload"], d["scale"], [RunResult.from_dict(r) for r in d["results"]],
                   [NodeResult.from_json_dict(n) for n in d.get("nodes", [])], **typed)


# The fields of Investigation that results.json holds beside its results and nodes.
_INVESTIGATION_FIELDS = ("payload_bytes", "budget", "budget_bytes", "budget_given", "budget_transport", "budget_note",
                         "headline", "ray_cluster", "node_note", "environment", "command", "workload_source")


def matrix(
    workload: str = DEFAULT_WORKLOAD,
    scale: float | None = None,
    codecs: tuple[str, ...] = BUILTIN_CODECS,
    transports: tuple[str, ...] = IN_PROCESS_TRANSPORTS,
    progress: Callable[[str], None] | None = None,
    repeat: int = 1,
    on_fresh_forkservers_done: Callable[[], None] | None = None,
    **run_kw: Any,
) -> Investigation:
    """Run every codec over every transport; unknown names fail before anything runs.

    ``repeat`` > 1 runs the whole matrix that many times, in rounds, and keeps each case's worst run, with
    the spread of every peak in ``result.variation``. Each round's children come from a freshly started
    forkserver, so each case gets ``repeat`` independent draws of a peak that varies (docs/varying_peaks.md)
    for the cost of ``repeat`` forkserver starts, not one per case and round. A case whose run does not
    end ``ok`` is not repeated. ``on_fresh_forkservers_done`` is called once the last fresh forkserver is up:
    from then on the forkserver is not restarted, so other threads may fork from it."""
    for c in codecs:
        CODECS.get(c)
    for t in transports:
        TRANSPORTS.get(t)
    check_repeat(repeat)
    spec = load_workload(workload)
    scale = default_scale(workload) if scale is None else scale
    inv = Investigation(spec.name, scale)
    cases = [(c, t) for c in codecs for t in transports]
    runs: dict[tuple[str, str], list[RunResult]] = {case: [] for case in cases}
    forkservers: dict[tuple[str, str], list[int | None]] = {case: [] for case in cases}
    for i in range(repeat):
        if i:
            fresh_forkserver()
        if i == repeat - 1 and on_fresh_forkservers_done is not None:
            launcher.warm_up()
            on_fresh_forkservers_done()
        for c, t in cases:
            done = runs[(c, t)]
            if done and done[-1].outcome != "ok":
                continue
            if progress:
                progress(f"{c} over {t}" + (f" (round {i + 1} of {repeat})" if repeat > 1 else ""))
            done.append(run(c, t, workload, scale, **run_kw))
            forkservers[(c, t)].append(launcher.forkserver_pid())
    for case in cases:
        inv.results.append(runs[case][0] if repeat == 1 else worst_of(runs[case], forkservers[case]))
    return inv


def _choose_budget(inv: Investigation, transport: str) -> Size | None:
    """A sender budget halfway between what the fixed and the legacy codec need, to 0.05x payload."""
    need = {}
    for r in inv.results:
        if r.transport == transport and r.codec in (LEGACY, FIXED) and r.outcome == "ok":
            need[r.codec] = r.headroom_bytes if r.headroom_bytes is not None else r.sender.peak_bytes
    if len(need) < 2 or not inv.results or need[LEGACY] <= need[FIXED]:
        return None
    p = inv.results[0].payload_bytes
    mid = (need[LEGACY] + need[FIXED]) / 2 / p
    mult = round(mid * 20) / 20
    if not need[FIXED] / p < mult < need[LEGACY] / p:
        mult = round(mid, 3)
    return Size(multiple=mult)


def investigate(
    workload: str = DEFAULT_WORKLOAD,
    scale: float | None = None,
    budget: Any = None,
    *,
    codecs: tuple[str, ...] = BUILTIN_CODECS,
    transports: tuple[str, ...] = IN_PROCESS_TRANSPORTS,
    headroom: bool = True,
    trace: str | None = "all",
    progress: Callable[[str], None] | None = None,
    command: str | None = None,
    ray: bool | None = None,
    ray_address: str | None = None,
    repeat: int = REPEAT,
    node_pair: bool | None = None,
    **run_kw: Any,
) -> Investigation:
    """The main job: the matrix, each case's sender headroom, and one budgeted run per codec.

    Each unbudgeted case runs ``repeat`` times: a peak that varies is flagged (``result.variation``),
    the report shows its range, and the headroom covers its worst run.

    ``ray`` (default: when Ray is installed) adds one row per codec over the ``ray`` transport, all
    on one cluster: ``ray_address``, or a local one started and stopped for them (no headroom search
    or budget for these rows; see :mod:`picklescope.investigate.ray_matrix`). ``node_pair`` (default: with
    the Ray rows) then replays a whole node on that cluster for the legacy and the fixed codec (a driver
    and 4 worker actors over 4 training steps, Python's default collector, both codecs replayed on the same
    processes: :func:`~picklescope.investigate.node.node_series`): what the incident looked like, and
    ``inv.nodes`` holds both results.

    The budgeted runs use ``budget`` (default: halfway between the fixed and the legacy codec's
    headroom) on the sender over pickle5-oob, so the legacy codec is OOM-killed where the fixed one
    survives. A budget the machine cannot give is refused before the first run. ``trace`` adds one
    unbudgeted run of the legacy codec with those tracers (``None``: skip it), so the report can show
    what each tracker saw of the copy that caused the OOM and who allocated it.
    """
    spec = load_workload(workload)
    scale = default_scale(workload) if scale is None else scale
    given = None if budget is None else parse_size(budget, "--budget")
    if given is not None:
        plan_limits(given, None, spec.payload_bytes(scale))  # refuse an impossible budget up front
    for c in codecs:
        CODECS.get(c)
    for t in transports:
        TRANSPORTS.get(t)
    check_repeat(repeat)
    lane = None
    if ray if ray is not None else ray_available():
        if ray_address:  # an unreachable address is the user's to fix: say so now, not after the matrix
            TRANSPORTS.get("ray").check_options({"ray_address": ray_address})
        lane = _RayLane(workload, scale, codecs, ray_address, progress, node_pair is not False, run_kw).start()
    interrupted = True
    try:
        inv = matrix(workload, scale, codecs, transports, progress=progress, repeat=repeat,
                     on_fresh_forkservers_done=lane.forkserver_ready.set if lane else None, **run_kw)
        for r in inv.results:
            r.role = "matrix"
            if headroom and r.outcome == "ok" and r.sender.peak_bytes is not None:
                seen = r.variation.peak("sender") if r.variation is not None else None
                h = find_headroom(r.codec, r.transport, workload, scale, peak_bytes=r.sender.peak_bytes,
                                  peak_min_bytes=seen.min if seen is not None else None, on_run=progress, **run_kw)
                r.headroom_bytes = h.headroom_bytes
                r.headroom_detail = h.to_dict()
        btransport = BUDGET_TRANSPORT if BUDGET_TRANSPORT in transports else transports[0]
        later: list[RunResult] = []
        if trace:
            traced = LEGACY if LEGACY in codecs else codecs[0]
            if progress:
                progress(f"{traced} over {btransport} with tracers: {trace}")
            r = run(traced, btransport, workload, scale, tracer=trace, **run_kw)
            r.role = "traced"
            later.append(r)
        chosen = given or _choose_budget(inv, btransport)
        inv.budget, inv.budget_given = None if chosen is None else str(chosen), given is not None
        inv.budget_transport, inv.environment, inv.command = btransport, envinfo.collect(), command
        inv.payload_bytes, inv.workload_source = spec.payload_bytes(scale), spec.source or spec.name
        if chosen is not None:
            inv.budget_bytes = chosen.resolve(spec.payload_bytes(scale))
            for c in codecs:
                if progress:
                    progress(f"{c} over {btransport} at sender budget {chosen}")
                r = run(c, btransport, workload, scale, budget=chosen, **run_kw)
                r.role = "budgeted"
                later.append(r)
        else:
            inv.budget_note = (f"no budget separates {FIXED} from {LEGACY} here (one of them is missing or "
                                        "failed, or the legacy codec did not need more); pass --budget to choose one")
        if lane is not None:
            if progress and lane.thread.is_alive():
                progress(IN_PROCESS_DONE)  # what is left is the lane's: the last in-process label is no longer true
            lane.join()
        interrupted = False
    finally:
        if lane is not None and interrupted:  # Ctrl-C, or an error of ours: end the lane's runs too
            lane.stop()
    if lane is not None:
        lane.merge(inv)
    inv.results.extend(later)
    inv.headline = headline(inv)
    return inv


class _RayLane:
    """The Ray rows and the node pair, on one cluster, in a thread beside the in-process runs.

    The cluster starts at once: its start-up costs 10-20 s, which the in-process matrix would otherwise
    wait for. Runs of the lane fork their drivers from the forkserver, so they wait until the matrix
    has started its last fresh one (a restart would end them). Each measured process's exact peak is its
    own, whatever else the machine runs; the lane's runs go one at a time, because a node replay
    counts the cluster's object store, which the Ray rows also write to. What runs beside them shares
    the two cores, so the seconds columns of both are measured under that load (docs/budgets.md).
    """

    def __init__(self, workload: str, scale: float, codecs: tuple[str, ...], ray_address: str | None,
                 progress: Callable[[str], None] | None, with_node_pair: bool, run_kw: dict[str, Any]) -> None:
        self.workload, self.scale, self.codecs, self.ray_address = workload, scale, codecs, ray_address
        self.progress = progress
        self.with_node_pair, self.run_kw = with_node_pair, run_kw
        self.forkserver_ready = threading.Event()
        self.cancel = threading.Event()
        self.rows: list[RunResult] = []
        self.nodes: list[NodeResult] = []
        self.info: dict[str, Any] = {}
        self.node_note: str | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._main, name=RAY_LANE, daemon=True)

    def start(self) -> _RayLane:
        self.thread.start()
        return self

    def _say(self, label: str) -> None:
        if self.progress:
            self.progress(label)

    def _wait_for_forkserver(self) -> None:
        while not self.forkserver_ready.wait(0.2):
            raise_if_cancelled()

    def _main(self) -> None:
        pair = _node_pair(self, self.workload, self.scale, self.codecs, self._say, self.run_kw.get("timeout_s")) \
            if self.with_node_pair else None
        with cancellable(self.cancel):
            try:
                self.rows, self.info = ray_matrix.cluster_rows(self.workload, self.scale, self.codecs,
                                                    ray_address=self.ray_address, progress=self._say, also=pair,
                                                    before_runs=self._wait_for_forkserver, **self.run_kw)
            except Cancelled:
                self.info = {"error": "interrupted"}
            except RayStartError as exc:  # the machine, not the input: the rest of the report stands
                self.info = {"error": str(exc)}  # its sentence already gives the load average
            except PicklescopeError as exc:
                if self.ray_address:  # the user's own cluster: raised again in the caller's thread
                    self.error = exc
                else:  # the local cluster did not start: the in-process rows stand, the report says why
                    self.info = {"error": str(exc), "load_average": _load_average()}
            except Exception as exc:  # noqa: BLE001 - a cluster that fails to start must not lose the rest
                self.info = {"error": f"{type(exc).__name__}: {exc}", "load_average": _load_average()}

    def join(self) -> None:
        """Wait for the lane (a Ctrl-C meanwhile stops it, see :meth:`stop`); raise the user's input error."""
        self.forkserver_ready.set()  # a matrix that ended early (an error) must not leave the lane waiting
        while self.thread.is_alive():
            self.thread.join(0.5)
        if self.error is not None:
            raise self.error

    def stop(self, wait_s: float = 120.0) -> None:
        """Call the lane's runs off: each ends its processes as on Ctrl-C; waits for that (bounded)."""
        self.cancel.set()
        self.forkserver_ready.set()
        self.thread.join(wait_s)

    def merge(self, inv: Investigation) -> None:
        inv.results.extend(self.rows)
        inv.nodes.extend(self.nodes)
        inv.node_note = self.node_note
        inv.ray_cluster = self.info


def _node_pair(lane: _RayLane, workload: str, scale: float, codecs: tuple[str, ...],
               progress: Callable[[str], None] | None, timeout_s: float | None) -> Callable[[str], None] | None:
    """The node pair's runner, given the Ray cluster's address; None when the legacy or fixed codec is not
    among ``codecs``. A replay that fails is kept with its error: it never loses the rest."""
    if LEGACY not in codecs or FIXED not in codecs:
        return None

    def pair(address: str) -> None:
        if progress:
            progress(f"{LEGACY} then {FIXED}: a node of {NODE_WORKERS} workers over {NODE_STEPS} training steps")
        try:
            done = node_series((LEGACY, FIXED), workload, scale, NODE_WORKERS, NODE_STEPS, ray_address=address,
                               **({"timeout_s": timeout_s} if timeout_s else {}))
        except PicklescopeError as exc:  # e.g. too few rows for 4 workers at this scale
            lane.notes["node_note"] = f"no node pair: {exc}"
            return
        lane.nodes.extend(r.trimmed() for r in done)

    return pair


def _load_average() -> float | None:
    """The machine's one-minute load average (a start-up that timed out is often a busy machine)."""
    import os

    try:
        return round(os.getloadavg()[0], 1)
    except OSError:
        return None


def ray_lane_sentence(inv: Investigation) -> str | None:
    """Why the Ray rows (and the node pair on their cluster) did not run, in one line, or None.

    Ray's own start-up errors run to many lines; the first says what happened, the rest is advice
    about Ray's log files, which a run of picklescope removes. So the sentence keeps the first line.
    """
    info = inv.ray_cluster or {}
    err = info.get("error")
    if not err:
        return None
    first = next((line.strip() for line in str(err).splitlines() if line.strip()), str(err))
    if len(first) > 240:
        first = first[:237] + "..."
    load = info.get("load_average")
    busy = f"; the machine's load average was {load:g}" if isinstance(load, (int, float)) else ""
    return f"the Ray rows did not run: {first}{busy}"


def node_pair_sentence(inv: Investigation) -> str | None:
    """The node pair's verdict in one sentence (:func:`~picklescope.investigate.node.compare_drivers`), or
    why there is none: the pair did not run, or one of its replays did not end ``ok``."""
    by = {r.codec: r for r in inv.nodes}
    if LEGACY not in by or FIXED not in by:
        return inv.node_note
    leg, fix = by[LEGACY], by[FIXED]
    if leg.outcome != "ok" or fix.outcome != "ok":
        bad = leg if leg.outcome != "ok" else fix
        return f"node pair: {bad.codec} ended {bad.outcome} ({bad.error or 'no detail'})"
    return compare_drivers(leg, fix)


def matrix_results(inv: Investigation) -> list[RunResult]:
    """The unbudgeted codec x transport runs (the comparison table)."""
    return [r for r in inv.results if (r.role or "matrix") == "matrix"]


def traced_results(inv: Investigation) -> list[RunResult]:
    """The run(s) with in-process tracers attached (what each tracker saw)."""
    return [r for r in inv.results if r.role == "traced"]


def budgeted_results(inv: Investigation) -> list[RunResult]:
    """The runs at the investigation's sender budget."""
    return [r for r in inv.results if r.role == "budgeted"]


def headline(inv: Investigation) -> str:
    """The investigation's verdict in one sentence, from the measured results only."""
    budgeted = {r.codec: r for r in budgeted_results(inv)}
    payload = inv.payload_bytes or (inv.results[0].payload_bytes if inv.results else 0)
    heads = {(r.codec, r.transport): r.headroom_bytes for r in matrix_results(inv)}
    t = inv.budget_transport or BUDGET_TRANSPORT
    gap = ""
    if heads.get((LEGACY, t)) is not None and heads.get((FIXED, t)) is not None and payload:
        diff = (heads[(LEGACY, t)] - heads[(FIXED, t)]) / payload
        gap = f"; over {t} the legacy codec needs {diff:.2f}x payload more sender memory than the fixed one"
    if LEGACY in budgeted and FIXED in budgeted:
        b, bb = inv.budget, inv.budget_bytes
        clause = verdicts.outcome_clause
        return (f"At a sender budget of {b} payload ({fmt_bytes(bb)}) on {inv.workload} x{inv.scale:g}, "
                f"{LEGACY} {clause(budgeted[LEGACY])} while {FIXED} {clause(budgeted[FIXED])}"
                + "".join(f"; {c} {clause(r)}" for c, r in budgeted.items() if c not in (LEGACY, FIXED))
                + f"{gap}.")
    if gap:
        return f"On {inv.workload} x{inv.scale:g}{gap} (no budgeted run: {inv.budget_note or ''})."
    return f"{len(inv.results)} runs on {inv.workload} x{inv.scale:g}; no budgeted comparison of {LEGACY} and {FIXED}."
