"""Observations for the cost model: node replays at small sizes, boiled down to plain per-step numbers, cached.

A node replay's result holds every process's curve at about 1 ms; the model needs far less: per
training step, where each role (the controller, the workers, the object store, the node's total)
stood at the step's end and how high it went during the step, how many full collections the
controller had seen by then, and its container allocations (what sets when its collector runs).
:func:`observe` extracts exactly that from a
:class:`~picklescope.investigate.node.NodeResult`; :func:`replays` runs the replays a fit needs and keeps
the observations as JSON in the cache, keyed by everything that changes them: the workload file's
contents, the codec (and the verl version it names), the collector mode, the data plane, the replay
options and whether the replay started its own cluster or joined one.

Each training step of a fit ends with :data:`FIT_STEP_GAP_S` idle, as a production step spends minutes
computing: Ray frees unpinned objects in batches, by default at most every 1000 ms, and on such a cluster
steps run back to back allocate the next step's chunks first, so the object store touched a payload of
fresh pages per step (0.33x, 1.33x, 2.33x ... of the payload at steps 1, 2, 3 ...), where with a 2 s gap it
stayed at its first step's level (flowgrpo x0.05, benchmarks/README.md). A cluster the toolkit starts frees
them at once (:data:`~picklescope.ray.cluster.OWN_CLUSTER_ENV`); a joined cluster keeps its own setting,
which the gap covers.

On a cluster of its own each codec replays alone, on a fresh object store that holds every step's
objects (:func:`replay_store_bytes`), as a user's training job starts on a node. The store's pages
count in the node's memory once touched and are never given back, so what a step's objects touch is
measured only where the store's pages start untouched: in a series, the unmeasured steps before each
replay touch them first, and on a joined cluster earlier work has (that cluster's store then shows
little or nothing, docs/predict.md).

On the TransferQueue data plane (:mod:`picklescope.investigate.node.tq_plane`) the node has more
kinds of process: the rollout's ``producer`` actor, TransferQueue's storage units (``storage-N``, one
role ``storage``: their sum) and its controller actor (``tq-controller``); each is a role of its own,
and ``workers`` counts the ``worker-N`` processes only.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from picklescope.errors import PicklescopeError
from picklescope.investigate.node import NodeResult, node_series
from picklescope.verl import envs
from picklescope.workloads.spec import Workload, load_workload

CACHE_VERSION = 4  # 2: each step records its end jitter (the growth floor); 3: each step ends with FIT_STEP_GAP_S
# idle, and on a cluster of its own each codec replays alone on a store that never fills; 4: every replay's
# baseline is taken after malloc_trim(0), a standalone one's too (change it with them)
FIT_SCALES = (0.05, 0.1, 0.2)
FIT_WORKERS = (2, 4)
FIT_STEPS = 6
# An idle wait at the end of each of a fit's (and a check's) training steps: a stand-in for the step's compute,
# long enough for Ray to free the step's objects before the next step allocates (see the module doc)
FIT_STEP_GAP_S = 2.0
ROLES = ("controller", "worker", "workers", "store", "node")  # worker: the busiest one; workers: their sum
TQ_ROLES = ("controller", "producer", "worker", "workers", "storage", "tq-controller", "store", "node")


@dataclass
class StepObs:
    """One training step of one replay: per role, bytes above baselines at the step's end and the highest
    sample during the step (sampled private memory; the store counted once)."""

    index: int
    end: dict[str, int] = field(default_factory=dict)
    peak: dict[str, int] = field(default_factory=dict)
    collections: int | None = None  # the controller's full collections so far (cumulative)
    allocations: int | None = None  # its container allocations so far, as the collector counts them
    # its collector's runs in the step, each [generation, the step's worker calls made when it ran, where the call in
    # hand stood against its copy (collector.PHASES)] (calls and place None where the loop did not say; no place in
    # a replay cached before it was recorded); None in a replay cached before runs were recorded
    runs: list[list[int | str | None]] | None = None
    # the most worker calls open at one moment in the step (each from its first named step to its last, on
    # the run's clock), and a call's mean span over the controller's mean time to send one chunk (the
    # calls open when the last chunk leaves: floor(ratio) + 1); None in a replay cached before calls were
    # timed, or where the controller sends no chunk (the TransferQueue plane)
    calls_in_flight: int | None = None
    call_to_send: float | None = None
    # per role, how far its level moved between the first two samples after the step's end: what one sample
    # interval resolves of the level (empty in a replay cached before it was kept)
    end_jitter: dict[str, int] = field(default_factory=dict)
    # the controller's mean seconds to send one chunk in the step (what a worker's compute is weighed against:
    # Model.open_calls); None in a replay cached before it was kept, or where the controller sends no chunk
    send_s: float | None = None


@dataclass
class Replay:
    """One measured replay as the model sees it."""

    codec: str
    gc: str
    workload: str
    scale: float
    workers: int
    steps: int
    payload_bytes: int
    rows: int
    chunk_bytes: int  # the largest chunk's payload (rows are split as torch.chunk / DataProto.chunk split them)
    non_tensor_objects: int  # rows x non-tensor keys: the objects that do not scale with bytes
    outcome: str
    node_peak_bytes: int | None
    controller_own_peak_bytes: int | None
    controller_exact_peak_bytes: int | None
    full_collections: dict[str, int] = field(default_factory=dict)
    per_step: list[StepObs] = field(default_factory=list)
    data_plane: str = "dataproto"  # how the batch reached the workers (a cache written before planes: dataproto)

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> Replay:
        r = cls(**{k: v for k, v in doc.items() if k != "per_step"})
        known = {f.name for f in fields(StepObs)}  # a key of another version's cache is not the model's
        r.per_step = [StepObs(**{k: v for k, v in s.items() if k in known}) for s in doc.get("per_step", [])]
        return r


def chunk_rows(rows: int, workers: int) -> int:
    """Rows of the largest chunk: ``ceil(rows / workers)``, as ``torch.chunk`` and verl's ``chunk`` cut."""
    return math.ceil(rows / workers)


