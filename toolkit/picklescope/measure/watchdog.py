"""The parent-side killer: SIGUSR1 (stack dump) then SIGKILL the moment a side crosses its budget.

It lives in the parent because the measured process cannot be trusted to police itself: a thread
inside it is starved by the GIL during ``pickle.dumps``, and the real OOM killer gives no warning
either. Three independent signals trigger it, so the verdict does not depend on sampling luck:

- each RSS sample the parent's sampler takes (about every millisecond);
- the side's kernel high-water mark (``VmHWM``, read from the parent with every sample), which
  catches a spike that rose and fell between two samples;
- the exact step peaks the side streams, which catch anything else the moment a step ends.

A machine guard runs in every run, budget or not: if the machine's available memory falls under
the reserve, the biggest side is killed, so the kernel's own OOM killer never has to choose a victim
(it might choose the Jupyter kernel).
"""

from __future__ import annotations

import os
import signal
import threading
import time

from picklescope.core.events import Event, EventHook, chain
from picklescope.core.kill import Kill
from picklescope.core.procmem import HwmReader, machine_memory
from picklescope.measure.budget import BudgetBelowBaseline, Limits

STACK_WAIT_S = 0.1  # longest wait for the stack dump before SIGKILL
STACK_STABLE_S = 0.005  # the dump is complete once its size has not changed for this long
MEMINFO_EVERY_S = 0.01


class Watchdog:
    """Watches the sides of one run; :attr:`kills` says whom it killed."""

    def __init__(self, limits: Limits, run_dir: str, t0: float) -> None:
        self.limits = limits
        self.run_dir = run_dir
        self.t0 = t0
        self.enforce = limits.enforcement == "watchdog"
        self.kills: dict[str, Kill] = {}
        self.refused: dict[str, tuple[int, int]] = {}  # side -> (total limit, baseline): see check_refused
        self.pids: dict[str, int] = {}
        self.baselines: dict[str, int] = {}
        self.last_rss: dict[str, int] = {}
        self._hwm: dict[str, HwmReader] = {}
        self._lock = threading.Lock()
        self._next_meminfo = 0.0

    def add(self, side: str, pid: int) -> None:
        """Start watching a side (before its baseline only the machine guard applies)."""
        self.pids[side] = pid
        try:
            self._hwm[side] = HwmReader(pid)
        except OSError:
            pass

    def chain(self, hook: EventHook | None) -> EventHook:
        """An event hook that lets the watchdog see each event, then calls ``hook``."""
        return chain(self.event, hook)

    def _budget(self, side: str) -> int | None:
        return self.limits.budgets.get(side) if self.enforce else None

    def event(self, ev: Event) -> None:
        """Arm on a side's baseline; kill on an exact step peak over the budget."""
        side, kind = ev.get("side"), ev.get("type")
        if kind == "baseline":
            total = self.limits.totals.get(side)
            if total is not None and self.limits.arm_total(side, ev["baseline_bytes"]) is None:
                self.refused[side] = (total, ev["baseline_bytes"])  # not a kill: nothing was measured
                try:
                    os.kill(self.pids[side], signal.SIGKILL)
                except (KeyError, ProcessLookupError):
                    pass
            self.baselines[side] = ev["baseline_bytes"]
            return
        budget = self._budget(side)
        if budget is None or kind not in ("step_end", "done"):
            return
        peak = ev.get("peak_bytes")
        if peak is not None and peak > budget:
            self._kill(side, "budget", "exact step peak", peak, ev.get("name") if kind == "step_end" else None)

    def watch(self, side: str, t: float, rss: int) -> None:
        """Session watcher: called with every RSS sample of every side, in the session's sampling thread."""
        if side in self.kills:
            return
        self.last_rss[side] = rss
        budget = self._budget(side)
        base = self.baselines.get(side)
        if budget is not None and base is not None:
            if rss - base > budget:
                self._kill(side, "budget", "sampled RSS", rss - base)
                return
            reader = self._hwm.get(side)
            hwm = reader.read() if reader is not None else None
            if hwm is not None and hwm - base > budget:
                self._kill(side, "budget", "kernel peak (VmHWM)", hwm - base)
                return
        now = time.monotonic()
        if now >= self._next_meminfo:
            self._next_meminfo = now + MEMINFO_EVERY_S
            avail = machine_memory()["available"]
            if avail and avail < self.limits.guard_floor_bytes:
                alive = {s: r for s, r in self.last_rss.items() if s not in self.kills}
                victim = max(alive, key=alive.__getitem__) if alive else side
                b = self.baselines.get(victim)
                self._kill(victim, "machine", "available memory", None if b is None else alive.get(victim, rss) - b)

    def _kill(self, side: str, reason: str, via: str, above: int | None, step: str | None = None) -> None:
        with self._lock:
            if side in self.kills or side not in self.pids:
                return
            kill = Kill(process=side, t_s=round(time.monotonic() - self.t0, 6),
                        budget_bytes=self.limits.budgets.get(side), pid=self.pids[side], reason=reason, via=via,
                        above_baseline_bytes=above, step=step)
            self.kills[side] = kill
        dump_stack_then_kill(self.pids[side], os.path.join(self.run_dir, f"{side}.stack"), self.t0, kill)

    def check_refused(self) -> None:
        """Raise :class:`~picklescope.measure.budget.BudgetBelowBaseline` if a whole-process limit was refused.

        Called by the runner after the run's processes are gone, so refusing leaves nothing behind.
        """
        for side, (total, baseline) in self.refused.items():
            raise BudgetBelowBaseline(side, total, baseline)

    def close(self) -> None:
        for reader in self._hwm.values():
            reader.close()
        self._hwm = {}


