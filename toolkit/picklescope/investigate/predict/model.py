"""The cost model: per role, how memory grows with the payload, the workers, the steps and the collector.

Plain data in, plain data out, no processes: :func:`fit` takes the :class:`~.fit.Replay` observations
of one codec under one collector mode and returns a :class:`Model`; :meth:`Model.play` plays it forward
at any payload, worker count and number of training steps.

Each role (``controller``, ``worker`` the busiest worker, ``workers`` all of them, ``store``, and
``node`` the node's total, fitted on its own because its parts peak at different moments) follows

    level after step k = base + growth * m_k
    peak during step k  = max(level after k-1, level after k) + transient

where ``m_k`` counts the training steps whose copies are still held (``k`` with nothing to free them;
reset by a release). Each term is a linear function of what the role's work depends on (see
:data:`FEATURES`: the payload ``P``, the worker count ``W``, a chunk's payload ``c`` and its heap-sized
leaves ``h``), fitted by least squares over the replays (one value per replay: the growth its median
rise between steps, the others means over its steps); the node is the sum of the controller, the workers
and the store plus its own rise.
On the TransferQueue data plane the node also has the rollout's ``producer``, TransferQueue's storage
units (``storage``, their sum) and its controller actor (``tq-controller``): each is a role of its own
and a part of the node's sum (:data:`TQ_PARTS`).
What does not scale with bytes is kept apart: under the default collector a release is a step at which
the controller's memory fell back (a collection freed the cycle-held copies), and how often depends on the
objects a step creates, not on bytes. Where the replays counted the controller's container allocations (what
CPython's collector counts: it runs each time they pass :data:`YOUNG_EVERY`), the releases are the steps in
which a run falls, counted from the full collection before the first step: hundreds of allocations a step
are a far finer measurement than the one or two releases six steps show. Elsewhere the release rate per step
is fitted as a linear function of the batch's non-tensor objects (rows x keys) and ``W``. What a release
gives back, and how the next steps reuse what it does not, is :mod:`.heap`'s (the controller's base and growth
then come from the same codec's collector-off replays, where nothing is freed: :func:`fit`'s ``held``).

The object store is a bounded high-water mark: its pages are never given back, so its level after a step is
the highest its base plus the held steps' objects have been (a release frees objects, and the next steps
reuse their pages without a new rise), never below its baseline and never above the store's capacity (Ray
spills what does not fit to disk, where it is no memory of the node's).
A growth the replays cannot tell from nothing (:func:`~.fit.growth_floor`) counts as none: it is the sampler's or
the allocator's jitter, and played over 120 steps it would be a rise no step makes.

How many workers' calls are open at once (the chunks whose leaves above glibc's mmap threshold the
workers' sum holds together, see :data:`MMAP_THRESHOLD_MAX`) comes from the call-to-send ratio of the
fits' steps: for each replay its longest step (calls that fault in fresh pages last longer, as every
call with a mapped leaf does), then the median over the replays (the higher middle one of an even
count). One slow step, from a loaded machine, lands in one replay and moves that replay's longest only,
where the maximum over every step of every replay would be set by it and move between runs.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from picklescope.investigate.predict import heap
from picklescope.investigate.predict.fit import TQ_ROLES, Replay, call_to_send, chunk_rows, chunk_sizes, growth_floor
from picklescope.investigate.predict.heap import YOUNG_EVERY, calls_done, released_at, replay_releases
from picklescope.investigate.predict.terms import Term, fit_supported, fit_term

ROLES = ("controller", "worker", "workers", "store", "node")
PARTS = ("controller", "workers", "store")  # the node's total is their sum (the store counted once)
TQ_PARTS = ("controller", "producer", "workers", "storage", "tq-controller", "store")  # the TransferQueue plane's
# What each role's bytes can depend on: the controller serializes W chunks that add up to P and pays
# something per call (W); one worker handles one chunk (c); the workers' sum and the store see every
# chunk (P) and per-worker constants (W); the node's own transient (the parts peaking together) any.
# A worker keeps, after its call, the part of its chunk that glibc served from its heap: blocks above
# glibc's largest mmap threshold (32 MiB on 64-bit) are mapped and returned to the kernel when freed, so
# only leaves whose per-chunk bytes stay under it remain resident (``h``; ``H`` for all workers, summed
# over the chunks as ``torch.chunk`` cuts them, not W times the largest). The rest of a chunk is resident
# only during its call: it is added to the worker's rise within a step, and to the workers' sum for as many
# calls as are open when the controller sends the last chunk (``Model.calls_in_flight``, from the fits'
# call-to-send ratio; all W when unknown, an upper bound). Calls are timed, not weighed: the fits' chunks
# never reach the threshold, so no sampled byte of theirs shows the overlap, but their calls' spans do.
MMAP_THRESHOLD_MAX = 32 * 2**20
# The roles whose level with nothing held is taken from the second training step on, on every plane: a worker's
# heap keeps its chunk's heap-sized leaves only once glibc's mmap threshold has risen past them (_role_terms)
SETTLING_ROLES = ("worker", "workers")
# On the TransferQueue plane: the controller passes metadata (keys per row) and reads the per-token result of
# every row, both in proportion to the rows, so to P for one workload (P, W, 1 as above); the producer writes
# the whole batch at every step (P); the storage units hold the batch from the producer's write to the
# step's clear, about one payload per step in flight (P), split among a fixed number of units (1);
# TransferQueue's controller actor keeps per-key metadata (P) and per-client state (W).
FEATURES = {"controller": ("P", "W", "1"), "worker": ("h", "1"), "workers": ("H", "W", "1"),
            "store": ("P", "c", "1"), "node": ("P", "c", "1"), "objects": ("objects", "W", "1"),
            "allocations": ("objects", "calls", "1"),
            "producer": ("P", "1"), "storage": ("P", "1"), "tq-controller": ("P", "W", "1")}
# On the DataProto plane the controller serializes the batch one chunk at a time: besides what it keeps of
# the whole batch (P), what stays in it between steps and its rise within a step are of the chunk in hand
# (c: half the payload with 2 workers, a quarter with 4), not a cost per worker call.
DATAPROTO_FEATURES = {"controller": ("P", "c", "1")}
# Its level with nothing held is what glibc keeps of its per-call temporaries: a legacy codec's
# ``consolidate`` clones every leaf of a chunk that does not start its storage (every chunk but the first)
# and frees the clones when the copy is made. A freed heap-sized clone stays in the heap for the next call
# to reuse; a mapped one goes back to the kernel. So the level follows the chunk's heap-sized leaves (h: at
# the fit sizes every leaf is heap-sized, h = c), and the share of a chunk that is such a temporary
# (:meth:`Model.temp_share`) is resident within a call only where a leaf is mapped.
DATAPROTO_BASE = ("h", "1")


def heap_sized(block: float) -> bool:
    """Whether glibc can keep a freed block of ``block`` bytes in its heap. It maps every request whose
    chunk (the request plus its 8-byte size word, rounded up to 16 bytes) reaches the mmap threshold, and
    that threshold never rises past :data:`MMAP_THRESHOLD_MAX`: a leaf of exactly 32 MiB (many-keys'
    latents in a 256-row chunk) is mapped, and given back to the kernel when freed."""
    return math.ceil((block + 8) / 16) * 16 < MMAP_THRESHOLD_MAX


def _temp_share(base: Term) -> float:
    """The controller's level's slope on the chunk's heap-sized leaves, within 0 and 1 (:meth:`Model.temp_share`)."""
    return min(1.0, max(0.0, base.coef[base.features.index("h")])) if "h" in base.features else 0.0


