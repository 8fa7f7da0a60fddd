"""Starting a local Ray cluster on a busy machine: one policy for every caller, one sentence when it fails.

A cluster of our own (``ray.init(address="local")`` in a driver, or ``ray start --head`` for a
:class:`~picklescope.ray.local_cluster.LocalCluster`) starts gcs_server, a raylet (which
holds the object store) and two agents. On an idle 2-core machine that takes seconds; at a load
average of 10 it can take minutes, and Ray's own waits are fixed (the driver gives the raylet 30 s to
register with the GCS). So every start-up here follows one policy:

- up to :data:`TRIES` tries, each bounded by :data:`TRY_TIMEOUT_S`, all of them together by
  :data:`START_BUDGET_S` and by what is left of the run's own limit, so a start-up never runs the run
  past its ``--timeout``. A failed try usually ends early (the raylet aborts when its dashboard agent
  has not written its port file within Ray's fixed 15 s, and the watch below sees it within a second),
  so on a busy machine several tries fit where one long one would not: each is a new draw of how
  fast the agent's imports get the CPU;
- while a try runs, the core processes are watched (:class:`ComponentWatch`): one that dies is
  noticed within a second and named ("the raylet died 0:41 into start-up"), instead of waiting out
  Ray's timeout;
- when every try fails, :class:`RayStartError` says so in one sentence, with the reason and the
  machine's load average. It is a :class:`~picklescope.errors.PicklescopeError`, raised in the caller's
  process the same way for every caller (``run --transport ray``, ``node``, a ``LocalCluster``).

This module imports only the standard library, :mod:`picklescope.errors` and :mod:`.cluster`, so the
parent (which never imports Ray) uses it too.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Callable, Iterable

from picklescope.errors import PicklescopeError
from picklescope.ray import cluster

TRIES = 4  # up to three retries, while START_BUDGET_S lasts
TRY_TIMEOUT_S = 150.0  # one try at most: a loaded 2-core machine has started Ray in 30-90 s
START_BUDGET_S = 300.0  # all tries together when the caller sets no limit (two full tries' worth)
MIN_TRY_S = 15.0  # a retry with less time than this left is not started
# The core processes of a Ray node, by a part of their command line, and how a message names them.
# The object store lives inside the raylet; each agent is fate-shared with it (the raylet exits when
# one dies). The dashboard, log monitor and autoscaler monitor are not needed to run tasks.
COMPONENTS = (
    ("/gcs/gcs_server", "the GCS (gcs_server)"),
    ("/raylet/raylet", "the raylet (with the object store)"),
    ("dashboard/agent.py", "the dashboard agent"),
    ("runtime_env/agent/main.py", "the runtime-env agent"),
)
_CORE = 2  # COMPONENTS before this index are the cluster's core processes, the rest the raylet's agents
AGENT_GRACE_S = 1.0  # how long a dead agent waits for its raylet's or the GCS's end to show (ComponentWatch.poll)


def _rank(label: str) -> int:
    """Where a component's name stands in :data:`COMPONENTS` (the GCS first)."""
    return next((i for i, (_, name) in enumerate(COMPONENTS) if name == label), len(COMPONENTS))


LOCAL_CLUSTER = "the local Ray cluster"  # the subject of RayStartError's sentence when a run starts its own
DID_NOT_START = f"{LOCAL_CLUSTER} did not start"  # how that sentence begins, for a caller that reads the line

WAY_OUT = ("try again when the machine is less busy, give the run more time with --timeout, or start a cluster "
           "once with 'ray start --head' and pass --ray-address")


def load_average() -> float | None:
    """The machine's 1-minute load average (None where the system does not say)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def clock(seconds: float) -> str:
    """``m:ss``, for "died 1:40 into start-up"."""
    s = max(0, int(round(seconds)))
    return f"{s // 60}:{s % 60:02d}"


class RayStartError(PicklescopeError):
    """The local Ray cluster did not start: one sentence with why, how long was tried, and the load.

    ``reasons`` holds one short reason per try; ``log`` whatever Ray printed (kept for a reader who
    wants it, never printed by the toolkit)."""

    def __init__(self, seconds: float, reasons: list[str], load: float | None = None, log: str = "",
                 what: str = LOCAL_CLUSTER) -> None:
        self.seconds, self.reasons, self.load, self.log, self.what = seconds, list(reasons), load, log, what
        tries = f"{len(reasons)} {'try' if len(reasons) == 1 else 'tries'}"
        why = f"; {reasons[-1]}" if reasons else ""
        where = f"; the machine's load average was {load:.1f}" if load is not None else ""
        super().__init__(f"{what} did not start within {seconds:.0f} s ({tries}){why}{where}", WAY_OUT)

    def __reduce__(self) -> tuple:  # crosses process boundaries whole (the driver -> the parent)
        return (RayStartError, (self.seconds, self.reasons, self.load, self.log, self.what))


def short_reason(exc: BaseException) -> str:
    """One line for a failed try: Ray's start-up exceptions run to many lines and name internals."""
    text = str(exc).strip()
    if "timed out during startup" in text:
        return "Ray's node timed out during startup (the raylet did not register with the GCS within Ray's fixed 30 s)"
    first = text.splitlines()[0] if text else type(exc).__name__
    return first if len(first) <= 160 else first[:157] + "..."


