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
With it goes where the call in hand stood (:data:`PHASES`): a legacy codec's copy is referenced only while its
``consolidate`` step runs (the result is thrown away as it returns), so a run that comes later in the same call
(while the call pickles and sends its chunk) finds that copy garbage too, and one that comes before finds none
made yet. The step machinery says which (:meth:`picklescope.core.steps.Meter.innermost`, ``Meter.ended``). A run inside
``consolidate`` may come before or after the copy's block is allocated, and the two leave different memory
(docs/predict.md, "What a run inside a call's copy leaves"), so each run also keeps the bytes the allocator had
handed out more at its start than when the call in hand began (:func:`picklescope.core.procmem.heap_in_use`):
about the copy's size once its block is made.
The driver and every worker use this module in their own process.
"""

from __future__ import annotations

import gc
from typing import Any

from picklescope.core import procmem, steps

_collections = [0, 0, 0]  # per generation, since count_collections()
# the worker calls of the training step in hand that the controller has made (at_call); -1: not said (an engine
# whose loop is not the toolkit's own, such as real verl's worker group)
_calls_done = [-1]
# each collection since take_runs(), as one int (generation + 3 x (calls done + 1)): an int is no container, so the
# record adds nothing to the count of container allocations that sets when the collector runs next
_runs: list[int] = []
# the step in which a legacy codec makes its copy (codecs.numpy_codec, codecs.torch_codec mark it so)
COPY_STEP = "consolidate"
# where the call in hand stood at a run, kept beside each run (an index into PHASES, -1: not known): its copy not
# made yet, being made (referenced), or made and thrown away (garbage for the run)
PHASES = ("before-copy", "in-copy", "after-copy")
_phases: list[int] = []
_copies_at_step_start = [-1]  # the copy steps that had ended when the training step began (-1: no meter then)
# the allocator's bytes in use when the call in hand began (at_call; -1: not read, or no glibc), and per run what it
# had handed out more at the run's start (an int each, no container: see _runs); the collection in progress's first
_heap_at_call = [-1]
_UNREAD = -(1 << 62)  # a run's growth where it was not read
_grown_at_run = [_UNREAD]
_grown: list[int] = []
procmem.heap_in_use()  # glibc's reading loaded at import, before any count: its objects are no step's allocations


def apply_mode(mode: str) -> None:
    """``off`` disables the automatic collector; ``default`` and ``each-step`` leave it as it is."""
    if mode == "off":
        gc.disable()


def count_collections() -> None:
    """Count every collection from now on, per generation, whoever asked for it (from zero)."""
    _collections[:] = [0, 0, 0]
    _calls_done[0] = -1
    _runs.clear()
    _phases.clear()
    _grown.clear()
    _heap_at_call[0] = -1
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
    codec made for it is garbage for a collection; the call in hand references its own only while making it
    (:data:`PHASES`)."""
    _calls_done[0] = done
    _heap_at_call[0] = procmem.heap_in_use()
    if done == 0:
        _copies_at_step_start[0] = _copies_ended()


def _copies_ended() -> int:
    """The copy steps ended so far in this process's measured phase (-1: no meter keeps them)."""
    meter = steps.current()
    return meter.ended.get(COPY_STEP, 0) if meter is not None and meter.tracks_steps else -1


def _phase() -> int:
    """Where the call in hand stands (an index into :data:`PHASES`, -1: not known). Reads without allocating a
    container, as the run's record must (see ``_runs``)."""
    meter = steps.current()
    if meter is None or not meter.tracks_steps or _calls_done[0] < 0 or _copies_at_step_start[0] < 0:
        return -1
    if meter.innermost() == COPY_STEP:
        return 1
    return 2 if meter.ended.get(COPY_STEP, 0) - _copies_at_step_start[0] > _calls_done[0] else 0


def take_runs() -> list[list[Any]]:
    """Each collection since the last call (or since :func:`count_collections`), in order, as [generation,
    calls done when it ran, where the call in hand stood (:data:`PHASES`), the bytes the allocator had handed out
    more at the run's start than when the call in hand began] (calls, place and bytes None where the loop never
    said: :func:`at_call`, or no meter kept the codec's steps, or no glibc); and start the next list."""
    out = [[r % 3, r // 3 - 1 if r >= 3 else None, PHASES[p] if p >= 0 else None,
            None if p < 0 or g == _UNREAD else g]
           for r, p, g in zip(_runs, _phases, _grown)]
    _runs.clear()
    _phases.clear()
    _grown.clear()
    return out


def _on_collection(phase: str, info: dict[str, Any]) -> None:
    generation = info.get("generation")
    if phase == "start":  # before the run frees anything: what the call in hand has allocated so far
        _grown_at_run[0] = procmem.heap_in_use() - _heap_at_call[0] if _heap_at_call[0] >= 0 else _UNREAD
    elif phase == "stop" and generation in (0, 1, 2):
        _collections[generation] += 1
        _runs.append(generation + 3 * (_calls_done[0] + 1))
        _phases.append(_phase())
        _grown.append(_grown_at_run[0])
