"""``picklescope node``: a driver and N worker actors over K training steps, every process on one clock."""

from __future__ import annotations

import argparse
import json
from typing import Any

from picklescope.cli.commands.common import add_worker_compute, idle_seconds, print_json, seconds
from picklescope.errors import PicklescopeError
from picklescope.investigate.node import node_series, tq_plane

ORDER = 25
STEP_GAP = idle_seconds("--step-gap", "2", "idle seconds at the end of each training step")


def _resources(text: str) -> dict[str, float]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    if not isinstance(value, dict) or not all(isinstance(v, (int, float)) and v >= 0 for v in value.values()):
        raise PicklescopeError(f"--worker-resources {text!r} is not a JSON mapping of resource names to amounts",
                               "use e.g. --worker-resources '{\"node2\": 0.01}'")
    return {str(k): float(v) for k, v in value.items()}


def register(sub: Any) -> None:
    p = sub.add_parser("node", help="replay a verl node: a driver and N worker actors over K training steps")
    p.add_argument("--codec", default="numpy",
                   help="codec, including verl-<version>:<mode>; default numpy. Several built-in ones joined by commas "
                        "(numpy-legacy,numpy) replay one after the other on the same driver and workers")
    p.add_argument("--workload", default="flowgrpo", help="preset name or YAML path; default flowgrpo")
    p.add_argument("--scale", type=float, default=0.25, help="factor on the batch dimension; default 0.25")
    p.add_argument("--workers", type=int, default=4, help="worker actors; default 4")
    p.add_argument("--steps", type=int, default=4, help="training steps; default 4")
    p.add_argument("--returns", type=float, default=None,
                   help="each worker returns this multiple of its chunk's payload (default: a small per-token tensor)")
    p.add_argument("--dispatch", default="chunk", help="chunk (verl's DP_COMPUTE_PROTO) or broadcast")
    p.add_argument("--gc", default="default", help="default (Python's collector), off, or each-step")
    p.add_argument("--transport", default="ray-arg", help="ray-arg (the chunk as the call's argument) or ray (ray.put)")
    p.add_argument("--node-budget", default=None,
                   help="cap on the node's total above its baseline (700MiB, or a payload multiple: 1.5x)")
    p.add_argument("--engine", default="replica",
                   help="replica (default), or verl: real verl's RayWorkerGroup, DP_COMPUTE_PROTO (needs a verl codec)")
    p.add_argument("--enforcement", default="watchdog",
                   help="watchdog (default: kill the highest oom_score at the budget), cgroup (one memory cgroup "
                        "for the cluster, the kernel's OOM killer picks) or ray (Ray's memory monitor picks and kills "
                        "at the budget, with its own message)")
    p.add_argument("--controller", default="process",
                   help="where the training loop runs: process (default: the driver that starts Ray) or actor "
                        "(a Ray actor, as verl's TaskRunner, so Ray's memory monitor can choose it)")
    p.add_argument("--ray-address", default=None, help="join this Ray cluster instead of starting a local one")
    p.add_argument("--worker-resources", type=_resources, default=None,
                   help="Ray resources each worker needs, as JSON (pins workers to nodes that have them)")
    p.add_argument("--spread", action="store_true", help="spread the workers over the cluster's nodes")
    p.add_argument("--data-plane", default="dataproto",
                   help="dataproto (default: the batch through the driver, verl's single controller) or transferqueue "
                        "(through TransferQueue's storage units, the driver passing metadata only); both joined by a "
                        "comma run one after the other and are compared")
    p.add_argument("--step-gap", type=STEP_GAP, default=0.0,
                   help="idle seconds at the end of each training step, a stand-in for the rest of it (rollout, "
                        "update): Ray frees a step's objects before the next one's (docs/node.md); default 0, "
                        "back to back")
    add_worker_compute(p)
    p.add_argument("--timeout", type=seconds, default=900.0, help="wall-clock limit in seconds; default 900")
    p.add_argument("--json", action="store_true",
                   help="print the result as one JSON object (a list of them for several codecs)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    codecs = [c.strip() for c in args.codec.split(",")]
    if not all(codecs):
        raise PicklescopeError(f"--codec {args.codec!r} has an empty name", "use e.g. --codec numpy-legacy,numpy")
    planes = [p.strip() for p in args.data_plane.split(",")]
    for plane in planes:  # every plane checked (TransferQueue's install included) before the first one starts
        tq_plane.check(plane, codecs, engine=args.engine, dispatch=args.dispatch, transport=args.transport)
    results = []
    for plane in planes:
        results += node_series(codecs, args.workload, args.scale, args.workers, args.steps, returns=args.returns,
                               dispatch=args.dispatch, gc=args.gc, transport=args.transport,
                               node_budget=args.node_budget, ray_address=args.ray_address,
                               worker_resources=args.worker_resources, spread=args.spread, engine=args.engine,
                               enforcement=args.enforcement, timeout_s=args.timeout, data_plane=plane,
                               controller=args.controller, step_gap_s=args.step_gap,
                               worker_compute_s=args.worker_compute)
    if args.json:
        docs = [r.to_json_dict() for r in results]
        print_json(docs[0] if len(docs) == 1 else docs)
    else:
        print("\n\n".join(r.summary() for r in results))
        if len(planes) > 1:
            print("\ndata planes side by side (own peaks above baseline, x payload):")
            print("\n".join(tq_plane.plane_lines(results)))
            by_plane = {r.data_plane: r for r in results}
            if {"dataproto", "transferqueue"} <= set(by_plane) and any(r.budget_bytes for r in results):
                print("Would the TransferQueue plane have saved this node? "
                      + tq_plane.plane_verdict(by_plane["dataproto"], by_plane["transferqueue"]))
    return 0 if all(r.outcome in ("ok", "oom-killed") for r in results) else 1