@dataclass
class RoleModel:
    role: str
    base: Term
    growth: Term
    transient: Term


@dataclass
class Model:
    """One codec under one collector mode, fitted on ``replays`` (each named by scale and workers)."""

    codec: str
    gc: str
    workload: str
    roles: dict[str, RoleModel] = field(default_factory=dict)
    data_plane: str = "dataproto"
    release_rate: Term | None = None  # releases per training step (None: nothing ever released in the fits)
    release_share: float = 0.0  # share of the held growth a release frees
    run_lag: int = 0  # calls by which the collector's run comes before the even spread of the allocations (.heap)
    # allocations by which the count runs ahead of its even spread within a step, read from where the fits' runs
    # came (heap.observed_lead); None where no fit replay recorded them (run_lag, fitted on the levels, then)
    run_lead: float | None = None
    # how far into a call's allocations the call's copy is thrown away, so that a run past it finds none in hand
    # (heap.observed_release); None where no fit recorded a run after its call's copy (every run finds it in hand)
    copy_released: float | None = None
    collection_rate: Term | None = None  # the controller's full collections per training step
    allocations_at: list[Term] = field(default_factory=list)  # the controller's allocations so far at the end of
    # each of the fits' steps (the default collector, counted); past them, allocation_rate per step
    allocation_rate: Term | None = None
    calls_in_flight: int | None = None  # worker calls open at once, from call_to_send (None: not timed)
    call_to_send: float | None = None  # a call's span over the controller's time to send a chunk (see the module doc)
    send_s: Term | None = None  # the controller's seconds to send one chunk, by the chunk's bytes (None: not timed)
    # the object store's bytes per payload byte of the chunks it holds at once: the most a fit's store held over its
    # payload after any step, less what the steps before kept (its fitted growth), at the largest fit size (DataProto
    # plane; None: not fitted). The store's level is at least this share of the calls open at once' chunks (``O``):
    # a call's chunk stays in the store until the call ends, so workers that compute keep every chunk there
    store_share: float | None = None
    fitted_on: list[str] = field(default_factory=list)
    growth_fitted_on: list[str] = field(default_factory=list)  # the collector-off replays its controller's base and
    # growth come from (fit's ``held``; empty: these replays)
    leaf_row_bytes: list[float] = field(default_factory=list)  # bytes per row of each tensor leaf

    @property
    def parts(self) -> tuple[str, ...]:
        """The roles whose levels add up to the node's: the plane's processes and the store, counted once."""
        return PARTS if self.data_plane == "dataproto" else TQ_PARTS

    def open_calls(self, chunk: float, workers: int, compute_s: float = 0.0) -> int:
        """How many workers' calls are open at once when the controller sends the last chunk (see the module
        doc). A worker that computes ``compute_s`` seconds on its chunk keeps its call open that much longer:
        ``compute_s / send`` more of the controller's sends of a ``chunk``-byte chunk (its time fitted on the
        fits' sends). All the workers when the fits did not time the calls or the sends: an upper bound."""
        if self.calls_in_flight is None or self.call_to_send is None:
            return workers
        if compute_s <= 0:
            return max(1, min(workers, self.calls_in_flight))
        if self.send_s is None or math.isinf(compute_s):
            return workers
        send = max(self.send_s({"c": chunk, "1": 1.0}), 1e-6)
        return max(1, min(workers, math.floor(self.call_to_send + compute_s / send) + 1))

    def features(self, payload: float, rows: int, workers: int, objects_per_row: float,
                 compute_s: float = 0.0) -> dict[str, float]:
        """What the terms are functions of, at one size (see :data:`FEATURES`); ``mapped``: the largest chunk's
        mapped part, ``M``: the mapped parts of the calls open at once (the largest chunks first), workers
        computing ``compute_s`` seconds on their chunk (:meth:`open_calls`); ``mshare``: the share of the
        payload whose controller's copy glibc maps (``consolidate`` copies a chunk into one block)."""
        heaps, mapped, chunks = [], [], []
        for crows in chunk_sizes(rows, workers):
            c_i = payload * crows / rows
            chunks.append(c_i)
            heap = sum(b * crows for b in self.leaf_row_bytes if heap_sized(b * crows)) \
                if self.leaf_row_bytes else c_i
            heaps.append(min(heap, c_i))
            mapped.append(c_i - heaps[-1])
        chunk = payload * chunk_rows(rows, workers) / rows
        in_flight = self.open_calls(chunk, workers, compute_s)
        return {"P": float(payload), "c": chunk, "h": heaps[0], "H": sum(heaps),
                "mapped": mapped[0], "M": sum(sorted(mapped, reverse=True)[:in_flight]),
                "mshare": sum(c_i for c_i in chunks if not heap_sized(c_i)) / payload if payload > 0 else 0.0,
                "O": sum(sorted(chunks, reverse=True)[:in_flight]),
                "W": float(workers), "objects": rows * objects_per_row, "calls": float(len(heaps)), "1": 1.0}

    def temp_share(self) -> float:
        """The share of a chunk the controller allocates and frees within each call (:data:`DATAPROTO_BASE`):
        its level's slope on the chunk's heap-sized leaves, within 0 and 1 (none off the DataProto plane)."""
        return _temp_share(self.roles["controller"].base) if "controller" in self.roles else 0.0

    def mapped_rise(self, role: str, x: dict[str, float], temp: float | None = None) -> float:
        """What ``role`` holds during a step beyond its fitted transient, which has it taken out (a fit size may map
        leaves too): leaves above glibc's mmap threshold, resident during their call only (a worker's chunk's, the
        open calls' for the workers and the node, the controller's temporaries' share ``temp``: :meth:`temp_share`)."""
        if role == "controller":  # (no level on h, so no temporaries, off the DataProto plane)
            return (self.temp_share() if temp is None else temp) * x["mapped"]
        return {"worker": x["mapped"], "workers": x["M"], "node": x["M"]}.get(role, 0.0)

    def role_features(self, role: str) -> tuple[str, ...]:
        """The features ``role``'s terms are fitted on, on this model's data plane."""
        if self.data_plane == "dataproto":
            return DATAPROTO_FEATURES.get(role, FEATURES[role])
        return FEATURES[role]

    def release_steps(self, x: dict[str, float], steps: int) -> list[int]:
        return sorted(self.release_points(x, steps))  # the training steps (1-based) of the releases

    def release_points(self, x: dict[str, float], steps: int, released: bool = True) -> dict[int, tuple[float, ...]]:
        """Training steps (1-based) with a release, each with the shares of its calls done at its collector's first
        and last run (:func:`calls_done`) if the allocations were counted (module doc), else every 1/rate steps.
        ``released``: a run far enough into its call finds that call's copy thrown away (``copy_released``, as the
        fits found); False: every run within a call finds the call's copy in hand."""
        if self.release_rate is None:
            return {}
        if (so_far := self.counts(x, steps)) is not None:
            done = [calls_done(so_far[k - 1], so_far[k], int(x["calls"]), self.run_lag, self.run_lead,
                               self.copy_released if released else None) for k in range(1, steps + 1)]
            return {k: d for k, d in enumerate(done, 1) if d is not None}
        rate = min(1.0, max(0.0, self.release_rate(x)))
        if rate <= 0:
            return {}
        return {k: (0.0, 0.0) for k in range(1, steps + 1)
                if math.floor(rate * k + 1e-9) > math.floor(rate * (k - 1) + 1e-9)}

    def counts(self, x: dict[str, float], steps: int) -> list[float] | None:
        """The controller's allocations counted from the full collection before step 1 to each step's end (0..steps)."""
        if self.release_rate is None or self.allocation_rate is None:  # allocation_rate is set with allocations_at
            return None  # (the fits did not count)
        counted, rate = [max(0.0, t(x)) for t in self.allocations_at], max(0.0, self.allocation_rate(x))
        return [0.0] + [counted[k - 1] if k <= len(counted) else counted[-1] + rate * (k - len(counted))
                        for k in range(1, steps + 1)]

    def play(self, payload: float, rows: int, workers: int, steps: int, objects_per_row: float,
             store_capacity: float | None = None, compute_s: float = 0.0,
             copy_in_hand: str | None = None) -> dict[str, list[tuple[float, float]]]:
        """Per role, (level after the step, peak during it) for steps 1..``steps``, bytes above baselines.

        ``store_capacity`` bounds the object store's level and peak (None: unbounded); the store's level is a
        high-water mark (see the module doc). ``compute_s``: each worker's compute on its chunk
        (:meth:`open_calls`). ``copy_in_hand``: where a run comes inside a call, whether it leaves that call's copy:
        None as the fits found (:attr:`copy_released`: a run far enough into its call leaves nothing of the copy,
        one before leaves it until a run of the older generation), ``"kept"`` every such run leaves it (a run
        before the copy's block), ``"given back"`` none does (a run after the block: :func:`heap.copy_given_back`).
        """
        x = self.features(payload, rows, workers, objects_per_row, compute_s)
        cap = math.inf if store_capacity is None else max(0.0, store_capacity)
        releases = self.release_points(x, steps, released=copy_in_hand != "kept")
        so_far = self.counts(x, steps)  # which generation a run collects:
        if copy_in_hand == "given back":
            releases = heap.copy_given_back(releases, int(x["calls"]))
        gens = None if so_far is None else heap.generations(so_far)  # from the count
        before_run = [0.0] * steps  # per step, how far above its level after the step the controller stood at a run
        out: dict[str, list[tuple[float, float]]] = {}
        for role, rm in self.roles.items():
            base, growth, trans = rm.base(x), max(0.0, rm.growth(x)), max(0.0, rm.transient(x))
            pooled = role == "controller" and self.data_plane == "dataproto"  # its copies, freed and reused
            ctl: list[tuple[float, float]] = []
            if pooled:  # its copies' levels
                ctl = heap.play(base, growth, x["mshare"], releases, steps, self.release_share, int(x["calls"]), gens)
            trans += self.mapped_rise(role, x)
            held, prev, rows_out = 0.0, 0.0, []
            for k in range(1, steps + 1):
                if pooled:  # the step's highest may be just before its run, when it held all its garbage
                    level, before = ctl[k - 1]
                    before_run[k - 1] = max(0.0, before - level)
                else:
                    level_held, held = held, held + growth  # what the steps before left held, and this one's
                    if k in releases and (self.data_plane == "dataproto" or role == "controller"):  # on the
                        # TransferQueue plane a collection in the controller frees the controller's own objects only
                        held -= self.release_share * level_held
                    level = base + held
                if role == "store":  # at least the chunks of the calls open at once; the high-water mark of what it
                    if self.store_share is not None:  # held (its pages are never given back: never under its
                        level = max(level, self.store_share * x["O"])  # baseline), within its capacity
                    level = min(cap, max(prev, level))
                    rows_out.append((level, min(cap, level + trans)))
                else:  # the controller's highest in a step with a run may be just before the run, in a call
                    extra = before_run[k - 1] if role == "controller" else 0.0
                    rows_out.append((level, max(max(prev, level), level + extra) + trans))
                prev = level
            out[role] = rows_out
        if "node" in self.roles and all(p in out for p in self.parts):  # the node: its parts' levels, plus its
            # own rise: the higher of the sends' (the fits' rise and the mapped chunks of the calls they overlap)
            # and the compute's after them (every open call's mapped chunk, no send)
            sends = x if compute_s <= 0 else self.features(payload, rows, workers, objects_per_row)
            trans = max(max(0.0, self.roles["node"].transient(x)) + sends["M"], x["M"])
            levels = [sum(out[p][k][0] for p in self.parts) for k in range(steps)]
            out["node"] = [(lvl, max(max(levels[k - 1] if k else 0.0, lvl) + trans, lvl + before_run[k]))
                           for k, lvl in enumerate(levels)]
        return out

    def terms_table(self, unit_payload: float = 1.0) -> list[tuple[str, str, str]]:
        """(role, term, value in words): the model's terms, the short table ``predict`` prints."""
        mib = 2**20
        rows = []
        for role, rm in self.roles.items():
            if role == "node" and all(p in self.roles for p in self.parts):
                rows.append(("node", "sum of", " + ".join(self.parts) + ", plus its own rise while the controller "
                             "sends (or, if more, the open calls' mapped chunks while workers compute): "
                             + rm.transient.describe(mib)))
                continue
            rows.append((role, "level with nothing held", rm.base.describe(mib)))
            freed = f"{self.release_share:.0%} of it freed at each release"
            if self.release_rate is None:
                freed = "never freed in the fits"
            elif role == "store":
                freed = "its pages kept at a release (a high-water mark, reused by the next steps)"
            elif role == "controller" and self.data_plane == "dataproto":
                freed = (f"at each release the earlier steps' and the step's calls done: the copies of chunks above "
                         f"glibc's mmap threshold (one block each) all, {self.release_share:.0%} of the rest, whose "
                         "other blocks the next steps' copies reuse; the copy of the call a run interrupts survives "
                         f"it and only every {heap.OLDER_EVERY}th run frees such copies (Python's older generation), "
                         "which leaves its own for good (no full collection is played)")
            if role == "controller" and self.growth_fitted_on:
                freed += f" (this and the level: the collector-off replays, {', '.join(self.growth_fitted_on)})"
            rows.append((role, "held per training step", rm.growth.describe(mib) + f", {freed}"))
            temp = ""
            if role == "controller" and self.data_plane == "dataproto" and self.temp_share() > 0:
                temp = (f", plus {self.temp_share():.2f} x the chunk's leaves above glibc's mmap threshold (its "
                        "per-call temporaries, which the level keeps where they are heap-sized)")
            rows.append((role, "transient within a step", rm.transient.describe(mib) + temp))
        if self.release_rate is not None and self.allocation_rate is None:  # else the allocations set them
            rows.append(("controller", "releases per training step", self.release_rate.describe(1)))
        if self.allocation_rate is not None:
            lag = (f", {self.run_lag} call{'' if self.run_lag == 1 else 's'} before where an even spread of the "
                   "step's allocations puts it (fitted on the levels)") if self.run_lag else ""
            if self.run_lead is not None:
                lag = (f", in the call where the count, {self.run_lead:.0f} ahead of an even spread of the step's "
                       "allocations (it cuts the chunks before its calls), passes it (where the fits' runs came)")
                if self.copy_released is not None:
                    lag += (f"; a run {self.copy_released:.2f} or more of the way through a call's allocations finds "
                            "that call's copy thrown away (where the fits' runs found it)")
            rows.append(("controller", "allocations per step", f"{self.allocations_at[0].describe(1, 1)} in the first, "
                         f"{self.allocation_rate.describe(1, 1)} in each later one; the collector runs every "
                         f"{YOUNG_EVERY} and frees the held copies{lag}"))
        if self.collection_rate is not None:
            none = all(abs(c) < 1e-9 for c in self.collection_rate.coef)
            rows.append(("controller", "full collections per step",
                         "none in the fits" if none else self.collection_rate.describe(1)))
        if self.leaf_row_bytes and "workers" in self.roles:
            rows.append(("workers", "calls open at once", self.calls_text()))
        if self.store_share is not None:
            rows.append(("store", "chunks held at once", f"at least {self.store_share:.2f} x the payload of the chunks "
                         "of the calls open at once (the most a fit's store held after a step beyond what earlier "
                         "steps kept, over its payload, at the largest fit size): a chunk stays until its call ends"))
        return rows

    def calls_text(self) -> str:
        """The overlap of the workers' calls in words: it sets how many chunks' mapped leaves (those above
        glibc's mmap threshold, resident during a call only) the workers' sum holds together."""
        if self.calls_in_flight is None:
            return "all workers (an upper bound: the fits' replays did not time their calls)"
        text = (f"{self.calls_in_flight}, at most the workers (a worker's call lasted {self.call_to_send:.2f} x the "
                "controller's sending of one chunk in the fits: each replay's longest step, the median over the "
                "replays), each holding its chunk's leaves above glibc's mmap threshold during the call")
        if self.send_s is None:
            return text + ("; workers that compute on their chunk (--worker-compute) overlap more: all of them "
                           "is the bound then (the fits did not time the controller's sends)")
        per_gib, fixed = self.send_s.coef[0] * 2**30, self.send_s.coef[1]
        return text + (f"; a worker that computes S seconds on its chunk (--worker-compute S) keeps its call open "
                       f"S / send longer, where sending one chunk takes {per_gib:.2f} s per GiB {fixed * 1000:+.1f} ms "
                       "(fitted on the fits' sends), up to all the workers")


