"""A node predicted: the fitted model played forward at the user's batch, workers, steps and node, with Ray's kill.

Ray's memory monitor (in every raylet) compares the node's used memory with ``RAY_memory_usage_threshold``
(default 0.95) of the node's memory. Above it, it kills one worker process (a task's or an actor's),
never the raylet nor the driver script: retriable tasks first, and among the rest the one scheduled most
recently. What is modelled here: no process of the node is retriable (actors restart only when
``max_restarts`` is set, which the replay's workers do not set), so the victim is the worker whose call
was scheduled last in the step that crossed: the last of the step's worker calls (``worker-<W-1>``),
since the controller (verl's ``TaskRunner``, an actor whose one task runs the whole training loop) was
scheduled long before. The caller then sees ``ray.exceptions.OutOfMemoryError`` and the training stops,
so the first crossing is the answer.

On the TransferQueue data plane the node has more actors: the rollout's producer, TransferQueue's
storage units and its controller actor. None is retriable either (TransferQueue creates its actors
without ``max_restarts``, the producer sets none), and all are owned by the controller, which creates
TransferQueue's actors first, then the producer, then the workers in order, and calls the producer
before the workers in every step. So by lease (actor creation) and by call alike the most recent is
still the last worker, ``worker-<W-1>``: the storage units, which hold the batch, are not Ray's pick,
and the node keeps their memory until the training stops.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

from picklescope.core.units import fmt_bytes, parse_size, seconds
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import GC_MODES, tq_plane
from picklescope.investigate.predict import fit as fitting
from picklescope.investigate.predict.answer import Check, CodecPrediction
from picklescope.investigate.predict.heap import released_at
from picklescope.investigate.predict.model import Model
from picklescope.investigate.predict.model import fit as fit_model
from picklescope.workloads.spec import Workload, load_workload

RAY_THRESHOLD = 0.95
# Ray's default object store on a node (ray._private.utils.resolve_object_store_memory, with its constants
# DEFAULT_OBJECT_STORE_MEMORY_PROPORTION and DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES): a share of the node's
# memory, capped; what does not fit is spilled to disk. The node's /dev/shm, which Ray also caps it by, is
# not known here.
RAY_STORE_SHARE = 0.3
RAY_STORE_MAX_BYTES = 200 * 10**9
STORE_DEFAULT_SOURCE = "ray default: 0.3 x node memory"
STORE_GIVEN_SOURCE = "--store-capacity"


def ray_store_capacity(node_memory: int | None) -> int | None:
    """The object store's capacity Ray gives a node of ``node_memory`` bytes by default (None: unknown, the
    store's level is then unbounded)."""
    if not node_memory:
        return None
    return min(int(RAY_STORE_SHARE * node_memory), RAY_STORE_MAX_BYTES)


def resolve_store_capacity(given: Any, node_memory: int | None) -> tuple[int | None, str | None]:
    """(capacity in bytes, where it came from) of the node's object store.

    A cluster started with ``object_store_memory`` (``ray.init(object_store_memory=...)``, ``ray start
    --object-store-memory``), as verl's users often start theirs, has that store and not Ray's default, so a
    capacity given (``--store-capacity``) wins; without one, Ray's default for ``node_memory``
    (:func:`ray_store_capacity`, None when the node's memory is not given either: the store is then
    unbounded). A given capacity above the node's memory is refused: Ray could not map it, and the prediction
    would never cap the store."""
    if given is None:
        cap = ray_store_capacity(node_memory)
        if cap is None:
            return None, None
        capped = node_memory is not None and RAY_STORE_SHARE * node_memory > RAY_STORE_MAX_BYTES
        return cap, STORE_DEFAULT_SOURCE + (f", at most {RAY_STORE_MAX_BYTES // 10**9} GB" if capped else "")
    cap = node_bytes(given, "--store-capacity", "give your cluster's object_store_memory, e.g. --store-capacity 100GB")
    if node_memory is not None and cap > node_memory:
        raise PicklescopeError(f"--store-capacity {fmt_bytes(cap)} is more than the node's memory "
                               f"({fmt_bytes(node_memory)})",
                               "give your cluster's object_store_memory, at most --node-memory")
    return cap, STORE_GIVEN_SOURCE


