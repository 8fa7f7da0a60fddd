"""Memory budgets: how much a side may spend above its baseline, and who enforces the limit.

The failure being reproduced is a node killed for host RAM: SIGKILL, no Python exception. A budget
recreates that on demand without endangering the machine. It is given per side, as bytes
(``700MiB``) or as a multiple of the payload (``1.5x``, the question an engineer actually asks), and
counts from the side's baseline after its setup, like every other number in a run.

Three enforcements exist, because machines differ in what they allow:

- ``watchdog`` (default, works everywhere): the parent's sampler checks each side's RSS, its
  kernel high-water mark and every exact step peak, and sends SIGUSR1 (the child dumps its Python
  stack) then SIGKILL the moment the side crosses its budget.
- ``cgroup``: the side moves itself into a memory cgroup (v1) under the parent's own cgroup with
  the limit set, and the kernel's OOM killer does the killing, exactly as on the node. Only where the
  process may create such a cgroup; otherwise the run says why and falls back to the watchdog.
- ``address-space``: ``RLIMIT_AS`` on the side, the way ``ulimit -v`` clusters fail: allocations
  raise instead of being killed, and torch's misleading messages are classified as out-of-memory.

This module decides and prepares; :mod:`picklescope.measure.watchdog` kills, :mod:`picklescope.measure.verdicts`
explains.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Any

from picklescope.core import cgroup, procmem
from picklescope.core.childconfig import ChildConfig, ChildLimits
from picklescope.core.units import GiB, MiB, Size, fmt_bytes, parse_size
from picklescope.errors import PicklescopeError

ENFORCEMENTS = ("watchdog", "cgroup", "address-space")
_run_ids = itertools.count(1)  # run cgroups of one process never share a name, even from two threads
SIDES = ("sender", "receiver")


def machine_reserve(total_bytes: int) -> int:
    """Memory kept free for the parent, the Jupyter kernel and the user's other work.

    A budget may not eat into it, and the watchdog's machine guard kills a side before the machine's
    available memory falls below it, budget or not.
    """
    return max(512 * MiB, min(2 * GiB, total_bytes // 16))


@dataclass
class Limits:
    """The resolved budgets of one run and how they are enforced."""

    budgets: dict[str, int | None]  # bytes above each side's baseline; None: no budget
    specs: dict[str, str | None]  # as given ("0.5x", "700MiB", "total:2 GiB")
    enforcement: str = "watchdog"
    note: str = ""  # why this enforcement (e.g. why not the cgroup that was asked for)
    cgroups: dict[str, str] = field(default_factory=dict)  # side -> cgroup directory (cgroup mode)
    guard_floor_bytes: int = 0  # the machine guard fires below this much available memory
    # whole-process limits (``total:2GiB``): turned into ``budgets`` once each side's baseline is known
    totals: dict[str, int | None] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        return any(b is not None for b in [*self.budgets.values(), *self.totals.values()])

    def for_child(self) -> ChildLimits:
        """What a child needs to apply its own limit (cgroup and address-space modes)."""
        return ChildLimits(enforcement=self.enforcement, budgets=dict(self.budgets), cgroups=dict(self.cgroups),
                           totals=dict(self.totals))

    def arm_total(self, side: str, baseline_bytes: int) -> int | None:
        """Turn a whole-process limit into a budget above the measured baseline.

        Returns the budget, or ``None`` when the limit is at or below the baseline: the side cannot
        even hold its batch under it, so a run would only report an instant kill that says nothing
        about the codec (:class:`BudgetBelowBaseline` explains).
        """
        total = self.totals.get(side)
        if total is None:
            return self.budgets.get(side)
        if total <= baseline_bytes:
            return None
        self.budgets[side] = total - baseline_bytes
        return self.budgets[side]

    def cleanup(self) -> dict[str, dict[str, int]]:
        """Remove the run's cgroups (their processes have exited); returns their OOM counters and charges
        (:func:`picklescope.core.cgroup.counters`), read before the caller removes the run directory."""
        counters = {}
        for side, path in self.cgroups.items():
            counters[side] = cgroup.counters(path)
            if self.budgets.get(side) is not None:  # the limit was "charged at join + budget"
                counters[side]["budget_bytes"] = int(self.budgets[side])
            cgroup.remove(path)
        self.cgroups = {}
        return counters


class BudgetBelowBaseline(PicklescopeError):
    """A whole-process limit under what the side holds before its first measured step."""

    def __init__(self, side: str, total: int, baseline: int) -> None:
        super().__init__(
            f"{side} budget total:{fmt_bytes(total)} is below the {side}'s baseline of {fmt_bytes(baseline)} "
            "(interpreter, torch and the built batch, measured in the child before any step)",
            f"give a total above {fmt_bytes(baseline)}, or a budget above the baseline like 0.5x or 200MiB",
        )


def _resolve(spec: Any, payload: int, what: str) -> tuple[int | None, str | None, int | None]:
    """(bytes above baseline, the spec as text, whole-process bytes) of one side's budget."""
    if spec is None:
        return None, None, None
    size = spec if isinstance(spec, Size) else parse_size(spec, what)
    if size.total:
        return None, str(size), size.resolve(payload)
    return max(1, size.resolve(payload)), str(size), None


