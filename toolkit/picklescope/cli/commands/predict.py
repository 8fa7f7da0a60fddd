"""``picklescope predict``: a node too large to run here, from a cost model fitted on small replays."""

from __future__ import annotations

import argparse
import shlex
import sys
from typing import Any

from picklescope.cli.commands.common import add_worker_compute, print_json, seconds
from picklescope.core.paths import OutFolder
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import tq_plane
from picklescope.investigate.predict import fit
from picklescope.investigate.predict.prediction import predict
from picklescope.views.report import OWN_FILES, prepare_out_dir, write_predictions

ORDER = 26


def _floats(text: str) -> list[float]:
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(v > 0 for v in values):
        raise PicklescopeError(f"{text!r} is not a list of positive numbers", "use e.g. --fit-scales 0.05,0.1,0.2")
    return values


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or not all(v >= 1 for v in values):
        raise PicklescopeError(f"{text!r} is not a list of worker counts", "use e.g. --fit-workers 2,4")
    return values


def register(sub: Any) -> None:
    p = sub.add_parser("predict", help="predict a node you cannot run here: peaks per step, Ray's kill, the largest "
                                       "batch that survives")
    p.add_argument("--codec", default="numpy-legacy,numpy",
                   help="codecs joined by commas, including verl-<version>:<mode>; default numpy-legacy,numpy")
    p.add_argument("--workload", default="flowgrpo", help="preset name or YAML path; default flowgrpo")
    p.add_argument("--scale", type=float, default=None, help="factor on the batch dimension (as for node)")
    p.add_argument("--batch-size", type=int, default=None, help="the batch's rows instead of --scale")
    p.add_argument("--payload", default=None, help="the batch's tensor payload instead of --scale, e.g. 44GB")
    p.add_argument("--workers", type=int, default=4, help="worker actors; default 4")
    p.add_argument("--steps", type=int, default=4, help="training steps; default 4")
    p.add_argument("--gc", default="default", help="default (Python's collector) or off")
    add_worker_compute(p)
    p.add_argument("--data-plane", default="dataproto",
                   help="how the batch reaches the workers: dataproto (through the controller, verl's default) or "
                        "transferqueue (through TransferQueue's storage units); both joined by a comma side by side")
    p.add_argument("--node-memory", default=None, help="the node's memory, e.g. 1507GB (for Ray's threshold)")
    p.add_argument("--store-capacity", default=None,
                   help="the object store's size where your cluster sets it (ray.init(object_store_memory=...), ray "
                        "start --object-store-memory), e.g. 100GB; default Ray's: 0.3 of --node-memory, at most "
                        "200GB")
    p.add_argument("--ray-threshold", type=float, default=0.95,
                   help="RAY_memory_usage_threshold: Ray's monitor kills above this share; default 0.95")
    p.add_argument("--process-baseline", action="append", default=[], metavar="ROLE=SIZE",
                   help="what a process holds before the batch (controller=379GB, worker=40GB for each worker, "
                        "store=..., any other name for another process of the node); repeatable")
    p.add_argument("--fit-scales", type=_floats, default=None, help="scales of the fit's replays; default 0.05,0.1,0.2")
    p.add_argument("--fit-workers", type=_ints, default=None, help="worker counts of the fit's replays; default 2,4")
    p.add_argument("--fit-steps", type=int, default=None, help="training steps of each fit replay; default 6")
    p.add_argument("--refit", action="store_true", help="replay the fit's sizes again instead of using the cache")
    p.add_argument("--check", action="store_true",
                   help="also replay the predicted size for real and print predicted vs measured with the error")
    p.add_argument("--ray-address", default=None,
                   help="join this Ray cluster for every replay instead of starting one per size (its object store "
                        "must hold every step's chunks with --gc off)")
    p.add_argument("--timeout", type=seconds, default=900.0, help="wall-clock limit of each replay; default 900")
    p.add_argument("--json", action="store_true", help="print the predictions as one JSON list")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="also write report.html (the answer, the figure, every step, the model's terms) and "
                        "results.json (the --json list) into this folder, to share or attach to a ticket")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds other files")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    codecs = [c.strip() for c in args.codec.split(",")]
    if not all(codecs):
        raise PicklescopeError(f"--codec {args.codec!r} has an empty name", "use e.g. --codec numpy-legacy,numpy")
    if args.fit_steps is not None and not 2 <= args.fit_steps <= 16:
        raise PicklescopeError(f"--fit-steps {args.fit_steps} must be from 2 to 16", "use e.g. --fit-steps 6")

    planes = [d.strip() for d in args.data_plane.split(",")]
    if len(set(planes)) != len(planes):
        raise PicklescopeError(f"--data-plane {args.data_plane!r} names a plane twice",
                               "use e.g. --data-plane dataproto,transferqueue")
    for plane in planes:  # every plane refused before the first one's fit starts (the node replay's own check)
        tq_plane.check(plane, codecs, engine="replica", dispatch="chunk", transport="ray-arg")

    if args.out is None:
        return _predict(args, codecs, planes)
    # locked while this run writes it, and removed again if this run made it and stops before writing
    with OutFolder(args.out, own=tuple(OWN_FILES)) as folder:
        prepare_out_dir(args.out, args.force)  # a folder holding other files is refused before any fit
        code = _predict(args, codecs, planes)
        folder.keep()
    return code


def _predict(args: argparse.Namespace, codecs: list[str], planes: list[str]) -> int:
    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    preds = []
    for plane in planes:
        preds += predict(codecs, args.workload, scale=args.scale, batch_size=args.batch_size, payload=args.payload,
                         workers=args.workers, steps=args.steps, gc=args.gc, node_memory=args.node_memory,
                         store_capacity=args.store_capacity, threshold=args.ray_threshold,
                         process_baselines=args.process_baseline,
                         fit_scales_=args.fit_scales or fit.FIT_SCALES,
                         fit_workers=args.fit_workers or fit.FIT_WORKERS, fit_steps=args.fit_steps or fit.FIT_STEPS,
                         check=args.check, refresh=args.refit, timeout_s=args.timeout, ray_address=args.ray_address,
                         data_plane=plane, worker_compute_s=args.worker_compute, log=log)
    if args.out is not None:
        command = shlex.join(["picklescope", *sys.argv[1:]]) if sys.argv[1:2] == ["predict"] else \
            "picklescope predict (from Python)"
        path = write_predictions(preds, args.workload, command, args.out)
        print(f"report: {path}", file=sys.stderr)
    if args.json:
        print_json([p.to_json_dict() for p in preds])
        return 0
    # the answer first, where the terminal shows it; the terms that reached it after (about 20 lines a codec)
    print("\n".join(p.summary() for p in preds))
    print()
    first = preds[0]
    print(f"How: the model's terms (gc {first.gc}, fitted on {', '.join(first.fitted_on)}):")
    for p in preds:
        print(f"  {p.codec}" + ("" if p.data_plane == "dataproto" else f", data plane {p.data_plane}") + ":")
        for role, term, value in p.terms:
            print(f"    {role:<13} {term:<26} {value}")
    return 0