def node_bytes(given: Any, option: str, way_out: str) -> int:
    """A size of the node (its memory, its store's capacity) in bytes. A payload multiple or a ``total:``
    (a process budget's form) means nothing for the node: refused in one line naming ``way_out``."""
    size = parse_size(given, option)
    if size.bytes is None or size.total:
        form = "a payload multiple" if size.bytes is None else "total: (a process budget's form)"
        raise PicklescopeError(f"{option} {given!r} needs plain bytes, not {form}", way_out)
    return size.bytes


# -- inputs -----------------------------------------------------------------------------------------


def parse_baselines(items: Sequence[str], workers: int) -> dict[str, int]:
    """``role=GB`` items (``controller=379GB``, ``worker=40GB`` for each worker, ``worker-3=50GB``, any other
    name for a process of the node outside the replay) as bytes per process name."""
    out: dict[str, int] = {}
    for item in items:
        name, sep, size = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise PicklescopeError(f"--process-baseline {item!r} is not role=size",
                                   "use e.g. --process-baseline controller=379GB")
        value = parse_size(size, f"--process-baseline {name}")
        if value.bytes is None:
            raise PicklescopeError(f"--process-baseline {item!r} needs bytes, not a payload multiple",
                                   "use e.g. --process-baseline worker=40GB")
        if name == "worker":
            for i in range(workers):
                out[f"worker-{i}"] = out.get(f"worker-{i}", 0) + value.bytes
        else:
            out[name] = out.get(name, 0) + value.bytes
    return out


def batch_shape(wl: Workload, scale: float | None, batch_size: int | None, payload: Any) -> tuple[float, int, int]:
    """(scale, rows, payload bytes) from exactly one of ``scale``, ``batch_size`` (rows) or ``payload`` (bytes).

    A large batch is computed by arithmetic per row (it may not fit this machine, which is the point)."""
    given = [v is not None for v in (scale, batch_size, payload)]
    if sum(given) > 1:
        raise PicklescopeError("give one of --scale, --batch-size and --payload", "drop the others")
    per_row = wl.payload_bytes(1.0) / wl.rows(1.0)
    if payload is not None:
        size = parse_size(payload, "--payload")
        if size.bytes is None:
            raise PicklescopeError(f"--payload {payload!r} needs bytes", "use e.g. --payload 44GB")
        rows = max(1, round(size.bytes / per_row))
    elif batch_size is not None:
        if batch_size < 1:
            raise PicklescopeError(f"--batch-size {batch_size} must be at least 1 row", "use e.g. --batch-size 512")
        rows = batch_size
    else:
        s = 0.25 if scale is None else scale
        if not s > 0:
            raise PicklescopeError(f"--scale {s:g} must be positive", "use e.g. --scale 0.5")
        rows = max(1, round(wl.batch_size * s))
    return rows / wl.batch_size, rows, int(rows * per_row)


def fit_scales(wl: Workload, codec: str, scales: Sequence[float], workers: Sequence[int]) -> list[float]:
    """The fit's scales; for a verl codec moved to the nearest row count every worker count divides (verl's
    ``DataProto.chunk`` needs even chunks)."""
    if not codec.startswith("verl-"):
        return list(scales)
    step = 1
    for w in workers:
        step = step * w // _gcd(step, w)
    out = []
    for s in scales:
        rows = max(step, round(wl.batch_size * s / step) * step)
        out.append(rows / wl.batch_size)
    return out


def leaf_row_bytes(wl: Workload) -> list[float]:
    """Bytes per row of each tensor leaf (nested leaves by their mean row), from the spec alone."""
    rows = wl.rows(1.0)
    return [wl.leaf_bytes(t, 1.0) / rows for t in wl.tensors]


