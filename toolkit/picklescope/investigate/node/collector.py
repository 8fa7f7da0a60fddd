"""Python's collector in a node's processes: the ``--gc`` modes, and a count of its collections.

``--gc off`` disables only the automatic collector: an explicit ``gc.collect()`` still runs, and Ray's
core worker calls it when the raylet asks every worker to collect (object store under pressure).
The count of full (generation 2) collections, whoever asked for them, says whether a run's memory
was shaped by such collections. The count of every generation's collections says when the collector
ran: CPython collects the youngest generation each time its container allocations outrun its first
threshold, so a replay's count of those allocations per training step is what ``picklescope
predict`` extrapolates the collector's schedule from (its thresholds count objects, not bytes).
The driver and every worker use this module in their own process.
"""

from __future__ import annotations

import gc
from typing import Any

_collections = [0, 0, 0]  # per generation, since count_collections()


def apply_mode(mode: str) -> None:
    """``off`` disables the automatic collector; ``default`` and ``each-step`` leave it as it is."""
    if mode == "off":
        gc.disable()


def count_collections() -> None:
    """Count every collection from now on, per generation, whoever asked for it (from zero)."""
    _collections[:] = [0, 0, 0]
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


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    generation = info.get("generation")
    if phase == "stop" and generation in (0, 1, 2):
        _collections[generation] += 1