def chunk_sizes(rows: int, workers: int) -> list[int]:
    """Rows of every chunk as ``torch.chunk`` cuts them: ``ceil(rows / workers)`` each and the rest in the
    last, so 13 rows among 4 workers are 4, 4, 4, 1 and 6 rows are 2, 2, 2 (one worker gets no call).
    The workers' sum holds these, not ``workers`` times the largest."""
    size = chunk_rows(rows, workers)
    full, rest = divmod(rows, size)
    return [size] * full + ([rest] if rest else [])


def observe(result: NodeResult, wl: Workload) -> Replay:
    """The plain per-step numbers of one replay (see the module doc)."""
    rows = wl.rows(result.scale)
    rep = Replay(result.codec, result.gc, result.workload, result.scale, result.workers, result.steps,
                 result.payload_bytes, rows, result.payload_bytes * chunk_rows(rows, result.workers) // rows,
                 rows * len(wl.non_tensor), result.outcome, result.node_peak_bytes,
                 result.own_peak_bytes("driver") if "driver" in result.processes else None,
                 result.driver.peak_bytes if "driver" in result.processes else None,
                 dict(result.full_collections), data_plane=result.data_plane)
    if result.outcome != "ok" or result.node_baseline_bytes is None:
        return rep
    series = _role_series(result)
    for s in result.training_steps:
        if s.end_s is None:
            continue
        obs = StepObs(s.index, collections=result.driver_full_collections.get(s.index),
                      allocations=result.driver_allocations.get(s.index), runs=result.driver_runs.get(s.index),
                      calls_in_flight=_calls_in_flight(result, s.index), call_to_send=_call_to_send(result, s.index),
                      send_s=_send_s(result, s.index))
        for role, (ts, vs) in series.items():
            inside = [v for t, v in zip(ts, vs) if s.start_s <= t <= s.end_s]
            after = [v for t, v in zip(ts, vs) if t >= s.end_s]
            if inside:
                obs.peak[role] = max(inside)
            if after:
                obs.end[role] = after[0]
            if len(after) >= 2:
                obs.end_jitter[role] = abs(after[1] - after[0])
        rep.per_step.append(obs)
    return rep


def call_to_send(reps: Sequence[Replay]) -> float | None:
    """The call-to-send ratio ``r`` the model counts calls open at once by (``floor(r) + 1`` when the last
    chunk leaves): per replay its longest step, since a mapped leaf is fresh pages at every call (the
    kernel faults them in, and takes them back at the free), as the fits' heaps are in their first step
    only, and calls that fault in their pages last longer; then the median over the replays (the higher
    middle one: the side of more calls open), so that one slow step, which lands in one replay, does not
    set it. None when any step of any replay was not timed (the upper bound, all workers, then holds)."""
    longest = []
    for r in reps:
        ratios = [s.call_to_send for s in r.per_step]
        if not ratios or any(v is None for v in ratios):
            return None
        longest.append(max(v for v in ratios if v is not None))
    return statistics.median_high(longest) if longest else None


