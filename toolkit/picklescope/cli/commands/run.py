"""``picklescope run``: one codec over one transport, both sides measured."""

from __future__ import annotations

import argparse
from typing import Any

from picklescope.cli.commands.common import add_run_args, print_json, repeat_count, run_kwargs
from picklescope.core.units import fmt_bytes
from picklescope.investigate.reproduce import DEFAULT_SCALE
from picklescope.measure import verdicts
from picklescope.measure.budget import add_budget_args, budget_kwargs
from picklescope.measure.runner import run
from picklescope.tracers import tracer_report
from picklescope.views import table

ORDER = 10


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="measure one codec over one transport in isolated processes")
    add_run_args(p)
    add_budget_args(p)
    p.add_argument("--receiver-codec", default=None, help="codec the receiver uses (default: same)")
    p.add_argument("--repeat", type=repeat_count, default=1, metavar="N",
                   help="run the case N times in fresh processes; report min / median / max of every peak "
                        "and the run with the largest sender peak")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    scale = DEFAULT_SCALE if args.scale is None else args.scale
    r = run(args.codec, args.transport, args.workload, scale, receiver_codec=args.receiver_codec, **run_kwargs(args),
            **budget_kwargs(args), repeat=args.repeat)
    if args.json:
        print_json(r.to_dict())
        return 0
    print(f"{r.codec} over {r.transport} on {r.workload} x{r.scale:g} (payload {fmt_bytes(r.payload_bytes)}): "
          + verdicts.verdict(r).sentence(r.outcome))
    if r.killed_at:
        print(f"died at {r.killed_at} with {fmt_bytes(r.memory_at_death_bytes)} above baseline "
              f"(enforcement: {r.enforcement}); --json has the Python stack at death")
    print(table.render(table.steps_rows(r)))
    print()
    print(table.render(table.comparison_rows([r])))
    if r.variation is not None:
        print()
        print(f"over {r.variation.runs} runs (the tables above show the run with the largest sender peak):")
        print(table.render(table.variation_rows(r)))
        print(table.variation_summary(r))
    if r.tracer not in ("sampler", "none"):
        print()
        print(tracer_report(r))
    return 0
