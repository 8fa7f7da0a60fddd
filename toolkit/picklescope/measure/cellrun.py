"""Run a notebook cell's code in an isolated, measured child, under an optional memory budget.

This is what ``%%picklescope`` stands on. The cell's code cannot run in the kernel: an allocation
beyond the budget must end a process, and that process must not be the kernel holding the user's
work. So the code goes to a child from the warm forkserver (torch already imported, never computed,
so no OpenMP deadlock after the kernel's own torch work). The child first re-runs the kernel's
import statements (their cost lands in the baseline, not in the cell's peak), then runs the cell
inside one step named ``cell`` with a :class:`~picklescope.core.steps.Meter` installed, so the cell's
exact peak comes from ``VmHWM`` and any ``step(...)`` the cell marks gets its own peak too.

The parent samples the child's RSS; the same :class:`~picklescope.measure.watchdog.Watchdog` that guards
every run enforces the budget the way the kernel's OOM killer would (SIGKILL, no Python exception,
after ``faulthandler`` wrote the Python stack), and :mod:`picklescope.measure.verdicts` words the outcome,
so a cell's verdict reads like a run's. ``--tracer`` attaches the same in-process tracers as a run.
"""

from __future__ import annotations

import gc
import os
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from picklescope import tracers
from picklescope.core import procmem, steps
from picklescope.core.childconfig import ChildConfig
from picklescope.core.events import Done, Error, Event, Output, Ready
from picklescope.core.leftovers import temp_name
from picklescope.core.result import Process, RunResult
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError
from picklescope.measure import launcher, verdicts
from picklescope.measure.budget import Limits, check_machine, machine_reserve
from picklescope.measure.child import arm_stack_dump, begin_measure, end_measure
from picklescope.measure.engine import MeasuredRun
from picklescope.measure.fold import RunFold
from picklescope.measure.watchdog import Watchdog
from picklescope.tracers import DEFAULT_TRACER, ChildTracing

SIDE = "cell"
CELL_FILE = "picklescope_cell.py"
DEFAULT_TIMEOUT_S = 600.0
_SHM = "/dev/shm" if os.path.isdir("/dev/shm") else None


class _StreamToParent:
    """A file-like ``sys.stdout`` for the child: each write is sent to the parent as it happens."""

    def __init__(self, conn: Any, name: str) -> None:
        self.conn = conn
        self.name = name

    def write(self, text: str) -> int:
        if text:
            self.conn.send(Output(type="output", side=SIDE, stream=self.name, text=text))
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


@dataclass(kw_only=True)
class CellConfig(ChildConfig):
    """A notebook cell run in a child: its source, the kernel's import lines and its pushed variables."""

    code: str
    imports: list[str] = field(default_factory=list)
    variables: bytes = b""  # a pickled dict of the kernel's variables the cell uses


def cell_main(conn: Any, cfg: CellConfig) -> None:
    """Child side: imports, baseline, the cell in step ``cell``, then held and cycle-held memory."""
    launcher.collect_like_a_fresh_process()  # a cell may loop: its collector runs as in a fresh kernel
    stack_file = arm_stack_dump(cfg, SIDE)  # noqa: F841 - kept open for the signal handler
    sys.stdout = _StreamToParent(conn, "stdout")  # type: ignore[assignment]
    sys.stderr = _StreamToParent(conn, "stderr")  # type: ignore[assignment]
    # The cell's source as a real file, so tracebacks show its lines and a kill names the cell's line.
    cell_file = os.path.join(cfg.run_dir, CELL_FILE)
    with open(cell_file, "w") as f:
        f.write(cfg.code)
    ns: dict[str, Any] = {"__name__": "__main__", "__file__": cell_file}
    import_errors = []
    try:
        ns.update(pickle.loads(cfg.variables))
    except BaseException as exc:  # noqa: BLE001 - a variable that cannot be rebuilt here is reported
        import_errors.append(f"pushed variables: {type(exc).__name__}: {exc}")
    for stmt in cfg.imports:
        try:
            exec(compile(stmt, "<kernel imports>", "exec"), ns)
        except BaseException as exc:  # noqa: BLE001 - a kernel import that fails here is reported, not fatal
            import_errors.append(f"{stmt}: {type(exc).__name__}: {exc}")
    gc.collect()
    conn.send(Ready(type="ready", side=SIDE, pid=os.getpid(), import_errors=import_errors))
    tracing = ChildTracing.from_cfg(cfg, SIDE, conn.send)
    meter = begin_measure(steps.Meter(tracing.sink, cfg.t0, SIDE), tracing)
    error: Error | None = None
    try:
        with steps.step(SIDE):
            exec(compile(cfg.code, cell_file, "exec"), ns)
    except BaseException as exc:  # noqa: BLE001 - the cell's own failure is the result, not a crash
        error = Error(type="error", side=SIDE, exc_type=type(exc).__name__, message=str(exc),
                      traceback="".join(traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)))
    m = end_measure(conn, meter, error, tracing=tracing)
    conn.send(Done(type="done", side=SIDE, peak_bytes=m.peak_bytes, held_bytes=m.held_bytes,
                   cycle_held_bytes=m.cycle_held_bytes, baseline_bytes=m.baseline_bytes, t_s=meter.now()))
    try:
        conn.recv()  # stay alive (and sampled) until the parent lets go
    except EOFError:
        pass