def _gcd(a: int, b: int) -> int:
    while b:
        a, b = b, a % b
    return a


# -- the prediction ---------------------------------------------------------------------------------


def models(codecs: Sequence[str], workload: str, gc: str, *, scales: Sequence[float] = fitting.FIT_SCALES,
           workers: Sequence[int] = fitting.FIT_WORKERS, steps: int = fitting.FIT_STEPS, refresh: bool = False,
           ray_address: str | None = None, data_plane: str = "dataproto",
           log: Callable[[str], None] | None = None) -> dict[str, Model]:
    """One fitted model per codec, from cached replays where they exist (the rest replayed, see :mod:`.fit`).

    The replays are gathered group by group (:func:`~.fit.replay_groups`: a group's codecs share their fit
    sizes), then each codec is fitted on its :func:`fit_set` of all of them. Under a collector that runs, on
    the DataProto plane, the same sizes are also replayed with the collector off: there nothing frees the
    controller's copies, so its rise per step is what a step keeps, which the collector's own replays blur
    where the next steps reuse what a run freed (:mod:`.heap`)."""
    wl = load_workload(workload)
    modes = fit_modes(gc, data_plane)
    reps: dict[str, list[fitting.Replay]] = {mode: [] for mode in modes}
    for mode in modes:
        for group in fitting.replay_groups(codecs, data_plane, bool(ray_address)):
            reps[mode] += fitting.replays(group, workload, mode, fit_scales(wl, group[0], scales, workers), workers,
                                          steps, refresh=refresh, ray_address=ray_address, data_plane=data_plane,
                                          log=log)
    out: dict[str, Model] = {}
    rows = leaf_row_bytes(wl)
    for codec in codecs:
        held = fit_model(fit_set(reps["off"], codec, data_plane), rows) if len(modes) > 1 else None
        out[codec] = fit_model(fit_set(reps[gc], codec, data_plane), rows, held)
        out[codec].codec = codec
    return out


def fit_modes(gc: str, data_plane: str = "dataproto") -> list[str]:
    """The collector modes a prediction under ``gc`` replays its fit sizes in (:func:`models`): ``gc``, and on
    the DataProto plane under a collector that runs, ``off`` too (what a step keeps, with nothing freeing it)."""
    return [gc] + (["off"] if gc != "off" and data_plane == "dataproto" else [])


def fit_set(reps: Sequence[fitting.Replay], codec: str, data_plane: str = "dataproto") -> list[fitting.Replay]:
    """The replays one codec's model is fitted on: its own; on the TransferQueue plane every codec's, since
    the codec never touches the tensors there (docs/node.md) and their replays differ by noise only, which
    pooling them halves."""
    if data_plane == "dataproto":
        return [r for r in reps if r.codec == codec]
    return list(reps)


