"""A node replay's input, checked before anything runs: one clear line for each thing that is wrong.

:func:`plan` reads every option of :func:`~picklescope.investigate.node.parent.node_series` (the codecs,
the workload and its rows, workers and steps, dispatch, collector, transport, engine, budget and its
enforcement, the time limit) and either returns what the run needs (the workload, its payload, the
budget in bytes, where to make a cgroup) or raises a :class:`~picklescope.errors.PicklescopeError` that
names the problem and the way out. Nothing has been started when it raises.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from picklescope.codecs import get_codec
from picklescope.core import cgroup
from picklescope.core.units import parse_size
from picklescope.errors import PicklescopeError
from picklescope.workloads.spec import Workload, load_workload

DISPATCHES = ("chunk", "broadcast")
GC_MODES = ("default", "off", "each-step")
NODE_TRANSPORTS = ("ray-arg", "ray")
ENGINES = ("replica", "verl")
ENFORCEMENTS = ("watchdog", "cgroup", "ray")
MIN_TIMEOUT_S = 60.0
DEFAULT_SCALE = 0.25


@dataclass(frozen=True)
class Plan:
    """What a checked series of replays needs: its codecs, workload and payload, budget and cgroup base."""

    codecs: tuple[str, ...]
    gc_modes: tuple[str, ...]  # the collector of each replay, one per codec
    workload: Workload
    payload_bytes: int
    budget_bytes: int | None
    cgroup_base: str | None  # --enforcement cgroup: the directory to create the run's memory cgroup in


def check_options(codec: str, workers: int, steps: int, dispatch: str, gc_mode: str, transport: str,
                  returns: float | None, engine: str) -> None:
    """One codec's options (the codec exists, the counts and names are in range); bad input raises."""
    get_codec(codec)
    if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 64:
        raise PicklescopeError(f"--workers {workers!r} must be an integer from 1 to 64", "use e.g. --workers 4")
    if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= 1000:
        raise PicklescopeError(f"--steps {steps!r} must be an integer from 1 to 1000", "use e.g. --steps 4")
    for what, value, allowed in (("--dispatch", dispatch, DISPATCHES), ("--gc", gc_mode, GC_MODES),
                                 ("--transport", transport, NODE_TRANSPORTS), ("--engine", engine, ENGINES)):
        if value not in allowed:
            raise PicklescopeError(f"{what} {value!r} is not one of {', '.join(allowed)}", f"use {what} {allowed[0]}")
    if engine == "verl":
        if not codec.startswith("verl-"):
            raise PicklescopeError(f"--engine verl drives real verl's DataProto; {codec!r} is not a verl codec",
                                   "use e.g. --codec verl-0.9.1:numpy (picklescope verl list)")
        for what, value, needed in (("--dispatch", dispatch, "chunk"), ("--transport", transport, "ray-arg")):
            if value != needed:
                raise PicklescopeError(f"--engine verl runs verl's DP_COMPUTE_PROTO, which takes {what} {needed}, "
                                       f"not {value!r}", f"leave {what} out with --engine verl")
    if returns is not None and not (isinstance(returns, (int, float)) and 0 <= returns <= 16):
        raise PicklescopeError(f"--returns {returns!r} must be a multiple of the chunk payload from 0 to 16",
                               "use e.g. --returns 0.5, or leave it out for a small per-token result")


