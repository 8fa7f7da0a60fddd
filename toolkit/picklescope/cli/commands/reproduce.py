"""``picklescope reproduce``: the main job, from the matrix to a shareable postmortem.

Every codec x transport on the default workload, the sender headroom of each, and one budgeted run
per codec at a sender budget between what the fixed and the legacy codec need; with Ray, one row per
codec over the ``ray`` transport and a node pair on that cluster (a driver and 4 worker actors over 4
training steps, legacy then fixed codec). Prints the tables and writes ``DIR/results.json`` and
``DIR/report.html`` (one self-contained file that opens offline).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import threading
from typing import Any

from picklescope.cli.commands.common import add_handoff_arg, repeat_count, run_kwargs, seconds
from picklescope.core.paths import OutFolder
from picklescope.core.units import fmt_bytes, parse_size
from picklescope.investigate.ray_matrix import CLUSTER_START
from picklescope.investigate.reproduce import (
    BUILTIN_CODECS,
    IN_PROCESS_TRANSPORTS,
    RAY_LANE,
    REPEAT,
    budgeted_results,
    default_scale,
    investigate,
    matrix_results,
    node_pair_sentence,
    ray_lane_sentence,
)
from picklescope.measure.budget import plan
from picklescope.views import table
from picklescope.views.report import OWN_FILES, prepare_out_dir, write_report
from picklescope.workloads.spec import DEFAULT_WORKLOAD, load_workload

ORDER = 1
DEFAULT_OUT = os.path.join("out", "reproduce")


def register(sub: Any) -> None:
    p = sub.add_parser("reproduce", help="the main job: every codec x transport, headroom, an OOM under a budget, "
                                         "a report")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help=f"preset name or YAML path; default {DEFAULT_WORKLOAD}")
    p.add_argument("--scale", type=float, default=None, help="default: 0.25, less on a small machine")
    p.add_argument("--budget", default=None,
                   help="sender budget of the budgeted runs: bytes (60MiB) or a multiple of the payload (0.5x); "
                        "default: halfway between numpy's and numpy-legacy's headroom")
    p.add_argument("--out", default=DEFAULT_OUT,
                   help=f"folder for report.html and results.json; default {DEFAULT_OUT}. Locked while this run "
                        "writes it; removed again if this run created it and is stopped before writing")
    p.add_argument("--force", action="store_true", help="write into --out even if it holds other files")
    p.add_argument("--repeat", type=repeat_count, default=REPEAT, metavar="N",
                   help=f"runs of each unbudgeted case (default {REPEAT}): a peak that varies from run to run is "
                        "flagged and its range reported")
    p.add_argument("--no-headroom", action="store_true", help="skip the headroom search (faster)")
    p.add_argument("--no-trace", action="store_true",
                   help="skip the run with every tracer attached (the report's attribution and tracker sections)")
    p.add_argument("--timeout", type=seconds, default=None, help="wall-clock limit per run in seconds")
    p.add_argument("--no-ray", action="store_true", help="skip the rows over the ray transport (added when Ray "
                                                          "is installed)")
    p.add_argument("--no-node", action="store_true",
                   help="skip the node pair (a driver and 4 worker actors over 4 training steps, legacy and fixed "
                        "codec) that runs on the ray rows' cluster")
    p.add_argument("--ray-address", dest="ray_cluster", default=None,
                   help="run the ray rows on this cluster (host:port) instead of a local one started for them")
    add_handoff_arg(p)
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if args.budget is not None:  # refuse a malformed or impossible budget before spending a minute on runs
        scale = default_scale(args.workload) if args.scale is None else args.scale
        plan(parse_size(args.budget, "--budget"), None, load_workload(args.workload).payload_bytes(scale))
    # --out is locked while this run writes it (a second run into it gets one line), and removed again
    # if this run created it and ends before writing its outputs (Ctrl-C, SIGTERM, an error)
    with OutFolder(args.out, own=tuple(OWN_FILES)) as folder:
        code = _reproduce(args)
        folder.keep()
    return code


def _reproduce(args: argparse.Namespace) -> int:
    from tqdm import tqdm


    out = prepare_out_dir(args.out, args.force)
    n = len(BUILTIN_CODECS) * len(IN_PROCESS_TRANSPORTS)
    ray_runs = 0 if args.no_ray else len(BUILTIN_CODECS) + (0 if args.no_node else 1)
    total = (n * (args.repeat + (0 if args.no_headroom else 2)) + len(BUILTIN_CODECS) + (0 if args.no_trace else 1)
             + ray_runs)
    bar = tqdm(total=total, desc="reproduce", unit="run",
               file=sys.stderr, leave=False, dynamic_ncols=True)
    lanes: dict[str, str] = {}  # what each lane (the in-process runs, the Ray lane beside them) is doing

    def progress(label: str) -> None:
        lane = "ray" if threading.current_thread().name == RAY_LANE else "main"
        with bar.get_lock():
            if lanes.get(lane) and not lanes[lane].startswith(CLUSTER_START):
                bar.update(1)  # that lane's previous run is over
            if bar.n >= bar.total:  # a bisection added runs
                bar.total = bar.n + 1
            lanes[lane] = label
            bar.set_postfix_str("; ".join(lanes[k] for k in ("main", "ray") if k in lanes), refresh=True)

    command = shlex.join(["picklescope", *sys.argv[1:]]) if sys.argv and sys.argv[0] else None
    try:
        inv = investigate(args.workload, args.scale, args.budget, headroom=not args.no_headroom,
                          trace=None if args.no_trace else "all", progress=progress, command=command,
                          ray=False if args.no_ray else None, ray_address=args.ray_cluster, repeat=args.repeat,
                          node_pair=not args.no_node,
                          **run_kwargs(args))
        bar.update(bar.total - bar.n)
        bar.refresh()
    finally:
        bar.close()
    payload = inv.payload_bytes or 0
    print(f"workload {inv.workload} x{inv.scale:g}: payload {fmt_bytes(payload)}")
    print(table.render(table.comparison_rows(matrix_results(inv))))
    for r in matrix_results(inv):
        if r.variation is not None and r.variation.varies:
            print(f"{r.codec} over {r.transport}: {table.variation_summary(r)}")
    ray_failed = ray_lane_sentence(inv)
    if ray_failed:
        print(ray_failed)
    if inv.nodes:
        print()
        print("a whole node (a driver and worker actors on the ray rows' cluster), memory above each process's "
              "baseline:")
        print(table.render(table.node_rows(inv.nodes)))
    pair = node_pair_sentence(inv)
    if pair:
        print(pair)
    budgeted = budgeted_results(inv)
    if budgeted:
        print()
        print(f"sender budget {inv.budget} ({fmt_bytes(inv.budget_bytes)}) over {inv.budget_transport}:")
        print(table.render([{"codec": r.codec, "outcome": r.outcome, "side": r.killed_side or "-",
                             "step": r.killed_in_step or "-", "line": r.killed_at or "-"}
                            for r in budgeted]))
    print()
    print(inv.headline)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(inv.to_dict(), f)
    path = write_report(inv, os.path.join(out, "report.html"))
    print(f"wrote {os.path.join(out, 'results.json')} and {path}")
    return 0