def play_node(model: Model, wl: Workload, rows: int, payload: int, workers: int, steps: int,
              baselines: dict[str, int], node_memory: int | None, threshold: float, *,
              store_capacity: int | None, compute_s: float = 0.0, copy_in_hand: str | None = None) -> dict[str, Any]:
    """The model at one size: per step node and controller bytes, per process peaks, Ray's kill, the steps at
    which the controller's memory falls back and the share of what those releases free in heap-sized blocks
    (``release_heap_share``: their return is the model's least certain term, docs/predict.md). The object
    store is bounded by ``store_capacity`` as :func:`resolve_store_capacity` decided it (None: unbounded), less
    what the store holds before the batch (its baseline, if given); ``store_full_step`` is the first step it
    is at that bound. The capacity is an argument, not worked out here, so that the default is decided in one
    place. ``compute_s``: each worker's compute on its chunk (:meth:`~.model.Model.open_calls`);
    ``copy_in_hand``: :meth:`~.model.Model.play`'s outcome for the copy of a call a run comes inside."""
    obj = len(wl.non_tensor)
    room = None if store_capacity is None else store_capacity - baselines.get("store", 0)
    played = model.play(payload, rows, workers, steps, obj, room, compute_s, copy_in_hand)
    names = ["controller"] + [f"worker-{i}" for i in range(workers)]
    base_of = {n: baselines.get(n, 0) for n in names}
    shared = ["store"] if model.data_plane == "dataproto" else ["store", "producer", "storage", "tq-controller"]
    others = sum(v for n, v in baselines.items() if n not in names and n not in shared)
    fixed = sum(base_of.values()) + others + sum(baselines.get(n, 0) for n in shared)
    steps_out, killed = [], None
    limit = threshold * node_memory if node_memory else None
    peaks = {n: 0 for n in names}
    for n in shared:  # the store and, on the TransferQueue plane, its other actors (the storage units summed)
        peaks[n] = 0
    for k in range(steps):
        node_peak = fixed + played["node"][k][1]
        ctl = base_of["controller"] + played["controller"][k][1]
        store = baselines.get("store", 0) + played["store"][k][1] if "store" in played else None
        steps_out.append({"index": k + 1, "node_bytes": int(node_peak), "controller_bytes": int(ctl),
                          "node_end_bytes": int(fixed + played["node"][k][0]),
                          "store_bytes": None if store is None else int(store)})
        peaks["controller"] = max(peaks["controller"], int(ctl))
        for n in names[1:]:
            peaks[n] = max(peaks[n], int(base_of[n] + played["worker"][k][1]))
        for n in shared:
            if n in played:
                peaks[n] = max(peaks[n], int(baselines.get(n, 0) + played[n][k][1]))
        if limit is not None and killed is None and node_peak >= limit:
            killed = {"training_step": k + 1, "process": f"worker-{workers - 1}", "by": "ray",
                      "node_bytes": int(node_peak), "limit_bytes": int(limit)}
            break
    x = model.features(payload, rows, workers, obj, compute_s)
    releases = model.release_steps(x, steps)
    full_node, full_killed = None, None  # were the store at its capacity from the first step
    if store_capacity is not None and all(s["store_bytes"] is not None for s in steps_out):
        at_full = [s["node_bytes"] + max(0, store_capacity - s["store_bytes"]) for s in steps_out]
        full_node = max(at_full)
        if limit is not None:
            full_killed = next((k + 1 for k, v in enumerate(at_full) if v >= limit), None)
    full = None if room is None else next((k + 1 for k, (lvl, _) in enumerate(played.get("store", [])[:len(steps_out)])
                                           if lvl >= max(0, room)), None)
    return {"steps": steps_out, "killed": killed, "peaks": peaks, "store_full_step": full,
            "node_peak_store_full": full_node, "store_full_killed_step": full_killed,
            "node_peak": max(s["node_bytes"] for s in steps_out), "releases": releases,
            "release_heap_share": max(0.0, 1.0 - x["mshare"]) if releases else None,
            "calls_open": model.open_calls(x["c"], workers, compute_s)}


def largest_surviving(model: Model, wl: Workload, workers: int, steps: int, baselines: dict[str, int],
                      node_memory: int, threshold: float, *, store_capacity: int | None,
                      store_full: bool = False, compute_s: float = 0.0) -> int | None:
    """The largest payload (whole rows) whose node stays under the threshold for ``steps`` steps (the store
    bounded as in :func:`play_node`; with ``store_full``, the node with its store at its capacity from the
    first step); None if even one row crosses it."""
    per_row = wl.payload_bytes(1.0) / wl.rows(1.0)

    def survives(rows: int) -> bool:
        played = play_node(model, wl, rows, int(rows * per_row), workers, steps, baselines, node_memory,
                           threshold, store_capacity=store_capacity, compute_s=compute_s)
        return played["killed"] is None and not (store_full and played["store_full_killed_step"] is not None)

    if not survives(1):
        return None
    lo, hi = 1, max(2, int(node_memory / per_row) + 1)
    if survives(hi):
        return int(hi * per_row)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if survives(mid):
            lo = mid
        else:
            hi = mid
    return int(lo * per_row)


