"""The standard investigation: every codec x transport on one workload, as one data object.

Computed here, printed by the CLI, drawn by figures and reports later. The default scale keeps the
whole investigation quick and within the machine's free memory.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from picklescope.codecs import CODECS
from picklescope.core.procmem import machine_memory
from picklescope.core.result import RunResult
from picklescope.core.units import Size, fmt_bytes, parse_size
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import NodeResult, node
from picklescope.measure import verdicts
from picklescope.measure.budget import plan as plan_limits
from picklescope.measure.runner import run
from picklescope.transports import TRANSPORTS
from picklescope.workloads.spec import DEFAULT_WORKLOAD, load_workload

DEFAULT_SCALE = 0.25
IN_PROCESS_TRANSPORTS = ("pickle", "pickle5-oob")
BUILTIN_CODECS = ("torch", "numpy-legacy", "numpy")
LEGACY, FIXED = "numpy-legacy", "numpy"
BUDGET_TRANSPORT = "pickle5-oob"  # what Ray does: the transport of the production failure
NODE_WORKERS, NODE_STEPS = 4, 4  # the node pair: a driver and 4 worker actors over 4 training steps
REPEAT = 2  # runs of each unbudgeted case: enough to flag a peak that takes two values, see docs/varying_peaks.md


def default_scale(workload: str = DEFAULT_WORKLOAD) -> float:
    """0.25, or less if a payload would exceed 1/16 of the memory available now."""
    spec = load_workload(workload)
    avail = machine_memory()["available"] or 1 << 34
    full = spec.payload_bytes(1.0)
    return min(DEFAULT_SCALE, max(0.01, avail / 16 / full))


@dataclass
class Investigation:
    """All runs of one investigation, in the order they ran."""

    workload: str
    scale: float
    results: list[RunResult] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    nodes: list[NodeResult] = field(default_factory=list)  # the node pair: legacy and fixed codec, one node each

    def to_dict(self) -> dict[str, Any]:
        return {"workload": self.workload, "scale": self.scale, "extra": self.extra,
                "results": [r.to_dict() for r in self.results], "nodes": [n.to_json_dict() for n in self.nodes]}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Investigation:
        return cls(d["workload"], d["scale"], [RunResult.from_dict(r) for r in d["results"]], d.get("extra", {}),
                   [NodeResult.from_json_dict(n) for n in d.get("nodes", [])])


def matrix(
    workload: str = DEFAULT_WORKLOAD,
    scale: float | None = None,
    codecs: tuple[str, ...] = BUILTIN_CODECS,
    transports: tuple[str, ...] = IN_PROCESS_TRANSPORTS,
    progress: Callable[[str], None] | None = None,
    repeat: int = 1,
    **run_kw: Any,
) -> Investigation:
    """Run every codec over every transport; unknown names fail before anything runs.

    ``repeat`` > 1 runs each case that many times and keeps its worst run, with the spread of every
    peak in ``result.variation``."""
    for c in codecs:
        CODECS.get(c)
    for t in transports:
        TRANSPORTS.get(t)
    spec = load_workload(workload)
    scale = default_scale(workload) if scale is None else scale
    inv = Investigation(spec.name, scale)
    for c in codecs:
        for t in transports:
            if progress:
                progress(f"{c} over {t}")
            inv.results.append(run(c, t, workload, scale, repeat=repeat, **run_kw))
    return inv


def _choose_budget(inv: Investigation, transport: str) -> Size | None:
    """A sender budget halfway between what the fixed and the legacy codec need, to 0.05x payload."""
    need = {}
    for r in inv.results:
        if r.transport == transport and r.codec in (LEGACY, FIXED) and r.outcome == "ok":
            need[r.codec] = r.extra.get("headroom") if r.extra.get("headroom") is not None else r.sender.peak_bytes
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
    and 4 worker actors over 4 training steps, Python's default collector): what the incident looked
    like, and ``inv.nodes`` holds both results.

    The budgeted runs use ``budget`` (default: halfway between the fixed and the legacy codec's
    headroom) on the sender over pickle5-oob, so the legacy codec is OOM-killed where the fixed one
    survives. A budget the machine cannot give is refused before the first run. ``trace`` adds one
    unbudgeted run of the legacy codec with those tracers (``None``: skip it), so the report can show
    what each tracker saw of the copy that caused the OOM and who allocated it.
    """
    from picklescope.core import envinfo
    from picklescope.investigate.headroom import find_headroom

    spec = load_workload(workload)
    scale = default_scale(workload) if scale is None else scale
    given = None if budget is None else parse_size(budget, "--budget")
    if given is not None:
        plan_limits(given, None, spec.payload_bytes(scale))  # refuse an impossible budget up front
    inv = matrix(workload, scale, codecs, transports, progress=progress, repeat=repeat, **run_kw)
    for r in inv.results:
        r.extra["role"] = "matrix"
        if headroom and r.outcome == "ok" and r.sender.peak_bytes is not None:
            seen = r.variation.peak("sender") if r.variation is not None else None
            h = find_headroom(r.codec, r.transport, workload, scale, peak_bytes=r.sender.peak_bytes,
                              peak_min_bytes=seen.min if seen is not None else None, on_run=progress, **run_kw)
            r.extra["headroom"] = h.headroom_bytes
            r.extra["headroom_detail"] = h.to_dict()
    from picklescope.transports.ray import ray_available

    if ray if ray is not None else ray_available():
        from picklescope.investigate.ray_matrix import cluster_rows

        pair = _node_pair(inv, workload, scale, codecs, progress, run_kw.get("timeout_s")) \
            if node_pair is not False else None
        try:
            rows, inv.extra["ray_cluster"] = cluster_rows(workload, scale, codecs, ray_address=ray_address,
                                                          progress=progress, also=pair, **run_kw)
            inv.results.extend(rows)
        except PicklescopeError:
            raise  # the user's own input (an unreachable --ray-address) is theirs to fix
        except Exception as exc:  # noqa: BLE001 - a cluster that fails to start must not lose the rest
            inv.extra["ray_cluster"] = {"error": f"{type(exc).__name__}: {exc}"}
    btransport = BUDGET_TRANSPORT if BUDGET_TRANSPORT in transports else transports[0]
    if trace:
        traced = LEGACY if LEGACY in codecs else codecs[0]
        if progress:
            progress(f"{traced} over {btransport} with tracers: {trace}")
        r = run(traced, btransport, workload, scale, tracer=trace, **run_kw)
        r.extra["role"] = "traced"
        inv.results.append(r)
    chosen = given or _choose_budget(inv, btransport)
    inv.extra.update({"budget": None if chosen is None else str(chosen), "budget_given": given is not None,
                      "budget_transport": btransport, "environment": envinfo.collect(), "command": command,
                      "payload_bytes": spec.payload_bytes(scale), "workload_source": spec.source or spec.name})
    if chosen is not None:
        inv.extra["budget_bytes"] = chosen.resolve(spec.payload_bytes(scale))
        for c in codecs:
            if progress:
                progress(f"{c} over {btransport} at sender budget {chosen}")
            r = run(c, btransport, workload, scale, budget=chosen, **run_kw)
            r.extra["role"] = "budgeted"
            inv.results.append(r)
    else:
        inv.extra["budget_note"] = (f"no budget separates {FIXED} from {LEGACY} here (one of them is missing or "
                                    "failed, or the legacy codec did not need more); pass --budget to choose one")
    inv.extra["headline"] = headline(inv)
    return inv