def check_timeout(timeout_s: Any) -> None:
    """A positive, finite ``--timeout``, long enough to start a node's processes and Ray."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not 0 < timeout_s < float("inf"):
        raise PicklescopeError(f"--timeout {timeout_s!r} must be a positive number of seconds",
                               "use e.g. --timeout 600")
    if timeout_s < MIN_TIMEOUT_S:  # the first child's start (the warm forkserver) cannot be cut short
        raise PicklescopeError(f"--timeout {timeout_s:g} is too short for a node replay: starting its processes "
                               "and Ray's takes tens of seconds on a busy machine",
                               f"use at least --timeout {MIN_TIMEOUT_S:g}")


def check_enforcement(enforcement: str, budget: int | None, ray_address: str | None) -> str | None:
    """The cgroup directory to create the run's memory cgroup in (``cgroup``), else None; bad input raises."""
    if enforcement not in ENFORCEMENTS:
        raise PicklescopeError(f"--enforcement {enforcement!r} is not one of {', '.join(ENFORCEMENTS)}",
                               "use --enforcement watchdog (the oom_score check), cgroup (the kernel) or ray "
                               "(Ray's memory monitor)")
    if enforcement == "watchdog":
        return None
    if budget is None:
        raise PicklescopeError(f"--enforcement {enforcement} needs a --node-budget (where it kills, above the "
                               "node's baseline)", "add e.g. --node-budget 2x")
    if ray_address:
        raise PicklescopeError(f"--enforcement {enforcement} puts the cluster it starts in a cgroup; a joined "
                               "cluster's processes are not its children",
                               f"leave --ray-address out with --enforcement {enforcement}")
    cgroup.remove_stale_everywhere()
    base, why = cgroup.support()
    if base is None:
        raise PicklescopeError(f"--enforcement {enforcement} is unavailable here: {why}",
                               "use --enforcement watchdog (picklescope kills the highest oom_score itself)")
    if enforcement == "ray":
        ok, why = cgroup.can_view_as_root()
        if not ok:  # Ray's monitor reads the cgroup at /sys/fs/cgroup/memory only: it must be shown there
            raise PicklescopeError(f"--enforcement ray is unavailable here: {why}",
                                   "use --enforcement cgroup (the kernel) or watchdog")
    return base


def plan(codecs: Sequence[str], workload: str, scale: float, workers: int, steps: int, *, returns: float | None,
         dispatch: str, gc: str | Sequence[str], transport: str, node_budget: Any, ray_address: str | None,
         worker_resources: dict[str, float] | None, spread: bool, engine: str, enforcement: str,
         timeout_s: float) -> Plan:
    """Every option of a series of replays checked, in the order a user reads them; see the module doc.

    ``gc`` is one collector mode for every replay, or one per codec (a series that compares the
    collectors on the same processes)."""
    codecs = tuple(codecs)
    check_timeout(timeout_s)
    if not codecs:
        raise PicklescopeError("a node series needs at least one codec", "name one, e.g. ('numpy-legacy', 'numpy')")
    gc_modes = tuple(gc) if isinstance(gc, (list, tuple)) else (gc,) * len(codecs)
    if len(gc_modes) != len(codecs):
        raise PicklescopeError(f"a node series of {len(codecs)} codec(s) got {len(gc_modes)} collector mode(s)",
                               "give one mode for every replay (gc='off') or one per codec")
    # one real verl codec may repeat (its collector modes compared on the same processes, which loaded its
    # verl once); a switch to another codec cannot happen where a verl codec is in the series
    switches_verl = len(set(codecs)) > 1 and any(c.startswith("verl-") for c in codecs)
    if len(codecs) > 1 and (engine != "replica" or switches_verl):
        raise PicklescopeError("a node series switches codecs inside its processes, which real verl's codecs "
                               "cannot (each loads its own verl)", "run picklescope node once per verl codec")
    if len(codecs) > 1 and enforcement == "ray":  # Ray's threshold is fixed at start-up on one watched cgroup
        raise PicklescopeError("--enforcement ray watches one cgroup from the first replay's baseline, so a series' "
                               "later replays would start above it", "run picklescope node once per codec")
    for codec, gc_mode in zip(codecs, gc_modes):
        check_options(codec, workers, steps, dispatch, gc_mode, transport, returns, engine)
    wl = load_workload(workload)
    payload = wl.payload_bytes(scale)
    rows = wl.rows(scale)
    if dispatch == "chunk" and rows < workers:
        raise PicklescopeError(f"{rows} rows cannot be chunked among {workers} workers",
                               "use fewer workers or a larger --scale")
    if any(c.startswith("verl-") for c in codecs) and dispatch == "chunk" and rows % workers:
        raise PicklescopeError(f"verl's DataProto.chunk needs the {rows} rows to divide among {workers} workers",
                               "choose a worker count that divides the batch")
    if engine == "verl" and (worker_resources or spread):
        raise PicklescopeError("--engine verl places its workers with verl's RayResourcePool (one CPU bundle each)",
                               "leave --worker-resources and --spread out with --engine verl")
    budget = None if node_budget is None else parse_size(node_budget, "--node-budget").resolve(payload)
    if budget is not None and budget <= 0:
        raise PicklescopeError(f"--node-budget {node_budget!r} must be positive", "use e.g. --node-budget 1.5x")
    return Plan(codecs, gc_modes, wl, payload, budget, check_enforcement(enforcement, budget, ray_address))