def growth_floor(rep: Replay, role: str, rises: Sequence[float]) -> float:
    """The smallest rise per step of ``role`` that ``rep`` can tell from nothing: the larger of what one
    sample interval resolves of its level (the median over the steps of how far it moved between the first
    two samples after a step's end) and the noise of its rises between steps (their median absolute
    deviation from their median). A consistent rise has no deviation and always counts; a median rise
    among rises that scatter more than it does is noise."""
    jitter = [s.end_jitter[role] for s in rep.per_step if role in s.end_jitter]
    resolution = statistics.median(jitter) if jitter else 0.0
    if len(rises) < 2:
        return float(resolution)
    mid = statistics.median(rises)
    return float(max(resolution, statistics.median(abs(r - mid) for r in rises)))


SEND_STEPS = ("argument serialization", "ray.put")  # the controller's named steps that send one chunk


def _call_spans(result: NodeResult, index: int) -> list[tuple[float, float]]:
    """Each worker's call in training step ``index``: from its first named step of the training step (Ray's
    deserialization of the chunk) to its last (the result's serialization), the span it holds its chunk."""
    spans = []
    for name, rec in result.processes.items():
        if not name.startswith("worker-"):
            continue
        mine = [st for st in rec.steps if st.training_step == index and st.end_s is not None]
        if mine:
            spans.append((min(st.start_s for st in mine), max(st.end_s for st in mine)))
    return spans


def _calls_in_flight(result: NodeResult, index: int) -> int | None:
    """The most worker calls open at one moment of training step ``index``; None when no worker recorded a
    step."""
    spans = _call_spans(result, index)
    if not spans:
        return None
    return max(sum(1 for b, e in spans if b <= start < e) for start, _ in spans)


def _call_to_send(result: NodeResult, index: int) -> float | None:
    """A worker call's mean span over the controller's mean time to send one chunk, in training step
    ``index``. The controller sends the chunks one after the other; a call that lasts r sends leaves
    floor(r) + 1 calls open when the last chunk leaves. Both are copies of a chunk's bytes (into the object
    store, out of it), so the ratio holds across sizes where a count of open calls, blurred by the fixed
    latencies of tiny chunks, would not. None without both, and on the TransferQueue plane, where the
    controller sends metadata only (the workers read their shards from the storage units)."""
    calls, send = _call_spans(result, index), _send_s(result, index)
    if not calls or send is None:
        return None
    return (sum(e - b for b, e in calls) / len(calls)) / send


def _send_s(result: NodeResult, index: int) -> float | None:
    """The controller's mean seconds per chunk sent in training step ``index`` (its named steps that send
    one, :data:`SEND_STEPS`); None without any, and on the TransferQueue plane (metadata only)."""
    if result.data_plane != "dataproto":
        return None
    driver = result.processes.get("driver")
    sends = [st.end_s - st.start_s for st in (driver.steps if driver else [])
             if st.training_step == index and st.name in SEND_STEPS and st.depth == 0 and st.end_s is not None]
    if not sends or sum(sends) <= 0:
        return None
    return sum(sends) / len(sends)


def _role_series(result: NodeResult) -> dict[str, tuple[list[float], list[int]]]:
    """Per role, the sampled bytes above baselines on the session's ticks (from the baseline tick on)."""
    start = result.baseline_s or 0.0
    ticks = [t for t in result.node.t_s if t >= start]
    index = {t: i for i, t in enumerate(ticks)}

    def above(name: str) -> list[int]:
        curve = result.processes[name].above_baseline(unknown_baseline=0)
        out = [0] * len(ticks)
        for t, v in zip(curve.t_s, curve.bytes):
            i = index.get(t)
            if i is not None:
                out[i] = v
        return out

    roles: dict[str, list[int]] = {"controller": above("driver")}
    if result.data_plane == "dataproto":
        workers = [above(n) for n, p in result.processes.items() if n != "driver" and p.sampled]
    else:  # the TransferQueue plane: the workers apart from the producer and TransferQueue's own actors
        workers = [above(n) for n, p in result.processes.items() if n.startswith("worker-") and p.sampled]
        storage = [above(n) for n, p in result.processes.items() if n.startswith("storage-") and p.sampled]
        roles["storage"] = [sum(col) for col in zip(*storage)] if storage else [0] * len(ticks)
        for name in ("producer", "tq-controller"):
            rec = result.processes.get(name)
            roles[name] = above(name) if rec is not None and rec.sampled else [0] * len(ticks)
    roles["workers"] = [sum(col) for col in zip(*workers)] if workers else [0] * len(ticks)
    roles["worker"] = [max(col) for col in zip(*workers)] if workers else [0] * len(ticks)
    store = [0] * len(ticks)
    if result.store_baseline_bytes is not None:
        for t, v in zip(result.store.t_s, result.store.bytes):
            i = index.get(t)
            if i is not None:
                store[i] = v - result.store_baseline_bytes
    roles["store"] = store
    base = result.node_baseline_bytes or 0
    roles["node"] = [v - base for t, v in zip(result.node.t_s, result.node.bytes) if t >= start]
    return {role: (ticks, values) for role, values in roles.items()}