def check_machine(budgets: dict[str, int | None], machine: dict[str, int] | None = None) -> None:
    """Refuse, before any child starts, budgets the machine cannot give without risking the parent."""
    machine = machine or procmem.machine_memory()
    avail, total = machine["available"], machine["total"]
    if not avail:
        return
    reserve = machine_reserve(total)
    room = avail - reserve
    for side, b in budgets.items():
        if b is not None and b > room:
            raise PicklescopeError(
                f"{side} budget {fmt_bytes(b)} is more than this machine can give: {fmt_bytes(avail)} "
                f"available and {fmt_bytes(reserve)} kept free for everything else",
                f"use a budget under {fmt_bytes(max(room, 0))} or a smaller --scale",
            )
    both = sum(b for b in budgets.values() if b is not None)
    if both > room:
        raise PicklescopeError(
            f"sender and receiver budgets together ({fmt_bytes(both)}) are more than this machine can "
            f"give ({fmt_bytes(avail)} available, {fmt_bytes(reserve)} kept free)",
            "lower one of the budgets",
        )


def plan(budget: Any = None, receiver_budget: Any = None, payload: int = 0,
         enforcement: str = "watchdog") -> Limits:
    """Resolve and check the budgets of one run and prepare their enforcement.

    Raises :class:`PicklescopeError` for a malformed budget, an unknown enforcement or a budget the
    machine cannot give. A cgroup that cannot be created is not an error: the run falls back to the
    watchdog and ``note`` says why.
    """
    if enforcement not in ENFORCEMENTS:
        raise PicklescopeError(f"unknown enforcement {enforcement!r}", f"known: {', '.join(ENFORCEMENTS)}")
    sb, ss, st = _resolve(budget, payload, "--budget")
    rb, rs, rt = _resolve(receiver_budget, payload, "--receiver-budget")
    budgets = {"sender": sb, "receiver": rb}
    totals = {"sender": st, "receiver": rt}
    check_machine({s: budgets[s] if budgets[s] is not None else totals[s] for s in SIDES})
    mem = procmem.machine_memory()
    limits = Limits(budgets, {"sender": ss, "receiver": rs}, "watchdog",
                    guard_floor_bytes=machine_reserve(mem["total"]) // 2, totals=totals)
    if enforcement == "watchdog":
        limits.note = "the parent samples each side and kills it with SIGKILL when it crosses its budget"
    elif enforcement == "address-space":
        limits.enforcement = "address-space"
        limits.note = ("RLIMIT_AS on each budgeted side: allocations over the budget fail inside the process "
                       "(as under 'ulimit -v') instead of the process being killed")
    else:
        base, why = cgroup.support()
        if base is None:
            limits.note = f"cgroup requested but unavailable ({why}); the watchdog enforced the budget instead"
        else:
            run_id = next(_run_ids)
            try:
                for side, b in budgets.items():
                    if b is not None:
                        limits.cgroups[side] = cgroup.create(base, f"picklescope-{os.getpid()}-{run_id}-{side}")
            except OSError as exc:
                limits.cleanup()
                limits.note = (f"cgroup requested but could not be created ({exc}); the watchdog enforced the "
                               "budget instead")
            else:
                limits.enforcement = "cgroup"
                limits.note = (f"memory cgroup v1 under {base}: the kernel's OOM killer kills the side at its "
                               "limit (it counts page cache and /dev/shm pages the side writes, unlike RSS)")
    return limits


def _vm_size() -> int:
    """This process's address-space size in bytes (``VmSize``), what RLIMIT_AS limits."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("/proc/self/status has no VmSize")


def apply_in_child(cfg: ChildConfig, side: str) -> None:
    """Apply this side's limit from inside the child, right after its baseline (no race with work).

    The watchdog needs nothing here. For ``address-space`` the limit is the current address space
    plus the budget; for ``cgroup`` the side joins its cgroup and sets the limit to what is charged
    now plus the budget.
    """
    limits = cfg.limits
    b = limits.budgets.get(side)
    total = limits.totals.get(side)
    if total is not None:  # whole-process limit: what is left above this side's baseline (taken just now)
        b = total - procmem.rss()
        if b <= 0:
            return  # the parent refuses the run (BudgetBelowBaseline) and kills this side
    if b is None:
        return
    mode = limits.enforcement
    if mode == "address-space":
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        want = _vm_size() + b
        if hard != resource.RLIM_INFINITY:
            want = min(want, hard)
        resource.setrlimit(resource.RLIMIT_AS, (want, hard))
    elif mode == "cgroup":
        path = limits.cgroups.get(side)
        if path:
            cgroup.join_and_limit(path, b)


def lift_in_child(cfg: ChildConfig) -> None:
    """After the measured phase: lift an address-space limit so verifying and reporting cannot fail."""
    if cfg.limits.enforcement == "address-space":
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (hard, hard))


def add_budget_args(p: Any) -> None:
    """``--budget``, ``--receiver-budget`` and ``--enforcement`` for a command that runs cases."""
    p.add_argument("--budget", default=None,
                   help="sender memory budget above its baseline: bytes (700MiB, 1.5GiB) or a payload multiple "
                        "(1.5x); total:2GiB limits the whole process, as a container limit does")
    p.add_argument("--receiver-budget", default=None, help="receiver memory budget, same forms as --budget")
    p.add_argument("--enforcement", default="watchdog", choices=ENFORCEMENTS,
                   help="who enforces budgets: watchdog (default, SIGKILL from the parent), cgroup (the kernel's OOM "
                        "killer, where a memory cgroup can be created) or address-space (RLIMIT_AS: allocations fail)")


def budget_kwargs(args: Any) -> dict[str, Any]:
    """The :func:`picklescope.run` keywords for the arguments of :func:`add_budget_args`."""
    return {"budget": getattr(args, "budget", None), "receiver_budget": getattr(args, "receiver_budget", None),
            "enforcement": getattr(args, "enforcement", "watchdog")}
