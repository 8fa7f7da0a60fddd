"""``picklescope reproduce``: the standard investigation on the default workload."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .. import table
from ..reproduce import matrix
from ..units import fmt_bytes
from ..workloads import DEFAULT_WORKLOAD, load_workload
from .common import run_kwargs

ORDER = 1


def register(sub: Any) -> None:
    p = sub.add_parser("reproduce", help="run every codec x transport on a workload and compare")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD)
    p.add_argument("--scale", type=float, default=None, help="default: 0.25, less on a small machine")
    p.add_argument("--out", default=None, help="folder for results.json")
    p.add_argument("--timeout", type=float, default=None)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    spec = load_workload(args.workload)
    bar = tqdm(total=6, desc="runs", unit="run", file=sys.stderr, leave=False)

    def progress(label: str) -> None:
        bar.set_postfix_str(label)
        if bar.n < bar.total:
            bar.update(0)

    def tick(ev: dict[str, Any]) -> None:
        if ev.get("type") == "done" and ev.get("side") == "receiver":
            bar.update(1)

    inv = matrix(args.workload, args.scale, progress=progress, on_event=tick, **run_kwargs(args))
    bar.close()
    payload = inv.results[0].payload_bytes if inv.results else spec.payload_bytes(inv.scale)
    print(f"workload {inv.workload} x{inv.scale:g}: payload {fmt_bytes(payload)}")
    print(table.render(table.comparison_rows(inv.results)))
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "results.json"), "w") as f:
            json.dump(inv.to_dict(), f)
        print(f"wrote {os.path.join(args.out, 'results.json')}")
    return 0