def _node_pair(inv: Investigation, workload: str, scale: float, codecs: tuple[str, ...],
               progress: Callable[[str], None] | None, timeout_s: float | None) -> Callable[[str], None] | None:
    """The node pair's runner, given the Ray cluster's address; None when the legacy or fixed codec is not
    among ``codecs``. A replay that fails is kept with its error: it never loses the rest."""
    if LEGACY not in codecs or FIXED not in codecs:
        return None

    def pair(address: str) -> None:
        for c in (LEGACY, FIXED):
            if progress:
                progress(f"{c}: a node of {NODE_WORKERS} workers over {NODE_STEPS} training steps")
            try:
                r = node(c, workload, scale, NODE_WORKERS, NODE_STEPS, ray_address=address,
                         **({"timeout_s": timeout_s} if timeout_s else {}))
            except PicklescopeError as exc:  # e.g. too few rows for 4 workers at this scale
                inv.extra["node_note"] = f"no node pair: {exc}"
                return
            inv.nodes.append(r.trimmed())

    return pair


def node_pair_sentence(inv: Investigation) -> str | None:
    """The node pair's verdict in one sentence: how much higher the driver's exact peak was with the legacy
    codec than with the fixed one, and where the driver's memory stood at the last training step's end.

    Only the difference of the two peaks is given: each exact peak also counts the object-store pages the
    driver writes each chunk into, the same for both codecs (docs/node.md)."""
    by = {r.codec: r for r in inv.nodes}
    if LEGACY not in by or FIXED not in by:
        return inv.extra.get("node_note")
    leg, fix = by[LEGACY], by[FIXED]
    if leg.outcome != "ok" or fix.outcome != "ok":
        bad = leg if leg.outcome != "ok" else fix
        return f"node pair: {bad.codec} ended {bad.outcome} ({bad.error or 'no detail'})"
    p = leg.payload_bytes
    a, b = leg.driver.peak_bytes, fix.driver.peak_bytes
    if a is None or b is None or not p:
        return "node pair: a driver's exact peak is missing"
    text = (f"On a node of a driver and {leg.workers} workers over {leg.steps} training steps, the driver's exact "
            f"peak was {fmt_bytes(a - b)} ({(a - b) / p:.2f}x payload) higher with {LEGACY} than with {FIXED}")
    ends = [r.training_steps[-1].driver_bytes if r.training_steps else None for r in (leg, fix)]
    if None not in ends:
        text += (f", and at the last step's end the driver held {ends[0] / p:.2f}x payload with {LEGACY} and "
                 f"{ends[1] / p:.2f}x with {FIXED}")
    return text + "."


