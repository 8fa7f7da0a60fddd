"""How steady is the driver's peak difference between two codecs in standalone node replays?

A standalone ``picklescope node`` replay counts, in its driver's exact peak (``VmHWM``), the object
store's pages the driver maps while it writes the chunks, and how many it maps depends on where the
store puts them. This benchmark replays two codecs (by default real verl 0.9.0 and 0.9.1 in numpy
mode) alternately for ``--rounds`` rounds on one local cluster, joined like a real one, and gives per
round both differences: of the exact peaks, and of the driver's own peaks (the highest sample of its
private memory, which leaves the store's pages out). Ratios to the payload only.

    python benchmarks/node_pairs.py [--rounds 3] [--codecs verl-0.9.0:numpy,verl-0.9.1:numpy] [--gc default]

Writes ``benchmarks/results/node_pairs.json``. A ``verl-*`` codec needs ``picklescope verl install``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from picklescope.errors import PicklescopeError
from picklescope.investigate.node import node
from picklescope.ray.local_cluster import LocalCluster

RESULTS = Path(__file__).resolve().parent / "results"
MiB = 1024**2


def _start_cluster() -> LocalCluster:
    """A local cluster (two tries on a loaded machine, ray/startup.py), or the one line why not."""
    try:
        return LocalCluster(object_store_bytes=1024 * MiB, num_cpus=1).start()
    except PicklescopeError as exc:
        sys.exit(f"node_pairs: {exc}")


def one(codec: str, args: argparse.Namespace, address: str) -> dict:
    t0 = time.monotonic()
    r = node(codec, workload=args.workload, scale=args.scale, workers=args.workers, steps=args.steps, gc=args.gc,
             ray_address=address)
    payload = r.payload_bytes
    own = r.own_peak_bytes()
    return {"codec": codec, "outcome": r.outcome, "error": r.error,
            "exact_peak_x": None if r.driver.peak_bytes is None else round(r.driver.peak_bytes / payload, 3),
            "own_peak_x": None if own is None else round(own / payload, 3),
            "step_ends_x": [None if s.driver_bytes is None else round(s.driver_bytes / payload, 3)
                            for s in r.training_steps],
            "wall_s": round(time.monotonic() - t0, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--codecs", default="verl-0.9.0:numpy,verl-0.9.1:numpy", help="two codecs, old first")
    ap.add_argument("--workload", default="flowgrpo")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--gc", default="default")
    ap.add_argument("--out", default=str(RESULTS / "node_pairs.json"))
    args = ap.parse_args()
    pair = args.codecs.split(",")
    if len(pair) != 2:
        sys.exit(f"node_pairs: --codecs takes two codecs separated by a comma, not {args.codecs!r}")
    load_before = os.getloadavg()
    cluster = _start_cluster()
    rounds = []
    try:
        for k in range(args.rounds):
            old, new = (one(c, args, cluster.address) for c in pair)
            row = {"round": k + 1, "old": old, "new": new}
            if old["outcome"] == new["outcome"] == "ok":
                row["exact_difference_x"] = round(old["exact_peak_x"] - new["exact_peak_x"], 3)
                row["own_difference_x"] = round(old["own_peak_x"] - new["own_peak_x"], 3)
            rounds.append(row)
            print(f"round {k + 1}: exact peak {old['exact_peak_x']}x vs {new['exact_peak_x']}x "
                  f"(difference {row.get('exact_difference_x')}x), own peak {old['own_peak_x']}x vs "
                  f"{new['own_peak_x']}x (difference {row.get('own_difference_x')}x)", flush=True)
    finally:
        stopped = cluster.stop()
    doc = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                       "load_before": load_before, "load_after": os.getloadavg()},
           "config": {k: v for k, v in vars(args).items() if k != "out"}, "rounds": rounds,
           "cluster_left": stopped.get("remaining")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
