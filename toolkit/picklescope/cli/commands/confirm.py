"""``picklescope confirm``: a candidate ``__getstate__``/``__setstate__`` against the real verl it replaces."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from picklescope.cli.commands.common import add_run_args, print_json, run_kwargs
from picklescope.investigate.confirm import confirm
from picklescope.investigate.emit import emit_test, run_emitted
from picklescope.investigate.reproduce import DEFAULT_SCALE
from picklescope.views.confirm_text import render

ORDER = 45


def register(sub: Any) -> None:
    p = sub.add_parser("confirm", help="run a real verl baseline and a candidate fix side by side and judge it")
    p.add_argument("--baseline", required=True, help="a real verl codec, e.g. verl-0.9.0:numpy")
    p.add_argument("--candidate", required=True,
                   help="a .py file defining __getstate__ and/or __setstate__ for DataProto, or a verl checkout")
    add_run_args(p, codec=False)
    p.add_argument("--emit-test", default=None, metavar="PATH",
                   help="write a pytest file for the verl repository pinning the fix, then run it both ways")
    p.add_argument("--no-headroom", action="store_true", help="skip the budgeted runs that find the headroom")
    p.add_argument("--no-trace", action="store_true", help="skip the line-by-line step-through")
    p.add_argument("--source", action="store_true", help="also print both functions' source, consolidate marked")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    scale = DEFAULT_SCALE if args.scale is None else args.scale
    rep = confirm(args.baseline, args.candidate, workload=args.workload, scale=scale, transport=args.transport,
                  headroom=not args.no_headroom, line_trace=not args.no_trace, **run_kwargs(args))
    emitted = _emit(rep, args.emit_test) if args.emit_test else None
    if args.json:
        d = rep.to_dict()
        d["emitted_test"] = emitted
        print_json(json.loads(json.dumps(d, default=str)))
    else:
        print(render(rep, source=args.source))
        if emitted:
            print(f"\nregression test written to {emitted['path']}:")
            for r in emitted["runs"]:
                state = "passes" if r["passed"] else "fails"
                print(f"  against {r['against']}: {state} (pytest exit {r['returncode']})")
            print(f"  {emitted['verdict']}")
    if emitted and not emitted["discriminates"]:
        return 1
    return 0


def _emit(rep: Any, path: str) -> dict[str, Any]:
    """Write the test, then run it on the baseline (must fail) and on the candidate (must pass)."""
    out = emit_test(rep, path)
    print("running the emitted test against baseline and candidate...", file=sys.stderr)
    base = run_emitted(out, rep.baseline.label)
    cand = run_emitted(out, rep.candidate.label, rep.candidate.patch)
    runs = [{"against": rep.baseline.codec, "passed": base.passed, "returncode": base.returncode},
            {"against": rep.candidate.codec, "passed": cand.passed, "returncode": cand.returncode}]
    ok = not base.passed and base.returncode == 1 and cand.passed
    verdict = ("it fails on the baseline and passes on the candidate" if ok else
               "WARNING: it does not separate them (see pytest output with --json)")
    return {"path": str(out), "runs": runs, "discriminates": ok, "verdict": verdict,
            "output": {"baseline": base.output[-4000:], "candidate": cand.output[-4000:]}}
