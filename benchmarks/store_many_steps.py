"""How far does the object store's level rise over many training steps, with nothing held between them?

``picklescope predict`` fits the store on replays of six steps, which start after warm-up steps that
already touched some of its pages. This benchmark replays one codec (by default the fixed ``numpy``,
which holds nothing from step to step) for many steps, each replay on a local cluster of its own whose
store holds ``--store-payloads`` payloads (``picklescope node`` sizes its own cluster's store by the
collector mode: about two payloads with the collector on, too small to see it rise). It prints the
store's level at every step's end above its baseline (the pages of Ray's plasma file, docs/node.md) as
a multiple of the payload, and its mean rise per step. Ratios to the payload only.

    python benchmarks/store_many_steps.py [--codec numpy] [--scale 0.2] [--workers 4] [--steps 40] [--gc off]
        [--store-payloads 20] [--step-gap 2]

``--step-gap`` ends each training step with that many idle seconds (``node(step_gap_s=...)``), a stand-in
for the step's compute: without it the steps run back to back, and with Ray's default freeing (in batches,
at most every 1000 ms) Ray has not yet freed a step's objects when the next step allocates its own. The
cluster this starts (``LocalCluster``) frees them at once unless ``RAY_free_objects_period_milliseconds`` is
set in the environment: set it to 1000 to see Ray's default.

Writes ``benchmarks/results/store_many_steps.json`` (``--out`` to change).
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
from picklescope.investigate.node import NodeResult, node
from picklescope.ray.local_cluster import LocalCluster
from picklescope.workloads.spec import load_workload

RESULTS = Path(__file__).resolve().parent / "results"


def store_levels(r: NodeResult) -> list[float]:
    """The store's level at each training step's end, above its baseline, as a multiple of the payload: the
    session's own reading at the step's end (``TrainingStep.per_process_bytes["store"]``), which the fit
    reads too."""
    return [round(s.per_process_bytes.get("store", 0) / r.payload_bytes, 3) for s in r.training_steps]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--codec", default="numpy")
    ap.add_argument("--workload", default="flowgrpo")
    ap.add_argument("--scale", type=float, default=0.2)
    ap.add_argument("--workers", default="4", help="worker counts, comma-separated: one replay each")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--gc", default="off")
    ap.add_argument("--store-payloads", type=float, default=20.0, help="the store's capacity, in payloads")
    ap.add_argument("--step-gap", type=float, default=0.0, help="idle seconds at the end of each training step")
    ap.add_argument("--out", default=str(RESULTS / "store_many_steps.json"))
    args = ap.parse_args()
    rows, t0 = [], time.monotonic()
    capacity = int(args.store_payloads * load_workload(args.workload).payload_bytes(args.scale))
    for w in [int(x) for x in args.workers.split(",")]:
        try:
            cluster = LocalCluster(object_store_bytes=capacity, num_cpus=1).start()
        except PicklescopeError as exc:
            sys.exit(f"store_many_steps: {exc}")
        try:
            r = node(args.codec, args.workload, args.scale, w, args.steps, gc=args.gc, timeout_s=1800,
                     ray_address=cluster.address, step_gap_s=args.step_gap)
        finally:
            cluster.stop()
        if r.outcome != "ok":
            print(f"store_many_steps: the replay with {w} workers ended {r.outcome}: {r.error}", file=sys.stderr)
            return 1
        levels = store_levels(r)
        rate = (levels[-1] - levels[0]) / (len(levels) - 1) if len(levels) > 1 else 0.0
        row = {"codec": args.codec, "workload": args.workload, "scale": args.scale, "workers": w,
               "steps": args.steps, "gc": args.gc, "payload_bytes": r.payload_bytes, "store_levels_x": levels,
               "mean_rise_per_step_x": round(rate, 3), "chunk_x": round(1 / w, 3),
               "store_capacity_x": round(capacity / r.payload_bytes, 2), "step_gap_s": args.step_gap}
        rows.append(row)
        print(f"{args.codec}, {w} workers, {args.steps} steps: store at each step's end (x payload) "
              f"{' '.join(f'{v:.2f}' for v in levels)}; mean rise {rate:.3f}x per step ({rate * w:.2f} chunks)")
    doc = {"machine": {"cores": os.cpu_count(), "platform": platform.platform()},
           "load_average": list(os.getloadavg()), "wall_s": round(time.monotonic() - t0, 1), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