def node_peak_at(model: Model, wl: Workload, payload: int, workers: int, steps: int, baselines: dict[str, int],
                 node_memory: int, threshold: float, *, store_capacity: int | None, compute_s: float = 0.0) -> int:
    """The node's peak at ``payload`` (whole rows of the workload), as :func:`largest_surviving` plays it: printed
    beside the largest surviving payload, under the threshold, so that the figure can be checked."""
    rows = max(1, round(payload / (wl.payload_bytes(1.0) / wl.rows(1.0))))
    return play_node(model, wl, rows, payload, workers, steps, baselines, node_memory, threshold,
                     store_capacity=store_capacity, compute_s=compute_s)["node_peak"]


def predict(codecs: Sequence[str] = ("numpy-legacy", "numpy"), workload: str = "flowgrpo", *,
            scale: float | None = None, batch_size: int | None = None, payload: Any = None, workers: int = 4,
            steps: int = 4, gc: str = "default", node_memory: Any = None, store_capacity: Any = None,
            threshold: float = RAY_THRESHOLD,
            process_baselines: Sequence[str] = (), fit_scales_: Sequence[float] = fitting.FIT_SCALES,
            fit_workers: Sequence[int] = fitting.FIT_WORKERS, fit_steps: int = fitting.FIT_STEPS,
            check: bool = False, refresh: bool = False, timeout_s: float = 900.0, ray_address: str | None = None,
            data_plane: str = "dataproto", worker_compute_s: float = 0.0,
            log: Callable[[str], None] | None = None) -> list[CodecPrediction]:
    """Predict the node for each codec (see the module doc); with ``check``, replay the size and compare.

    ``store_capacity`` is the object store's size where the cluster sets ``object_store_memory`` (bytes or a
    size such as ``"100GB"``); without it the store is capped at Ray's default for ``node_memory``
    (:func:`resolve_store_capacity`).

    ``data_plane`` is the node replay's (``dataproto`` or ``transferqueue``): the fit replays that plane
    and is cached apart; a combination the node replay refuses for it is refused here by the same check.

    ``worker_compute_s`` is each worker's compute on its chunk, during which it holds it (``node``'s
    ``--worker-compute``): it sets how many workers hold theirs at once. The fits never compute; a check
    replays with it."""
    if gc not in GC_MODES:
        raise PicklescopeError(f"--gc {gc!r} is not a collector mode", f"use one of {', '.join(GC_MODES)}")
    if gc == "each-step":
        raise PicklescopeError("predict models the default collector and --gc off",
                               "use --gc default or --gc off")
    if workers < 1 or steps < 1:
        raise PicklescopeError("--workers and --steps must be at least 1", "use e.g. --workers 8 --steps 120")
    if not 0 < threshold <= 1:
        raise PicklescopeError(f"--ray-threshold {threshold:g} must be in (0, 1]", "Ray's default is 0.95")
    worker_compute_s = seconds("worker_compute_s", worker_compute_s, "--worker-compute 2",
                               "seconds each worker holds its chunk, computing")
    tq_plane.check(data_plane, codecs, engine="replica", dispatch="chunk", transport="ray-arg")
    wl = load_workload(workload)
    the_scale, rows, pay = batch_shape(wl, scale, batch_size, payload)
    if rows < workers:
        raise PicklescopeError(f"{rows} rows cannot be chunked among {workers} workers",
                               "use fewer workers or a larger batch")
    mem = None if node_memory is None else node_bytes(node_memory, "--node-memory", "use e.g. --node-memory 1507GB")
    cap, cap_source = resolve_store_capacity(store_capacity, mem)
    baselines = parse_baselines(process_baselines, workers)
    if cap is not None and baselines.get("store", 0) > cap:
        raise PicklescopeError(f"--process-baseline store={fmt_bytes(baselines['store'])} is more than the object "
                               f"store's capacity ({fmt_bytes(cap)}, {cap_source})",
                               "give what the store holds before the batch, at most its capacity (--store-capacity)")
    if check:
        _refuse_a_check_that_cannot_fit(pay, steps)
    fitted = models(codecs, workload, gc, scales=fit_scales_, workers=fit_workers, steps=fit_steps,
                    refresh=refresh, ray_address=ray_address, data_plane=data_plane, log=log)
    out = []
    for codec in codecs:
        model = fitted[codec]
        played = play_node(model, wl, rows, pay, workers, steps, baselines, mem, threshold, store_capacity=cap,
                           compute_s=worker_compute_s)
        largest = largest_surviving(model, wl, workers, steps, baselines, mem, threshold,
                                    store_capacity=cap, compute_s=worker_compute_s) if mem else None
        largest_peak = None if not largest or largest >= mem else node_peak_at(
            model, wl, largest, workers, steps, baselines, mem, threshold, store_capacity=cap,
            compute_s=worker_compute_s)
        largest_full = largest_surviving(model, wl, workers, steps, baselines, mem, threshold, store_capacity=cap,
                                         store_full=True, compute_s=worker_compute_s) if mem and cap is not None \
            else None
        all_open = all_open_kill = None
        if played["calls_open"] < workers:  # what every worker holding its chunk at once would add
            every = play_node(model, wl, rows, pay, workers, steps, baselines, mem, threshold, store_capacity=cap,
                              compute_s=math.inf)
            if every["node_peak"] > played["node_peak"]:
                all_open = every["node_peak"]
                all_open_kill = every["killed"]["training_step"] if every["killed"] else None
        peaks = played["peaks"]
        given = play_other_way(played, "given back", model, wl, rows, pay, workers, steps, baselines, mem,
                               threshold, cap, worker_compute_s)
        kept = play_other_way(played, "kept", model, wl, rows, pay, workers, steps, baselines, mem, threshold, cap,
                              worker_compute_s)
        out.append(CodecPrediction(codec, gc, pay, rows, workers, steps, mem, threshold, baselines,
                                   played["node_peak"], peaks, played["steps"], played["killed"], largest,
                                   played["releases"], model.terms_table(), model.fitted_on, data_plane=data_plane,
                                   store_capacity_bytes=cap, store_capacity_source=cap_source,
                                   store_full_step=played["store_full_step"],
                                   node_peak_store_full_bytes=played["node_peak_store_full"],
                                   store_full_killed_step=played["store_full_killed_step"],
                                   largest_surviving_payload_store_full_bytes=largest_full,
                                   largest_surviving_node_peak_bytes=largest_peak,
                                   worker_compute_s=worker_compute_s, calls_open=played["calls_open"],
                                   node_peak_all_open_bytes=all_open, all_open_killed_step=all_open_kill,
                                   release_heap_share=played["release_heap_share"],
                                   node_peak_copy_given_back_bytes=_peaks(given)[0],
                                   controller_peak_copy_given_back_bytes=_peaks(given)[1],
                                   copy_given_back_killed_step=_kill_step(given),
                                   node_peak_copy_kept_bytes=_peaks(kept)[0],
                                   controller_peak_copy_kept_bytes=_peaks(kept)[1],
                                   copy_kept_killed_step=_kill_step(kept)))
    if check:
        _check(out, fitted, workload, the_scale, gc, wl, timeout_s, ray_address, log, data_plane,
               worker_compute_s)
    return out