def raylet_said(temp_dir: str | None) -> str | None:
    """Why the raylet of a session under ``temp_dir`` aborted, from the fatal line of its own log, in words.

    On a busy machine the usual one: the raylet waits a fixed 15 s for its dashboard agent to write its
    port file, and aborts when the agent (a Python process importing Ray's dashboard) is slower."""
    if not temp_dir:
        return None
    logs = sorted(glob.glob(os.path.join(temp_dir, "session_*", "logs", "raylet.out")), key=os.path.getmtime)
    if not logs:
        return None
    try:
        with open(logs[-1], "rb") as f:
            f.seek(max(0, os.fstat(f.fileno()).st_size - 65536))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    fatal = [ln for ln in lines if "Check failed" in ln or " C " in ln[:40]]
    if not fatal:
        return None
    line = fatal[-1]
    if "Timed out waiting for file" in line and "agent_port" in line:
        return "it gave up waiting for its dashboard agent to start (Ray allows 15 s)"
    text = line.split("Check failed:", 1)[-1].strip()
    return text if len(text) <= 120 else text[:117] + "..."


def try_budgets(left_s: float | None) -> Iterable[float]:
    """How long each try may take, given ``left_s`` seconds before the caller's own limit (None: none but
    :data:`START_BUDGET_S`).

    Each try gets up to :data:`TRY_TIMEOUT_S` of what is left; a retry is made while at least
    :data:`MIN_TRY_S` is left, up to :data:`TRIES` tries in all."""
    start = time.monotonic()
    total = START_BUDGET_S if left_s is None else min(float(left_s), START_BUDGET_S)
    for i in range(TRIES):
        left = total - (time.monotonic() - start)
        if i and left < MIN_TRY_S:
            return
        yield max(1.0, min(TRY_TIMEOUT_S, left))


class ComponentWatch:
    """The core processes of one cluster (:data:`COMPONENTS`), and the first one that died.

    ``scan`` lists the cluster's live pids (for example :func:`.cluster.cluster_processes` of the
    driver's session). :meth:`poll` adds newly started components and returns the name of one that
    was seen alive and has ended since (a zombie has), else None."""

    def __init__(self, scan: Callable[[], Iterable[int]], t0: float | None = None) -> None:
        self.scan = scan
        self.t0 = time.monotonic() if t0 is None else t0
        self.seen: dict[int, tuple[str, int | None]] = {}  # pid -> (name, start ticks)
        self.died: tuple[str, float] | None = None  # (name, seconds after t0)

    def add(self, pids: Iterable[int], name: str | None = None) -> None:
        """Watch ``pids`` (named by their command line unless ``name`` is given)."""
        for pid in pids:
            if pid in self.seen:
                continue
            label = name or self._name(pid)
            if label:
                self.seen[pid] = (label, cluster.start_ticks(pid))

    @staticmethod
    def _name(pid: int) -> str | None:
        cmd = cluster._cmdline(pid)
        for part, label in COMPONENTS:
            if part in cmd:
                return label
        return None

    def poll(self) -> str | None:
        """The name of a watched component that has died (remembered with when), else None.

        Components die together: the raylet's agents end with it, and the GCS's end takes the raylet down.
        What ended them is named: of those found dead, the first in :data:`COMPONENTS`' order; where only
        agents are, the raylet and the GCS get :data:`AGENT_GRACE_S` to show whether they ended too (a
        raylet that gives up on its agent stops its other agent a moment before it exits itself)."""
        if self.died is not None:
            return self.died[0]
        dead = self._dead()
        if dead:
            noticed = time.monotonic() - self.t0
            until = time.monotonic() + AGENT_GRACE_S
            while min(map(_rank, dead)) >= _CORE and time.monotonic() < until:
                time.sleep(0.05)
                dead = self._dead()
            first = min(dead, key=_rank)
            self.died = (first, noticed)
            return first
        try:
            self.add(self.scan())
        except OSError:
            pass
        return None

    def _dead(self) -> list[str]:
        return [label for pid, (label, ticks) in self.seen.items() if not cluster.running(pid, ticks)]

    def sentence(self, phase: str) -> str | None:
        """"the raylet (with the object store) died 1:40 into start-up", once one has died."""
        if self.died is None:
            return None
        return f"{self.died[0]} died {clock(self.died[1])} into {phase}"
