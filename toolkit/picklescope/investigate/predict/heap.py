"""The controller's heap under Python's collector: what a release gives back, and what the next steps reuse.

A legacy codec's controller keeps a copy of every chunk it sends (held by a reference cycle) until the
collector runs. A run frees the copies of the steps before and those of the step's calls already done (the
call in hand still holds its own). Of that garbage, blocks above glibc's mmap threshold go back to the kernel
whole; of the heap-sized rest glibc gives back what it can (``share``: the blocks at the top of its heap) and
keeps the rest resident as free blocks, which the next steps' heap-sized copies reuse before the heap grows
again. So after a run the controller's level falls by the mapped garbage and the share given back, then rises
by less than a step's copies until the kept blocks are used up.

The fits' replays show both halves at once: at the fit sizes every copy is heap-sized, and a run there
sometimes dropped the level by every garbage copy and sometimes by none (the level paused for a few steps
instead). Read as a median rise between steps, such pauses made the growth, and with it the prediction, move
by a fifth and more between draws of the fit (benchmarks/README.md, "The collector's freed heap, reused").
So what a step keeps is read where nothing frees it, in the collector-off replays of the same codec and
sizes, and the share given back is the one number per collector replay that plays its levels closest
(:func:`fit_share`).
"""

from __future__ import annotations

import gc
import math
from collections.abc import Mapping, Sequence

# The container allocations (net of frees) after which CPython's collector runs: its first threshold passed
YOUNG_EVERY = gc.get_threshold()[0] + 1
SHARE_GRID = 20  # fit_share tries shares 0, 1/20, ..., 1: finer than what draws of one replay agree on


def calls_done(before: float, after: float, calls: int) -> tuple[float, float] | None:
    """The shares of a step's ``calls`` done when the collector first and last runs in it (None: it does not run):
    the step took the counted allocations from ``before`` to ``after``, a run falls where they pass a multiple of
    :data:`YOUNG_EVERY`, and they fall evenly on the calls (flowgrpo: 53 a call, 21 a step). A call done has sent
    its chunk, so its cycle-held copy is garbage for a run; the call in hand still holds its own."""
    first, last = (math.floor(before / YOUNG_EVERY + 1e-9) + 1) * YOUNG_EVERY, \
        math.floor(after / YOUNG_EVERY + 1e-9) * YOUNG_EVERY
    if last < first or after <= before:
        return None
    n = max(1, calls)
    return math.floor((first - before) / (after - before) * n + 1e-9) / n, \
        math.floor((last - before) / (after - before) * n + 1e-9) / n


def freed_at_release(garbage: float, mapped_share: float, heap_share: float) -> float:
    """What a release gives back of ``garbage`` bytes of the controller's copies: their leaves above glibc's mmap
    threshold (``mapped_share``) all; of the heap-sized rest ``heap_share``, the rest kept as free blocks."""
    mapped = garbage * min(1.0, max(0.0, mapped_share))
    return mapped + (garbage - mapped) * heap_share


def play(base: float, growth: float, mapped_share: float, releases: Mapping[int, tuple[float, float]], steps: int,
         share: float) -> list[tuple[float, float]]:
    """Per training step 1..``steps``, the controller's (level after the step, level just before the step's
    collector run, the same as the level where no run falls). ``growth``: the copies a step makes;
    ``mapped_share``: their part above glibc's mmap threshold; ``releases``: training step -> the shares of its
    calls done at its first and last run (:func:`calls_done`); ``share``: of the heap-sized garbage,
    what a run gives back."""
    ms = min(1.0, max(0.0, mapped_share))
    held = free = 0.0  # the copies still referenced (or not yet collected), the kept free blocks
    out = []
    for k in range(1, steps + 1):
        free -= min(free, growth * (1 - ms))  # the step's heap-sized copies take kept blocks first
        prev, held = held, held + growth
        before = base + held + free
        if k in releases:
            first, last = releases[k]
            before = base + prev + growth * first + free  # the step's highest: just before its first run
            garbage = prev + growth * last
            held -= garbage
            free += garbage - freed_at_release(garbage, ms, share)
        out.append((base + held + free, before))
    return out


def fit_share(ends: Sequence[float], growth: float, mapped_share: float,
              releases: Mapping[int, tuple[float, float]]) -> float | None:
    """The share of heap-sized garbage a run gives back that plays one replay's levels after each step
    (``ends``) closest (least squares over :data:`SHARE_GRID`), played from its first step's level with its
    ``growth`` and ``releases``; None where no run falls before the replay's last step (no level after it
    shows what the run kept)."""
    if not ends or not any(k < len(ends) for k in releases):
        return None
    base = ends[0] - growth

    def misfit(i: int) -> float:
        played = play(base, growth, mapped_share, releases, len(ends), i / SHARE_GRID)
        return sum((level - e) ** 2 for (level, _), e in zip(played, ends))

    return min(range(SHARE_GRID + 1), key=lambda i: (misfit(i), i)) / SHARE_GRID
