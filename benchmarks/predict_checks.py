"""How close is ``picklescope predict`` to a real replay at a size its fit never saw?

For each collector mode, fits the codecs on node replays at the fit sizes (``--fit-scales``, 2 and 4
workers, cached like ``predict``'s own fits) and replays the held-out size (``--scale``, ``--workers``,
``--steps``, cached the same way), each codec alone on a local cluster of its own whose object store
never fills and with steps that end idle, as ``predict`` replays (a fresh store's pages show what a
step's objects touch, where a joined cluster's, already touched, show nothing; docs/predict.md). Then
it compares the prediction for the held-out size with that replay, as ``predict --check`` does: the
node's peak (highest sample above its baseline), the controller's own peak (its private memory, the
store apart), and the steps at which the controller's memory falls back.

    python benchmarks/predict_checks.py [--codecs numpy-legacy,numpy] [--gc off,default] [--workload flowgrpo]
        [--data-plane dataproto|transferqueue] [--worker-compute S]

On the TransferQueue plane (``--data-plane transferqueue``, the replay of verl's TransferQueue trainer)
every codec's model is fitted on all codecs' replays (as ``predict`` fits it there: the codec never
touches the tensors), and each row also compares the storage units' peak (their sum, above their
baselines).

A replay that does not end ``ok`` (most often a cluster that did not start on a loaded machine) is tried
again, up to ``--attempts`` times; every replay that did end ``ok`` is in the cache by then.

Writes ``benchmarks/results/predict_checks.json`` (``--out`` to change). A ``verl-*`` codec needs
``picklescope verl install``; its fit scales move to row counts every worker count divides.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from picklescope.errors import PicklescopeError
from picklescope.investigate.node import tq_plane
from picklescope.investigate.predict import fit as fitting
from picklescope.investigate.predict.heap import released_at
from picklescope.investigate.predict.model import Model
from picklescope.investigate.predict.prediction import fit_scales, models, play_node, play_other_way
from picklescope.workloads.spec import load_workload

RESULTS = Path(__file__).resolve().parent / "results"


def fitted_and_held_out(codecs: Sequence[str], workload: str, gc: str, scales: Sequence[float],
                        workers: Sequence[int], scale: float, held_workers: int, steps: int, *, plane: str,
                        worker_compute_s: float = 0.0,
                        log: Callable[[str], None] = print) -> tuple[dict[str, Model], dict[str, fitting.Replay]]:
    """Each codec's model, fitted as ``predict`` fits it (:func:`~picklescope.investigate.predict.prediction.models`:
    its replays gathered in :func:`~picklescope.investigate.predict.fit.replay_groups` and the codec fitted on
    its fit set), and each codec's held-out replay, replayed in the same groups: the one rule, so that the
    check here replays as the fit and ``predict --check`` do."""
    fitted = models(codecs, workload, gc, scales=scales, workers=workers, steps=fitting.FIT_STEPS,
                    data_plane=plane, log=log)
    held: dict[str, fitting.Replay] = {}
    for group in fitting.replay_groups(codecs, plane):
        for rep in fitting.replays(group, workload, gc, (scale,), (held_workers,), steps,
                                   data_plane=plane, worker_compute_s=worker_compute_s, log=log):
            held[rep.codec] = rep
    return fitted, held


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--codecs", default="numpy-legacy,numpy")
    ap.add_argument("--gc", default="off,default")
    ap.add_argument("--workload", default="flowgrpo")
    ap.add_argument("--fit-scales", default="0.05,0.1,0.2")
    ap.add_argument("--fit-workers", default="2,4")
    ap.add_argument("--scale", type=float, default=0.5)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--data-plane", default="dataproto", choices=tq_plane.DATA_PLANES)
    ap.add_argument("--worker-compute", type=float, default=0.0,
                    help="seconds each worker of the held-out replay holds its chunk, computing (the fits never do)")
    ap.add_argument("--attempts", type=int, default=5, help="tries of a replay that did not end ok")
    ap.add_argument("--out", default=str(RESULTS / "predict_checks.json"))
    args = ap.parse_args()
    codecs = args.codecs.split(",")
    scales = [float(s) for s in args.fit_scales.split(",")]
    workers = [int(w) for w in args.fit_workers.split(",")]
    wl = load_workload(args.workload)
    plane = args.data_plane
    tq_plane.check(plane, codecs, engine="replica", dispatch="chunk", transport="ray-arg")
    rows_out = []
    t0 = time.monotonic()
    for gc in args.gc.split(","):
        for attempt in range(1, args.attempts + 1):
            try:
                fitted, held = fitted_and_held_out(codecs, args.workload, gc, scales, workers, args.scale,
                                                   args.workers, args.steps, plane=plane,
                                                   worker_compute_s=args.worker_compute)
                break
            except PicklescopeError as exc:  # the replays that ended ok are cached: the next try goes on
                print(f"predict_checks: try {attempt} of {args.attempts}: {exc}", file=sys.stderr, flush=True)
        else:
            sys.exit(f"predict_checks: the replays did not end ok in {args.attempts} tries")
        for codec in codecs:
            model, real = fitted[codec], held[codec]
            fit_at = fit_scales(wl, codec, scales, workers)
            played = play_node(model, wl, real.rows, real.payload_bytes, args.workers, args.steps, {}, None,
                               0.95, store_capacity=None, compute_s=args.worker_compute)
            pred_node, pred_ctl = played["node_peak"], played["peaks"]["controller"]
            # the other outcomes: each copy of a call a run comes inside given back as its call returns, or kept
            # (docs/predict.md, "What a run inside a call's copy leaves"); the prediction plays each as the fits found
            ways = {way: play_other_way(played, way, model, wl, real.rows, real.payload_bytes, args.workers,
                                        args.steps, {}, None, 0.95, None, args.worker_compute) or played
                    for way in ("given back", "kept")}
            low_node, low_ctl = ways["given back"]["node_peak"], ways["given back"]["peaks"]["controller"]
            kept_node, kept_ctl = ways["kept"]["node_peak"], ways["kept"]["peaks"]["controller"]
            row = {"codec": codec, "gc": gc, "data_plane": plane, "workload": wl.name, "fit_scales": fit_at,
                   "fit_workers": workers,
                   "scale": args.scale, "workers": args.workers, "steps": args.steps,
                   "worker_compute_s": args.worker_compute, "calls_open": played["calls_open"],
                   "payload_bytes": real.payload_bytes,
                   "node_peak": {"predicted": pred_node, "measured": real.node_peak_bytes,
                                 "predicted_copy_given_back": low_node, "predicted_copy_kept": kept_node},
                   "controller_peak": {"predicted": pred_ctl, "measured": real.controller_own_peak_bytes,
                                       "predicted_copy_given_back": low_ctl, "predicted_copy_kept": kept_ctl},
                   "release_steps": {"predicted": played["releases"], "measured": released_at(real)},
                   "terms": model.terms_table()}
            if plane != "dataproto":
                row["storage_peak"] = {"predicted": played["peaks"]["storage"],
                                       "measured": max(s.peak.get("storage", 0) for s in real.per_step)}
            for key in [k for k in ("node_peak", "controller_peak", "storage_peak") if k in row]:
                m = row[key]["measured"]
                row[key]["error"] = None if not m else round((row[key]["predicted"] - m) / m, 4)
            rows_out.append(row)
            p = real.payload_bytes
            ctl_err = _pct(row["controller_peak"]["error"])
            print(f"{codec:>18} gc {gc:<7} node {pred_node / p:.2f}x vs {real.node_peak_bytes / p:.2f}x "
                  f"({_pct(row['node_peak']['error'])}); controller {pred_ctl / p:.2f}x vs "
                  f"{(real.controller_own_peak_bytes or 0) / p:.2f}x ({ctl_err})"
                  + (f", {low_ctl / p:.2f}x with each copy in hand given back" if low_ctl != pred_ctl else "")
                  + (f", {kept_ctl / p:.2f}x with each copy in hand kept" if kept_ctl != pred_ctl else "")
                  + f"; falls back at {played['releases']} vs {released_at(real)}"
                  + (f"; storage {row['storage_peak']['predicted'] / p:.2f}x vs "
                     f"{row['storage_peak']['measured'] / p:.2f}x ({_pct(row['storage_peak']['error'])})"
                     if "storage_peak" in row else ""), flush=True)
    doc = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "load_average": os.getloadavg(), "wall_s": round(time.monotonic() - t0, 1), "rows": rows_out,
           "clusters": "each replay on a cluster of its own, which the replay stops"}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


def _pct(e: float | None) -> str:
    return "n/a" if e is None else f"{e:+.1%}"


if __name__ == "__main__":
    main()