def _role_terms(rep: Replay, role: str, releases: list[int], growth: float | None = None
                ) -> tuple[float, float, float, list[float]]:
    """One replay's (base, growth, transient) for ``role`` (what a release gives back: :func:`fit`).

    On the TransferQueue plane the first write fills the processes' heaps: the storage units (and the
    producer and the workers) keep what a cleared step freed and the next step's write reuses it
    (docs/node.md), so their level jumps between the first two steps and then settles. There the rise
    into the second step is left out of the growth (the median rise from the third step on, robust to
    a late settling step) and the level with nothing held and the transient are taken from the second
    step on (the first step's fill is in the settled level).

    On the DataProto plane the workers settle the same way, for glibc's reason (:data:`SETTLING_ROLES`): its
    mmap threshold starts at 128 KiB and rises to the size of each mapped block freed, up to 32 MiB, so in
    the first step a worker maps every leaf above 128 KiB of its chunk and gives it back after the call
    (its level after step 1 was 0.00-0.05x of the payload in every fit), and from the second step on the
    same-sized leaves come from its heap and stay (0.81-0.97x). The level a long run keeps is the second
    step's; averaged with the first, a worker's level was a sixth too low.

    On both planes a replay's own growth is its median rise between steps, not the mean (:func:`fit` puts the
    role's line through every rise of every replay; ``growth`` given, the level with nothing held is what the
    steps keep beyond it, and the rises are returned for that line): besides what a step keeps,
    the allocators move a role's level by whole blocks at a few steps (a leaf-sized temporary left in the
    heap below a held block, or reused by the next step's same-sized one; the object store placing a chunk
    on pages it had never touched, which it keeps). Such a jump does not recur at every step, so it is no
    growth: the mean would carry it into every step played forward (over 120 steps, 4% of a payload per
    step is five payloads that no step keeps); left out of the growth, it stays in the level with nothing
    held, bounded."""
    ends = [s.end.get(role, 0) for s in rep.per_step]
    peaks = [s.peak.get(role, 0) for s in rep.per_step]
    idx = [s.index for s in rep.per_step]
    settle = 1 if (rep.data_plane != "dataproto" or role in SETTLING_ROLES) and len(ends) >= 3 else 0
    # growth: median rise over steps with no release in them (the first step carries the base, so from step 2)
    rises = [ends[i] - ends[i - 1] for i in range(1 + settle, len(ends)) if idx[i] not in releases]
    own = max(0.0, statistics.median(rises)) if rises else 0.0
    if own <= growth_floor(rep, role, rises):  # the sampler's or the allocator's jitter, not a growth
        own, rises = 0.0, [0.0] * len(rises)
    growth = own if growth is None else growth
    held, ms = 0.0, []
    for i, k in enumerate(idx):
        held = 1 if k in releases and i > 0 else held + 1
        ms.append(held)
    base = sum(e - growth * m for e, m in list(zip(ends, ms))[settle:]) / (len(ends) - settle)
    trans = [p - max(ends[i - 1] if i else 0.0, ends[i]) for i, p in enumerate(peaks)][settle:]
    transient = max(0.0, sum(trans) / len(trans))
    return base, growth, transient, rises