def _limits(budget_bytes: int | None) -> Limits:
    """The cell's budget, checked against what the machine can give, plus the machine guard."""
    check_machine({SIDE: budget_bytes})
    return Limits({SIDE: budget_bytes}, {SIDE: None if budget_bytes is None else fmt_bytes(budget_bytes)},
                  "watchdog", note="the parent samples the cell's process and kills it with SIGKILL at its budget",
                  guard_floor_bytes=machine_reserve(procmem.machine_memory()["total"]) // 2)


def run_cell(code: str, *, imports: list[str] | tuple[str, ...] = (), variables: dict[str, Any] | None = None,
             budget_bytes: int | None = None, tracer: str | list[str] | None = "sampler",
             timeout_s: float = DEFAULT_TIMEOUT_S, sample_interval_s: float = 0.001,
             on_event: Callable[[Event], None] | None = None) -> RunResult:
    """Run ``code`` after ``imports`` in an isolated child; always returns a :class:`RunResult`.

    ``variables`` (picklable) are defined in the child before the baseline, after the imports run.
    The result has one side, ``cell``; its outcome is ``ok``, ``error``, ``memory-error``,
    ``oom-killed`` (the budget watchdog, the machine guard, or the system's OOM killer) or
    ``timeout``. ``tracer`` adds in-process tracers as for :func:`picklescope.run`.
    """
    try:
        blob = pickle.dumps(dict(variables or {}))
    except Exception as exc:  # noqa: BLE001 - tell which values cannot cross, before any child starts
        raise PicklescopeError(f"the pushed variables cannot be pickled ({type(exc).__name__}: {exc})",
                               "push only plain values (numbers, strings, lists, arrays)") from None
    names = tracers.parse_tracers(tracer)
    if DEFAULT_TRACER not in names:
        raise PicklescopeError("a cell always runs with the sampler", "drop --tracer none")
    limits = _limits(budget_bytes)
    side = Process(SIDE, budget_bytes=budget_bytes)
    result = RunResult(codec="%%picklescope", transport="none", workload="cell", scale=1.0, payload_bytes=0,
                       processes={SIDE: side}, tracer=",".join(names))
    if budget_bytes is not None:
        result.enforcement, result.enforcement_note = limits.enforcement, limits.note
    run_dir = tempfile.mkdtemp(prefix=temp_name("picklescope-cell-"), dir=_SHM)
    t0 = time.monotonic()
    cfg = CellConfig(code=code, imports=list(imports), variables=blob, run_dir=run_dir, t0=t0, tracers=list(names))
    guard = Watchdog(limits, run_dir, t0)
    collector = tracers.Collector(names)
    fold = RunFold(result, guard.chain(collector.hook(on_event)))  # the run's fold: a cell is a one-side run
    run = MeasuredRun(t0, run_dir, sample_interval_s, guard=guard)  # the cell's curve is its whole RSS
    try:
        with run:
            proc, _conn = run.launch(SIDE, cell_main, (cfg,), "picklescope-cell")
            side.pid = proc.pid

            def decided(dead: list[str], drain: Callable[[str], bool]) -> bool:
                if dead and not fold.done[SIDE]:
                    drain(SIDE)  # what it sent before it died
                    return True
                return fold.done[SIDE]

            if not run.relay(lambda _name, ev: fold.handle(ev), t0 + timeout_s, decided):
                verdicts.time_out(result, "the cell")
    finally:
        side.exit_code = run.exit_codes.get(SIDE)
        guard.close()
        timelines = run.stop_sampling()
        side.timeline = timelines.get(SIDE, side.timeline)
        collector.collect(result, run_dir, t0, timelines)  # before the capture files go
        shutil.rmtree(run_dir, ignore_errors=True)
    done = fold.done[SIDE]
    if fold.errors:  # the cell's own exception (the last one, should several arrive)
        last = fold.errors[-1]
        result.traceback = last["traceback"]
        if result.outcome == "ok":
            verdicts.conclude(result, "error", f"{last['exc_type']}: {last['message']}")
    if not done and result.outcome == "ok":
        verdicts.conclude(result, "error", f"the cell's process ended without a result (exit code {side.exit_code})")
    verdicts.apply_memory_verdict(result, fold.errors, {SIDE: done}, guard.kills, result.enforcement, {})
    if result.outcome == "oom-killed" and side.peak_bytes is None:
        side.peak_bytes = result.memory_at_death_bytes  # no VmHWM reading survives a SIGKILL
        side.peak_source = "sampled at the kill"
    result.wall_s = time.monotonic() - t0
    return result
