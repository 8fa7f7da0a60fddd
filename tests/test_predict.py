"""``picklescope predict``: the fitting math on synthetic plain data (no processes), the CLI's bad input,
and one small fit checked against a held-out real replay (slow, starts Ray clusters).

The synthetic replays follow the shape the node replay measures for the legacy codec with the collector
off (docs/predict.md): the controller holds one payload more after every training step, each worker holds
its chunk, and the node is their sum.
"""

from __future__ import annotations

import gc
import hashlib
import importlib.util
import json
import math
from html import escape as html_escape
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from picklescope.cli import main
from picklescope.cli.commands import predict as predict_cmd
from picklescope.cli.commands.common import idle_seconds
from picklescope.core import steps
from picklescope.core.result import Step
from picklescope.core.units import fmt_bytes, seconds
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import collector
from picklescope.investigate.predict import fit as fitting
from picklescope.investigate.predict import heap, prediction
from picklescope.investigate.predict import model as model_mod
from picklescope.investigate.predict import terms as terms_mod
from picklescope.investigate.predict.fit import Replay, StepObs
from picklescope.ray.transferqueue import missing
from picklescope.views import figures
from picklescope.views.report import render_predictions
from picklescope.views.report import sentence as report_sentence
from picklescope.workloads.spec import load_workload

MiB = 2**20


