"""Python's collector in a node's processes: the ``--gc`` modes, and a count of its collections.

``--gc off`` disables only the automatic collector: an explicit ``gc.collect()`` still runs, and Ray's
core worker calls it when the raylet asks every worker to collect (object store under pressure).
The count of full (generation 2) collections, whoever asked for them, says whether a run's memory
was shaped by such collections. The count of every generation's collections says when the collector
ran: CPython collects the youngest generation each time its container allocations outrun its first
threshold, so a replay's count of those allocations per training step is what ``picklescope
predict`` extrapolates the collector's schedule from (its thresholds count objects, not bytes).
Where in a training step each collection ran is recorded too: the controller's loop says how many of the
step's worker calls it has made (:func:`at_call`), and each collection is kept with that count
(:func:`take_runs`), so ``predict`` reads which chunks' copies a run found garbage instead of inferring it.
The driver and every worker use this module in their own process.
"""

from __future__ import annotations

import gc
from typing import Any

_collections = [0, 0, 0]  # per generation, since count_collections()
# the worker calls of the training step in hand that the controller has made (at_call); -1: not said (an engine
# whose loop is not the toolkit's own, such as real verl's worker group)
_calls_done = [-1]
# each collection since take_runs(), as one int (generation + 3 x (calls done + 1)): an int is no container, so the
# record adds nothing to the count of container allocations that sets when the collector runs next
_runs: list[int] = []


def apply_mode(mode: str) -> None:
    """``off`` disables the automatic collector; ``default`` and ``each-step`` leave it as it is."""
    if mode == "off":
        gc.disable()


def count_collections() -> None:
    """Count every collection from now on, per generation, whoever asked for it (from zero)."""
    _collections[:] = [0, 0, 0]
    _calls_done[0] = -1
    _runs.clear()
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def full_collections() -> int:
    """Full (generation 2) collections since :func:`count_collections`."""
    return _collections[2]


def collections() -> list[int]:
    """Collections of generation 0, 1 and 2 since :func:`count_collections` (each collection is of one)."""
    return list(_collections)


def allocations() -> int:
    """Container allocations (net of frees) counted by the young generation since :func:`count_collections`,
    whose full collection zeroed the count: each run of the collector set off by allocating came when the
    count passed the first threshold and zeroed it, so the runs so far times that threshold's one more,
    plus the count now (an explicit ``gc.collect()`` also zeroes it: then a lower bound)."""
    return sum(_collections) * (gc.get_threshold()[0] + 1) + gc.get_count()[0]


def at_call(done: int) -> None:
    """The controller has made ``done`` of the training step's worker calls (0 when a step begins): a
    collection from now on is recorded with that count. A call made has sent its chunk, so the copy a legacy
    codec made for it is garbage for a collection; the call in hand still references its own."""
    _calls_done[0] = done


def take_runs() -> list[list[int]]:
    """Each collection since the last call (or since :func:`count_collections`), in order, as [generation,
    calls done when it ran] (calls None where the loop never said: :func:`at_call`); and start the next list."""
    out = [[r % 3, r // 3 - 1 if r >= 3 else None] for r in _runs]
    _runs.clear()
    return out


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    generation = info.get("generation")
    if phase == "stop" and generation in (0, 1, 2):
        _collections[generation] += 1
        _runs.append(generation + 3 * (_calls_done[0] + 1))
