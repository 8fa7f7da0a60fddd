"""Many named processes measured from the parent on one clock: sample, fold events, enforce a budget.

A :class:`Session` adopts processes by name and pid (a child of ours, or a process someone else
started, such as a Ray actor), samples every one of them and the object store from one thread of
the parent at about 1 ms, folds the events each process streams (named steps with exact ``VmHWM``
peaks, training-step boundaries) into typed records, and enforces one budget on the node's total.
It is the only sampler: :func:`picklescope.run` (its two sides), the cell magic, the Ray and
TransferQueue transports and a node of processes all measure through one, and
:meth:`Session.follow` is the one loop that waits on their children's pipes.

Why a thread of the parent: the parent only waits on pipes, so unlike a thread inside the measured
process it is never starved by a long ``pickle.dumps`` holding that process's GIL. ``watchers``
(the budget watchdog, live views) see every sample as it is taken.

Two readings of a process. ``"rss"`` is the whole resident set from ``/proc/PID/statm`` (one
number, the cheapest read): a run's sender and receiver and a cell are measured so, and their
figures (``Process.timeline``, the fidelity benchmark) are that number. ``"private"`` is the reading a
node total needs, explained below.

Accounting (what a node total means). Each process's curve is its *private* resident memory,
``VmRSS - RssShmem`` from ``/proc/PID/status`` (anonymous plus file-backed pages). Shared-memory
pages (``RssShmem``: the object store's ``/dev/shm`` file that a ``ray.put`` writer or a
zero-copy ``ray.get`` reader maps) are left out of every process and counted once, as the store:
the allocated blocks of the plasma file (``fstat``), read on the same tick. The node total at a
tick is the sum of those private curves plus the store. ``smaps_rollup`` (PSS) was not used: the
kernel walks every mapping to produce it, which costs milliseconds per read for a process that
mapped torch, too slow for 1 ms sampling of ten processes, and it would still split the store's
pages among its readers instead of counting them once. File-backed pages (shared libraries) stay
in each process, as they do in RSS; they are part of each process's baseline, and budgets count
above the node's baseline.

The budget check runs on every tick. Its victim is the process the kernel's OOM killer would pick,
the highest ``/proc/PID/oom_score`` among the adopted processes (Ray raises its workers'
``oom_score_adj``, so the kernel, and this check, pick a worker before the driver unless the driver
is much larger). The victim gets SIGUSR1 (its stack is dumped by ``faulthandler``) then SIGKILL.

This module imports neither Ray nor torch: it only reads ``/proc`` and sends signals.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import wait
from typing import Any, Protocol

from picklescope.core.events import Event
from picklescope.core.kill import Kill
from picklescope.core.procmem import StatmReader, StatusReader
from picklescope.core.result import Process, Series, Step
from picklescope.measure.sampler import hold_gc, raise_priority
from picklescope.measure.watchdog import dump_stack_then_kill


class Cancelled(KeyboardInterrupt):
    """Raised in a thread whose work was called off from another thread (``reproduce``'s Ray lane when
    the user presses Ctrl-C in the main one). It is a ``KeyboardInterrupt``, so every run's Ctrl-C clean-up
    ends that thread's processes too."""


_cancel_events: dict[int, threading.Event] = {}


@contextmanager
def cancellable(event: threading.Event) -> Iterator[None]:
    """Run the body so that ``event.set()`` from another thread ends it with :class:`Cancelled` at the next
    wake-up of a wait (:meth:`Session.follow` wakes at least every half second)."""
    ident = threading.get_ident()
    _cancel_events[ident] = event
    try:
        yield
    finally:
        _cancel_events.pop(ident, None)


def raise_if_cancelled() -> None:
    """Raise :class:`Cancelled` if this thread's work was called off (see :func:`cancellable`)."""
    event = _cancel_events.get(threading.get_ident())
    if event is not None and event.is_set():
        raise Cancelled()


# -- typed records: what the parent folds the streamed events into (a process: core.result.Process) ---


