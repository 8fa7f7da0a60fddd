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

A run collects the young generation only, and what survives it moves into generation 1: the copy of the call in
hand, still referenced when the run came, is garbage once its call ends, but only a run of generation 1 frees it,
and CPython makes every twelfth run one (its second threshold counts young runs, ten of them, and it collects
generation 1 at the first run that finds the count past ten); what survives that run moves into generation 2, which
only a full collection frees. So each run with a call in hand leaves a chunk's copy behind for up to eleven runs,
and each run of generation 1 one for good: over 40 steps at 8 workers the controller's level after a run climbed
by a chunk at every run with a call in hand and fell back at the twelfth (benchmarks/README.md, "Copies that
outlive a run of the collector"). Which run collects what follows from the count (:func:`generations`) or the
loop's record.

Where in a step the run falls comes from the controller's counted allocations, spread evenly over the step's
calls (:func:`calls_done`). The count is net of frees, and a step's allocations need not fall evenly on its
calls (it also cuts the batch into chunks before them and frees the chunks after them). So the count can reach
the threshold a call earlier than the even spread says: flowgrpo's run at x0.5 with four workers fell in the
third call's ``consolidate`` (two calls done, read from the collector's callback) where the spread puts it in
the fourth; many-keys' fell in the fourth, as the spread says. So the controller's loop records how many of
the step's calls it had made at each of its collector's runs (``StepObs.runs``): a fit replay's releases are
read from those records (:func:`recorded_runs`), and how far the count runs ahead of the spread within a step
(``lead``, in allocations: the step cuts its chunks before its calls) is the one that puts the most of the fits'
recorded runs where they came (:func:`observed_lead`). Only where no fit replay has the records is a lag in calls
fitted with the share, on the levels (:func:`fit_release`).