def synthetic(payload: int, workers: int, steps: int, *, grow: float = 1.0, base: float = 1.0,
              worker_const: int = 8 * MiB, release_every: int = 0, rows: int = 64, codec: str = "numpy-legacy",
              gc: str = "off") -> Replay:
    """A replay whose controller ends step k at base*c + grow*P*m_k (``c`` the chunk's payload: what glibc keeps
    of its per-call temporaries; m_k reset to 1 every ``release_every`` steps), whose busiest worker holds its
    chunk plus a constant, and whose node is the sum of all."""
    chunk = payload * fitting.chunk_rows(rows, workers) // rows
    rep = Replay(codec, gc, "synthetic", 0.1, workers, steps, payload, rows, chunk, rows * 2, "ok", None, None, None)
    held = 0
    for k in range(1, steps + 1):
        held += 1
        if release_every and k % release_every == 0:
            held = 1
        ctl = int(base * chunk + grow * payload * held)
        worker = chunk + worker_const
        workers_sum = workers * worker
        rep.per_step.append(StepObs(k, end={"controller": ctl, "worker": worker, "workers": workers_sum, "store": 0,
                                            "node": ctl + workers_sum},
                                    peak={"controller": ctl, "worker": worker, "workers": workers_sum, "store": 0,
                                          "node": ctl + workers_sum},
                                    collections=k // release_every if release_every else 0))
    return rep


def fit_set(**kw):
    return [synthetic(p * MiB, w, 6, **kw) for w in (2, 4) for p in (20, 40, 80)]


TQ_PARTS = ("controller", "producer", "workers", "storage", "tq-controller", "store")


def synthetic_tq(payload: int, workers: int, steps: int, *, rows: int = 64, codec: str = "numpy",
                 gc: str = "off") -> Replay:
    """A TransferQueue-plane replay (docs/node.md): the controller passes metadata (a constant and a per-row
    share of the result), the producer keeps a tenth of a payload, each worker its chunk, the storage units
    hold the batch while it is in flight (one payload at the step's peak) and keep a little more after every
    step, TransferQueue's controller actor a constant; the node is the sum of all its parts."""
    chunk = payload * fitting.chunk_rows(rows, workers) // rows
    rep = Replay(codec, gc, "synthetic", 0.1, workers, steps, payload, rows, chunk, rows * 2, "ok", None, None, None,
                 data_plane="transferqueue")
    for k in range(1, steps + 1):
        end = {"controller": 2 * MiB + payload // 100, "producer": payload // 10, "worker": chunk // 2,
               "workers": workers * (chunk // 2), "storage": payload // 5 + k * payload // 20,
               "tq-controller": 4 * MiB, "store": 0}
        peak = dict(end, storage=end["storage"] + payload)
        end["node"] = sum(end[p] for p in TQ_PARTS)
        peak["node"] = end["node"] + payload
        rep.per_step.append(StepObs(k, end=end, peak=peak, collections=0))
    return rep


def tq_fit_set():
    return [synthetic_tq(p * MiB, w, 6) for w in (2, 4) for p in (20, 40, 80)]


def test_fit_recovers_growth_and_base_and_predicts_a_held_out_size():
    m = model_mod.fit(fit_set())
    ctl = m.roles["controller"]
    x = m.features(200 * MiB, 64, 4, 2)
    assert ctl.growth(x) == pytest.approx(200 * MiB, rel=1e-6)
    assert ctl.base(x) == pytest.approx(50 * MiB, rel=1e-6)  # one chunk of 50 MiB, every leaf heap-sized
    assert m.temp_share() == pytest.approx(1.0, rel=1e-6)
    played = m.play(200 * MiB, 64, 4, 4, 2)
    # step 4: base 0.25P + 4 held payloads; node adds 4 workers holding a chunk and 8 MiB each
    assert played["controller"][3][1] == pytest.approx(4.25 * 200 * MiB, rel=1e-6)
    assert played["node"][3][1] == pytest.approx(4.25 * 200 * MiB + 200 * MiB + 4 * 8 * MiB, rel=1e-6)
    assert m.release_rate is None  # nothing fell back in the fits: nothing is freed in the prediction


def test_releases_are_found_and_their_rate_and_share_fitted():
    m = model_mod.fit(fit_set(release_every=3))
    assert m.release_rate is not None
    x = m.features(200 * MiB, 64, 4, 2)
    assert m.release_rate(x) == pytest.approx(2 / 6, abs=1e-6)
    assert m.release_share == pytest.approx(1.0, abs=1e-6)
    assert m.release_steps(x, 9) == [3, 6, 9]
    levels = [lvl for lvl, _ in m.play(200 * MiB, 64, 4, 6, 2)["controller"]]
    assert [round(v / (200 * MiB), 3) for v in levels] == [1.25, 2.25, 1.25, 2.25, 3.25, 1.25]
    assert model_mod.released_at(fit_set(release_every=3)[0]) == [3, 6]


def test_the_collector_runs_once_per_young_every_allocations_of_this_interpreter():
    """The schedule the model plays (model.YOUNG_EVERY) is this interpreter's: after a full collection, the
    collector runs once for every YOUNG_EVERY container allocations, and the count the node's processes
    report (collector.allocations) is those allocations."""
    enabled = gc.isenabled()
    gc.enable()
    gc.collect()
    collector.count_collections()
    try:
        keep = [[] for _ in range(heap.YOUNG_EVERY * 5 + 17)]
        counted, runs = collector.allocations(), sum(collector.collections())
    finally:
        if not enabled:
            gc.disable()
    assert runs == 5, runs
    assert abs(counted - len(keep)) <= 16, (counted, len(keep))  # the list itself and a few frames' objects
    collector.count_collections()  # each run is recorded with the calls the controller's loop said it had made
    gc.collect(0)
    collector.at_call(3)
    gc.collect(1)
    assert collector.take_runs() == [[0, None, None, None], [1, 3, None, None]] and collector.take_runs() == []


def test_each_run_is_recorded_with_where_the_call_in_hand_stood_against_its_copy():
    """A legacy codec's copy is referenced only inside its ``consolidate`` step (codecs.numpy_codec throws it
    away as the step returns): the controller's record of each run says whether the call in hand had not made its
    copy yet, was making it, or had thrown it away (collector.PHASES), read from the step machinery."""
    enabled = gc.isenabled()
    meter = steps.Meter(lambda ev: None, 0.0, "driver")
    collector.count_collections()
    try:
        steps.install(meter)
        collector.at_call(0)  # a training step begins
        gc.collect(0)  # before the first call's copy
        with steps.step("argument serialization"):
            with steps.step(collector.COPY_STEP):
                gc.collect(0)  # the copy being made, its block not yet
                block = bytearray(8 * MiB)  # the copy's block
                gc.collect(0)  # the copy being made, its block made
                del block
            gc.collect(0)  # the copy thrown away, the call still sending its chunk
        collector.at_call(1)
        gc.collect(0)  # the second call has not made its copy yet
        runs = collector.take_runs()
        collector.at_call(0)  # the next training step counts its own copies
        with steps.step(collector.COPY_STEP):
            pass
        gc.collect(0)
        again = collector.take_runs()
        steps.install(None)
        gc.collect(0)
        unknown = collector.take_runs()
    finally:
        steps.install(None)
        if not enabled:
            gc.disable()
    assert [r[:3] for r in runs] == [[0, 0, "before-copy"], [0, 0, "in-copy"], [0, 0, "in-copy"],
                                     [0, 0, "after-copy"], [0, 1, "before-copy"]]
    assert [r[:3] for r in again] == [[0, 0, "after-copy"]]
    assert unknown == [[0, 0, None, None]]  # no meter keeps the codec's steps: not known
    # and the bytes glibc's allocator had handed out more at each run than when the call in hand began: the copy's
    # block (8 MiB) once made, and what it gave back once the block is freed
    grown = [r[3] for r in runs]
    assert all(isinstance(g, int) for g in grown), runs
    assert grown[1] < MiB <= 8 * MiB <= grown[2] < 9 * MiB and grown[3] < MiB, grown


def _counted(reps: list[Replay], per_step: int) -> list[Replay]:
    """``reps`` with the controller's container allocations counted: ``per_step`` in each step."""
    for r in reps:
        for s in r.per_step:
            s.allocations = per_step * s.index
    return reps


def test_under_the_default_collector_releases_fall_where_the_counted_allocations_put_them():
    """Releases seen in six steps are one or two; allocations per step are counted in the hundreds. Where
    they were counted, the releases are the steps in which the collector runs (here half its threshold per
    step: a run every two steps), not the rate of the releases seen (every third step)."""
    counted = model_mod.fit(_counted(fit_set(release_every=3, gc="default"), heap.YOUNG_EVERY // 2 + 1))
    x = counted.features(200 * MiB, 64, 4, 2)
    assert counted.allocation_rate is not None
    assert counted.allocation_rate(x) == pytest.approx(heap.YOUNG_EVERY // 2 + 1, abs=1e-6)
    assert counted.release_steps(x, 6) == [2, 4, 6]
    assert any(term == "allocations per step" for _, term, _ in counted.terms_table())
    uncounted = model_mod.fit(fit_set(release_every=3, gc="default"))  # cached before allocations were counted
    assert uncounted.allocation_rate is None and uncounted.release_steps(x, 6) == [3, 6]
    off = model_mod.fit(_counted(fit_set(release_every=3, gc="off"), 400))
    assert off.allocation_rate is None  # only the default collector runs on its own schedule


def _phased(runs: list[tuple[int, int, str]], workers: int = 4) -> Replay:
    """A collector-default replay whose steps end at the given allocation counts, each with one recorded run:
    (allocations at the step's end, calls made at the run, where the call in hand stood)."""
    rep = Replay("numpy-legacy", "default", "t", 0.1, workers, len(runs), 64 * MiB, 64, 16 * MiB, 0, "ok",
                 None, None, None)
    rep.per_step = [StepObs(k, allocations=a, runs=[[0, made, phase]]) for k, (a, made, phase) in enumerate(runs, 1)]
    return rep


def test_a_run_late_in_a_call_finds_its_copy_thrown_away_where_the_fits_found_it():
    """The legacy copy is referenced only while its call's ``consolidate`` runs (heap's module doc), so a run
    that comes after it in the call finds it garbage and one before it finds none. Where the fits recorded runs
    after their call's copy, the share of a call past which its copy is garbage is read from where those runs and
    the others stood, and a run past it counts its call as done and keeps no copy in hand. The counts are
    many-keys' x0.5 replay's with 4 workers (437 to 704, 63.75 ahead of an even spread: the run at 3.0 calls'
    worth, the end of the third call) and flowgrpo's (429 to 705: 2.55, halfway through its third)."""
    assert heap.calls_done(437, 704, 4, lead=63.75) == (0.5, 0.5)  # no share known: the call in hand keeps its copy
    assert heap.calls_done(437, 704, 4, lead=63.75, released=0.6) == (0.75, 0.75, False)
    assert heap.calls_done(429, 705, 4, lead=95.875, released=0.6) == (0.5, 0.5)  # inside consolidate
    # played: the copy of the call in hand survives a young run into generation 1 (one chunk more after step 2);
    # thrown away, the run frees it with the others
    gens = {2: (0, 1)}
    kept = heap.play(0.0, 1.0, 1.0, {2: (0.5, 0.5)}, 2, 1.0, 4, gens)
    freed = heap.play(0.0, 1.0, 1.0, {2: (0.75, 0.75, False)}, 2, 1.0, 4, gens)
    assert [round(v, 3) for v, _ in kept] == [1.0, 0.5] and [round(v, 3) for v, _ in freed] == [1.0, 0.25]
    assert freed[1][1] == pytest.approx(1.75)  # just before the run: step 1's copies and three of step 2's
    # a run before its call's copy is made keeps none in hand either; the copy made after it stays young
    before = heap.play(0.0, 1.0, 1.0, {2: (0.5, 0.5, False)}, 3, 1.0, 4, {2: (0, 1), 3: (0, 1)})
    assert [round(v, 3) for v, _ in before] == [1.0, 0.5, 1.5]
    # the fits' records: steps of 200 allocations a call put a run at 0.505 of its call (after the copy) and at
    # 0.44 of another (inside it), so the share lies between them
    rep = _phased([(800, 3, "after-copy"), (1500, 3, "in-copy")])
    assert heap.recorded_runs(rep) == {1: (1.0, 1.0, False), 2: (0.75, 0.75)}
    assert heap.recorded_runs(rep, copies=False) == {1: (0.75, 0.75), 2: (0.75, 0.75)}
    assert heap.observed_release([rep], 0.0) == pytest.approx((0.44 + 0.505) / 2, abs=0.001)
    assert heap.observed_release([rep], None) is None  # no lead, no place in a call
    assert heap.observed_release([_phased([(800, 3, "in-copy"), (1500, 3, "before-copy")])], 0.0) is None
    # a last run before its call's copy finds none in hand
    assert heap.recorded_runs(_phased([(800, 2, "before-copy")])) == {1: (0.5, 0.5, False)}
    # a run inside consolidate: before the copy's block the copy outlives young runs, after it the copy goes as its
    # call returns. The record's fourth field (bytes the call had allocated by the run) tells which: from half a
    # chunk's payload on, the block was made, and the run reads as one after the copy
    chunk = 10 * MiB
    assert heap.stood([0, 1, "in-copy", 2 * chunk], chunk) == "after-copy"
    assert heap.stood([0, 1, "in-copy", 4096], chunk) == "in-copy"
    assert heap.stood([0, 1, "in-copy", None], chunk) == heap.stood([0, 1, "in-copy"], chunk) == "in-copy"
    assert heap.stood([0, 1, "before-copy", 2 * chunk], chunk) == "before-copy"  # only a run inside consolidate
    blocked = _phased([(800, 3, "in-copy"), (1500, 3, "in-copy")])
    blocked.chunk_bytes = chunk
    blocked.per_step[0].runs[0].append(2 * chunk)  # step 1's run came after its call's block, step 2's before it
    blocked.per_step[1].runs[0].append(1024)
    assert heap.recorded_runs(blocked) == {1: (1.0, 1.0, False), 2: (0.75, 0.75)}
    assert heap.observed_release([blocked], 0.0) == pytest.approx((0.44 + 0.505) / 2, abs=0.001)
    # the other outcomes give every copy in hand back, or keep every one
    assert heap.copy_given_back({2: (0.5, 0.5), 3: (0.0, 0.0), 4: (1.0, 1.0), 5: (0.75, 0.75, False)}, 4) == \
        {2: (0.75, 0.75, False), 3: (0.0, 0.0), 4: (1.0, 1.0), 5: (0.75, 0.75, False)}
    m = model_mod.fit(_counted(fit_set(release_every=3, gc="default"), heap.YOUNG_EVERY // 2 + 1))
    m.run_lag, m.release_share = 0, 1.0
    kept = m.play(200 * MiB, 64, 4, 6, 2)["controller"]
    given = m.play(200 * MiB, 64, 4, 6, 2, copy_in_hand="given back")["controller"]
    assert [round(v / (200 * MiB), 3) for v, _ in given] == [1.25, 0.25, 1.25, 0.25, 1.25, 0.25]
    assert all(g[0] <= k[0] + 1e-6 for g, k in zip(given, kept))  # less left after every step
    assert given[1][1] == pytest.approx(kept[1][1] + 0.25 * 200 * MiB)  # the step stands a copy higher at the run


def test_a_release_frees_the_calls_done_in_its_step_and_every_mapped_leaf_of_the_garbage():
    """The legacy copy is cycle-held: a run of the collector in step k frees the copies of the steps before
    and of step k's calls already done (their chunks sent); the call in hand keeps its own (docs/predict.md,
    "share freed at a release"). Of that garbage, leaves above glibc's mmap threshold go back to the kernel,
    all of them; the heap-sized rest by the fitted share. The counts are a flowgrpo x0.5 replay's with 4
    workers (429 to 704: the run at 99% of step 2, three of four calls done) and an x0.1 one's with 2
    (590 to 717: one of two), benchmarks/README.md."""
    assert heap.calls_done(429, 704, 4) == (0.75, 0.75)
    assert heap.calls_done(590, 717, 2) == (0.5, 0.5)
    assert heap.calls_done(100, 600, 4) is None  # no run in the step
    assert heap.calls_done(0, 2000, 4) == (0.25, 0.5)  # runs at 701 and 1402: the last frees the most
    assert heap.freed_at_release(2.0, 0.25, 0.5) == pytest.approx(0.5 + 0.75)
    m = model_mod.fit(_counted(fit_set(release_every=3, gc="default"), heap.YOUNG_EVERY // 2 + 1))
    m.run_lag = 0  # the runs where the count puts them (the lag: the test after this one)
    x = m.features(200 * MiB, 64, 4, 2)
    assert m.release_points(x, 6) == {k: (0.75, 0.75) for k in (2, 4, 6)}  # 351 a step: each run late in its step
    m.release_share = 1.0
    played = m.play(200 * MiB, 64, 4, 6, 2)
    levels = [round(lvl / (200 * MiB), 3) for lvl, _ in played["controller"]]
    # base 0.25 (a chunk) + what the call in hand still holds; that copy survives the run into generation 1, which
    # the next young runs leave alone: each run with a call in hand leaves a chunk more (benchmarks/README.md,
    # "Copies that outlive a run of the collector")
    assert levels == [1.25, 0.5, 1.5, 0.75, 1.75, 1.0]
    # the step's highest is just before the run: the copy of step 1 and three of step 2's, above base 0.25
    assert played["controller"][1][1] == pytest.approx(2.0 * 200 * MiB, rel=1e-6)
    node_level, node_peak = played["node"][1]
    assert node_peak == pytest.approx(node_level + 1.5 * 200 * MiB, rel=1e-6)  # the node stood as far above its level
    many = model_mod.fit(_counted(fit_set(release_every=3, gc="default"), 1500))  # two runs in every step
    many.release_share, many.run_lag = 1.0, 0
    assert many.release_points(x, 2) == {1: (0.25, 0.75), 2: (0.25, 0.75)}
    level, peak = many.play(200 * MiB, 64, 4, 2, 2)["controller"][1]
    # each run finds a call in hand (the second and the fourth), whose copies survive into generation 1: of the
    # step's four copies two are freed; its highest is before the first run, one call done
    assert (level, peak) == (pytest.approx(1.25 * 200 * MiB, rel=1e-6), pytest.approx(1.25 * 200 * MiB, rel=1e-6))
    # consolidate copies a chunk into one block: a 50 MiB chunk's copy is mapped though its 10 MiB leaf is not,
    # and a run gives it all back; the level with nothing held keeps the heap-sized leaf's temporary only
    m.release_share = 0.0
    m.leaf_row_bytes = [40 * MiB / 16, 10 * MiB / 16]
    assert m.features(200 * MiB, 64, 4, 2)["mshare"] == 1.0
    levels = [round(lvl / (200 * MiB), 3) for lvl, _ in m.play(200 * MiB, 64, 4, 3, 2)["controller"]]
    assert levels == [1.05, 0.3, 1.3]
    # a 20 MiB chunk's copy is heap-sized: of step 2's 1.75 payloads of garbage half goes back, the rest is kept as
    # free blocks (0.875), and step 3's copy (1.0) reuses them first (docs/predict.md); base: the 20 MiB chunk
    m.release_share = 0.5
    m.leaf_row_bytes = [16 * MiB / 16, 4 * MiB / 16]
    assert m.features(80 * MiB, 64, 4, 2)["mshare"] == 0.0
    levels = [round(lvl / (80 * MiB), 3) for lvl, _ in m.play(80 * MiB, 64, 4, 3, 2)["controller"]]
    assert levels == [1.25, 1.375, 1.5]


def test_a_copy_in_hand_at_a_run_outlives_it_until_a_run_of_its_generation():
    """A run of the collector set off by allocating collects the young generation only: the copy of the call in hand,
    still referenced, moves into generation 1 and stays there, garbage, until a run of generation 1, which CPython
    makes every twelfth run (its second threshold, 10 young runs, passed); what survives that run moves into
    generation 2. A flowgrpo replay at x1 with 8 workers over 40 steps (benchmarks/README.md, "Copies that outlive
    a run of the collector") ran at 709, 1148, 1571 and 2110 allocations in steps 1, 3 and 4, and its twelfth run,
    in step 19, was of generation 1; its level after each run with a call in hand climbed by a chunk and fell back
    there."""
    assert heap.OLDER_EVERY == gc.get_threshold()[1] + 2 == 12
    assert heap.generations([0, 709, 1148, 1571, 2110]) == {1: (0, 1), 3: (0, 1), 4: (0, 1)}
    counts = [0.0] + [heap.YOUNG_EVERY * k + 10.0 for k in range(1, 14)]  # a run in every step
    gens = heap.generations(counts)
    assert [gens[k][0] for k in range(1, 14)] == [0] * 11 + [1, 0]  # the twelfth is of generation 1
    assert heap.generations([0.0, 1500.0]) == {1: (0, 2)}  # two runs in one step
    runs = {k: (0.75, 0.75) for k in range(1, 14)}  # six of eight calls done, the seventh in hand
    levels = [round(lvl, 4) for lvl, _ in heap.play(0.0, 1.0, 1.0, runs, 13, 1.0, 8, gens)]
    # a chunk left by each run (the seventh call's copy), every one of them freed by the twelfth run but its own,
    # which moves into generation 2 for good; the eighth call's copy is still young after each step
    assert levels == [0.125 + 0.125 * k for k in range(1, 12)] + [0.25, 0.375]
    assert [round(lvl, 4) for lvl, _ in heap.play(0.0, 1.0, 1.0, runs, 13, 1.0, 8)] == [0.25] * 13  # gens unknown
    # a run before the step's first call finds no copy in hand: the next one frees all of the step's
    at_start = heap.play(0.0, 1.0, 1.0, {1: (0.0, 0.0), 2: (0.0, 0.0)}, 2, 1.0, 8, {1: (0, 1), 2: (0, 1)})
    assert [lvl for lvl, _ in at_start] == [1.0, 1.0]
    at_end = heap.play(0.0, 1.0, 1.0, {1: (1.0, 1.0)}, 1, 1.0, 8, {1: (0, 1)})  # every call made: none in hand
    assert at_end[0][0] == 0.0
    rep = fit_set(gc="default")[0]
    for s in rep.per_step:
        s.runs = [[1, 1]] if s.index == 2 else []
    assert heap.replay_generations(rep) == {2: (1, 1)}  # as the loop recorded it


def test_a_run_that_comes_a_call_before_the_even_spread_of_the_allocations_is_fitted_from_the_levels():
    """The controller's allocation count is net of frees, and a step frees the chunks' containers only at its
    end, so the collector can run a call before the even spread of the count says: flowgrpo x0.5 with 4 workers
    (429 to 704 in step 2) ran in the third call's consolidate, two calls done (docs/predict.md). Replays made
    so are fitted with that lag, also where a run keeps most of what it frees (the next steps' reuse of the kept
    blocks then shows it); replays whose run falls where the count says are not."""
    off = fit_set()

    def made(lag: int, share: float) -> list[Replay]:
        reps = []
        for r in _counted(fit_set(gc="default"), heap.YOUNG_EVERY // 2 + 1):
            p = r.payload_bytes
            mapped = model_mod.fit(off).features(p, r.rows, r.workers, 2)["mshare"]
            played = heap.play(0.5 * p, 1.0 * p, mapped, model_mod.replay_releases(r, lag), r.steps, share,
                               len(fitting.chunk_sizes(r.rows, r.workers)), heap.replay_generations(r))
            for s, (level, _) in zip(r.per_step, played):
                s.end["controller"] = s.peak["controller"] = int(level)
            reps.append(r)
        return reps

    assert heap.calls_done(429, 704, 4, lag=1) == (0.5, 0.5) and heap.calls_done(590, 717, 2, lag=1) == (0.0, 0.0)
    early = model_mod.fit(made(1, 1.0), held=model_mod.fit(off))
    assert early.run_lag == 1 and early.release_share == pytest.approx(1.0)
    x = early.features(200 * MiB, 64, 4, 2)
    assert early.release_points(x, 2) == {2: (0.5, 0.5)}  # two of step 2's four copies still held after its run
    level = early.play(200 * MiB, 64, 4, 2, 2)["controller"][1][0]
    assert level == pytest.approx(0.25 * 200 * MiB + 0.5 * 200 * MiB, rel=1e-6)
    assert model_mod.fit(made(0, 1.0), held=model_mod.fit(off)).run_lag == 0
    assert model_mod.fit(made(1, 0.3), held=model_mod.fit(off)).run_lag == 1  # kept blocks: seen in the reuse


def _recorded(reps: list[Replay], lead: float, verl_loop: bool = False) -> list[Replay]:
    """``reps`` with the controller's loop's record of each run (``StepObs.runs``): a young collection in each step
    the count puts one, where the count ``lead`` allocations ahead of its even spread passes the collector's
    threshold (lead 0: where the spread says); ``verl_loop``: the calls not said."""
    for r in reps:
        n, counts = len(fitting.chunk_sizes(r.rows, r.workers)), [s.allocations or 0 for s in r.per_step]
        for before, s in zip([0, *counts], r.per_step):
            done = heap.calls_done(before, s.allocations or 0, n, lead=lead)
            s.runs = [] if done is None else [[0, None if verl_loop else round(done[0] * n)]]
    return reps


def test_where_the_loop_recorded_the_runs_sets_the_lead_and_the_releases_whatever_the_levels_say():
    """The controller's loop records the calls it had made at each of its collector's runs (StepObs.runs, the
    driver's ``driver_runs``). Where the fits have that record, each replay's releases are the recorded ones, and
    the count's lead over the even spread of a step's allocations (in allocations, so that it plays alike at every
    worker count) is one that puts every recorded run where it came: levels played with no lag but runs recorded
    a call early are read as the records say (the levels alone give no lag, as the test above shows), and the
    other way round. A replay whose loop did not say (real verl's worker group) falls back on the levels."""
    off = fit_set()

    def made(lag: int) -> list[Replay]:
        reps = []
        for r in _counted(fit_set(gc="default"), heap.YOUNG_EVERY // 2 + 1):
            p = r.payload_bytes
            mapped = model_mod.fit(off).features(p, r.rows, r.workers, 2)["mshare"]
            played = heap.play(0.5 * p, 1.0 * p, mapped, model_mod.replay_releases(r, lag), r.steps, 1.0,
                               len(fitting.chunk_sizes(r.rows, r.workers)), heap.replay_generations(r))
            for s, (level, _) in zip(r.per_step, played):
                s.end["controller"] = s.peak["controller"] = int(level)
            reps.append(r)
        return reps

    def plays_the_records(reps: list[Replay], lead: float) -> bool:
        for r in reps:
            n, counts = len(fitting.chunk_sizes(r.rows, r.workers)), [s.allocations for s in r.per_step]
            played = {s.index: heap.calls_done(b, s.allocations, n, lead=lead)
                      for b, s in zip([0, *counts], r.per_step)}
            if {k: v for k, v in played.items() if v is not None} != heap.recorded_runs(r):
                return False
        return True

    early = _recorded(made(0), 180.0)  # at 2 workers a call before the spread (351 a step), at 4 workers two
    assert heap.recorded_runs(early[0]) == {k: (v[0] - 0.5, v[0] - 0.5) for k, v in heap.counted_runs(early[0]).items()}
    assert heap.recorded_runs(early[3]) == {k: (v[0] - 0.5, v[0] - 0.5) for k, v in heap.counted_runs(early[3]).items()}
    lead = heap.observed_lead(early)
    assert lead is not None and lead > 0 and plays_the_records(early, lead)
    m = model_mod.fit(early, held=model_mod.fit(off))
    assert m.run_lead == lead and m.run_lag == 0
    x = m.features(200 * MiB, 64, 4, 2)
    assert m.release_points(x, 2) == {2: heap.calls_done(heap.YOUNG_EVERY // 2 + 1, 2 * (heap.YOUNG_EVERY // 2 + 1), 4,
                                                         lead=lead)}
    words = " ".join(v for _, term, v in m.terms_table() if term == "allocations per step")
    assert f"{lead:.0f} ahead of an even spread" in words and "where the fits' runs came" in words, words
    even = _recorded(made(1), 0.0)
    assert plays_the_records(even, heap.observed_lead(even))
    assert model_mod.fit(even, held=model_mod.fit(off)).release_points(x, 2) == {2: (0.75, 0.75)}  # as the spread
    verl_loop = _recorded(made(1), 0.0, verl_loop=True)
    assert heap.recorded_runs(verl_loop[0]) is None and heap.observed_lead(verl_loop) is None
    fallback = model_mod.fit(verl_loop, held=model_mod.fit(off))
    assert fallback.run_lag == 1 and fallback.run_lead is None  # the levels', as without a record


def test_a_chunks_temporaries_are_level_where_glibc_keeps_them_and_a_rise_within_the_call_where_it_maps_them():
    """The legacy codec's consolidate clones a chunk's leaves and frees the clones (every chunk but the first:
    tensordict clones a leaf that does not start its storage). At the fit sizes every leaf is heap-sized: the
    freed clones stay in the heap for the next call, and the level with nothing held is about one chunk
    (fit_set: exactly one). Where a leaf is mapped its clone goes back to the kernel after the call: the level
    keeps the heap-sized leaves' part only, and the mapped part is a rise within each call."""
    m = model_mod.fit(fit_set())
    assert m.temp_share() == pytest.approx(1.0, rel=1e-6)
    m.leaf_row_bytes = [40 * MiB / 16, 10 * MiB / 16]  # at 200 MiB with 4 workers: a 40 MiB leaf mapped, 10 MiB not
    (level, peak), = m.play(200 * MiB, 64, 4, 1, 2)["controller"]
    assert level == pytest.approx(200 * MiB + 10 * MiB, rel=1e-6)
    assert peak == pytest.approx(level + 40 * MiB, rel=1e-6)
    assert model_mod.fit(fit_set(base=0.0)).temp_share() == 0.0  # a codec without temporaries (numpy): none


def test_under_the_default_collector_the_controller_keeps_what_the_collector_off_fits_keep_and_reuses_freed_blocks(
        monkeypatch):
    """A run gives back part of its heap-sized garbage and keeps the rest as free blocks, which the next steps'
    copies reuse: the level pauses after a run instead of falling (docs/predict.md, "share freed at a release").
    Replays made so (a copy of 1.0x a step, 30% given back at each run), read alone, take the pauses for a
    smaller growth; with the collector-off replays' growth (``held``), the fit finds the share and plays
    their levels back, and ``models`` replays the fit sizes in both modes for it."""
    share, reps, off = 0.3, [], fit_set()  # off: 1.0x a step, never freed
    for r in _counted(fit_set(gc="default"), heap.YOUNG_EVERY // 2 + 1):  # a run late in every second step
        p = r.payload_bytes
        runs = model_mod.replay_releases(r)
        done = 1 - 1 / len(fitting.chunk_sizes(r.rows, r.workers))  # all calls but the one in hand
        assert runs == {k: (done, done) for k in (2, 4, 6)}
        mapped = model_mod.fit(off).features(p, r.rows, r.workers, 2)["mshare"]  # an 80 MiB batch's 40 MiB chunks
        for s, (level, _) in zip(r.per_step, heap.play(0.5 * p, 1.0 * p, mapped, runs, r.steps, share,
                                                       len(fitting.chunk_sizes(r.rows, r.workers)),
                                                       heap.replay_generations(r))):
            s.end["controller"] = s.peak["controller"] = int(level)
        reps.append(r)
    x = reps[0]
    ends = [s.end["controller"] / x.payload_bytes for s in x.per_step]
    # no fall: each run's blocks reused; and each run's call in hand outlives it (a copy of half the payload)
    assert ends == pytest.approx([1.5, 2.05, 2.05, 2.55, 2.55, 3.05], abs=1e-6)
    alone = model_mod.fit(reps)
    both = model_mod.fit(reps, held=model_mod.fit(off))
    feats = both.features(x.payload_bytes, x.rows, x.workers, 2)
    assert alone.roles["controller"].growth(feats) < 0.5 * x.payload_bytes  # the pauses read as growth
    assert both.roles["controller"].growth(feats) == pytest.approx(x.payload_bytes, rel=1e-3)
    assert both.release_share == pytest.approx(share, abs=1 / heap.SHARE_GRID) and both.run_lag == 0
    played = [lvl / x.payload_bytes for lvl, _ in both.play(x.payload_bytes, x.rows, x.workers, 6, 2)["controller"]]
    assert played == pytest.approx(ends, abs=0.02)
    table = dict(((r, t), v) for r, t, v in both.terms_table())
    assert "the collector-off replays" in table[("controller", "held per training step")]
    assert prediction.fit_modes("default") == ["default", "off"] and prediction.fit_modes("off") == ["off"]
    assert prediction.fit_modes("default", "transferqueue") == ["default"]
    modes: list[str] = []

    def fake_replays(group, workload, gc, scales, workers, steps, **kw):  # the replays above, by collector mode
        modes.append(gc)
        return reps if gc == "default" else off

    monkeypatch.setattr(fitting, "replays", fake_replays)
    fitted = prediction.models(("numpy-legacy",), "flowgrpo", "default")["numpy-legacy"]
    assert modes == ["default", "off"] and fitted.growth_fitted_on == model_mod.fit(off).fitted_on


def test_the_answer_says_the_controllers_peak_is_an_estimate_where_its_releases_free_heap_sized_copies():
    """A release gives back its copies' mapped leaves whole and of the heap-sized rest what glibc can, which the
    fits show on average only (docs/predict.md, "The allocator"). The answer says so where a tenth or more of the
    freed copies are heap-sized, and not where they are (nearly) all mapped or nothing is released."""
    wl = load_workload("flowgrpo")
    m = model_mod.fit(_counted(fit_set(release_every=3, gc="default"), heap.YOUNG_EVERY // 2 + 1))
    pay = 200 * MiB

    def answer(model, pay=pay, rows=64):
        out = prediction.play_node(model, wl, rows, pay, 4, 6, {}, None, 0.95, store_capacity=None)
        return out, prediction.CodecPrediction(
            "numpy-legacy", model.gc, pay, 64, 4, 6, None, 0.95, {}, out["node_peak"], out["peaks"], out["steps"],
            out["killed"], None, out["releases"], model.terms_table(), model.fitted_on,
            release_heap_share=out["release_heap_share"])

    m.leaf_row_bytes = [2 * MiB]  # 65 rows in chunks of 17, 17, 17, 14: copies of 34 MiB mapped, one of 28 MiB not
    out, p = answer(m, 130 * MiB, 65)
    assert out["releases"] and out["release_heap_share"] == pytest.approx(14 / 65)
    assert "22% of the copies the controller's collections free are heap-sized blocks" in p.summary()
    assert "read the controller's peak as an estimate" in p.allocator_text()
    assert p.to_json_dict()["release_heap_share"] == pytest.approx(14 / 65)
    page = render_predictions([p], "flowgrpo", "picklescope predict")  # the report, under what it cannot know
    assert html_escape(p.allocator_text()) in page.split("<h2>What the model cannot know</h2>", 1)[1]
    m.leaf_row_bytes = [40 * MiB / 16, 10 * MiB / 16]  # every copy one mapped block of 50 MiB: all given back
    out, p = answer(m)
    assert out["release_heap_share"] == 0.0 and p.allocator_text() is None
    assert "heap-sized blocks" not in p.summary()
    out, p = answer(model_mod.fit(fit_set()))  # the collector off: nothing released, nothing to say
    assert out["releases"] == [] and out["release_heap_share"] is None and p.allocator_text() is None
    assert p.to_json_dict()["release_heap_share"] is None


def test_the_answer_gives_the_other_way_a_run_inside_a_calls_copy_goes():
    """A run of the collector inside a call's ``consolidate`` leaves that call's copy to outlive it if it came before
    the copy's block, nothing of it if after, and no count places a run that finely for sure (docs/predict.md, "What
    a run inside a call's copy leaves"). The answer plays each run as the fits found runs at its place in a call and
    says what the other way would give: the controller's and the node's peaks and Ray's step, in the summary, the
    JSON and the report; nothing where every way plays the same (the collector off). Where the fits found the copy
    thrown away at the run's place, the figures assume that and the other way keeps it."""
    wl = load_workload("flowgrpo")
    m = model_mod.fit(_counted(fit_set(release_every=3, gc="default"), heap.YOUNG_EVERY // 2 + 1))
    m.run_lag, m.release_share = 0, 1.0
    preds = []
    for model in (m, model_mod.fit(fit_set())):
        out = prediction.play_node(model, wl, 64, 200 * MiB, 4, 6, {}, 2**40, 0.95, store_capacity=None)
        other = prediction.play_other_way(out, "given back", model, wl, 64, 200 * MiB, 4, 6, {}, 2**40, 0.95, None,
                                          0.0)
        assert prediction.play_other_way(out, "kept", model, wl, 64, 200 * MiB, 4, 6, {}, 2**40, 0.95, None,
                                         0.0) is None  # the fits found no copy thrown away within a call
        preds.append(prediction.CodecPrediction(
            "numpy-legacy", model.gc, 200 * MiB, 64, 4, 6, 2**40, 0.95, {}, out["node_peak"], out["peaks"],
            out["steps"], out["killed"], None, out["releases"], model.terms_table(), model.fitted_on,
            node_peak_copy_given_back_bytes=None if other is None else other["node_peak"],
            controller_peak_copy_given_back_bytes=None if other is None else other["peaks"]["controller"],
            copy_given_back_killed_step=None))
    given, off = preds
    # each run here comes with three of four calls made: the copy of the fourth, in hand, is given back
    kept = model_mod.Model.play(m, 200 * MiB, 64, 4, 6, 2)["controller"]
    back = model_mod.Model.play(m, 200 * MiB, 64, 4, 6, 2, copy_in_hand="given back")["controller"]
    assert given.controller_peak_copy_given_back_bytes == int(max(v for _, v in back))
    assert given.processes["controller"] == int(max(v for _, v in kept))
    text = given.copy_text()
    assert text and fmt_bytes(given.controller_peak_copy_given_back_bytes) in text and "figures above assume" in text
    assert "every step" not in text  # both ways survive the 1 TiB node: Ray's verdict is said only where it changes
    given.copy_given_back_killed_step = 5
    assert "Ray would kill in training step 5" in given.copy_text()
    given.copy_given_back_killed_step = None
    assert text in given.summary()
    doc = given.to_json_dict()
    assert doc["controller_peak_copy_given_back_bytes"] == given.controller_peak_copy_given_back_bytes
    assert doc["node_peak_copy_given_back_bytes"] == given.node_peak_copy_given_back_bytes
    assert html_escape(text) in render_predictions([given], "flowgrpo", "picklescope predict")
    assert off.copy_text() is None and off.to_json_dict()["controller_peak_copy_given_back_bytes"] is None
    # the fits found each run past the share of its call where the copy is thrown away: the figures assume it goes,
    # and the other way keeps every copy in hand
    m.run_lead, m.copy_released = 0.0, 0.5  # the count puts each run at the end of its fourth call
    out = prediction.play_node(m, wl, 64, 200 * MiB, 4, 6, {}, 2**40, 0.95, store_capacity=None)
    assert prediction.play_other_way(out, "given back", m, wl, 64, 200 * MiB, 4, 6, {}, 2**40, 0.95, None,
                                     0.0) is None
    kept_way = prediction.play_other_way(out, "kept", m, wl, 64, 200 * MiB, 4, 6, {}, 2**40, 0.95, None, 0.0)
    assert kept_way is not None and kept_way["peaks"]["controller"] == int(max(v for _, v in kept))
    assert out["peaks"]["controller"] == int(max(v for _, v in back))
    gone = prediction.CodecPrediction(
        "numpy-legacy", m.gc, 200 * MiB, 64, 4, 6, 2**40, 0.95, {}, out["node_peak"], out["peaks"], out["steps"],
        out["killed"], None, out["releases"], m.terms_table(), m.fitted_on,
        node_peak_copy_kept_bytes=kept_way["node_peak"],
        controller_peak_copy_kept_bytes=kept_way["peaks"]["controller"])
    said = gone.copy_text()
    assert said and "figures above assume that it does not" in said and "if it survives" in said, said
    assert fmt_bytes(kept_way["peaks"]["controller"]) in said
    assert gone.to_json_dict()["controller_peak_copy_kept_bytes"] == kept_way["peaks"]["controller"]


def test_a_feature_the_fits_do_not_need_is_not_extrapolated():
    """Allocations that do not move with the objects at the fit sizes (flowgrpo's: 452 with 2 calls at 12,
    26 and 52 objects) get no objects slope from the calls' slight curvature: at a production batch of
    23,000 objects such a slope alone (-0.035 each) made the count negative and the collector never run.
    Counts that do move with the objects keep it."""
    pts = [(2, 12, 452), (3, 12, 590), (2, 26, 452), (4, 26, 707), (2, 52, 452), (4, 52, 707)]
    xs = [{"objects": o, "calls": c, "1": 1.0} for c, o, _ in pts]
    flat = terms_mod.fit_supported("allocations", ("objects", "calls", "1"), xs, [a for *_, a in pts])
    assert flat.features == ("calls", "1"), flat
    assert flat({"calls": 8, "1": 1.0}) > 1000
    moving = terms_mod.fit_supported("allocations", ("objects", "calls", "1"), xs,
                                     [a + 3 * o for c, o, a in pts])
    assert moving.features == ("objects", "calls", "1") and moving.coef[0] == pytest.approx(3, rel=0.1), moving


def test_a_default_collector_replay_cached_without_its_counted_collections_is_measured_again(tmp_path):
    rep = synthetic(20 * MiB, 2, 3, gc="default")
    path = tmp_path / "r.json"
    fitting.save_cached(path, rep)
    assert fitting.load_cached(path) is None
    fitting.save_cached(path, _counted([rep], 4)[0])
    assert fitting.load_cached(path) is not None
    fitting.save_cached(path, synthetic(20 * MiB, 2, 3, gc="off"))
    assert fitting.load_cached(path) is not None  # the collector off: nothing to count
    doc = json.loads(path.read_text())
    doc["per_step"][0]["a_key_of_another_version"] = 1
    path.write_text(json.dumps(doc))
    assert fitting.load_cached(path) is not None  # read as far as this version knows it, not measured again


def test_lstsq_separates_payload_chunk_and_constant_terms():
    xs = [[p, p / w, 1.0] for w in (2, 4) for p in (1e7, 2e7, 4e7)]
    ys = [0.25 * a + 1.0 * b + 5e6 for a, b, _ in xs]
    coef = terms_mod.lstsq(xs, ys)
    assert coef == pytest.approx([0.25, 1.0, 5e6], rel=1e-6)


def test_the_workers_sum_holds_the_chunks_as_torch_chunk_cuts_them():
    """13 rows among 4 workers are chunks of 4, 4, 4 and 1 rows (6 rows: 2, 2, 2, and one worker idle): the
    workers together hold the batch's rows, not 4 x the largest chunk. Fitted on such uneven splits, the
    workers' level is one heap-sized batch at an even split too (no per-worker term to make up for it)."""
    assert fitting.chunk_sizes(13, 4) == [4, 4, 4, 1] and fitting.chunk_sizes(6, 4) == [2, 2, 2]
    assert fitting.chunk_sizes(64, 4) == [16] * 4 and fitting.chunk_sizes(13, 2) == [7, 6]
    reps = []
    for rows, workers in ((6, 2), (13, 2), (26, 2), (6, 4), (13, 4), (26, 4)):
        payload = rows * MiB
        rep = synthetic(payload, workers, 6, rows=rows)
        for s in rep.per_step:  # every row's bytes stay in some worker's heap, plus 1 MiB per worker
            s.end["workers"] = s.peak["workers"] = payload + workers * MiB
            s.end["node"] = s.peak["node"] = s.end["controller"] + s.end["workers"]
        reps.append(rep)
    m = model_mod.fit(reps)
    x = m.features(64 * MiB, 64, 4, 2)
    assert x["H"] == pytest.approx(64 * MiB) and m.features(13 * MiB, 13, 4, 2)["H"] == pytest.approx(13 * MiB)
    assert m.roles["workers"].base(x) == pytest.approx(68 * MiB, rel=1e-3)


def test_the_controller_keeps_a_chunk_fitted_on_the_chunk_not_on_the_worker_count():
    """The controller serializes one chunk at a time: what it keeps between steps beside the held copies is
    about one chunk (P/2 with 2 workers, P/4 with 4). A function of the chunk, it holds at 8 workers too,
    where a straight line in the worker count fitted at 2 and 4 would have gone below nothing."""
    reps = [synthetic(p * MiB, w, 6) for w in (2, 4) for p in (20, 40, 80)]
    m = model_mod.fit(reps)
    x = m.features(200 * MiB, 64, 8, 2)
    assert m.roles["controller"].base(x) == pytest.approx(25 * MiB, rel=1e-3)


def test_a_jump_of_the_allocator_at_one_step_is_level_not_growth():
    """The controller keeps one payload per step, and at one step of each replay its heap also keeps a
    leaf-sized block (0.4 x payload) that no later step adds to. The growth is the payload (the median
    rise), not the mean rise (1.08 x payload), which over 120 steps would add ten payloads no step keeps;
    the jump stays in the level with nothing held, below one jump."""
    reps = fit_set()
    for rep in reps:
        for s in rep.per_step[3:]:
            s.end["controller"] += int(0.4 * rep.payload_bytes)
            s.peak["controller"] = s.end["controller"]
    m = model_mod.fit(reps)
    x = m.features(200 * MiB, 64, 4, 2)
    assert m.roles["controller"].growth(x) == pytest.approx(200 * MiB, rel=1e-6)
    assert 50 * MiB < m.roles["controller"].base(x) < 50 * MiB + 0.4 * 200 * MiB  # a chunk, and below one jump
    level_120 = m.play(200 * MiB, 64, 4, 120, 2)["controller"][-1][0]
    assert level_120 < (0.25 + 120 + 0.4) * 200 * MiB


def test_one_replay_whose_allocator_jumped_at_most_steps_does_not_set_the_growth():
    """A replay's growth is its median rise; where its allocator kept a chunk-sized block at three of five steps
    (many-keys x0.2 with 2 workers in one draw: 1.49x of the payload a step where 1.00x is kept, benchmarks/
    README.md) the median is the jump. The growth's line through the replays is fitted by least absolute
    deviations, so that one such replay among six does not move it; least squares would have."""
    reps = fit_set()
    odd = reps[1]  # 40 MiB with 2 workers: 1.5 payloads a step
    for s in odd.per_step:
        s.end["controller"] += int(0.5 * odd.payload_bytes * (s.index - 1))
        s.peak["controller"] = s.end["controller"]
    m = model_mod.fit(reps)
    x = m.features(200 * MiB, 64, 4, 2)
    assert m.roles["controller"].growth(x) == pytest.approx(200 * MiB, rel=1e-3)
    xs = [m.features(r.payload_bytes, r.rows, r.workers, 2) for r in reps]
    squares = terms_mod.fit_term("growth", ("P", "c", "1"), xs,
                                 [model_mod._role_terms(r, "controller", [])[1] for r in reps])
    assert abs(squares(x) - 200 * MiB) > 0.03 * 200 * MiB


def test_a_replay_whose_allocator_kept_a_chunk_at_three_of_five_steps_weighs_as_those_three_rises():
    """The pattern of that many-keys replay (x0.2 with 2 workers: rises of 1.49, 1.00, 1.50, 1.49, 0.99x of the
    payload), among five replays whose levels scatter by a percent: the growth's line goes through every rise of
    every replay, so those three rises are three of thirty (the growth 1.00x within 1.5%), where the line
    through each replay's median rise took the replay as 1.49x and read 1.05x or more. The kept chunks stay in
    that replay's level with nothing held."""
    reps = fit_set()
    odd = reps[2]  # 80 MiB with 2 workers
    for r in reps:
        kept = 0.0
        for s in r.per_step:
            if r is odd and s.index in (2, 4, 5):
                kept += 0.5 * r.payload_bytes
            scatter = ((3 * s.index + r.workers + r.payload_bytes // MiB) % 5 - 2) * 0.005 * r.payload_bytes
            s.end["controller"] += int(kept + scatter)
            s.peak["controller"] = s.end["controller"]
    m = model_mod.fit(reps)
    x = m.features(200 * MiB, 64, 4, 2)
    assert m.roles["controller"].growth(x) == pytest.approx(200 * MiB, rel=0.015)
    xs = [m.features(r.payload_bytes, r.rows, r.workers, 2) for r in reps]
    medians = [model_mod._role_terms(r, "controller", [])[1] for r in reps]
    assert medians[2] == pytest.approx(1.5 * odd.payload_bytes, rel=0.02)
    per_replay = terms_mod.fit_term("growth", ("P", "c", "1"), xs, medians, robust=True)
    assert per_replay(x) > 1.05 * 200 * MiB
    held = model_mod._role_terms(odd, "controller", [], growth=m.roles["controller"].growth(xs[2]))[0]
    alone = model_mod._role_terms(odd, "controller", [])[0]
    assert held - alone > odd.payload_bytes  # what the jumps kept is level, not growth


def test_the_store_never_falls_below_its_baseline():
    """The object store's pages are never given back: a line fitted through small sizes whose store rose a
    little less at each larger size (8, 6 and 0 MiB) goes below nothing at a large one; the store's level
    is then nothing, never less."""
    reps = fit_set()
    for rep in reps:
        for s in rep.per_step:
            s.end["store"] = s.peak["store"] = max(0, 8 * MiB - rep.payload_bytes // 10)
    m = model_mod.fit(reps)
    x = m.features(400 * MiB, 64, 4, 2)
    assert m.roles["store"].base(x) < 0
    assert all(level == 0.0 for level, _ in m.play(400 * MiB, 64, 4, 3, 2)["store"])


def _mapped_fit_set(ratios: list[float | None]) -> list[Replay]:
    """The fit set whose replays' worker calls lasted ``ratios[k]`` x the controller's sending of a chunk in
    step k+1."""
    reps = fit_set()
    for rep in reps:
        for s, r in zip(rep.per_step, ratios):
            s.call_to_send = r
    return reps


def test_mapped_leaves_count_once_per_call_open_at_once_not_once_per_worker():
    """A leaf whose per-chunk bytes pass glibc's mmap threshold is mapped fresh at each call and given back
    after it: the workers' sum holds it for the calls open at the same moment. The fits' longest call lasted
    1.6 x the controller's sending of a chunk, so two calls are open when the last chunk leaves and at 4
    workers the sum rises by two chunks' mapped leaves, not four; replays that were not timed keep the
    upper bound (all four), and the terms table says which."""
    leaves = [1.0 * MiB, 3.0 * MiB]  # bytes per row: at 16 rows a chunk, 16 MiB in the heap and 48 MiB mapped
    timed = model_mod.fit(_mapped_fit_set([1.6, 0.4, 0.5, 0.4, 0.4, 0.5]), leaves)
    untimed = model_mod.fit(_mapped_fit_set([None] * 6), leaves)
    assert timed.calls_in_flight == 2 and untimed.calls_in_flight is None
    payload, rows = 64 * 4 * MiB, 64
    for m, open_calls in ((timed, 2), (untimed, 4)):
        level, peak = m.play(payload, rows, 4, 3, 2)["workers"][2]
        assert peak - level == pytest.approx(open_calls * 48 * MiB, rel=1e-6)
        node_level, node_peak = m.play(payload, rows, 4, 3, 2)["node"][2]
        assert node_peak - node_level == pytest.approx(open_calls * 48 * MiB, rel=1e-3)
    assert ("workers", "calls open at once") in [(r, t) for r, t, _ in timed.terms_table()]
    assert timed.calls_text().startswith("2, at most the workers") and "upper bound" in untimed.calls_text()


def test_workers_that_compute_keep_more_calls_open_by_their_compute_over_the_sending_of_a_chunk():
    """A worker that computes S seconds on its chunk keeps its call open S longer: with the fits' calls at
    1.6 x the controller's sending of a chunk and a chunk sent in 10 ms + 1 s per GiB (fitted on the fits'
    sends, per chunk byte), a 0.02 s compute on a 64 MiB chunk (72.5 ms to send) adds 0.28 sends, still two
    calls open, and a 0.2 s one adds 2.76: four, every worker; a minute of compute at a production size is
    all of them, and the workers' sum rises by every chunk's mapped leaves. Without timed sends a compute
    counts as every worker (the upper bound), without a compute the fits' own overlap holds. The fit sizes' own
    calls map their leaves too, so their node rose by those as well: the fit takes them out of its own rise
    (``Model.mapped_rise``), which a workload of large rows showed counted twice (benchmarks/README.md, "Copies
    that outlive a run of the collector")."""
    leaves = [1.0 * MiB, 3.0 * MiB]  # 16 MiB in the heap and 48 MiB mapped a chunk, as above
    reps = _mapped_fit_set([1.6, 0.4, 0.5, 0.4, 0.4, 0.5])
    opened = model_mod.fit(reps, leaves)  # the fit sizes' open calls hold their mapped leaves too, as a replay's do
    for rep in reps:
        mapped = opened.features(rep.payload_bytes, rep.rows, rep.workers, 2)["M"]
        for s in rep.per_step:
            s.send_s = 0.010 + rep.chunk_bytes / 2**30
            s.peak["node"] += 20 * MiB + int(mapped)  # the node's own rise while the controller sends, and those
    m = model_mod.fit(reps, leaves)
    assert m.send_s is not None and m.send_s({"c": 64 * MiB, "1": 1.0}) == pytest.approx(0.0725, rel=1e-3)
    chunk = 64 * MiB
    assert [m.open_calls(chunk, 4, s) for s in (0.0, 0.02, 0.2, 60.0, math.inf)] == [2, 2, 4, 4, 4]
    payload, rows = 4 * chunk, 64
    level, peak = m.play(payload, rows, 4, 3, 2, compute_s=60.0)["workers"][2]
    assert peak - level == pytest.approx(4 * 48 * MiB, rel=1e-6)
    # the node rises by the higher of the sends' moment (its own rise and the two calls they overlap) and the
    # compute's after them (all four calls, the send over: docs/predict.md), not by their sum (212 MiB)
    for compute, rise in ((0.0, 20 + 2 * 48), (0.02, 20 + 2 * 48), (60.0, 4 * 48)):
        level, peak = m.play(payload, rows, 4, 3, 2, compute_s=compute)["node"][2]
        assert peak - level == pytest.approx(rise * MiB, rel=1e-3), (compute, (peak - level) / MiB)
    untimed = model_mod.fit(_mapped_fit_set([1.6, 0.4, 0.5, 0.4, 0.4, 0.5]), leaves)  # sends not timed
    assert untimed.send_s is None and untimed.open_calls(chunk, 4, 0.02) == 4 and untimed.open_calls(chunk, 4) == 2
    assert "--worker-compute S" in m.calls_text() and "s per GiB" in m.calls_text()


def test_the_store_holds_at_least_the_chunks_of_the_calls_open_at_once():
    """A call's chunk stays in the object store until the call ends, so workers that compute hold every chunk
    there at once, where the fits' short calls let the next chunk reuse the pages of one already freed (real
    verl 0.9.1: 0.38-0.63x of the payload in the 4-worker fits, 0.94x in the held-out replay whose workers
    computed 2 s, benchmarks/README.md, "A baseline after the trim"). The store's level is at least the most a
    fit's store held over its payload after any step at the largest fit size (here 0.9x) times the payload of
    the calls open at once: two of four chunks with the fits' overlap, all four with a minute of compute. Not
    after its first step alone: the store is a high-water mark of touched pages, and a first step whose chunks
    reused each other's pages touched half of them (flowgrpo x0.2: 0.42-0.46x, then 0.73-0.92x)."""
    reps = _mapped_fit_set([1.6, 0.4, 0.5, 0.4, 0.4, 0.5])
    for i, rep in enumerate(reps):
        for s in rep.per_step:
            s.send_s = 0.010 + rep.chunk_bytes / 2**30
            s.end["store"] = s.peak["store"] = int((0.9 if i == 2 else 0.4) * rep.payload_bytes)  # 80 MiB, 2 workers
    m = model_mod.fit(reps, [1.0 * MiB, 3.0 * MiB])
    assert m.store_share == pytest.approx(0.9, rel=1e-6)
    payload, rows = 4 * 64 * MiB, 64
    fitted = m.roles["store"].base(m.features(payload, rows, 4, 2))  # the line through the fits: about 0.53x
    assert 0.45 * payload < fitted < 0.9 * payload
    assert m.play(payload, rows, 4, 3, 2)["store"][2][0] == pytest.approx(fitted, rel=1e-6)  # two open: 0.45x under it
    level, _ = m.play(payload, rows, 4, 3, 2, compute_s=60.0)["store"][2]
    assert level == pytest.approx(0.9 * payload, rel=1e-3), level / payload
    assert ("store", "chunks held at once") in [(r, t) for r, t, _ in m.terms_table()]
    for s in reps[2].per_step[:2]:  # the largest fit's store touched half its pages by the first two steps
        s.end["store"] = s.peak["store"] = int(0.45 * reps[2].payload_bytes)
    assert model_mod.fit(reps, [1.0 * MiB, 3.0 * MiB]).store_share == pytest.approx(0.9, rel=1e-6)


def test_the_answer_states_how_many_workers_hold_their_chunk_and_the_node_if_all_of_them_did(monkeypatch):
    """Without ``--worker-compute`` the prediction keeps the fits' overlap of calls (two of four open) and
    says what every worker holding its chunk, as a training step's do, would make of the node; with a
    compute of a minute every worker holds its chunk, the node is that figure, and the line says why."""
    leaves = [1.0 * MiB, 3.0 * MiB]
    reps = _mapped_fit_set([1.6, 0.4, 0.5, 0.4, 0.4, 0.5])
    for rep in reps:
        for s in rep.per_step:
            s.send_s = 0.010 + rep.chunk_bytes / 2**30
    m = model_mod.fit(reps, leaves)
    monkeypatch.setattr(prediction, "models", lambda codecs, *a, **k: {c: m for c in codecs})
    bare, computing = (prediction.predict(("numpy",), "flowgrpo", payload="4GB", workers=4, steps=3,
                                          node_memory="100GB", worker_compute_s=s)[0] for s in (0.0, 60.0))
    assert bare.calls_open == 2 and computing.calls_open == 4
    assert bare.node_peak_all_open_bytes == computing.node_peak_bytes > bare.node_peak_bytes
    assert computing.node_peak_all_open_bytes is None
    assert "workers: 2 of 4 calls open at once, reading their chunk" in bare.summary()
    assert f"the node would peak at {fmt_bytes(computing.node_peak_bytes)}" in bare.summary()
    assert "workers: all 4 hold their chunk at once, each computing 60 s on it" in computing.summary()
    doc = bare.to_json_dict()
    assert doc["calls_open"] == 2 and doc["node_peak_all_open_bytes"] == computing.node_peak_bytes
    for bad in (-1, float("nan"), "60"):  # the API's line is node's (core.units.seconds)
        with pytest.raises(PicklescopeError, match="worker_compute_s .* must be a number of seconds"):
            prediction.predict(("numpy",), "flowgrpo", payload="4GB", workers=4, steps=3, worker_compute_s=bad)


@pytest.mark.parametrize("value", [0, 2, 0.5, 1e3, -1, -0.0, float("nan"), float("inf"), True])
def test_the_duration_flags_and_keywords_accept_and_refuse_the_same_values(value):
    """``--worker-compute`` / ``--step-gap`` and ``worker_compute_s`` / ``step_gap_s`` are one check
    (``core.units.seconds``): a value the API refuses, typed as the flag, is refused too, and one it takes
    is the same number."""
    flag = idle_seconds("--worker-compute", "2", "seconds each worker holds its chunk")
    try:
        api = seconds("worker_compute_s", value, "--worker-compute 2", "seconds each worker holds its chunk")
    except PicklescopeError:
        api = None
    try:
        cli = flag(str(value))
    except PicklescopeError as exc:
        assert "--worker-compute" in str(exc) and "use e.g. --worker-compute 2" in str(exc)
        cli = None
    assert cli == api  # True: the keyword refuses a bool, the flag the text 'True'


def test_a_workers_level_is_its_second_steps_once_glibc_keeps_its_leaves_in_the_heap():
    """glibc's mmap threshold starts at 128 KiB and rises to each freed mapped block's size: in the first step
    a worker maps its chunk's leaves and gives them back (its level after step 1 about nothing, as every fit
    replay measured), from the second on it keeps them in its heap. The level with nothing held is the one a
    long run keeps, the second step's on, not an average that the first step pulls down by a sixth; the
    controller's first step, which holds its first copy, still counts."""
    reps = fit_set()
    for rep in reps:
        first = rep.per_step[0]
        for role in ("worker", "workers"):
            first.end[role] = 0
    m = model_mod.fit(reps)
    x = m.features(160 * MiB, 64, 4, 2)
    chunk = 160 * MiB * fitting.chunk_rows(64, 4) // 64
    assert m.roles["worker"].base(x) == pytest.approx(chunk + 8 * MiB, rel=1e-3)
    assert m.roles["workers"].base(x) == pytest.approx(4 * (chunk + 8 * MiB), rel=1e-3)
    assert m.roles["controller"].base(x) == pytest.approx(chunk, rel=1e-3)


def test_a_leaf_of_exactly_the_largest_mmap_threshold_is_mapped():
    """glibc maps a request whose chunk (the request, its 8-byte size word, rounded up to 16) reaches the mmap
    threshold, which never rises past 32 MiB: a 256-row chunk of many-keys' latents (128 KiB a row, exactly
    32 MiB; benchmarks/workloads/many_keys.yaml at x0.5 with 4 workers) is given back after each call, as the
    replay measured (a worker's level 0.01 x payload after its call, not a chunk). The boundary, to the byte."""
    assert not model_mod.heap_sized(32 * MiB) and not model_mod.heap_sized(32 * MiB - 16)
    assert model_mod.heap_sized(32 * MiB - 24) and model_mod.heap_sized(MiB)
    m = model_mod.fit(fit_set(), [128 * 1024, 2048])  # bytes per row of two leaves
    x = m.features(4 * 256 * (128 * 1024 + 2048), 1024, 4, 2)
    assert x["mapped"] == 32 * MiB and x["h"] == 256 * 2048 and x["M"] == 4 * 32 * MiB  # fits not timed: all 4


def test_one_slow_step_does_not_set_the_calls_open_at_once():
    """Every replay's longest call lasted 1.6 x the controller's sending of a chunk (two calls open), but in
    one step of one replay, slowed by the machine's load, a call lasted 3.5 sends. The maximum over all steps
    made that four calls open at once, all the mapped chunks; the median over the replays of each one's
    longest step keeps two, as a run without the slow step would."""
    leaves = [1.0 * MiB, 3.0 * MiB]
    calm = _mapped_fit_set([1.6, 0.4, 0.5, 0.4, 0.4, 0.5])
    slow = _mapped_fit_set([1.6, 0.4, 0.5, 0.4, 0.4, 0.5])
    slow[2].per_step[3].call_to_send = 3.5
    m, m_calm = model_mod.fit(slow, leaves), model_mod.fit(calm, leaves)
    assert m.call_to_send == pytest.approx(1.6) and m.calls_in_flight == 2 == m_calm.calls_in_flight
    assert m.play(256 * MiB, 64, 4, 3, 2)["workers"] == m_calm.play(256 * MiB, 64, 4, 3, 2)["workers"]
    assert fitting.call_to_send(_mapped_fit_set([0.9, 1.2, None])) is None  # a step not timed: the upper bound
    halves = _mapped_fit_set([0.5] * 6)
    for rep in halves[:3]:
        rep.per_step[0].call_to_send = 2.5
    assert fitting.call_to_send(halves) == pytest.approx(2.5)  # of an even count, the side of more calls


def test_a_growth_within_the_steps_noise_or_below_a_samples_resolution_is_none():
    """The store's level moved by whole blocks between steps (rises of 2, -2, 3, -2 and 1 units): the median
    rise, one unit, is within the rises' scatter (median absolute deviation two units), so it is no growth;
    multiplied by 120 steps it would have been six payloads no step keeps. A consistent rise of half a unit
    per step is a growth, unless one sample interval moved the level by more than that at the steps' ends."""
    def store_levels(levels: list[float], jitter: float = 0.0) -> list[Replay]:
        reps = fit_set()
        for rep in reps:
            unit = rep.payload_bytes / 20
            for s, v in zip(rep.per_step, levels):
                s.end["store"] = s.peak["store"] = int(v * unit)
                s.end["node"] = s.peak["node"] = s.end["controller"] + s.end["workers"] + s.end["store"]
                if jitter:
                    s.end_jitter["store"] = int(jitter * unit)
        return reps

    pay = 200 * MiB
    x = model_mod.fit(fit_set()).features(pay, 64, 4, 2)
    noisy = model_mod.fit(store_levels([0, 2, 0, 3, 1, 2]))
    assert noisy.roles["store"].growth(x) == pytest.approx(0.0, abs=1.0)
    levels = [lvl for lvl, _ in noisy.play(pay, 64, 4, 120, 2)["store"]]
    assert levels[-1] - levels[0] < pay / 20
    creep = [0.5 * k for k in range(6)]
    assert model_mod.fit(store_levels(creep)).roles["store"].growth(x) == pytest.approx(pay / 40, rel=1e-3)
    unresolved = model_mod.fit(store_levels(creep, jitter=1.0))
    assert unresolved.roles["store"].growth(x) == pytest.approx(0.0, abs=1.0)


def test_calls_are_timed_from_the_workers_named_steps_against_the_controllers_sends():
    """Worker calls are spans from a worker's first named step of a training step to its last: two spans
    that overlap count as two open at once, the driver's steps and other training steps not at all. The
    ratio is a call's mean span over the controller's mean time to send one chunk (its depth-0 sends)."""
    def proc(*spans):
        return SimpleNamespace(steps=[Step(name=n, start_s=a, end_s=b, depth=d, training_step=k)
                                      for n, a, b, k, d in spans])

    result = SimpleNamespace(data_plane="dataproto", processes={
        "driver": proc(("argument serialization", 0.0, 1.0, 1, 0), ("ray.serialize", 0.0, 0.5, 1, 1),
                       ("argument serialization", 1.0, 2.0, 1, 0), ("argument serialization", 2.0, 3.0, 1, 0),
                       ("ray.get", 3.0, 6.0, 1, 0)),
        "worker-0": proc(("ray.deserialize", 1.0, 2.0, 1, 0), ("compute", 2.0, 3.0, 1, 0),
                         ("compute", 5.0, 6.0, 2, 0)),
        "worker-1": proc(("ray.deserialize", 2.5, 3.5, 1, 0), ("compute", 6.5, 7.0, 2, 0)),
        "worker-2": proc(("ray.deserialize", 4.0, 5.0, 1, 0))})
    assert fitting._calls_in_flight(result, 1) == 2
    assert fitting._calls_in_flight(result, 2) == 1
    assert fitting._calls_in_flight(result, 3) is None
    assert fitting._call_to_send(result, 1) == pytest.approx((2.0 + 1.0 + 1.0) / 3 / 1.0)
    assert fitting._call_to_send(result, 2) is None  # the controller sent nothing in that step
    result.data_plane = "transferqueue"  # the controller sends metadata only: no ratio, the upper bound
    assert fitting._call_to_send(result, 1) is None


def _flowgrpo_batch(rows: int = 512) -> tuple[Any, float, int]:
    """flowgrpo, its payload per row, and the payload of ``rows`` rows."""
    wl = load_workload("flowgrpo")
    per_row = wl.payload_bytes(1.0) / wl.rows(1.0)
    return wl, per_row, int(rows * per_row)


def test_ray_kills_the_last_scheduled_worker_at_the_first_crossing_and_largest_batch_is_bisected():
    m = model_mod.fit(fit_set())
    rows = 512
    wl, per_row, pay = _flowgrpo_batch(rows)
    node_mem = int(6 * pay)  # the node reaches 0.95 x 6P when the controller holds about 4.2 payloads
    cap = prediction.ray_store_capacity(node_mem)  # what predict() resolves when no --store-capacity is given
    out = prediction.play_node(m, wl, rows, pay, 8, 10, {}, node_mem, 0.95, store_capacity=cap)
    assert out["killed"]["by"] == "ray" and out["killed"]["process"] == "worker-7"
    k = out["killed"]["training_step"]
    assert out["steps"][k - 1]["node_bytes"] >= 0.95 * node_mem > out["steps"][k - 2]["node_bytes"]
    largest = prediction.largest_surviving(m, wl, 8, 10, {}, node_mem, 0.95, store_capacity=cap)
    assert largest is not None and largest < pay
    rows_ok = round(largest / per_row)
    ok = prediction.play_node(m, wl, rows_ok, largest, 8, 10, {}, node_mem, 0.95, store_capacity=cap)
    assert ok["killed"] is None
    bigger = int((rows_ok + 1) * per_row)
    over = prediction.play_node(m, wl, rows_ok + 1, bigger, 8, 10, {}, node_mem, 0.95, store_capacity=cap)
    assert over["killed"] is not None


def test_tq_plane_node_is_the_sum_of_its_parts_storage_included():
    m = model_mod.fit(tq_fit_set())
    assert m.data_plane == "transferqueue"
    assert {"controller", "producer", "storage", "tq-controller", "workers", "store", "node"} <= set(m.roles)
    pay, steps = 200 * MiB, 5
    played = m.play(pay, 64, 4, steps, 2)
    for k in range(steps):  # the storage units' level is part of the node's at every step
        assert played["storage"][k][0] == pytest.approx(pay / 5 + (k + 1) * pay / 20, rel=1e-6)
        assert played["node"][k][0] == pytest.approx(sum(played[p][k][0] for p in TQ_PARTS), rel=1e-6)
    truth = synthetic_tq(pay, 4, steps)  # the held-out size: the model must reach its node peak
    for k, s in enumerate(truth.per_step):
        assert played["node"][k][1] == pytest.approx(s.peak["node"], rel=0.01), k
    roles = {role for role, _, _ in m.terms_table()}
    assert {"producer", "storage", "tq-controller"} <= roles
    node_row = next(v for role, term, v in m.terms_table() if role == "node")
    assert "storage" in node_row and "producer" in node_row
    with pytest.raises(ValueError, match="data planes"):
        model_mod.fit(tq_fit_set() + fit_set())


def test_tq_plane_prediction_names_its_processes_and_ray_kills_the_last_worker():
    m = model_mod.fit(tq_fit_set())
    rows = 512
    wl, per_row, pay = _flowgrpo_batch(rows)
    out = prediction.play_node(m, wl, rows, pay, 8, 10, {"storage": 10**9}, None, 0.95, store_capacity=None)
    assert {"controller", "producer", "storage", "tq-controller", "store", "worker-7"} <= set(out["peaks"])
    assert out["peaks"]["storage"] >= 10**9 + pay  # the batch in flight, above the storage units' baseline
    alone = prediction.play_node(m, wl, rows, pay, 8, 10, {}, None, 0.95, store_capacity=None)
    assert out["node_peak"] - alone["node_peak"] == 10**9  # the storage units' baseline counts in the node
    # the node ends step k at about (1.81 + 0.05 k) P and peaks a payload above: it crosses 0.95 x 2.17 P at step 5
    small = int(2.17 * pay)
    out = prediction.play_node(m, wl, rows, pay, 8, 10, {}, small, 0.95,
                               store_capacity=prediction.ray_store_capacity(small))
    assert out["killed"] is not None and out["killed"]["process"] == "worker-7"
    k = out["killed"]["training_step"]
    assert out["steps"][k - 1]["node_bytes"] >= 0.95 * 2.17 * pay > out["steps"][k - 2]["node_bytes"]
    p = prediction.CodecPrediction("numpy", "off", pay, rows, 8, 10, int(2.17 * pay), 0.95, {}, out["node_peak"],
                                   out["peaks"], out["steps"], out["killed"], None, out["releases"], m.terms_table(),
                                   m.fitted_on, data_plane="transferqueue")
    doc = p.to_json_dict()
    assert doc["data_plane"] == "transferqueue" and "storage units" in doc["kill_policy"]
    assert "data plane transferqueue" in p.summary()
    names = [t.name for t in figures.predict_figure([doc]).data]
    assert "numpy (transferqueue): node" in names


def test_tq_plane_fits_every_codec_on_all_codecs_replays_and_dataproto_on_its_own():
    tq = [synthetic_tq(20 * MiB, 2, 4, codec="numpy"), synthetic_tq(20 * MiB, 2, 4, codec="numpy-legacy")]
    assert prediction.fit_set(tq, "numpy", "transferqueue") == tq  # the codec never touches the tensors there
    dp = [synthetic(20 * MiB, 2, 4, codec="numpy"), synthetic(20 * MiB, 2, 4, codec="numpy-legacy")]
    assert prediction.fit_set(dp, "numpy") == dp[:1]


def test_the_fit_the_check_and_the_models_group_codecs_by_one_rule(monkeypatch):
    """One rule groups the codecs into replays: on a cluster of its own each codec alone, on a store that
    holds every step's objects (a series' warm-up steps would touch the store's pages before the replay,
    docs/predict.md); on a joined cluster, on the DataProto plane the built-in codecs as one series and each
    verl codec alone, on the TransferQueue plane each alone. The fit's replays, the check's and the
    models' gathering of replays all follow it (here with the replays stubbed: no cluster starts)."""
    codecs = ("verl-0.9.0:numpy", "numpy-legacy", "numpy")
    assert fitting.replay_groups(codecs, "dataproto") == [["verl-0.9.0:numpy"], ["numpy-legacy"], ["numpy"]]
    assert fitting.replay_groups(codecs, "dataproto", joined=True) == [["numpy-legacy", "numpy"],
                                                                       ["verl-0.9.0:numpy"]]
    for joined in (False, True):
        assert fitting.replay_groups(("numpy-legacy", "numpy"), "transferqueue", joined) == [["numpy-legacy"],
                                                                                             ["numpy"]]
    assert fitting.replay_groups((), "dataproto") == []
    series: list[list[str]] = []
    stores: list[int | None] = []
    gaps: list[float] = []

    def fake_series(group, workload, scale, workers, steps, **kw):
        series.append(list(group))
        stores.append(kw.get("store_bytes"))
        gaps.append(kw.get("step_gap_s", 0.0))
        return [SimpleNamespace(outcome="ok", node_peak_bytes=1, processes={}) for _ in group]

    def fake_observe(result, wl):
        return synthetic(20 * MiB, 2, 3, codec=series[-1][0])

    monkeypatch.setattr(fitting, "node_series", fake_series)
    monkeypatch.setattr(fitting, "observe", fake_observe)
    monkeypatch.setattr(fitting, "save_cached", lambda path, rep: None)
    monkeypatch.setattr(fitting, "load_cached", lambda path, plane="dataproto": None)
    fitting.replays(codecs, "flowgrpo", "off", scales=(0.05,), workers=(2,), steps=3)
    assert series == fitting.replay_groups(codecs, "dataproto")
    payload = load_workload("flowgrpo").payload_bytes(0.05)
    assert stores == [fitting.replay_store_bytes(payload, 3, None)] * 3 and stores[0] >= 5 * payload
    # each step ends idle, so that Ray's frees land before the next step allocates (docs/node.md, --step-gap)
    assert gaps == [fitting.FIT_STEP_GAP_S] * 3 and fitting.FIT_STEP_GAP_S > 0
    series.clear()
    stores.clear()
    fitting.replays(codecs, "flowgrpo", "off", scales=(0.05,), workers=(2,), steps=3, ray_address="127.0.0.1:1")
    assert series == fitting.replay_groups(codecs, "dataproto", joined=True) and stores == [None, None]
    series.clear()
    preds = [prediction.CodecPrediction(c, "off", 1, 1, 2, 3, None, 0.95, {}, 1, {"controller": 1}, [], None, None,
                                        [], [], []) for c in codecs]
    wl = load_workload("flowgrpo")
    fitted_any = model_mod.fit(fit_set())
    gaps.clear()
    prediction._check(preds, dict.fromkeys(codecs, fitted_any), "flowgrpo", 0.05, "off", wl, 60.0, None, None)
    assert series == fitting.replay_groups(codecs, "dataproto") and gaps == [fitting.FIT_STEP_GAP_S] * 3
    calls: list[list[str]] = []

    def fake_replays(group, *args, **kw):
        calls.append(list(group))
        return [synthetic(20 * MiB, 2, 3, codec=c) for c in group]

    monkeypatch.setattr(fitting, "replays", fake_replays)
    fitted = prediction.models(("numpy-legacy", "numpy"), "flowgrpo", "off", data_plane="transferqueue")
    assert calls == fitting.replay_groups(("numpy-legacy", "numpy"), "transferqueue")
    assert set(fitted) == {"numpy-legacy", "numpy"}

    def fake_sized_replays(group, workload, gc, scales, workers, steps, **kw):  # one per size, as the fit needs
        calls.append(list(group))
        return [synthetic(int(400 * s) * MiB, w, steps, codec=c) for c in group for w in workers for s in scales]

    monkeypatch.setattr(fitting, "replays", fake_sized_replays)
    checks = _benchmark("predict_checks")  # benchmarks/predict_checks.py: the fit and the held-out replay alike
    for plane in ("dataproto", "transferqueue"):
        chosen = codecs if plane == "dataproto" else ("numpy-legacy", "numpy")
        calls.clear()
        models, held = checks.fitted_and_held_out(chosen, "flowgrpo", "off", (0.05, 0.1, 0.2), (2, 4), 0.5, 4, 3,
                                                  plane=plane, log=lambda line: None)
        assert calls == 2 * fitting.replay_groups(chosen, plane), plane
        assert set(models) == set(held) == set(chosen)


def test_the_check_compares_the_replay_with_the_model_at_its_size_not_with_the_users_capped_node(monkeypatch):
    """``--check`` replays the batch on a cluster whose store holds every step's objects and with no process
    baselines, so its predicted figures are the model played that way. A user's prediction whose node is
    bounded by a small store capacity, carries baselines and is killed at an early step must not be what the
    replay is held to (here with the replay stubbed: no cluster starts)."""
    m = model_mod.fit(fit_set())  # the collector off: the controller and the store keep a payload per step
    rows = 512
    wl, _, pay = _flowgrpo_batch(rows)
    base = {"controller": 10**9, "store": pay // 4}
    small, cap = 5 * pay, pay // 2
    played = prediction.play_node(m, wl, rows, pay, 4, 8, base, small, 0.95, store_capacity=cap)
    assert played["killed"] is not None  # the user's node dies early: its peak stops at that step
    p = prediction.CodecPrediction("numpy-legacy", "off", pay, rows, 4, 8, small, 0.95, base, played["node_peak"],
                                   played["peaks"], played["steps"], played["killed"], None, played["releases"],
                                   m.terms_table(), m.fitted_on, store_capacity_bytes=cap)

    def fake_series(group, workload, scale, workers, steps, **kw):
        assert (workers, steps) == (4, 8)
        return [SimpleNamespace(outcome="ok", node_peak_bytes=123, processes={}) for _ in group]

    monkeypatch.setattr(fitting, "node_series", fake_series)  # the check replays through fitting.replay_series
    monkeypatch.setattr(fitting, "observe", lambda result, wl: synthetic(20 * MiB, 2, 3))
    prediction._check([p], {"numpy-legacy": m}, "flowgrpo", 0.5, "off", wl, 60.0, None, None)
    bare = prediction.play_node(m, wl, rows, pay, 4, 8, {}, None, 0.95, store_capacity=None)
    assert p.check is not None and p.check.measured_node_peak_bytes == 123
    assert p.check.predicted_node_peak_bytes == bare["node_peak"]
    assert p.check.predicted_controller_peak_bytes == bare["peaks"]["controller"]
    assert bare["node_peak"] > p.node_peak_bytes - sum(base.values())  # the capped, killed node was lower
    assert p.check.predicted_release_steps == bare["releases"]


def _benchmark(name: str) -> Any:
    """A script of benchmarks/ as a module (the folder is no package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"benchmarks_{name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_baselines_count_in_the_node_total():
    assert prediction.parse_baselines(["controller=379GB", "worker=40GB", "reward=51GB"], 2) == {
        "controller": 379 * 10**9, "worker-0": 40 * 10**9, "worker-1": 40 * 10**9, "reward": 51 * 10**9}
    wl = load_workload("flowgrpo")
    m = model_mod.fit(fit_set())
    base = prediction.play_node(m, wl, 64, 10**9, 2, 2, {}, None, 0.95, store_capacity=None)
    more = prediction.play_node(m, wl, 64, 10**9, 2, 2, {"controller": 10**10, "reward": 10**9}, None, 0.95,
                                store_capacity=None)
    assert more["node_peak"] - base["node_peak"] == 11 * 10**9
    assert more["peaks"]["controller"] - base["peaks"]["controller"] == 10**10


def test_a_changed_workload_file_is_a_new_cache_key(tmp_path):
    path = tmp_path / "w.yaml"
    path.write_text("name: w\nbatch_size: 8\ntensors:\n  x: {shape: [N, 64], dtype: float32}\n")
    first = fitting.cache_path(load_workload(str(path)), "numpy", "off", 0.1, 2, 6)
    path.write_text("name: w\nbatch_size: 8\ntensors:\n  x: {shape: [N, 128], dtype: float32}\n")
    assert fitting.cache_path(load_workload(str(path)), "numpy", "off", 0.1, 2, 6) != first
    assert fitting.cache_path(load_workload(str(path)), "numpy", "default", 0.1, 2, 6) != \
        fitting.cache_path(load_workload(str(path)), "numpy", "off", 0.1, 2, 6)


def test_the_data_plane_is_in_the_cache_key_and_dataproto_keys_are_unchanged(tmp_path, monkeypatch):
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path))
    wl = load_workload("flowgrpo")
    dp = fitting.cache_path(wl, "numpy", "off", 0.1, 2, 6)
    assert fitting.cache_path(wl, "numpy", "off", 0.1, 2, 6, "dataproto") == dp
    # the key a DataProto fit was cached under before data planes existed (no plane in it)
    key = json.dumps({"v": fitting.CACHE_VERSION, "workload": fitting.workload_key(wl), "codec": "numpy", "gc": "off",
                      "scale": 0.1, "workers": 2, "steps": 6}, sort_keys=True)
    assert dp.name.endswith(hashlib.sha256(key.encode()).hexdigest()[:12] + ".json")
    tq = fitting.cache_path(wl, "numpy", "off", 0.1, 2, 6, "transferqueue")
    assert tq != dp
    # a replay on a joined cluster, whose store earlier work touched, is never read for one on a fresh store
    assert fitting.cache_path(wl, "numpy", "off", 0.1, 2, 6, joined=True) not in (dp, tq)
    fitting.save_cached(tq, synthetic_tq(20 * MiB, 2, 3))
    fitting.save_cached(dp, synthetic(20 * MiB, 2, 3, codec="numpy"))
    assert fitting.load_cached(tq, "transferqueue").data_plane == "transferqueue"
    assert fitting.load_cached(tq) is None  # a TransferQueue replay is never read as a DataProto one
    assert fitting.load_cached(dp, "transferqueue") is None and fitting.load_cached(dp).data_plane == "dataproto"


NO_TQ = "no-transferqueue-here"


@pytest.mark.parametrize("args, words", [
    (["--payload", "44GB", "--batch-size", "512"], "give one of --scale"),
    (["--payload", "2x"], "--payload"),
    (["--gc", "each-step"], "predict models the default collector"),
    (["--process-baseline", "controller"], "is not role=size"),
    (["--ray-threshold", "1.5"], "--ray-threshold"),
    (["--node-memory", "lots"], "--node-memory"),
    (["--store-capacity", "lots"], "--store-capacity 'lots' is not a size"),
    (["--store-capacity", "0GB"], "--store-capacity '0GB' must be above zero"),
    (["--store-capacity", "0.5x"], "needs plain bytes, not a payload multiple"),
    (["--store-capacity", "total:100GB"], "needs plain bytes, not total:"),
    (["--node-memory", "2x"], "--node-memory '2x' needs plain bytes, not a payload multiple"),
    (["--node-memory", "total:1507GB"], "--node-memory 'total:1507GB' needs plain bytes, not total:"),
    (["--node-memory", "100GB", "--store-capacity", "200GB"], "is more than the node's memory"),
    (["--node-memory", "100GB", "--store-capacity", "20GB", "--process-baseline", "store=30GB"],
     "is more than the object store's capacity"),
    (["--payload", "44GB", "--check"], "would not fit this machine's free memory"),
    (["--data-plane", "shared-memory"], "is not one of dataproto, transferqueue"),
    (["--data-plane", "dataproto,transferqueue", "--codec", "verl-0.9.1:numpy"], "never a verl DataProto"),
    (["--data-plane", "transferqueue,transferqueue"], "names a plane twice"),
    (["--worker-compute", "-2"], "--worker-compute '-2' is not a number of seconds, zero or more"),
    (["--worker-compute", "inf"], "use e.g. --worker-compute 2"),
    # the same line as picklescope node's when the package is absent (tests/test_node_transferqueue.py)
    (["--data-plane", "transferqueue", "--tq-dir-missing"], "install it with pip install --no-deps --target"),
    (["--out", "FILE"], "exists and is not a folder"),
    (["--out", "NEW", "--payload", "2x"], "--payload"),  # the folder the refused run made is removed
])
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path, monkeypatch, capsys):
    """Through the command's main() in this process: each case is refused before any replay, so no
    interpreter of its own (torch imported again) is needed to check its line."""
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path))
    if "--tq-dir-missing" in args:
        args = [a for a in args if a != "--tq-dir-missing"]
        monkeypatch.setenv("PICKLESCOPE_TQ_DIR", str(tmp_path / NO_TQ))
        words = f"{NO_TQ} or on sys.path"  # names where it looked; the hint names the install (below)
    (tmp_path / "FILE").write_text("mine")
    args = [str(tmp_path / a) if a in ("FILE", "NEW") else a for a in args]
    capsys.readouterr()
    rc = main(["predict", *args])
    out, err = capsys.readouterr()
    assert rc == 2, err
    assert (tmp_path / "FILE").read_text() == "mine" and not (tmp_path / "NEW").exists()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in err, err
    assert out == ""
    if NO_TQ in words:
        assert "pip install --no-deps --target" in lines[0], lines[0]


def _short_step_gap(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fits' idle end of each step (``fit.FIT_STEP_GAP_S``) lets Ray free a step's objects before the next
    allocates, which sets the object store's level. These tests join the suite's cluster, whose store earlier
    tests touched, and hold no store figure, so a short gap checks the same fit and check in less time; the fit
    and the check both read the one constant."""
    monkeypatch.setattr(fitting, "FIT_STEP_GAP_S", 0.25)


@pytest.mark.slow
@pytest.mark.ray
def test_fit_on_small_replays_predicts_a_held_out_replay(tmp_path, monkeypatch, ray_cluster):
    """Fitted on flowgrpo x0.025/x0.05/x0.1 with 2 workers (collector off, 4 steps), the prediction for x0.2
    must come within 15% of the real replay's controller peak for the legacy codec
    (the fixed controller holds about nothing, so there the check is that it stays near nothing). The suite's
    one local cluster, joined like a real one (its 1 GiB store holds every step's chunks of x0.2: 5 x 93 MiB;
    the fixture checks that nothing of it is left).

    The prediction's workers compute 0.5 s on their chunk (``--worker-compute``), and the check replays them
    so: the fit times the controller's sends, and a compute that long against sends of a few milliseconds
    keeps both calls open at once."""
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path))
    _short_step_gap(monkeypatch)
    # The legacy controller, which the model follows (+0.5% in one run of this test), is held to 15%. The
    # fits and the held-out replay are each one draw of the allocator's and the store's state, and on a busy
    # 2-core machine one draw can miss by more than that, so the check is the best of up to three fits and
    # checks, each measured anew; every try's error and summary is in the message.
    errors, summaries = [], []
    for attempt in range(3):
        preds = prediction.predict(("numpy-legacy", "numpy"), "flowgrpo", scale=0.2, workers=2, steps=4, gc="off",
                                   fit_scales_=(0.025, 0.05, 0.1), fit_workers=(2,), fit_steps=4, check=True,
                                   ray_address=ray_cluster.address, refresh=attempt > 0, worker_compute_s=0.5)
        legacy = next(p for p in preds if p.codec == "numpy-legacy")
        c = legacy.check
        assert c is not None and c.outcome == "ok", legacy.summary()
        errors.append(c.error(c.predicted_controller_peak_bytes, c.measured_controller_peak_bytes))
        summaries.append(legacy.summary())
        if abs(errors[-1]) < 0.15:
            break
    assert min(abs(e) for e in errors) < 0.15, (errors, summaries)
    for p in preds:
        c = p.check
        assert c is not None and c.outcome == "ok", p.summary()
        # the node peak is not held to a bound: its held-out error ran from -72% to +21% between runs of this
        # test (the object store's pages and glibc's mmap threshold, docs/predict.md), so a bound would only
        # say which run it was; the check's report gives it (c.error)
        assert c.measured_node_peak_bytes > 0 and c.predicted_node_peak_bytes > 0, p.summary()
        if p.codec != "numpy-legacy":
            assert c.measured_controller_peak_bytes < 0.1 * p.payload_bytes
    assert list((tmp_path / "predict").glob("*.json")), "the fit's replays were not cached"
    for p in preds:  # the sends were timed, so the compute is weighed against them, not taken as the bound
        calls = dict(((r, t), v) for r, t, v in p.terms)[("workers", "calls open at once")]
        assert "s per GiB" in calls and p.calls_open == 2 and p.worker_compute_s == 0.5, calls
    doc = json.loads(json.dumps([p.to_json_dict() for p in preds]))
    assert {"node_peak_bytes", "processes", "training_steps", "killed", "largest_surviving_payload_bytes"} <= \
        set(doc[0])


@pytest.mark.slow
@pytest.mark.ray
def test_tq_plane_fit_on_small_replays_predicts_a_held_out_replay(tmp_path, monkeypatch, ray_cluster):
    """The TransferQueue plane (docs/predict.md, "The data plane"): fitted on flowgrpo x0.025/x0.05 with 2
    workers (collector off, 3 steps), the prediction for x0.1 is checked against a real replay of that size.
    The controller passes metadata only, so it must stay near nothing in both; the storage units (a role of
    the model, their peak in the prediction) must be predicted to hold about the batch at its peak. On the
    suite's one local cluster (three logical CPUs: one per TransferQueue actor)."""
    if missing() is not None:
        pytest.skip(f"TransferQueue is not installed: {missing()}")
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path))
    _short_step_gap(monkeypatch)
    preds = prediction.predict(("numpy",), "flowgrpo", scale=0.1, workers=2, steps=3, gc="off",
                               fit_scales_=(0.025, 0.05), fit_workers=(2,), fit_steps=3, check=True,
                               ray_address=ray_cluster.address, data_plane="transferqueue")
    (p,) = preds
    c = p.check
    assert p.data_plane == "transferqueue" and c is not None and c.outcome == "ok", p.summary()
    assert {"producer", "storage", "tq-controller"} <= set(p.processes), p.processes
    assert c.measured_controller_peak_bytes < 0.05 * p.payload_bytes, p.summary()
    assert c.predicted_controller_peak_bytes < 0.1 * p.payload_bytes, p.summary()
    assert p.processes["storage"] >= 0.5 * p.payload_bytes, p.summary()  # the batch in flight in the units
    assert c.measured_node_peak_bytes > 0 and c.predicted_node_peak_bytes > 0, p.summary()
    cached = list((tmp_path / "predict").glob("*transferqueue*.json"))
    assert len(cached) == 2, cached  # the fit's two sizes (the check's replay is not kept)
    doc = p.to_json_dict()
    assert doc["data_plane"] == "transferqueue" and "storage" in doc["processes"]


def test_the_figure_is_drawn_from_the_plain_data():
    wl = load_workload("flowgrpo")
    m = model_mod.fit(fit_set())
    per_row = wl.payload_bytes(1.0) / wl.rows(1.0)
    pay = int(512 * per_row)
    cap, source = prediction.resolve_store_capacity(None, 6 * pay)
    out = prediction.play_node(m, wl, 512, pay, 8, 10, {"store": pay // 8}, 6 * pay, 0.95, store_capacity=cap)
    p = prediction.CodecPrediction("numpy-legacy", "off", pay, 512, 8, 10, 6 * pay, 0.95, {"store": pay // 8},
                                   out["node_peak"], out["peaks"], out["steps"], out["killed"], None, out["releases"],
                                   m.terms_table(), m.fitted_on, store_capacity_bytes=cap, store_capacity_source=source)
    doc = p.to_json_dict()
    fig = figures.predict_figure([doc])
    names = [t.name for t in fig.data]
    assert "numpy-legacy: node" in names and "numpy-legacy: controller" in names
    assert fig.layout.xaxis.dtick == 1  # ten training steps: a tick at each whole one, none between
    assert any(t.text and "Ray kills worker-7" in t.text[0] for t in fig.data)  # the kill's marker
    # the store per step, its baseline included, never above its capacity; the capacity is a line named by its source
    store = next(t for t in fig.data if t.name == "numpy-legacy: object store")
    assert list(store.y) == pytest.approx([s["store_bytes"] / 2**30 for s in doc["training_steps"]])
    assert all(pay // 8 <= s["store_bytes"] <= cap for s in doc["training_steps"])
    lines = {a.text for a in fig.layout.annotations}
    assert f"object store's capacity, {fmt_bytes(cap)} ({source})" in lines
    assert f"Ray's threshold, {fmt_bytes(0.95 * 6 * pay)} (0.95 of the node)" in lines
    assert len(fig.layout.shapes) == 2
    # a node far under its threshold: the lines are named above the chart, not drawn, so the curves keep their height
    far = {**doc, "node_memory_bytes": 400 * pay, "store_capacity_bytes": 100 * pay, "killed": None}
    far_fig = figures.predict_figure([far])
    top = max(v for t in far_fig.data for v in t.y if v is not None)
    assert not far_fig.layout.shapes and far_fig.layout.yaxis.range[1] == pytest.approx(1.15 * top)
    said = " ".join(a.text for a in far_fig.layout.annotations)
    assert f"above this chart: Ray's threshold, {fmt_bytes(0.95 * 400 * pay)}" in said
    assert f"above this chart: object store's capacity, {fmt_bytes(100 * pay)}" in said
    for s in doc["training_steps"]:  # a document saved before the store was kept per step draws without it
        del s["store_bytes"]
    assert "numpy-legacy: object store" not in [t.name for t in figures.predict_figure([doc]).data]


def test_a_tiny_coefficient_is_printed_with_the_digits_that_matter():
    """A growth of 3.6e-4 x payload per step prints as 0.000 with three decimals, yet over 120 steps of a
    44 GB payload it is 1.9 GB: the terms table must not show it as nothing."""
    mib = 2**20
    growth = terms_mod.Term("controller growth", ("P", "W", "1"), [3.6e-4, 2048.0, 0.0])
    assert growth.describe(mib) == "3.6e-04 x payload +2.0 KiB x workers +0.00 MiB"
    assert terms_mod.Term("t", ("P", "1"), [0.25, 3 * mib]).describe(mib) == "0.250 x payload +3.00 MiB"
    zeros = terms_mod.Term("t", ("P", "1"), [1e-13, -1e-3])  # what least squares leaves of a zero
    assert zeros.describe(mib) == "0.000 x payload +0.00 MiB"


def _two_codecs_on_a_small_node() -> list[prediction.CodecPrediction]:
    """numpy-legacy killed by Ray, numpy surviving: the collector-off fit set played on a node of 6 payloads."""
    m = model_mod.fit(fit_set())
    wl, _, pay = _flowgrpo_batch(512)
    cap, source = prediction.resolve_store_capacity(None, 6 * pay)
    out = []
    for codec, model in (("numpy-legacy", m), ("numpy", model_mod.fit(fit_set(grow=0.0, codec="numpy")))):
        played = prediction.play_node(model, wl, 512, pay, 8, 10, {}, 6 * pay, 0.95, store_capacity=cap)
        largest = prediction.largest_surviving(model, wl, 8, 10, {}, 6 * pay, 0.95, store_capacity=cap)
        peak = prediction.node_peak_at(model, wl, largest, 8, 10, {}, 6 * pay, 0.95, store_capacity=cap)
        out.append(prediction.CodecPrediction(codec, "off", pay, 512, 8, 10, 6 * pay, 0.95, {}, played["node_peak"],
                                              played["peaks"], played["steps"], played["killed"], largest,
                                              played["releases"], model.terms_table(), model.fitted_on,
                                              store_capacity_bytes=cap, store_capacity_source=source,
                                              largest_surviving_node_peak_bytes=peak))
    return out


def test_out_writes_a_report_that_answers_in_words_and_the_json_beside_it(tmp_path, monkeypatch, capsys):
    """``predict --out DIR`` writes report.html (one self-contained page: the answer per codec in words first,
    the figure, each process, the store, every step, the terms, the command) and results.json (the ``--json``
    list). A folder holding other files is refused before any fit; a run that fails removes the folder it
    made (the fit is stubbed here: no replay runs)."""
    preds = _two_codecs_on_a_small_node()
    assert preds[0].killed is not None and preds[1].killed is None
    monkeypatch.setattr(predict_cmd, "predict", lambda *a, **kw: preds)
    out = tmp_path / "out"
    assert main(["predict", "--workers", "8", "--steps", "10", "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    killed = preds[0].killed
    first = html.index("class='headline'")
    assert html.index(f"numpy-legacy: Ray&#x27;s memory monitor would kill {killed['process']} in training step "
                      f"{killed['training_step']} of 10") > first
    assert html.index("numpy: survives all 10 training steps") > first
    assert "Largest payload that survives 10 steps: " in html
    for p in preds:  # the verdict is put in words once: the report's sentence is the summary's line
        assert p.verdict_text() in p.summary() and html.count(html_escape(p.verdict_text())) == 1, p.verdict_text()
    assert html.count("data-figure=") == 1 and "Figure unavailable" not in html
    for heading in ("Each process's peak", "The object store", "Every training step", "The model's terms",
                    "Reproduce"):
        assert f"<h2>{heading}</h2>" in html, heading
    terms = html.split("<h2>The model's terms</h2>", 1)[1].split("<h2>", 1)[0]
    for role, term, value in preds[0].terms:  # a table whose values wrap, not preformatted lines cut at the edge
        assert f"<td>{html_escape(f'{role}: {term}')}</td><td>{html_escape(value)}</td>" in terms, (role, term)
    assert "<pre>" not in terms
    assert "https://" not in html.split("<script>", 1)[0]  # nothing fetched: plotly.js is inline
    # an option named in a sentence stays on one line: a browser breaks after a hyphen, and "(--" at a line's end
    # with "worker-compute" on the next reads as two words
    assert report_sentence("hold all 8 (--worker-compute S) & more") == \
        'hold all 8 (<span class="opt">--worker-compute</span> S) &amp; more'
    assert json.loads((out / "results.json").read_text()) == [p.to_json_dict() for p in preds]
    assert "report: " in capsys.readouterr().err
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main(["predict", "--out", str(tmp_path / "busy")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "already holds other files" in err[0], err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine"

    def fails(*a, **kw):
        raise PicklescopeError("the fit failed", "try again")

    monkeypatch.setattr(predict_cmd, "predict", fails)
    assert main(["predict", "--out", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()  # made by the run that failed: removed


def test_a_codec_that_survives_the_whole_node_is_not_given_the_search_bound_as_its_largest_batch():
    """The bisection for the largest surviving payload stops at the node's memory: a codec that survives there
    survives any payload up to it, which the words say, rather than printing the search's bound as a figure."""
    preds = _two_codecs_on_a_small_node()
    legacy, fixed = preds
    assert legacy.largest_text() == f"largest payload that survives 10 steps: " \
                                    f"{fmt_bytes(legacy.largest_surviving_payload_bytes)} (the node then peaks at " \
                                    f"{fmt_bytes(legacy.largest_surviving_node_peak_bytes)}, under " \
                                    f"{fmt_bytes(legacy.threshold * legacy.node_memory_bytes)}; a row more crosses it)"
    # the evidence holds: under the threshold at the largest payload, and the batch asked about, larger, crossed it
    assert legacy.largest_surviving_node_peak_bytes <= legacy.threshold * legacy.node_memory_bytes
    assert legacy.killed and legacy.node_peak_bytes > legacy.largest_surviving_node_peak_bytes
    fixed.largest_surviving_payload_bytes = fixed.node_memory_bytes + 1
    assert fixed.largest_text().startswith("any payload up to the node's whole memory (")
    assert "any payload up to the node's whole memory" in fixed.summary()
    fixed.node_memory_bytes = None
    assert fixed.largest_text() is None
