"""``--enforcement cgroup``: the whole cluster in one memory cgroup, and the kernel's OOM killer as the enforcer.

The driver joins the cgroup before Ray starts (every process of the cluster is born inside it); at
the node's baseline the parent caps it at what it holds then plus the budget (:func:`limit`); when
the kernel's OOM killer fires, :func:`record_kill` finds which process it took and when, and at the
end :func:`remove` reads the cgroup's counters, kills what is left in it and removes it.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from picklescope.core import cgroup
from picklescope.investigate.node.result import NodeResult
from picklescope.investigate.node.tracking import Tracking
from picklescope.measure.session import KillRecord, Session
from picklescope.transports.ray.cluster import running, start_ticks


def limit(path: str, budget: int) -> dict[str, Any]:
    """Cap the cgroup at what it holds now (the node's baseline) plus ``budget``; swap counted too."""
    usage, cap = cgroup.limit_above_usage(path, budget)
    return {"baseline_usage_bytes": usage, "limit_bytes": cap}


def _alive(pid: int) -> bool:
    ticks = start_ticks(pid)
    return ticks is not None and running(pid, ticks)


def record_kill(session: Session, result: NodeResult, tracking: Tracking) -> None:
    """After the kernel's OOM killer fired in the run's cgroup: record which process it killed, and when."""
    path = tracking.cgroup
    if path is None or session.kill is not None or tracking.limit is None:
        return
    if cgroup.counters(path).get("oom_kill", 0) <= 0:
        return
    t = round(time.monotonic() - session.t0, 6)
    inside = set(cgroup.procs(path))
    named = {name: rec.pid for name, rec in session.processes.items()}
    for role, pids in tracking.cluster_pids.items():
        for pid in pids:
            named.setdefault(f"{role} ({pid})" if len(pids) > 1 else role, pid)
    dead = [name for name, pid in named.items() if pid not in inside and not _alive(pid)]
    if not dead:
        return

    def seen_until(name: str) -> float:
        r = session.processes.get(name)
        return r.timeline.t_s[-1] if r is not None and r.timeline.t_s else math.inf

    # the first to vanish is the one the killer chose; the others died of it (Ray ends a dead worker's
    # driver, a dead raylet's workers). A Ray core process is not sampled: it is taken when no sampled one died.
    victim = min(dead, key=seen_until)
    rec = session.processes.get(victim)
    # what the node held on the victim's last sample (once it is gone, its memory is gone from the total)
    if rec is not None and rec.timeline.t_s:
        last = rec.timeline.t_s[-1]
    else:  # a process the session does not sample (a Ray core process): when the driver was last seen, since
        # the driver ends soon after such a death and the node's latest tick would hold only the store
        driver = session.processes.get("driver")
        last = (driver.timeline.t_s[-1] if driver is not None and driver.timeline.t_s
                else (session.node.t_s or [t])[-1])
    step, step_of = session.step_at_kill(victim, at=last)  # the step it died in, closed since or not
    memory = {}
    for name, r in session.processes.items():
        if r.timeline.t_s and r.timeline.t_s[-1] >= last:
            memory[name] = session.value_at(r.timeline, last) or 0
    memory["store"] = session.value_at(session.store, last) or 0
    node_now = (session.value_at(session.node, last) or 0) - (session.node_baseline or 0)
    session.kill = KillRecord(victim, named[victim], t, node_now, int(tracking.budget or 0),
                              session.current_training_step(last), step, {}, memory, step_of=step_of)
    result.cgroup["killed_by"] = "the kernel's OOM killer in the run's memory cgroup"
    if len(dead) > 1:
        others = ", ".join(n for n in dead if n != victim)
        result.notes.append(f"also gone when the cgroup's OOM killer fired: {others}")


def remove(path: str, result: NodeResult) -> None:
    """The cgroup's counters into the result, whatever is left in it killed, the cgroup removed."""
    result.cgroup.update(cgroup.counters(path))
    left = cgroup.kill_all(path)
    if left:
        result.cgroup["killed_at_end"] = left
    cgroup.remove(path)
    result.cgroup["removed"] = not os.path.exists(path)