The call in hand references its copy only while its ``consolidate`` runs: the legacy codec throws the copy away
as it returns, and the call then spends the rest of its allocations pickling and sending its chunk. So a run that
comes later in a call finds that call's copy garbage too, and one that comes before it finds none made yet. The
controller's loop records where the call in hand stood at each run (``StepObs.runs``' third field: before its
copy, making it, after it), and how far into a call the copy is thrown away (``released``, a share of the call's
allocations) is the one that sorts the most of the fits' recorded runs as they came (:func:`observed_release`); a
run at least that far into its call counts the call as done and finds no copy in hand. None where no fit recorded
a run after a copy: every run then finds its call's copy in hand and keeps it (:func:`play`). A run inside
``consolidate`` after the copy's block was made gives it back as its call returns (benchmarks/README.md, "Where in a
call the collector runs"), as a run after the copy does, and the record's fourth field tells it from one before the
block (the bytes the call had allocated by the run: about its copy once the block is made), so :func:`stood` reads
such a run as one after the copy. :func:`copy_given_back` plays every run with a copy in hand that way, the other
outcome the answer gives beside its own.
"""

from __future__ import annotations

import gc
import math
import statistics
from collections.abc import Callable, Mapping, Sequence

from picklescope.investigate.predict.fit import Replay, chunk_sizes

# The container allocations (net of frees) after which CPython's collector runs: its first threshold passed
YOUNG_EVERY = gc.get_threshold()[0] + 1
SHARE_GRID = 20  # fit_share tries shares 0, 1/20, ..., 1: finer than what draws of one replay agree on
# A later lag is taken only where it plays the fits' levels with at most this share of the misfit of the one
# before (flowgrpo's 6-step fits: 0.82-0.87 of it for one call; many-keys': 0.99-1.07, so none). At most one call:
# six steps' levels tell one call from two no better than their noise (two played three draws of flowgrpo's
# fits closer, where the collector's callback at x0.5 counted one)
LAG_EVIDENCE, MAX_LAG = 0.9, 1

# CPython's collector (up to 3.13): a run set off by allocating collects the young generation and moves what
# survives it into generation 1; a run that finds generation 1's count of such runs past its threshold collects
# generation 1 too (every OLDER_EVERY-th run from a full collection) and moves its survivors into generation 2
OLDER_EVERY = gc.get_threshold()[1] + 2

# training step -> (the shares of its calls done at its first and last run[, whether the last run found the copy of
# the call in hand referenced: True where not given])
Releases = Mapping[int, tuple[float, ...]]
# training step -> (the oldest generation its collector's runs collected, how many runs it held)
Generations = Mapping[int, tuple[int, int]]


def _next_run(before: float) -> float:
    """The count of allocations at which the collector runs next after ``before``: the next multiple of
    :data:`YOUNG_EVERY` above it."""
    return (math.floor(before / YOUNG_EVERY + 1e-9) + 1) * YOUNG_EVERY


def calls_done(before: float, after: float, calls: int, lag: int = 0, lead: float | None = None,
               released: float | None = None) -> tuple[float, ...] | None:
    """The shares of a step's ``calls`` done when the collector first and last runs in it (None: it does not run):
    the step took the counted allocations from ``before`` to ``after``, a run falls where they pass a multiple of
    :data:`YOUNG_EVERY`, and they fall evenly on the calls (flowgrpo: 53 a call, 21 a step), less ``lag`` calls
    (the module doc); or, with a ``lead`` (:func:`observed_lead`), where the count runs that many allocations
    ahead of the spread. A call done has sent its chunk, so its cycle-held copy is garbage for a run; the call in
    hand still holds its own, unless the run comes at least ``released`` of the way through the call's allocations
    (:func:`observed_release`): its copy is then garbage too, the call counts as done, and a third field False says
    that the last run found no copy in hand."""
    first, last = _next_run(before), math.floor(after / YOUNG_EVERY + 1e-9) * YOUNG_EVERY
    if last < first or after <= before:
        return None
    n = max(1, calls)
    if lead is not None:
        a = (after - before) / n

        def made(m: float) -> tuple[float, bool]:  # the calls made when the count, lead ahead, passes m; in hand
            pos = (m - before - lead) / a
            j = min(n, max(0, math.ceil(pos - 1e-9) - 1))
            if released is not None and j < n and pos - j >= released:
                return (j + 1) / n, False
            return j / n, True
        (done1, _), (done2, hand) = made(first), made(last)
        return (done1, done2) if hand else (done1, done2, False)
    return max(0, math.floor((first - before) / (after - before) * n + 1e-9) - lag) / n, \
        max(0, math.floor((last - before) / (after - before) * n + 1e-9) - lag) / n


def generations(counts: Sequence[float]) -> dict[int, tuple[int, int]]:
    """Per training step in which the collector runs, the oldest generation its runs collect and their number, from
    the counted allocations at the end of each step (``counts[0]``: the full collection before step 1, which
    zeroed every generation's count): 1 where a step holds a run whose number since then is a multiple of
    :data:`OLDER_EVERY`, else 0. Never 2: CPython holds a full collection back until the objects moved into
    generation 2 since the last one are a quarter of all it holds, and a controller that imported torch and Ray
    holds hundreds of thousands (docs/predict.md, "share freed at a release")."""
    out = {}
    for k in range(1, len(counts)):
        first = math.floor(counts[k - 1] / YOUNG_EVERY + 1e-9) + 1  # the numbers of the step's runs
        last = math.floor(counts[k] / YOUNG_EVERY + 1e-9)
        if last >= first:
            out[k] = (1 if last // OLDER_EVERY >= -(-first // OLDER_EVERY) else 0, last - first + 1)
    return out


def replay_generations(rep: Replay) -> dict[int, tuple[int, int]] | None:
    """Per training step of ``rep`` with a run of the controller's collector, the oldest generation its runs
    collected and their number: as its loop recorded them (``StepObs.runs``), else from its counted allocations
    (:func:`generations`); None where neither was kept."""
    if rep.gc == "off" or rep.data_plane != "dataproto" or not rep.per_step:
        return None
    if all(s.runs is not None for s in rep.per_step):
        return {s.index: (max(r[0] or 0 for r in s.runs), len(s.runs)) for s in rep.per_step if s.runs}
    counts = [s.allocations for s in rep.per_step]
    return None if None in counts else generations([0.0, *(float(c or 0) for c in counts)])


def counted_runs(rep: Replay, lag: int = 0) -> dict[int, tuple[float, float]] | None:
    """The training steps of ``rep`` in which the collector ran, each with the shares of its calls done at the
    first and last run in it (:func:`calls_done`, ``lag`` calls earlier); None where the runs were not counted
    (the collector off, another data plane, a replay without the controller's allocations)."""
    counts = [s.allocations for s in rep.per_step]
    if rep.gc == "off" or rep.data_plane != "dataproto" or not counts or None in counts:
        return None
    calls = len(chunk_sizes(rep.rows, rep.workers))
    runs = {s.index: calls_done(before or 0, s.allocations or 0, calls, lag)
            for before, s in zip([0, *counts], rep.per_step)}
    return {k: done for k, done in runs.items() if done is not None}


BLOCK_MADE = 0.5  # of a chunk's payload allocated in the call by a run inside consolidate: the copy's block was made


def stood(run: Sequence[int | str | None], chunk_bytes: int) -> str | None:
    """Where the call in hand stood against its copy at a recorded run (:data:`~picklescope.investigate.node.collector.
    PHASES`, None where not recorded), a run inside ``consolidate`` whose call had allocated at least
    :data:`BLOCK_MADE` of a chunk's payload read as after the copy: its block was made, and the copy is given back as
    the call returns (the module doc), so nothing of it outlives the run, as after a copy."""
    place = run[2] if len(run) > 2 else None
    grown = run[3] if len(run) > 3 else None
    if place == "in-copy" and isinstance(grown, int) and chunk_bytes > 0 and grown >= BLOCK_MADE * chunk_bytes:
        return "after-copy"
    return place  # type: ignore[return-value]


def recorded_runs(rep: Replay, copies: bool = True) -> dict[int, tuple[float, ...]] | None:
    """The training steps of ``rep`` in which the controller's collector ran, each with the shares of its calls
    made at the first and last run in it, as the controller's loop recorded them; None where they were not
    recorded (the collector off, another data plane, a replay cached before the records, real verl's loop).
    ``copies``: where the loop also recorded where the call in hand stood (the module doc), a run after its copy
    counts that call as done, and a last run that did not find the copy being made says so (a third field
    False); without, the calls made as recorded."""
    if rep.gc == "off" or rep.data_plane != "dataproto" or not rep.per_step:
        return None
    if any(s.runs is None or any(r[1] is None for r in s.runs) for s in rep.per_step):
        return None
    n = max(1, len(chunk_sizes(rep.rows, rep.workers)))
    out: dict[int, tuple[float, ...]] = {}
    for s in rep.per_step:
        if not s.runs:
            continue
        phases = [stood(r, rep.chunk_bytes) if copies else None for r in s.runs]
        done = [min(r[1], n) + (1 if p == "after-copy" and r[1] < n else 0) for r, p in zip(s.runs, phases)]
        hand = phases[-1] in (None, "in-copy")
        out[s.index] = (min(done) / n, max(done) / n) if hand else (min(done) / n, max(done) / n, False)
    return out


def _first_runs(rep: Replay) -> tuple[int, list[tuple[float, float, int, str | None]]]:
    """``rep``'s calls per step, and for each of its steps with a recorded run (where the runs were recorded and
    the allocations counted): the count from the step's start to the threshold its first run passed (``M -
    before``), the step's allocations per call (``a``), the calls made at that run (``k``) and where the call in
    hand stood (:data:`~picklescope.investigate.node.collector.PHASES`, None where not recorded)."""
    n = max(1, len(chunk_sizes(rep.rows, rep.workers)))
    recorded, counts = recorded_runs(rep, copies=False), [s.allocations for s in rep.per_step]
    if not recorded or None in counts:
        return n, []
    out = []
    for before, s in zip([0, *counts], rep.per_step):
        after = s.allocations or 0
        if s.index not in recorded or after <= before:
            continue
        place = stood(s.runs[0], rep.chunk_bytes) if s.runs else None
        out.append((_next_run(before) - before, (after - before) / n, round(recorded[s.index][0] * n), place))
    return n, out


def lead_bounds(rep: Replay) -> list[tuple[float, float]]:
    """For each step of ``rep`` with a recorded run, the leads ``L`` that put the run where it was recorded: the
    count at the start of call ``j + 1`` (``j`` calls made) taken as ``before + L + j x a``, ``a`` the step's
    allocations per call, a run with ``k`` calls made passed the threshold ``M`` within call ``k + 1`` (or, at
    none, while the step cut its chunks), so ``M - before - (k + 1) a <= L < M - before - k a``."""
    n, runs = _first_runs(rep)
    return [(to_run - (k + 1) * a if k < n else -math.inf, to_run - k * a if k > 0 else math.inf)
            for to_run, a, k, _ in runs]


def observed_lead(replays: Sequence[Replay]) -> float | None:
    """How many allocations ahead of the even spread of a step's count the collector's runs came (the step cuts
    its chunks before its calls and frees them after): the lead within the most of the fits' steps' bounds
    (:func:`lead_bounds`), the middle of those where several do as well; None where no step was recorded. A lead
    in allocations, not in calls, so that it plays the same at every worker count (a call is fewer
    allocations where there are more workers)."""
    bounds = [b for rep in replays for b in lead_bounds(rep)]
    ends = sorted({v for b in bounds for v in b if math.isfinite(v)})
    if not ends:
        return None
    cands = [ends[0] - 1.0, *((p + q) / 2 for p, q in zip(ends, ends[1:])), ends[-1] + 1.0]
    held = [sum(lo <= c < hi for lo, hi in bounds) for c in cands]
    return statistics.median_low([c for c, h in zip(cands, held) if h == max(held)])


def found_in_hand(release: tuple[float, ...]) -> bool:
    """Whether a release's last run found the copy of the call in hand referenced (:data:`Releases`' third field,
    True where it is not given)."""
    return len(release) < 3 or bool(release[2])


def copy_given_back(releases: Releases, calls: int) -> Releases:
    """``releases`` with the copy of each call a run found in hand given back as that call returns: its call counts
    as done and nothing of it outlives the run. A run inside ``consolidate`` after the copy's block was made leaves
    it so (tensordict's ``consolidate`` under a forced young run: whenever the run came after the block, the copy
    was unmapped by the time ``consolidate`` returned; before the block, it outlived every young run until a run of
    generation 1; benchmarks/README.md, "Where in a call the collector runs"). The record cannot tell the two
    apart, so :meth:`~.model.Model.play` can play either: this one leaves less after each such run, though its
    step stands a copy higher at the run (the block is made by then)."""
    n = max(1, calls)
    out: dict[int, tuple[float, ...]] = {}
    for k, rel in releases.items():
        in_hand = found_in_hand(rel)
        j1, j2 = round(rel[0] * n), round(rel[1] * n)
        # a call in hand: one made and one not (play's rule: none before a step's first call or after its last)
        out[k] = (min(n, max(j1, 1) + 1) / n, (j2 + 1) / n, False) if in_hand and 0 < j2 < n else tuple(rel)
    return out


def observed_release(replays: Sequence[Replay], lead: float | None) -> float | None:
    """How far into a call's allocations its copy is garbage (the module doc): for each step of the fits with a
    recorded run and where its call in hand stood, the run's place in that call (the count at the run, ``lead``
    ahead of the even spread, as :func:`lead_bounds` reads it); the share that puts the most of those runs on their
    recorded side (after the copy at or past it, before or inside it short of it), the middle of those where
    several do as well. None without a lead, or where no fit recorded a run after its call's copy."""
    if lead is None:
        return None
    seen: list[tuple[float, bool]] = []  # (place in the call, after the copy)
    for rep in replays:
        for to_run, a, k, stood in _first_runs(rep)[1]:
            place = (to_run - lead) / a - k
            if stood is not None and 0.0 <= place < 1.0:  # the lead puts the run in its recorded call
                seen.append((place, stood == "after-copy"))
    if not any(after for _, after in seen):
        return None
    ends = sorted({p for p, _ in seen})
    cands = [*((p + q) / 2 for p, q in zip(ends, ends[1:])), ends[-1]] if len(ends) > 1 else ends
    cands = [ends[0], *cands]
    right = [sum((p >= c) == after for p, after in seen) for c in cands]
    return statistics.median_low([c for c, r in zip(cands, right) if r == max(right)])


def freed_at_release(garbage: float, mapped_share: float, heap_share: float) -> float:
    """What a release gives back of ``garbage`` bytes of the controller's copies: the part glibc mapped
    (``mapped_share``: copies of chunks above its mmap threshold) all; of the heap-sized rest ``heap_share``, the
    rest kept as free blocks."""
    mapped = garbage * min(1.0, max(0.0, mapped_share))
    return mapped + (garbage - mapped) * heap_share


def play(base: float, growth: float, mapped_share: float, releases: Releases, steps: int,
         share: float, calls: int = 1, gens: Generations | None = None) -> list[tuple[float, float]]:
    """Per training step 1..``steps``, the controller's (level after the step, level just before the step's
    collector run, the same as the level where no run falls). ``growth``: the copies a step makes;
    ``mapped_share``: their part glibc maps; ``releases``: training step -> the shares of its calls done at its
    first and last run and whether the last found a copy in hand (:func:`calls_done`); ``share``: of the
    heap-sized garbage, what a run gives back. ``gens``: per step with a run, the oldest generation it collects
    (:func:`generations`): the copy of the call in hand (one of ``calls``, still referenced) survives a run and
    moves into the next generation, which only a run of that generation frees (None: every run frees every copy
    not in hand)."""
    ms = min(1.0, max(0.0, mapped_share))
    # the copies in the young generation, those that survived a young run (generation 1) and a run of generation 1
    # (generation 2, which no run played here collects), and the kept free blocks
    young = old = kept = free = 0.0
    out, n = [], max(1, calls)
    for k in range(1, steps + 1):
        free -= min(free, growth * (1 - ms))  # the step's heap-sized copies take kept blocks first
        prev = young + old + kept
        young += growth
        before = base + prev + growth + free
        if k in releases:
            first, last = releases[k][:2]
            in_hand = found_in_hand(releases[k])
            before = base + prev + growth * first + free  # the step's highest: just before its first run
            gen, runs = (2, 1) if gens is None else gens.get(k, (0, 1))
            # each run with a call in hand (j of n calls made, 0 < j < n: none before the first call is made or after
            # the last): that call's copy survives into the next generation, once per call however many runs find it;
            # the last run's is of the calls not done, the earlier runs' of those done by the last
            j1, j2 = round(first * n), round(last * n)
            # (a last run that found no copy in hand, its call's copy not made yet or already thrown away, keeps none)
            hand = 0 if gens is None else max(0, min(runs, min(j2, n - 1) - max(j1, 1) + 1)
                                               - (0 if in_hand or j2 >= n else 1))
            late = growth / n if hand and in_hand and 0 < j2 < n else 0.0
            early = min(max(0, hand - (late > 0)) * growth / n, growth * last)
            garbage = young - growth * (1 - last) - early + (old if gen >= 1 else 0.0) + (kept if gen >= 2 else 0.0)
            young = growth * (1 - last) - late
            old, kept = (0.0 if gen >= 1 else old), (0.0 if gen >= 2 else kept)
            if gen >= 1:
                kept += late + early
            else:
                old += late + early
            free += garbage - freed_at_release(garbage, ms, share)
        out.append((base + young + old + kept + free, before))
    return out


def _misfit(ends: Sequence[float], growth: float, mapped_share: float, releases: Releases, share: float,
            calls: int = 1, gens: Generations | None = None) -> float:
    """How far one replay's levels after each step are from those played from its first step's level."""
    played = play(ends[0] - growth, growth, mapped_share, releases, len(ends), share, calls, gens)
    return sum((level - e) ** 2 for (level, _), e in zip(played, ends))


def fit_share(ends: Sequence[float], growth: float, mapped_share: float, releases: Releases, calls: int = 1,
              gens: Generations | None = None) -> float | None:
    """The share of heap-sized garbage a run gives back that plays one replay's levels after each step
    (``ends``) closest (least squares over :data:`SHARE_GRID`), played from its first step's level with its
    ``growth``, ``releases`` and their generations (:func:`play`); None where no run falls before the replay's
    last step (no level after it shows what the run kept) or where every copy is mapped (a run gives all of it
    back, whatever the share)."""
    if not ends or not any(k < len(ends) for k in releases) or mapped_share >= 1.0:
        return None
    return min(range(SHARE_GRID + 1), key=lambda i: (_misfit(ends, growth, mapped_share, releases, i / SHARE_GRID,
                                                             calls, gens), i)) / SHARE_GRID


def fit_release(replays: Sequence[tuple[Sequence[float], float, float, Callable[[int], Releases], int,
                                       Generations | None]],
                observed: int | None = None) -> tuple[int, float]:
    """(lag, share): how many calls earlier than the even spread the collector runs (up to :data:`MAX_LAG`) and the
    mean of the replays' :func:`fit_share` at that lag, for the lag whose shares play the replays' levels
    closest. Each replay is (levels after each step, growth, mapped share, its runs at a lag, its calls per step,
    the generations its runs collected: :func:`replay_generations`), levels and
    growth as multiples of its payload so that every replay weighs alike. A later lag must cut the misfit to
    :data:`LAG_EVIDENCE` of the best before it. An ``observed`` lag is the only one tried (0 where the runs were
    recorded: the replays' releases are then the records, whatever the lag)."""
    best: tuple[float, int, float] = (math.inf, 0, 1.0)
    for lag in range(MAX_LAG + 1) if observed is None else (observed,):
        plays = [(ends, growth, ms, runs(lag), calls, gens) for ends, growth, ms, runs, calls, gens in replays]
        shares = [fit_share(*p) for p in plays]
        known = [v for v in shares if v is not None]
        share = sum(known) / len(known) if known else 1.0
        miss = sum(_misfit(*p[:4], share, *p[4:]) for p, v in zip(plays, shares) if v is not None)
        if best[0] == math.inf or miss < best[0] * LAG_EVIDENCE:
            best = (miss, lag, share)
    return best[1], best[2]


def released_at(rep: Replay) -> list[int]:
    """Steps at which the controller's memory fell back: its level dropped by more than half a chunk,
    or its count of full collections moved."""
    out, prev_level, prev_coll = [], 0.0, rep.per_step[0].collections if rep.per_step else None
    for i, s in enumerate(rep.per_step):
        level = s.end.get("controller", 0)
        coll = s.collections
        moved = i > 0 and coll is not None and prev_coll is not None and coll > prev_coll
        if (i > 0 and level < prev_level - rep.chunk_bytes / 2) or moved:
            out.append(s.index)
        prev_level, prev_coll = level, coll
    return out


def replay_releases(rep: Replay, lag: int = 0) -> dict[int, tuple[float, float]]:
    """The training steps of ``rep`` with a release, each with the shares of its calls done at the collector's
    first and last run in it: where the collector ran and the controller's allocations were counted, the steps
    in which a run falls: as the controller's loop recorded them (:func:`recorded_runs`), else from the count
    (:func:`counted_runs`, ``lag`` calls earlier: a run that freed blocks the next copies reused shows no fall);
    elsewhere the steps at which the controller's memory fell back (:func:`released_at`), no call done."""
    runs = recorded_runs(rep)
    runs = counted_runs(rep, lag) if runs is None else runs
    return {k: (0.0, 0.0) for k in released_at(rep)} if runs is None else runs
