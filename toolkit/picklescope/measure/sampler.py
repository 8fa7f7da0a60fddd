"""RSS of the child processes sampled from the parent at about 1 ms.

The sampler is a thread of the parent, which only waits on pipes, so unlike a thread inside the
measured process it is never starved by a long ``pickle.dumps`` holding that process's GIL. Watchers
(the budget watchdog) see every sample as it is taken.
"""

from __future__ import annotations

import gc
import os
import threading
import time
from collections.abc import Callable

from picklescope.core.procmem import StatmReader
from picklescope.core.result import Timeline

Watcher = Callable[[str, float, int], None]
RT_PRIORITY = 10


def raise_priority() -> str:
    """Let this thread run ahead of busy processes; returns how ("realtime", "raised" or "normal").

    On a 2-core machine the measured child (and its OpenMP threads) keep both cores busy, and an
    ordinary thread waking from its 1 ms sleep can wait 20-100 ms for a core under load. A
    SCHED_FIFO thread that sleeps between short reads takes a core at once and cannot starve
    anything; where that is not permitted a lower nice value helps, and otherwise nothing changes.
    """
    tid = threading.get_native_id()
    try:
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(RT_PRIORITY))
        return "realtime"
    except (OSError, AttributeError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, tid, -10)
        return "raised"
    except OSError:
        return "normal"


_gc_lock = threading.Lock()
_gc_holders = 0


def hold_gc(hold: bool) -> None:
    """Freeze the objects that exist while any sampler runs, so garbage collection skips them.

    A full collection in a parent with a big heap (a Jupyter kernel, pytest with plotly loaded:
    ~250 ms for 180k objects) holds the GIL and would stop the sampling thread for that long. Frozen
    objects are not scanned; they return to the collector when the last sampler stops.
    """
    global _gc_holders
    with _gc_lock:
        if hold:
            if _gc_holders == 0:
                gc.freeze()
            _gc_holders += 1
        else:
            _gc_holders = max(0, _gc_holders - 1)
            if _gc_holders == 0:
                gc.unfreeze()


class Sampler:
    """Samples every registered process until stopped; one :class:`Timeline` per name."""

    def __init__(self, t0: float, interval_s: float = 0.001) -> None:
        self.t0 = t0
        self.interval_s = interval_s
        self.timelines: dict[str, Timeline] = {}
        self.watchers: list[Watcher] = []
        self.priority = "normal"  # set by the sampling thread: see raise_priority()
        self._gc_held = False
        self._readers: dict[str, StatmReader] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="picklescope-sampler", daemon=True)

    def start(self) -> Sampler:
        hold_gc(True)
        self._gc_held = True
        self._thread.start()
        return self

    def add(self, name: str, pid: int) -> None:
        try:
            reader = StatmReader(pid)
        except OSError:
            return
        with self._lock:
            self._readers[name] = reader
            self.timelines.setdefault(name, Timeline())

    def remove(self, name: str) -> None:
        with self._lock:
            reader = self._readers.pop(name, None)
        if reader:
            reader.close()

    def _loop(self) -> None:
        self.priority = raise_priority()
        while not self._stop.is_set():
            with self._lock:
                readers = list(self._readers.items())
            for name, reader in readers:
                value = reader.read()
                t = time.monotonic() - self.t0
                if value is None:
                    self.remove(name)
                    continue
                tl = self.timelines[name]
                tl.t_s.append(round(t, 6))
                tl.rss_bytes.append(value)
                for w in self.watchers:
                    w(name, t, value)
            time.sleep(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for name in list(self._readers):
            self.remove(name)
        if self._gc_held:
            self._gc_held = False
            hold_gc(False)


# Old private names, kept while the modules named below still import them; use the public names.