def _peaks(played: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """A play's node and controller peaks (None, None where there is no play: a way that plays as the prediction)."""
    return (None, None) if played is None else (played["node_peak"], played["peaks"]["controller"])


def _kill_step(played: dict[str, Any] | None) -> int | None:
    return None if played is None or not played["killed"] else played["killed"]["training_step"]


def play_other_way(played: dict[str, Any], copy_in_hand: str, model: Model, wl: Workload, rows: int, payload: int,
                   workers: int, steps: int, baselines: dict[str, int], node_memory: int | None,
                   threshold: float, store_capacity: int | None, compute_s: float) -> dict[str, Any] | None:
    """:func:`play_node` with every copy of a call a run comes inside ``copy_in_hand`` (``"kept"`` or ``"given
    back"``; the ways such a run can go, :meth:`~.model.Model.play`); None where it plays the same as ``played``
    (the prediction, which plays each run as the fits found)."""
    if not played["releases"] or model.data_plane != "dataproto":
        return None
    other = play_node(model, wl, rows, payload, workers, steps, baselines, node_memory, threshold,
                      store_capacity=store_capacity, compute_s=compute_s, copy_in_hand=copy_in_hand)
    same = other["node_peak"] == played["node_peak"] and other["peaks"]["controller"] == played["peaks"]["controller"]
    return None if same else other


def _check(preds: list[CodecPrediction], fitted: dict[str, Model], workload: str, scale: float, gc: str,
           wl: Workload, timeout_s: float, ray_address: str | None, log: Callable[[str], None] | None,
           data_plane: str = "dataproto", worker_compute_s: float = 0.0) -> None:
    """Replay the predicted size for real, in the groups the fit replays in (:func:`~.fit.replay_groups`),
    and set each prediction's check.

    The check compares like with like: the replay runs with no process baselines and as the fit's did
    (:func:`~.fit.replay_series`: steps that end idle, on a cluster of its own whose object store holds
    every step's objects, or on the joined one), so its prediction is the model played at the
    same size without the baselines and without the store's capacity. The user's prediction can differ from
    it only where ``--process-baseline`` or the store's capacity (``--store-capacity`` or Ray's default for
    ``--node-memory``) bound it."""
    by_codec = {p.codec: p for p in preds}
    first = preds[0]
    workers, steps = first.workers, first.steps
    for group in fitting.replay_groups(list(by_codec), data_plane, bool(ray_address)):
        if log:
            log(f"checking: replaying {','.join(group)} at x{scale:g}, {workers} workers, {steps} steps, gc {gc}")
        t = time.monotonic()
        results = fitting.replay_series(group, workload, scale, workers, steps, gc=gc, timeout_s=timeout_s,
                                        ray_address=ray_address, data_plane=data_plane,
                                        worker_compute_s=worker_compute_s)
        if log:
            log(f"  replayed in {time.monotonic() - t:.0f} s")
        for codec, r in zip(group, results):
            p = by_codec[codec]
            bare = play_node(fitted[codec], wl, p.rows, p.payload_bytes, workers, steps, {}, None, p.threshold,
                             store_capacity=None, compute_s=worker_compute_s)
            rep = fitting.observe(r, wl)
            given, kept = (play_other_way(bare, way, fitted[codec], wl, p.rows, p.payload_bytes, workers, steps, {},
                                          None, p.threshold, None, worker_compute_s) for way in ("given back", "kept"))
            p.check = Check(r.node_peak_bytes, bare["node_peak"],
                            r.own_peak_bytes("driver") if "driver" in r.processes else None,
                            bare["peaks"]["controller"],
                            released_at(rep) if rep.per_step else [], bare["releases"], r.outcome,
                            *_peaks(given), *_peaks(kept))


def _refuse_a_check_that_cannot_fit(payload: int, steps: int) -> None:
    need = payload * (steps + 3)  # the legacy driver holds about a payload per step, the workers one more
    if need > _available():
        raise PicklescopeError(f"--check replays the predicted batch ({fmt_bytes(payload)}) for real, and about "
                               f"{fmt_bytes(need)} of it would not fit this machine's free memory",
                               "check at a smaller --scale (the prediction itself needs no replay)")


def _available() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 62
