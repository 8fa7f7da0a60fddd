"""``picklescope headroom``: the smallest sender budget a codec survives, as a multiple of the payload."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from picklescope.cli.commands.common import add_run_args, print_json, repeat_count, run_kwargs
from picklescope.core.units import fmt_bytes
from picklescope.investigate.headroom import REPEAT, RESOLUTION, find_headroom
from picklescope.investigate.reproduce import DEFAULT_SCALE

ORDER = 20


def register(sub: Any) -> None:
    p = sub.add_parser("headroom", help="find the smallest sender budget a codec survives (to 2%% of payload)")
    add_run_args(p)
    p.add_argument("--repeat", type=repeat_count, default=REPEAT, metavar="N",
                   help=f"unbudgeted runs whose worst exact peak predicts the answer (default {REPEAT}): "
                        "some peaks vary from run to run")
    p.add_argument("--json", action="store_true", help="print the answer and its runs as one JSON object")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    scale = DEFAULT_SCALE if args.scale is None else args.scale

    def say(label: str) -> None:
        if not args.json:
            print(f"  run: {label}", file=sys.stderr, flush=True)

    h = find_headroom(args.codec, args.transport, args.workload, scale, resolution=RESOLUTION, on_run=say,
                      repeat=args.repeat, **run_kwargs(args))
    if args.json:
        print_json(h.to_dict())
        return 0 if h.headroom_bytes is not None else 1
    print(h.describe())
    for r in h.runs:
        step = f" in {r['killed_in_step']}" if r.get("killed_in_step") else ""
        print(f"  budget {fmt_bytes(r['budget_bytes'])} ({r['budget_bytes'] / h.payload_bytes:.3f}x): "
              f"{r['outcome']}{step}")
    return 0 if h.headroom_bytes is not None else 1