def matrix_results(inv: Investigation) -> list[RunResult]:
    """The unbudgeted codec x transport runs (the comparison table)."""
    return [r for r in inv.results if r.extra.get("role", "matrix") == "matrix"]


def traced_results(inv: Investigation) -> list[RunResult]:
    """The run(s) with in-process tracers attached (what each tracker saw)."""
    return [r for r in inv.results if r.extra.get("role") == "traced"]


def budgeted_results(inv: Investigation) -> list[RunResult]:
    """The runs at the investigation's sender budget."""
    return [r for r in inv.results if r.extra.get("role") == "budgeted"]


def headline(inv: Investigation) -> str:
    """The investigation's verdict in one sentence, from the measured results only."""
    budgeted = {r.codec: r for r in budgeted_results(inv)}
    payload = inv.extra.get("payload_bytes") or (inv.results[0].payload_bytes if inv.results else 0)
    heads = {(r.codec, r.transport): r.extra.get("headroom") for r in matrix_results(inv)}
    t = inv.extra.get("budget_transport", BUDGET_TRANSPORT)
    gap = ""
    if heads.get((LEGACY, t)) is not None and heads.get((FIXED, t)) is not None and payload:
        diff = (heads[(LEGACY, t)] - heads[(FIXED, t)]) / payload
        gap = f"; over {t} the legacy codec needs {diff:.2f}x payload more sender memory than the fixed one"
    if LEGACY in budgeted and FIXED in budgeted:
        b = inv.extra.get("budget")
        bb = inv.extra.get("budget_bytes")
        return (f"At a sender budget of {b} payload ({fmt_bytes(bb)}) on {inv.workload} x{inv.scale:g}, "
                f"{LEGACY} {verdicts.fate(budgeted[LEGACY])} while {FIXED} {verdicts.fate(budgeted[FIXED])}"
                + "".join(f"; {c} {verdicts.fate(r)}" for c, r in budgeted.items() if c not in (LEGACY, FIXED))
                + f"{gap}.")
    if gap:
        return f"On {inv.workload} x{inv.scale:g}{gap} (no budgeted run: {inv.extra.get('budget_note', '')})."
    return f"{len(inv.results)} runs on {inv.workload} x{inv.scale:g}; no budgeted comparison of {LEGACY} and {FIXED}."