def _node_transient(rep: Replay, parts: Sequence[str] = PARTS) -> float:
    """How far the node's sampled total rose within a step above the sum of its parts' levels (the higher
    of before and after the step): the moments at which parts peak together. Mean over the steps."""
    out, prev = [], 0.0
    for s in rep.per_step:
        level = sum(s.end.get(p, 0) for p in parts)
        out.append(s.peak.get("node", 0) - max(prev, level))
        prev = level
    if rep.data_plane != "dataproto" and len(out) >= 3:  # the first step's fill is in the settled levels
        out = out[1:]
    return max(0.0, sum(out) / len(out)) if out else 0.0


def fit(replays: Sequence[Replay], leaf_row_bytes: Sequence[float] = (), held: Model | None = None) -> Model:
    """The model of one codec under one collector mode from its replays (at least one, all ``ok``);
    ``leaf_row_bytes`` (bytes per row of each tensor leaf) places the chunk's leaves against glibc's
    mmap threshold (without it the whole chunk counts as heap). ``held``: the same codec's model with the
    collector off, whose controller's base and growth (what a step keeps where nothing frees it) the
    controller takes on the DataProto plane; the replays here then set only what a release gives back."""
    reps = [r for r in replays if r.outcome == "ok" and r.per_step]
    if not reps:
        raise ValueError("no replay with measured steps to fit")
    first = reps[0]
    planes = {r.data_plane for r in reps}
    if len(planes) > 1:
        raise ValueError(f"replays of different data planes cannot make one model: {sorted(planes)}")
    m = Model(first.codec, first.gc, first.workload, data_plane=first.data_plane,
              fitted_on=[f"x{r.scale:g} {r.workers}w" for r in reps], leaf_row_bytes=list(leaf_row_bytes))
    m.call_to_send = call_to_send(reps)  # first: the calls open at once set what a fit's mapped leaves add (M)
    m.calls_in_flight = None if m.call_to_send is None else math.floor(m.call_to_send) + 1
    xs = [m.features(r.payload_bytes, r.rows, r.workers, r.non_tensor_objects / r.rows) for r in reps]
    rel = [released_at(r) for r in reps]
    runs = [replay_releases(r) for r in reps]  # the collector's runs where they were counted, with their calls done
    read: dict[str, list[tuple[float, float, float]]] = {}  # per role, each replay's readings
    for role in (ROLES if m.data_plane == "dataproto" else TQ_ROLES):
        if not all(role in s.end for r in reps for s in r.per_step):
            continue
        feats = m.role_features(role)
        if role == "node" and all(p in s.end for r in reps for s in r.per_step for p in m.parts):
            per = [(0.0, 0.0, _node_transient(r, m.parts)) for r in reps]
            growth = fit_term(f"{role} growth", feats, xs, [0.0 for _ in reps])
        else:  # the growth through every rise of every replay (least absolute deviations), so that a replay whose
            # allocator kept a block at most of its steps weighs as those few rises, not as a whole replay; each
            # replay's level with nothing held then is what its steps keep beyond that growth
            own = [_role_terms(r, role, rl) for r, rl in zip(reps, rel)]
            pts = [(x, v) for x, p in zip(xs, own) for v in (p[3] or [p[1]])]
            growth = fit_term(f"{role} growth", feats, [x for x, _ in pts], [v for _, v in pts], robust=True)
            per = [_role_terms(r, role, rl, max(0.0, growth(x)))[:3] for r, rl, x in zip(reps, rel, xs)]
        base = fit_term(f"{role} base", DATAPROTO_BASE if role == "controller" and m.data_plane == "dataproto"
                        else feats, xs, [p[0] for p in per])
        m.roles[role] = RoleModel(role, base, growth, fit_term(f"{role} transient", feats, xs, [
            max(0.0, p[2] - m.mapped_rise(role, x, _temp_share(base))) for p, x in zip(per, xs)]))
        read[role] = per
    if held is not None and m.data_plane == "dataproto" and "controller" in m.roles and "controller" in held.roles:
        kept = held.roles["controller"]
        m.roles["controller"] = replace(m.roles["controller"], base=kept.base, growth=kept.growth)
        m.growth_fitted_on = held.fitted_on
    if m.data_plane == "dataproto" and "store" in read:  # less what the steps before kept: each replay's growth
        largest = max(r.payload_bytes for r in reps)  # where a fixed cost weighs least against the payload
        m.store_share = max((s.end["store"] - p[1] * k) / r.payload_bytes for r, p in zip(reps, read["store"])
                            if r.payload_bytes == largest for k, s in enumerate(r.per_step))
    sends = [statistics.median(s.send_s for s in r.per_step) for r in reps
             if r.per_step and all(s.send_s is not None for s in r.per_step)]
    if m.call_to_send is not None and len(sends) == len(reps):  # every replay timed its sends
        m.send_s = fit_term("seconds per chunk sent", ("c", "1"), xs, sends)
    counted = [r for r in reps if r.per_step[-1].collections is not None]
    if counted:
        m.collection_rate = fit_term("full collections", FEATURES["objects"],
                                     [x for x, r in zip(xs, reps) if r in counted],
                                     [r.per_step[-1].collections / len(r.per_step) for r in counted])
    if any(rel) or any(runs):
        m.release_rate = fit_supported("release rate", FEATURES["objects"], xs,
                                  [len(rl) / len(r.per_step) for r, rl in zip(reps, rel)])
        ctl = m.roles.get("controller")
        if ctl is not None:  # each replay's levels and growth as multiples of its payload
            m.run_lead = heap.observed_lead(reps)
            m.copy_released = heap.observed_release(reps, m.run_lead)
            m.run_lag, m.release_share = heap.fit_release(
                [([s.end["controller"] / r.payload_bytes for s in r.per_step],
                  max(0.0, ctl.growth(x)) / r.payload_bytes, x["mshare"],
                  lambda lag, r=r: replay_releases(r, lag), int(x["calls"]), heap.replay_generations(r))
                 for r, x in zip(reps, xs)],
                None if m.run_lead is None else 0)
        else:
            m.release_share = 1.0
    if m.release_rate is not None and m.gc == "default" and all(r.per_step[-1].allocations for r in reps):
        n = min(len(r.per_step) for r in reps)
        feats = FEATURES["allocations"]
        m.allocations_at = [fit_supported(f"allocations by step {k + 1}", feats, xs,
                                     [r.per_step[k].allocations or 0 for r in reps]) for k in range(n)]
        # past the fits' steps: the mean rise of the steps after the first (the first also sets up)
        m.allocation_rate = fit_supported("allocations", feats, xs,
                                     [((r.per_step[n - 1].allocations or 0) - (r.per_step[0].allocations or 0))
                                      / max(1, n - 1) for r in reps])
    return m
