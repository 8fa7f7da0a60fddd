"""``--enforcement cgroup``: the whole cluster in one memory cgroup, and the kernel's OOM killer as the enforcer.

With ``--enforcement ray`` (the functions at the end) the cluster is born in a start cgroup and moves,
at the baseline, into a watched cgroup that the raylet sees as the machine's own (a private mount
namespace, :func:`picklescope.core.cgroup.view_as_root`), so Ray's memory monitor reads the node's
usage above the baseline against a limit set so that it fires at the budget, before the kernel does.

The driver joins the cgroup before Ray starts (every process of the cluster is born inside it); at
the node's baseline the parent caps it at what it holds then plus the budget (:func:`limit`); when
the kernel's OOM killer fires, :func:`record_kill` finds which process it took and when, and at the
end :func:`remove` reads the cgroup's counters, kills what is left in it and removes it.
"""

from __future__ import annotations

import math
import os
import re
import time
from typing import Any

from picklescope.core import cgroup
from picklescope.core.kill import Kill
from picklescope.investigate.node.result import NodeResult
from picklescope.investigate.node.tracking import Tracking
from picklescope.measure.session import Session
from picklescope.ray.cluster import running, start_ticks


def limit(path: str, budget: int) -> dict[str, Any]:
    """Cap the cgroup at what it holds now (the node's baseline) plus ``budget``; swap counted too."""
    usage, cap = cgroup.limit_above_usage(path, budget)
    return {"baseline_usage_bytes": usage, "limit_bytes": cap}


def _alive(pid: int) -> bool:
    ticks = start_ticks(pid)
    return ticks is not None and running(pid, ticks)


def _seen_until(session: Session, name: str) -> float:
    """When ``name`` was last sampled (infinity for a process the session does not sample)."""
    r = session.processes.get(name)
    return r.timeline.t_s[-1] if r is not None and r.timeline.t_s else math.inf


def _before_fall(session: Session, name: str, last: float) -> float:
    """When to read the node for a kill of ``name`` whose last sample was at ``last``: the start of the
    strictly falling samples that end its curve.

    A killed process does not vanish from ``/proc`` at once: while the kernel tears its memory down
    (the OOM reaper, its exit), its samples fall, well below its own baseline at the end. The node
    total on its last sample then counts the node above its baseline as negative. The moment before
    that fall is the node as the killer found it."""
    rec = session.processes.get(name)
    if rec is None or not rec.timeline.t_s:
        return last
    t_s, values = rec.timeline.t_s, rec.timeline.bytes
    i = len(values) - 1
    while i > 0 and t_s[i] > last:
        i -= 1
    while i > 0 and values[i - 1] > values[i]:
        i -= 1
    return t_s[i]


def _vanished(session: Session, name: str) -> bool:
    """Whether ``name``'s samples ended before the node's latest tick: its memory was gone (a process
    being torn down, or a zombie, has none to read) although it may still be listed, even in the cgroup."""
    rec = session.processes.get(name)
    return bool(rec is not None and rec.timeline.t_s and session.node.t_s
                and rec.timeline.t_s[-1] < session.node.t_s[-1])


def _moment(session: Session, at: float) -> tuple[dict[str, int], int]:
    """Each process's memory (those still sampled then) and the store's at ``at``; the node above its baseline."""
    memory = {name: session.value_at(r.timeline, at) or 0 for name, r in session.processes.items()
              if r.timeline.t_s and r.timeline.t_s[-1] >= at}
    memory["store"] = session.value_at(session.store, at) or 0
    return memory, (session.value_at(session.node, at) or 0) - (session.node_baseline or 0)


def _node_kill(session: Session, tracking: Tracking, victim: str, pid: int, t: float, last: float,
               in_step: bool = True, *, by: str, message: str | None = None) -> Kill:
    """The node's kill record, whoever killed (the kernel's OOM killer or Ray's monitor): the victim, the
    step it died in (closed since or not: it is read after the fact; none when ``in_step`` is false, for a
    victim Ray did not name as one of the run's processes) and what each process and the node held just
    before the victim's memory fell away (``last``: when the victim was last seen)."""
    step, step_of = session.step_at_kill(victim, at=last) if in_step else (None, None)
    memory, node_now = _moment(session, _before_fall(session, victim, last))
    return Kill(process=victim, t_s=t, budget_bytes=int(tracking.budget or 0), pid=pid, node_bytes=node_now,
                training_step=session.current_training_step(last), step=step, step_of=step_of,
                memory_bytes=memory, by=by, message=message)


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
    # a process whose memory is already gone counts as dead though it is still listed: else a process that
    # vanished later is taken for the victim, and the node read then lacks the first one (a negative figure)
    dead = [name for name, pid in named.items()
            if _vanished(session, name) or (pid not in inside and not _alive(pid))]
    if not dead:
        return

    # the first to vanish is the one the killer chose; the others died of it (Ray ends a dead worker's
    # driver, a dead raylet's workers). A Ray core process is not sampled: it is taken when no sampled one died.
    victim = min(dead, key=lambda name: _seen_until(session, name))
    rec = session.processes.get(victim)
    # what the node held just before the victim's memory fell away (once it is gone, it is gone from the total)
    if rec is not None and rec.timeline.t_s:
        last = rec.timeline.t_s[-1]
    else:  # a process the session does not sample (a Ray core process): when the driver was last seen, since
        # the driver ends soon after such a death and the node's latest tick would hold only the store
        driver = session.processes.get("driver")
        last = (driver.timeline.t_s[-1] if driver is not None and driver.timeline.t_s
                else (session.node.t_s or [t])[-1])
    session.kill = _node_kill(session, tracking, victim, named[victim], t, last, by="kernel")
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


