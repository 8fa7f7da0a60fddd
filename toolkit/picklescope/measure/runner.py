"""One isolated, measured run: a sender process and a receiver process, as in Ray.

The parent (a terminal, a test, a Jupyter kernel) never touches the batch: it starts the two
children from the warm forkserver, samples their RSS, relays the hand-off, collects every streamed
event and always returns a :class:`RunResult`, whatever happened to the children.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Callable
from typing import Any

from picklescope import tracers
from picklescope.codecs import get_codec
from picklescope.core import procmem
from picklescope.core.childconfig import PairConfig
from picklescope.core.events import EventHook, Go
from picklescope.core.leftovers import RunTracker, sweep_orphans, temp_name
from picklescope.core.plugins import load_plugins
from picklescope.core.result import Process, RunResult, Variation
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError
from picklescope.measure import child, launcher, verdicts
from picklescope.measure.budget import plan as plan_limits
from picklescope.measure.engine import MeasuredRun
from picklescope.measure.fold import RunFold, finish_run
from picklescope.measure.watchdog import Watchdog
from picklescope.transports import OwnsItsReceiver, check_handoff_space, get_transport, handoff_root
from picklescope.workloads.spec import DEFAULT_WORKLOAD, check_scale, load_workload

DEFAULT_TIMEOUT_S = 900.0
MAX_REPEAT = 1000
SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else None


def _check_fits(payload: int) -> None:
    """Refuse a workload that cannot fit the machine before any child allocates it."""
    avail = procmem.machine_memory()["available"]
    need = 3 * payload  # the batch, one copy in flight, the hand-off
    if avail and need > avail:
        raise PicklescopeError(
            f"workload payload {fmt_bytes(payload)} needs about {fmt_bytes(need)} but the machine has "
            f"{fmt_bytes(avail)} available",
            "use a smaller --scale",
        )


def run(
    codec: str = "numpy",
    transport: str = "pickle5-oob",
    workload: str = DEFAULT_WORKLOAD,
    scale: float = 0.25,
    *,
    receiver_codec: str | None = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    sample_interval_s: float = 0.001,
    env: dict[str, dict[str, str]] | None = None,
    on_event: EventHook | None = None,
    on_sample: Callable[[str, float, int], None] | None = None,
    probe: dict[str, str | None] | None = None,
    plugins: list[str] | None = None,
    budget: Any = None,
    receiver_budget: Any = None,
    enforcement: str = "watchdog",
    tracer: str | list[str] | None = "sampler",
    transport_options: dict[str, Any] | None = None,
    handoff_dir: str | None = None,
    repeat: int = 1,
) -> RunResult:
    """Serialize ``workload`` with ``codec`` over ``transport`` in two isolated processes.

    Returns a :class:`RunResult` in every case; only bad input (unknown names, bad scale) raises.
    ``plugins`` are files or modules (see :mod:`picklescope.core.plugins`) loaded here and in both
    children before the codec is looked up, for codecs that are not built in. ``probe`` switches a
    side to a single-reading meter (``benchmarks/fidelity.py``).

    ``budget`` / ``receiver_budget`` cap what the sender / receiver may use above its baseline, as
    bytes or a size (``"700MiB"``) or a multiple of the payload (``"1.5x"``); a side that crosses its
    budget is killed and the run ends ``oom-killed`` with the side, step, stack and the timeline up to
    the kill. ``enforcement`` is ``watchdog`` (default), ``cgroup`` or ``address-space`` (see
    :mod:`picklescope.measure.budget`). A budget the machine cannot give raises before anything starts.

    ``tracer`` chooses how memory is watched (see :mod:`picklescope.tracers`): ``"sampler"`` (always
    on), ``"memray"``, ``"tracemalloc"``, ``"torch-profiler"``, several joined by commas, or ``"all"``;
    their views land in ``result.tracers`` and memray's stacks in ``result.attribution``.

    ``transport_options`` go to a transport that runs its own receiver (``ray``: ``ray_address`` to
    join an existing cluster, ``object_store_bytes``); see :mod:`picklescope.ray`.

    ``handoff_dir`` puts the run's hand-off file (and its other temporaries) in that folder instead of
    ``/dev/shm``; a hand-off that does not fit the free space there is refused before any child starts
    (see :func:`picklescope.transports.check_handoff_space`).

    ``repeat=N`` runs the case N times, each in fresh children forked from a freshly started forkserver
    (children of one forkserver inherit its allocator state, and with it the value a varying peak
    takes: see docs/varying_peaks.md), and returns the run with the largest
    sender peak (the one a budget must survive) with ``variation`` holding min / median / max of every
    exact peak over the N runs and whether it varies by more than 1% of the payload. A run that does
    not end ``ok`` stops the repetition and is returned as it is.
    """
    check_repeat(repeat)
    kw = dict(receiver_codec=receiver_codec, timeout_s=timeout_s, sample_interval_s=sample_interval_s, env=env,
              on_event=on_event, on_sample=on_sample, probe=probe, plugins=plugins, budget=budget,
              receiver_budget=receiver_budget, enforcement=enforcement, tracer=tracer,
              transport_options=transport_options, handoff_dir=handoff_dir)
    results: list[RunResult] = []
    forkservers: list[int | None] = []
    for i in range(repeat):
        if i:  # a fresh forkserver: a new process, as each production worker is (docs/varying_peaks.md)
            fresh_forkserver()
        results.append(_run_once(codec, transport, workload, scale, **kw))
        forkservers.append(launcher.forkserver_pid())
        if results[-1].outcome != "ok":
            break
    return results[0] if repeat == 1 else worst_of(results, forkservers)


def check_repeat(repeat: Any) -> None:
    """Refuse a repeat count that is not a whole number from 1 to MAX_REPEAT."""
    if not (isinstance(repeat, int) and not isinstance(repeat, bool) and 1 <= repeat <= MAX_REPEAT):
        raise PicklescopeError(f"repeat {repeat!r} must be a whole number from 1 to {MAX_REPEAT}",
                               "use e.g. --repeat 5 (1 runs the case once)")


def fresh_forkserver() -> None:
    """Stop the warm forkserver, so that the next run's children come from a newly started one.

    Children of one forkserver inherit its allocator state, and with it the value a varying peak takes
    (docs/varying_peaks.md); a repetition from a fresh forkserver is an independent draw."""
    launcher.shutdown()


def worst_of(results: list[RunResult], forkservers: list[int | None]) -> RunResult:
    """The repetitions of one case as one result: the first that did not end ``ok``, else the one with the
    largest sender peak (the one a budget must survive), with ``variation`` over all of them."""
    variation = Variation.of(results)
    variation.forkserver_pids = list(forkservers)
    failed = next((r for r in results if r.outcome != "ok"), None)
    worst = failed or max(results, key=lambda r: r.sender.peak_bytes or 0)
    worst.variation = variation
    return worst


def _run_once(
    codec: str,
    transport: str,
    workload: str,
    scale: float,
    *,
    receiver_codec: str | None,
    timeout_s: float,
    sample_interval_s: float,
    env: dict[str, dict[str, str]] | None,
    on_event: EventHook | None,
    on_sample: Callable[[str, float, int], None] | None,
    probe: dict[str, str | None] | None,
    plugins: list[str] | None,
    budget: Any,
    receiver_budget: Any,
    enforcement: str,
    tracer: str | list[str] | None,
    transport_options: dict[str, Any] | None,
    handoff_dir: str | None,
) -> RunResult:
    """One run of :func:`run`: two fresh children, one result."""
    plugins = [str(p) for p in plugins or []]
    load_plugins(plugins)
    get_codec(codec)
    if receiver_codec is not None:
        get_codec(receiver_codec)
    chosen = get_transport(transport)
    check_scale(scale)
    if not (isinstance(timeout_s, (int, float)) and timeout_s > 0 and timeout_s == timeout_s):
        raise PicklescopeError(f"timeout_s {timeout_s!r} must be a positive number of seconds",
                               f"use e.g. timeout_s=300 (default {DEFAULT_TIMEOUT_S:g})")
    if isinstance(chosen, OwnsItsReceiver):  # Ray: installed? does a cluster answer at ray_address? before anything
        chosen.check_options(transport_options or {})
    spec = load_workload(workload)
    payload = spec.payload_bytes(scale)
    _check_fits(payload)

    handoff_base = handoff_root(handoff_dir) if handoff_dir is not None else SHM_DIR
    if not isinstance(chosen, OwnsItsReceiver):  # Ray's object store is not our hand-off
        check_handoff_space(handoff_base, payload, chosen=handoff_dir is not None)
    limits = plan_limits(budget, receiver_budget, payload, enforcement)
    tracer_names = tracers.parse_tracers(tracer)
    if not tracer_names and limits.any:
        raise PicklescopeError("tracer 'none' turns off the sampling a budget is enforced with",
                               "drop --tracer none or the budget")

    result = RunResult(codec=codec, transport=transport, workload=spec.name, scale=scale,
                       payload_bytes=payload, receiver_codec=receiver_codec,
                       processes={"sender": Process("sender"), "receiver": Process("receiver")},
                       tracer=",".join(tracer_names) or "none")
    for name, side in result.processes.items():
        side.budget_bytes = limits.budgets[name]
    if limits.any:
        result.enforcement, result.enforcement_note = limits.enforcement, limits.note
    state = RunFold(result, on_event)
    sweep_orphans([handoff_base] if handoff_base else None)  # what a parent killed with SIGKILL could not remove
    run_dir = tempfile.mkdtemp(prefix=temp_name("picklescope-"), dir=handoff_base)  # creator pid: see leftovers.py
    result.run_dir = run_dir  # removed when the run ends; kept here so tests can check
    try:  # removed however the run ends, even if its own clean-up fails or Ctrl-C lands before it
        t0 = time.monotonic()
        cfg = PairConfig(codec=codec, transport=transport, workload=spec.source or spec.name, scale=scale,
                         receiver_codec=receiver_codec, run_dir=run_dir, t0=t0, env=dict(env or {}),
                         probe=dict(probe or {}), plugins=list(plugins or []), limits=limits.for_child(),
                         tracers=list(tracer_names))

        guard = Watchdog(limits, run_dir, t0)  # budgets, and the machine guard that protects this process
        state.on_event = guard.chain(on_event)
        collector = tracers.Collector(tracer_names)  # gathers what the tracers stream, reads their files
        state.on_event = collector.hook(state.on_event)
        if isinstance(chosen, OwnsItsReceiver):  # Ray, TransferQueue: the transport starts its receiver (an actor)
            ray_result = chosen.run_sides(state, cfg, timeout_s=timeout_s, sample_interval_s=sample_interval_s,
                                          on_sample=on_sample, options=transport_options or {}, guard=guard,
                                          limits=limits)
            guard.check_refused()
            _raise_bad_setup(state)
            _armed_budgets(ray_result, limits)
            return ray_result

        tracker = RunTracker()  # the sides and every descendant, whatever session it starts: ended with the run
        run = MeasuredRun(t0, run_dir, sample_interval_s, guard=guard, on_sample=on_sample)  # curves: whole RSS
        try:
            with run:
                for name, target in (("receiver", child.receiver_main), ("sender", child.sender_main)):
                    proc, _conn = run.launch(name, target, (cfg,), f"picklescope-{name}",
                                             sampled=bool(tracer_names))  # tracer "none": no sampling at all
                    tracker.add(proc.pid)
                    result.processes[name].pid = proc.pid
                _relay_pair(run, state, t0 + timeout_s, killed=lambda: "sender" in guard.kills)
                run.stop_sampling()
                tracker.snapshot()  # while the sides live, their descendants are still in their tree
        finally:
            for name, code in run.exit_codes.items():
                result.processes[name].exit_code = code
            stray = [pid for pid in tracker.end(keep=launcher.started_pids) if pid not in tracker.pids]
            if stray:
                result.killed_descendants = stray  # processes a side started and left running
            guard.close()
            cgroup_counters = limits.cleanup()
            timelines = run.stop_sampling()
            collector.collect(result, run_dir, t0, timelines)  # before the capture files go
            result.sampler_priority = run.session.priority  # realtime / raised / normal: see sampler.py
        guard.check_refused()  # a whole-process limit under the side's baseline: bad input, nothing measured
        _raise_bad_setup(state)
        _armed_budgets(result, limits)
        for name, tl in timelines.items():
            result.processes[name].timeline = tl
        finish_run(state)
        verdicts.apply_memory_verdict(result, state.errors, state.done, guard.kills, result.enforcement,
                                      cgroup_counters)
        result.wall_s = time.monotonic() - t0
        return result
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


def _relay_pair(run: MeasuredRun, state: RunFold, deadline: float,
                killed: Callable[[], bool] = lambda: False) -> None:
    """Relay events until both sides are done, one fails, or the deadline passes.

    ``killed`` says whether the budget killed the sender. Its "done" can carry an exact peak over the
    budget that no sample caught (the watchdog kills it on that event), and a killed sender's
    hand-off must never reach the receiver: the run ends there, as the real OOM kill would end it.
    """
    go_sent = False

    def decided(dead: list[str], drain: Callable[[str], bool]) -> bool:
        nonlocal go_sent
        if state.errors and not go_sent:
            return True
        if state.done["sender"] and not go_sent:
            if state.handoff is None or killed():
                return True
            run.conns["receiver"].send(Go(type="go", handoff=state.handoff, manifest=state.manifest))
            go_sent = True
        for name in dead:
            if not state.done[name]:
                drain(name)  # what the process sent before it died
                if not state.done[name]:
                    return True
        return state.done["sender"] and state.done["receiver"]

    if not run.relay(lambda _name, ev: state.handle(ev), deadline, decided):
        verdicts.time_out(state.result)


def _armed_budgets(result: RunResult, limits: Any) -> None:
    """Each side's budget as enforced: a ``total:`` limit became bytes above the baseline only when the
    watchdog saw that side's baseline (:meth:`~picklescope.measure.budget.Limits.arm_total`)."""
    for name, side in result.processes.items():
        if limits.budgets.get(name) is not None:
            side.budget_bytes = limits.budgets[name]


def _raise_bad_setup(state: RunFold) -> None:
    """A child that refused the user's input while setting up (a verl that does not import, a plugin
    that fails in the child) raises the same one-line error here, after the run's processes are gone:
    nothing was measured, so there is no result to return."""
    for ev in state.errors:
        if ev.get("phase") == "setup" and ev.get("bad_input"):
            raise PicklescopeError(*ev["bad_input"])