# -- the cache --------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where fits are kept: ``$PICKLESCOPE_CACHE/predict`` (default ``~/.cache/picklescope/predict``)."""
    return envs.cache_root() / "predict"


def workload_key(wl: Workload) -> str:
    """What identifies a workload's contents: its file's bytes (a changed file is a new key), or a preset's."""
    source = wl.source or wl.name
    try:
        data = Path(source).read_bytes()
    except OSError:
        data = json.dumps([wl.name, wl.batch_size, [asdict(t) for t in wl.tensors],
                           [asdict(n) for n in wl.non_tensor]], sort_keys=True).encode()
    return hashlib.sha256(data).hexdigest()[:16]


def codec_key(codec: str) -> str:
    """The codec, and for a ``verl-<version>:<mode>`` codec the installed version's record (a reinstall is new)."""
    if not codec.startswith("verl-"):
        return codec
    label = codec[len("verl-"):].split(":", 1)[0]
    info = envs.verl_root() / f"verl-{label}" / envs.INFO_FILE
    try:
        return codec + ":" + hashlib.sha256(info.read_bytes()).hexdigest()[:12]
    except OSError:
        return codec


def cache_path(wl: Workload, codec: str, gc: str, scale: float, workers: int, steps: int,
               data_plane: str = "dataproto", joined: bool = False, worker_compute_s: float = 0.0) -> Path:
    """The cache file of one replay. The data plane is part of the key (and of the name) for every plane but
    ``dataproto``; a replay on a joined cluster (``joined``) is keyed apart from one on a cluster of its own,
    since their object stores differ (see the module doc), and one whose workers computed
    (``worker_compute_s``, a check's) from one whose did not."""
    fields: dict[str, Any] = {"v": CACHE_VERSION, "workload": workload_key(wl), "codec": codec_key(codec), "gc": gc,
                              "scale": scale, "workers": workers, "steps": steps}
    label = f"{wl.name}-{codec}-{gc}"
    if data_plane != "dataproto":
        fields["data_plane"] = data_plane
        label += f"-{data_plane}"
    if joined:
        fields["cluster"] = "joined"
        label += "-joined"
    if worker_compute_s:
        fields["worker_compute_s"] = float(worker_compute_s)
        label += f"-compute{worker_compute_s:g}s"
    key = json.dumps(fields, sort_keys=True)
    safe = "".join(ch if ch.isalnum() or ch in "-_." else "_" for ch in label)
    return cache_dir() / f"{safe}-x{scale:g}-w{workers}-{hashlib.sha256(key.encode()).hexdigest()[:12]}.json"


def load_cached(path: Path, data_plane: str = "dataproto") -> Replay | None:
    """The cached replay at ``path``, or None when absent, unreadable or of another data plane."""
    try:
        doc = json.loads(path.read_text())
        rep = Replay.from_dict(doc)
    except (OSError, ValueError, TypeError, KeyError):
        return None  # absent or unreadable: measured again
    if rep.data_plane != data_plane:
        return None
    if rep.gc == "default" and rep.outcome == "ok" and any(s.allocations is None for s in rep.per_step):
        return None  # cached before the collector's runs were counted: the schedule is fitted from them
    return rep


def save_cached(path: Path, rep: Replay) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(asdict(rep)))
    os.replace(tmp, path)


# -- running the replays ----------------------------------------------------------------------------


def replay_store_bytes(payload: int, steps: int, ray_address: str | None) -> int | None:
    """The object store a replay of ``predict`` starts its cluster with: room for every step's chunks, one
    step's more and some slack, so that it never fills. A full store makes Ray run the collector in every
    process, a release the fit would then learn from the store's size at the fit sizes, not from the batch;
    the store's capacity is the prediction's to apply (``--store-capacity`` or Ray's default). None on a
    joined cluster, whose store is its own."""
    return None if ray_address else (steps + 2) * payload + 64 * 2**20


