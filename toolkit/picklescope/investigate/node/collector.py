"""Python's collector in a node's processes: the ``--gc`` modes, and a count of every full collection.

``--gc off`` disables only the automatic collector: an explicit ``gc.collect()`` still runs, and Ray's
core worker calls it when the raylet asks every worker to collect (object store under pressure).
The count of full (generation 2) collections, whoever asked for them, says whether a run's memory
was shaped by such collections. The driver and every worker use this module in their own process.
"""

from __future__ import annotations

import gc
from typing import Any

_full_collections = [0]


def apply_mode(mode: str) -> None:
    """``off`` disables the automatic collector; ``default`` and ``each-step`` leave it as it is."""
    if mode == "off":
        gc.disable()


def count_full_collections() -> None:
    """Count every full (generation 2) collection from now on, whoever asked for it (from zero)."""
    _full_collections[0] = 0
    if _on_collection not in gc.callbacks:
        gc.callbacks.append(_on_collection)


def full_collections() -> int:
    """Full collections since :func:`count_full_collections`."""
    return _full_collections[0]


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    if phase == "stop" and info.get("generation") == 2:
        _full_collections[0] += 1