@dataclass
class TrainingStep:
    """One training step as the driver saw it (start and end on the session clock)."""

    index: int
    start_s: float
    end_s: float | None = None
    node_bytes: int | None = None  # node total above the node baseline at the step's end (sampled)
    driver_bytes: int | None = None  # the driver's private memory above its baseline at the end (exact)
    per_process_bytes: dict[str, int] = field(default_factory=dict)  # at the step's end, above baselines


# -- reading /proc -----------------------------------------------------------------------------------


class Reader(Protocol):
    """What the sampling thread reads each tick: bytes now (None once the thing is gone), then closed."""

    def read(self) -> int | None: ...

    def close(self) -> None: ...


READINGS: dict[str, Callable[[int], Reader]] = {"private": StatusReader, "rss": StatmReader}
Watcher = Callable[[str, float, int], None]
Handler = Callable[[str, Event], None]
Drain = Callable[[str], bool]


def oom_score(pid: int) -> int | None:
    """The kernel's OOM-killer score of ``pid`` (higher is killed first), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/oom_score") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


# -- the session ------------------------------------------------------------------------------------


class Session:
    """Named processes and one store on one clock (a run makes one through
    :class:`~picklescope.measure.engine.MeasuredRun`)."""

    def __init__(self, t0: float, run_dir: str = "", interval_s: float = 0.001, budget_bytes: int | None = None,
                 reading: str = "private") -> None:
        if reading not in READINGS:
            raise ValueError(f"reading {reading!r} is not one of {sorted(READINGS)}")
        self.t0 = t0
        self.run_dir = run_dir  # where a budget kill's stack dump goes
        self.interval_s = interval_s
        self.budget_bytes = budget_bytes
        self.reading = reading  # how adopted processes are read unless adopt() says otherwise
        self.watchers: list[Watcher] = []  # called with (name, t, bytes) for every process sample, in the thread
        self.processes: dict[str, Process] = {}
        # the fold's bookkeeping, by process name: the steps begun and not yet ended (innermost last), and
        # the processes that said they are done (no longer a budget's victim)
        self.open_steps: dict[str, list[Step]] = {}
        self.done: set[str] = set()
        self.node = Series()
        self.store = Series()
        self.store_source: str | None = None
        self.node_baseline: int | None = None
        self.store_baseline: int | None = None
        self.baseline_s: float | None = None
        self.training_steps: list[TrainingStep] = []
        self.kill: Kill | None = None
        self.priority = "normal"
        self._readers: dict[str, Reader] = {}
        self._store_reader: Reader | None = None
        self._last: dict[str, int] = {}
        self._last_store = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._want_baseline = threading.Event()
        self._baseline_taken = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="picklescope-session", daemon=True)
        self._gc_held = False

    # -- membership ---------------------------------------------------------------------------------
    def adopt(self, name: str, pid: int, *, role: str = "worker", node_id: str | None = None,
              sampled: bool = True, reading: str | None = None) -> Process:
        """Start measuring ``pid`` under ``name`` (sampled from here only when it runs on this machine).

        ``reading`` ("private" or "rss", default the session's) says what its curve is (module docstring).
        """
        rec = self.processes.get(name) or Process(name, pid, role)
        rec.pid, rec.role, rec.node_id, rec.sampled = pid, role, node_id, sampled
        rec.reading = reading or self.reading
        self.processes[name] = rec
        if sampled:
            try:
                reader = READINGS[rec.reading](pid)
            except OSError:
                rec.sampled = False
                return rec
            with self._lock:
                self._readers[name] = reader
        return rec

    def hand_over(self, name: str, pid: int, keep_as: str, *, role: str, node_id: str | None = None) -> Process:
        """Measure ``name`` in process ``pid`` from now on; the process measured under ``name`` so far goes on
        as ``keep_as`` (its curve and reader with it). A node's controller can move into a Ray actor after the
        script that started Ray was adopted under its name; raises OSError when ``pid`` cannot be read."""
        reader = READINGS[self.reading](pid)
        with self._lock:
            old = self.processes.pop(name, None)
            if old is not None:
                old.name = old.role = keep_as
                self.processes[keep_as] = old
                if name in self._readers:
                    self._readers[keep_as] = self._readers.pop(name)
                if name in self._last:
                    self._last[keep_as] = self._last.pop(name)
                if name in self.open_steps:
                    self.open_steps[keep_as] = self.open_steps.pop(name)
                if name in self.done:
                    self.done.discard(name)
                    self.done.add(keep_as)
            rec = self.processes[name] = Process(name, pid, role, node_id, reading=self.reading)
            self._readers[name] = reader
        return rec

    def set_store(self, reader: Reader, source: str | None) -> None:
        """The object store's reader (``read() -> bytes``): sampled on the same tick, counted once."""
        with self._lock:
            self._store_reader = reader
        self.store_source = source
        self.store_attached = True

    store_attached = False  # set_store() was called: the store has a curve (maybe still empty)

    def timelines(self) -> dict[str, Series]:
        """Each sampled process's curve, for its side of a result: a :class:`Series` of its own over the same
        lists (no copy of a long curve; a view that rebinds a side's lists leaves the session's record alone)."""
        return {name: Series(rec.timeline.t_s, rec.timeline.bytes)
                for name, rec in self.processes.items() if rec.sampled}

    def start(self) -> Session:
        hold_gc(True)
        self._gc_held = True
        self._thread.start()
        return self

    def take_baseline(self, timeout_s: float = 5.0) -> int | None:
        """Ask the sampler for the node's baseline (the next tick's total); returns it."""
        self._want_baseline.set()
        self._baseline_taken.wait(timeout_s)
        return self.node_baseline

    # -- sampling -----------------------------------------------------------------------------------
    def _loop(self) -> None:
        self.priority = raise_priority()
        while not self._stop.is_set():
            self.tick()
            time.sleep(self.interval_s)

    def tick(self) -> None:
        """One sample of every process and the store, on one timestamp; then the budget check.

        The timestamp is taken after the reads, not before: a kill's SIGKILL is timed just before it is sent
        (``Kill.sigkill_t_s``), so a read of the dying process's teardown (its pages freed mapping by mapping,
        its level falling to where it started) always lands after it and is trimmed from the curve."""
        with self._lock:
            readers = list(self._readers.items())
            store = self._store_reader
        values = []
        gone = []
        for name, reader in readers:
            if self._readers.get(name) is not reader:  # handed over since the snapshot (hand_over)
                continue
            value = reader.read()
            if value is None:
                gone.append(name)
            else:
                values.append((name, value))
        s = store.read() if store is not None else None
        t = round(time.monotonic() - self.t0, 6)
        total = 0
        watchers = self.watchers
        for name, value in values:
            self._last[name] = value
            tl = self.processes[name].timeline
            tl.t_s.append(t)
            tl.bytes.append(value)
            total += value
            for w in watchers:  # at once, so a budget is enforced on this very sample
                w(name, t, value)
        if s is not None:
            self._last_store = s
            self.store.t_s.append(t)
            self.store.bytes.append(s)
            total += s
        for name in gone:
            self._drop(name)
            self._last.pop(name, None)
        if not readers and store is None:
            return
        self.node.t_s.append(t)
        self.node.bytes.append(total)
        if self._want_baseline.is_set() and not self._baseline_taken.is_set():
            self.node_baseline = total
            self.store_baseline = self._last_store if store is not None else 0
            self.baseline_s = t
            for name, _ in readers:
                if name in self._last:
                    self.processes[name].sampled_baseline_bytes = self._last[name]
            self._baseline_taken.set()
        if (self.budget_bytes is not None and self.node_baseline is not None and self.kill is None
                and total - self.node_baseline > self.budget_bytes):
            self._kill_victim(t, total - self.node_baseline)

    def _drop(self, name: str) -> None:
        with self._lock:
            reader = self._readers.pop(name, None)
        if reader is not None:
            reader.close()

    # -- the budget -----------------------------------------------------------------------------------
    def _kill_victim(self, t: float, over: int) -> None:
        scores = {}
        for name, rec in self.processes.items():
            if name in self._readers and name not in self.done:
                score = oom_score(rec.pid)
                if score is not None:
                    scores[name] = score
        if not scores:
            return
        victim = max(scores, key=lambda n: (scores[n], self._last.get(n, 0)))
        rec = self.processes[victim]
        step, step_of = self.step_at_kill(victim)
        memory = {n: v for n, v in self._last.items()}
        memory["store"] = self._last_store
        kill = Kill(process=victim, t_s=t, budget_bytes=int(self.budget_bytes or 0), pid=rec.pid, node_bytes=over,
                    training_step=self.current_training_step(), step=step, step_of=step_of, oom_scores=scores,
                    memory_bytes=memory)
        self.kill = kill
        dump_stack_then_kill(rec.pid, os.path.join(self.run_dir, f"{victim}.stack"), self.t0, kill)

    def step_at_kill(self, victim: str, at: float | None = None) -> tuple[str | None, str | None]:
        """The innermost step open in ``victim`` and whose it is: its own, else the driver's (a worker
        between its steps, or a process the session does not follow); (None, None) when neither has one.

        ``at``: the kill's time, when it is read afterwards (the kernel's OOM killer in a cgroup is seen
        on a later tick, by when the driver may have closed the step it was in on hearing of the death):
        the step open at that time, closed since or not."""
        for name in (victim, "driver"):
            rec = self.processes.get(name)
            if rec is None:
                continue
            if at is None:
                open_steps = self.open_steps.get(name)
                if open_steps:
                    return open_steps[-1].name, name
                continue
            spans = [s for s in rec.steps  # open steps are in it too
                     if s.start_s <= at and (s.end_s is None or s.end_s >= at)]
            if spans:
                return max(spans, key=lambda s: (s.depth, s.start_s)).name, name
        return None, None

    # -- events ---------------------------------------------------------------------------------------
    def current_training_step(self, at: float | None = None) -> int | None:
        """The training step running at ``at`` (default: now), from the driver's boundaries."""
        found = None
        for ts in self.training_steps:
            if at is None or ts.start_s <= at:
                found = ts.index
        return found

    def fold(self, name: str, ev: Event) -> None:
        """Fold one streamed event of process ``name`` into its typed record (see :mod:`picklescope.core.events`)."""
        rec = self.processes.get(name)
        if rec is None:
            return
        kind = ev.get("type")
        open_steps = self.open_steps.setdefault(name, [])
        if kind == "baseline":
            rec.baseline_bytes, rec.baseline_s = ev.get("baseline_bytes"), ev.get("t_s")
        elif kind == "step_start":
            s = Step(name=ev["name"], start_s=ev["t_s"], depth=ev.get("depth", 0),
                     training_step=self.current_training_step(ev["t_s"]))
            open_steps.append(s)
            rec.steps.append(s)
        elif kind == "step_end":
            s = open_steps.pop() if open_steps else Step(name=ev["name"], start_s=ev["start_s"])
            s.close(ev)
            if s.peak_bytes is not None:
                rec.peak_bytes = max(rec.peak_bytes or 0, s.peak_bytes)
        elif kind == "train_step_start":
            self.training_steps.append(TrainingStep(ev["index"], ev["t_s"]))
        elif kind == "train_step_end":
            ts = next((x for x in self.training_steps if x.index == ev["index"]), None)
            if ts is not None:
                ts.end_s = ev["t_s"]
                base = rec.baseline_bytes
                if ev.get("private_bytes") is not None and ev.get("private_baseline_bytes") is not None:
                    ts.driver_bytes = ev["private_bytes"] - ev["private_baseline_bytes"]
                elif base is not None and ev.get("rss_bytes") is not None:
                    ts.driver_bytes = ev["rss_bytes"] - base
        elif kind == "done":
            self.done.add(name)
            if ev.get("peak_bytes") is not None:
                rec.peak_bytes = max(rec.peak_bytes or 0, ev["peak_bytes"])
            rec.held_bytes, rec.cycle_held_bytes = ev.get("held_bytes"), ev.get("cycle_held_bytes")
        elif kind == "error":
            rec.error = rec.error or f"{ev.get('exc_type')}: {ev.get('message')}"

    # -- the children's pipes ---------------------------------------------------------------------------
    def follow(self, conns: dict[str, Any], procs: dict[str, Any], handler: Handler, deadline: float,
               until: Callable[[list[str], Drain], bool], poll_s: float = 0.5) -> bool:
        """Hand every event the children send to ``handler(name, event)`` until ``until`` says the run is decided.

        ``conns`` maps a name to a pipe; the caller may add one while this runs (an actor that connects
        late), and a pipe the other end closed is no longer waited on. ``procs`` maps a name to a process
        whose death wakes the wait. After each wake ``until(dead, drain)`` is called with the names of the
        processes found dead and ``drain(name)``, which hands over what waits on that pipe (False once it
        is closed); it returns True once the run is decided (it may also send to a child, e.g. the
        receiver's go). Returns False if the monotonic ``deadline`` passed first: the caller words the
        timeout. This is the parent's only event loop, so every kind of run waits and drains alike.
        """
        closed: set[str] = set()

        def drain(name: str) -> bool:
            c = conns.get(name)
            if c is None or name in closed:
                return False
            try:
                while c.poll():
                    handler(name, c.recv())
            except (EOFError, OSError):
                closed.add(name)
                return False
            return True

        while True:
            raise_if_cancelled()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            live = [(name, c) for name, c in conns.items() if name not in closed]
            sentinels = {p.sentinel: name for name, p in procs.items()}
            ready = wait([c for _, c in live] + list(sentinels), timeout=min(remaining, poll_s))
            for name, c in live:
                if c in ready:
                    drain(name)
            dead = [name for sentinel, name in sentinels.items() if sentinel in ready and not procs[name].is_alive()]
            if until(dead, drain):
                return True

    # -- after the run --------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for name in list(self._readers):
            self._drop(name)
        with self._lock:
            store, self._store_reader = self._store_reader, None
        if store is not None:
            store.close()
        if self._gc_held:
            self._gc_held = False
            hold_gc(False)

    def max_gap_s(self, after_s: float | None = None) -> float:
        """The longest interval between two consecutive ticks (after ``after_s``, default the baseline)."""
        start = self.baseline_s if after_s is None else after_s
        ts = [t for t in self.node.t_s if start is None or t >= start]
        return max((b - a for a, b in zip(ts, ts[1:])), default=0.0)

    def node_at(self, t: float) -> tuple[float, int] | None:
        """The first tick at or after ``t`` (or the last one): (its time, the node total)."""
        for tt, v in zip(self.node.t_s, self.node.bytes):
            if tt >= t:
                return tt, v
        return (self.node.t_s[-1], self.node.bytes[-1]) if self.node.t_s else None

    def value_at(self, series: Series, t: float) -> int | None:
        for tt, v in zip(series.t_s, series.bytes):
            if tt >= t:
                return v
        return series.bytes[-1] if series.bytes else None

    def settle_training_steps(self) -> None:
        """Fill each training step's node and per-process memory at its end from the samples."""
        base = self.node_baseline
        for ts in self.training_steps:
            if ts.end_s is None or base is None:
                continue
            at = self.node_at(ts.end_s)
            if at is not None:
                ts.node_bytes = at[1] - base
                for name, rec in self.processes.items():
                    v = self.value_at(rec.timeline, at[0])
                    above = None if v is None else rec.above(v)
                    if above is not None:
                        ts.per_process_bytes[name] = above
                sv = self.value_at(self.store, at[0])
                if sv is not None and self.store_baseline is not None:
                    ts.per_process_bytes["store"] = sv - self.store_baseline

    def __enter__(self) -> Session:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def to_dict(obj: Any) -> Any:
    """A record as plain JSON-able data."""
    return asdict(obj)
