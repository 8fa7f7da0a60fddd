"""``picklescope postmortem``: run the postmortem notebook with parameters and export offline HTML."""

from __future__ import annotations

import argparse
from typing import Any

from picklescope.views.postmortem import render
from picklescope.workloads.spec import DEFAULT_WORKLOAD

ORDER = 40


def register(sub: Any) -> None:
    p = sub.add_parser("postmortem", help="execute the postmortem notebook and export it as offline HTML")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help=f"preset name or YAML path; default {DEFAULT_WORKLOAD}")
    p.add_argument("--codecs", default="torch,numpy-legacy,numpy", help="comma-separated codecs to compare")
    p.add_argument("--transport", default="pickle5-oob", help="transport; default pickle5-oob")
    p.add_argument("--budget", default="0.5x", help="sender budget for the verdict runs (e.g. 0.5x, 300MiB; "
                                                   "'none' for no budgeted runs); default 0.5x")
    p.add_argument("--scale", type=float, default=None, help="default: 0.25, less on a small machine")
    p.add_argument("--out", required=True, help="folder for postmortem.ipynb, postmortem.html, report.html "
                                                "and results.json")
    p.add_argument("--tracer", default="all", help="tracers for one extra traced run of the legacy codec "
                                                  "('none' to skip); default all")
    p.add_argument("--ray", action="store_true", help="also send each codec through a local Ray cluster")
    p.add_argument("--no-headroom", action="store_true", help="skip the headroom search (2+ runs per codec)")
    p.add_argument("--force", action="store_true", help="overwrite an existing postmortem in --out")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    codecs = [c.strip() for c in args.codecs.split(",") if c.strip()]
    budget = None if args.budget.lower() in ("none", "") else args.budget
    pm = render(args.workload, codecs, budget, args.out, scale=args.scale, transport=args.transport,
                headroom=not args.no_headroom, trace=None if args.tracer == "none" else args.tracer, ray=args.ray,
                force=args.force)
    print(f"executed {pm.notebook}")
    print(f"wrote {pm.html} (the notebook, opens offline)")
    for name in ("report.html", "results.json"):
        if (pm.notebook.parent / name).exists():
            print(f"wrote {pm.notebook.parent / name}")
    return 0