def dump_stack_then_kill(pid: int, path: str, t0: float, kill: Kill) -> None:
    """SIGUSR1 (the process's faulthandler writes its Python stack to ``path``), then SIGKILL the moment the
    dump is written; sets ``kill.sigkill_t_s`` (seconds since ``t0``) and ``kill.stack``. Shared by every
    budget that kills. The process runs on while its stack is written, so SIGKILL follows the end of the
    signal handler, not a fixed pause: a copy still under way at the decision is still under way at death."""
    try:
        masks = _blocked_masks(pid)
        os.kill(pid, signal.SIGUSR1)
        wait_for_dump(path, pid, masks)
        kill.sigkill_t_s = round(time.monotonic() - t0, 6)
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        with open(path) as f:
            kill.stack = f.read() or None
    except OSError:
        pass


_USR1 = 1 << (signal.SIGUSR1 - 1)


def _status_fields(pid: int, tid: str, keys: tuple[str, ...]) -> dict[str, int]:
    try:
        with open(f"/proc/{pid}/task/{tid}/status") as f:
            return {k: int(v, 16) for k, _, v in (line.partition(":") for line in f) if k in keys}
    except (OSError, ValueError):
        return {}


def _blocked_masks(pid: int) -> dict[str, int] | None:
    """Each thread's blocked signals before SIGUSR1 is sent (some threads block it for good), or None
    when ``/proc`` cannot tell."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    masks = {tid: _status_fields(pid, tid, ("SigBlk",)).get("SigBlk") for tid in tids}
    return {t: m for t, m in masks.items() if m is not None} or None


def _handler_running(pid: int, masks: dict[str, int]) -> bool | None:
    """Whether SIGUSR1 is still pending or being handled: the kernel blocks it in the thread that runs
    faulthandler's handler until the handler returns. None when ``/proc`` cannot tell."""
    seen = False
    for tid, before in masks.items():
        f = _status_fields(pid, tid, ("SigPnd", "ShdPnd", "SigBlk"))
        if not f:
            continue
        seen = True
        if (f.get("SigPnd", 0) | f.get("ShdPnd", 0)) & _USR1:
            return True
        if f.get("SigBlk", 0) & _USR1 and not before & _USR1:
            return True
    return None if not seen else False


def wait_for_dump(path: str, pid: int | None = None, masks: dict[str, int] | None = None) -> None:
    """Until faulthandler has finished writing the stack, at most ``STACK_WAIT_S``.

    With the process's thread masks (read before the signal was sent) the end is exact: the signal is
    no longer pending, no thread is inside the handler, and the file holds the dump. Without them, the
    dump is taken as complete once its size has not changed for ``STACK_STABLE_S``: faulthandler writes
    a dump in many small pieces, so a single unchanged reading 1 ms apart can fall in a pause of a busy
    child and cut the stack short."""
    deadline = time.monotonic() + STACK_WAIT_S
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        running = _handler_running(pid, masks) if pid is not None and masks else None
        if running is False and size:
            return
        now = time.monotonic()
        if size != last:
            last, since = size, now
        elif running is None and size and now - since >= STACK_STABLE_S:
            return
        time.sleep(0.0002 if running is not None else 0.001)