# -- --enforcement ray: Ray's own memory monitor chooses and kills ----------------------------------
# The run's RAY_memory_usage_threshold (the user's own value is used when set). Not Ray's default 0.95:
# the kernel's limit is the budget / threshold, and at 0.95 the 5% between them is less than one chunk's
# write, which the kernel then sees before a 50 ms poll of Ray's monitor does (measured: the kernel killed
# the driver in an object-store write). At 0.5 the kernel's limit is twice the budget.
RAY_THRESHOLD = 0.5
RAY_REFRESH_MS = "50"  # Ray's default is 250 ms: a short one so the monitor acts before the kernel's limit
RAY_KILL_TYPES = ("OutOfMemoryError",)
_WORKER_ID = re.compile(r"Ray killed this worker \(ID: ([0-9a-f]+)\)")  # Ray before 2.56
_SELECTED = re.compile(r"Selected to kill: \((.*?)\)\s*$", re.M)  # Ray 2.56+: one line per worker it chose
_TOP_ROW = re.compile(r"^\s*(\d+)\s+([0-9.]+)\s+(\S.*)$")


def ray_threshold(env: dict[str, str]) -> float:
    """The fraction of the node's memory at which Ray's monitor kills: the user's ``RAY_memory_usage_threshold``
    if set and valid, else Ray's default."""
    try:
        value = float(env.get("RAY_memory_usage_threshold", RAY_THRESHOLD))
    except ValueError:
        return RAY_THRESHOLD
    return value if 0.0 < value < 1.0 else RAY_THRESHOLD


def ray_limit(budget: int, threshold: float) -> int:
    """The watched cgroup's limit: Ray's monitor fires at ``threshold`` x the limit = the budget, and the
    kernel's OOM killer only above it (at the limit itself), so Ray's policy decides first."""
    return int(math.ceil(budget / threshold))


def is_ray_kill(ev: dict[str, Any]) -> bool:
    """Whether a process's error is Ray's memory monitor killing a worker (the caller's ``ray.get`` raised)."""
    message = str(ev.get("message") or "")
    return ev.get("exc_type") in RAY_KILL_TYPES or "low on memory" in message or "memory monitor" in message


def ray_victim(message: str) -> dict[str, Any]:
    """What Ray's message says about the kill: the worker's id, the pid and task it selected (Ray 2.56+),
    and the "Top 10 memory users" rows."""
    found = _WORKER_ID.search(message)
    selected = _SELECTED.search(message)
    worker_id = found.group(1) if found else None
    pid = task = None
    if selected:
        text = selected.group(1)
        for key, pattern in (("pid", r"pid=(\d+)"), ("task", r"task name=([^,]+)"), ("id", r"worker ID=([0-9a-f]+)")):
            m = re.search(pattern, text)
            if m and key == "pid":
                pid = int(m.group(1))
            elif m and key == "task":
                task = m.group(1).strip()
            elif m:
                worker_id = m.group(1)
    top = []
    in_table = False
    for line in message.splitlines():
        if "PID" in line and "MEM" in line:
            in_table = True
            continue
        m = _TOP_ROW.match(line) if in_table else None
        if m:
            top.append({"pid": int(m.group(1)), "gb": float(m.group(2)), "command": m.group(3).strip()})
        elif in_table and line.strip():
            in_table = False
    return {"worker_id": worker_id, "pid": pid, "task": task, "top_memory_users": top}


def record_ray_kill(session: Session, result: NodeResult, tracking: Tracking, ev: dict[str, Any]) -> bool:
    """The driver's ``ray.get`` raised Ray's OutOfMemoryError: record the victim as Ray named it, the
    training step, and what every process held then. True if recorded."""
    if session.kill is not None or not is_ray_kill(ev):
        return False
    message = str(ev.get("message") or "")
    said = ray_victim(message)
    t = round(time.monotonic() - session.t0, 6)
    named = {name: rec.pid for name, rec in session.processes.items()}
    by_pid = {pid: name for name, pid in named.items()}
    # the driver script is never Ray's victim, but a controller actor (--controller actor) can be
    dead = [name for name, pid in named.items()
            if (name != "driver" or result.controller == "actor") and (_vanished(session, name) or not _alive(pid))]
    listed = [by_pid[p] for p in [said["pid"]] + [row["pid"] for row in said["top_memory_users"]] if p in by_pid]

    first_gone = min(dead, key=lambda name: _seen_until(session, name)) if dead else None
    victim = first_gone or (listed[0] if listed else "a Ray worker")
    rec = session.processes.get(victim)
    last = rec.timeline.t_s[-1] if rec is not None and rec.timeline.t_s else t
    session.kill = _node_kill(session, tracking, victim, named.get(victim, 0), t, last, in_step=rec is not None,
                              by="ray", message=message)
    result.cgroup["killed_by"] = "Ray's memory monitor"
    result.cgroup["ray_worker_id"] = said["worker_id"]
    result.cgroup["ray_selected"] = {"pid": said["pid"], "task": said["task"],
                                     "process": by_pid.get(said["pid"]) if said["pid"] else None}
    result.cgroup["ray_top_memory_users"] = said["top_memory_users"]
    if len(dead) > 1:
        result.notes.append("also gone when Ray's memory monitor fired: " + ", ".join(n for n in dead if n != victim))
    return True
