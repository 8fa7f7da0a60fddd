"""What the sampling thread of :class:`picklescope.measure.session.Session` needs from the parent process.

The session samples its processes from a thread of the parent at about 1 ms. Two things keep that
thread on time: a raised scheduling priority (:func:`raise_priority`) and a garbage collector that
skips the parent's existing objects while it runs (:func:`hold_gc`).
"""

from __future__ import annotations

import gc
import os
import threading

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