def replay_series(group: Sequence[str], workload: str, scale: float, workers: int, steps: int, *, gc: str,
                  timeout_s: float, ray_address: str | None, data_plane: str,
                  worker_compute_s: float = 0.0) -> list[NodeResult]:
    """One group's node replays as ``predict`` runs them, for its fit and its check alike: each step ending
    with :data:`FIT_STEP_GAP_S` idle and, on a cluster of its own, a store of :func:`replay_store_bytes`.
    The fit's workers never compute (its chunks have no leaf the overlap of calls would show, and their
    calls are timed as they are); a check's compute as the prediction says (``worker_compute_s``)."""
    payload = load_workload(workload).payload_bytes(scale)
    return node_series(group, workload, scale, workers, steps, gc=gc, timeout_s=timeout_s, ray_address=ray_address,
                       data_plane=data_plane, step_gap_s=FIT_STEP_GAP_S,
                       store_bytes=replay_store_bytes(payload, steps, ray_address), worker_compute_s=worker_compute_s)


def replay_groups(codecs: Sequence[str], data_plane: str = "dataproto", joined: bool = False) -> list[list[str]]:
    """The codecs that replay together, one ``node_series`` per group, in ``codecs``' order. On a cluster of
    its own every codec alone: a series' unmeasured steps before each replay touch the object store's pages,
    which would hide what a fresh node's store holds (see the module doc). On a joined cluster, whose
    store earlier work has touched anyway, on the DataProto plane the built-in codecs as one series (the
    node's start is most of a replay's cost) and each ``verl-*`` codec alone (it loads its own verl); on the
    TransferQueue plane every codec alone (a series' unmeasured steps before each replay leave the storage
    units' memory in its baseline, docs/node.md, which would hide the storage role). The fit's replays, the
    check's replay and the models fitted from them all group by this one rule, so a fit and its check replay
    alike."""
    series = data_plane == "dataproto" and joined
    built_in = [c for c in codecs if series and not c.startswith("verl-")]
    return ([built_in] if built_in else []) + [[c] for c in codecs if c not in built_in]


def replays(codecs: Sequence[str], workload: str, gc: str, scales: Sequence[float] = FIT_SCALES,
            workers: Sequence[int] = FIT_WORKERS, steps: int = FIT_STEPS, *, refresh: bool = False,
            timeout_s: float = 900.0, ray_address: str | None = None, data_plane: str = "dataproto",
            worker_compute_s: float = 0.0, log: Callable[[str], None] | None = None) -> list[Replay]:
    """The fit's replays, from the cache where they are, measured where not.

    The codecs missing at one size and worker count replay in the groups of :func:`replay_groups`. Sizes and
    worker counts run one after the other, never side by side: each group on a cluster of its own (its store
    sized by :func:`replay_store_bytes`), or all join ``ray_address`` (starting a cluster is the slowest and
    least reliable part of a replay on a loaded machine, but a joined store shows little of what a fresh one
    holds; the cluster's object store must then hold every step's chunks with ``gc off``).
    """
    wl = load_workload(workload)
    joined = bool(ray_address)
    out: list[Replay] = []
    for w in workers:
        for s in scales:
            missing = []
            for codec in codecs:
                path = cache_path(wl, codec, gc, s, w, steps, data_plane, joined, worker_compute_s)
                cached = None if refresh else load_cached(path, data_plane)
                if cached is not None and cached.outcome == "ok":
                    out.append(cached)
                else:
                    missing.append(codec)
            for group in replay_groups(missing, data_plane, joined):
                if log:
                    log(f"replaying {','.join(group)} on {wl.name} x{s:g}, {w} workers, {steps} steps, gc {gc}, "
                        f"data plane {data_plane}"
                        + (f", each worker computing {worker_compute_s:g} s" if worker_compute_s else ""))
                results = replay_series(group, workload, s, w, steps, gc=gc, timeout_s=timeout_s,
                                        ray_address=ray_address, data_plane=data_plane,
                                        worker_compute_s=worker_compute_s)
                for codec, r in zip(group, results):
                    rep = observe(r, wl)
                    if r.outcome != "ok":
                        raise PicklescopeError(f"the fit's replay of {codec} at x{s:g} with {w} workers ended "
                                               f"{r.outcome}: {r.error or 'no detail'}",
                                               "run it alone with picklescope node to see why, then predict again")
                    save_cached(cache_path(wl, codec, gc, s, w, steps, data_plane, joined, worker_compute_s), rep)
                    out.append(rep)
    return out
