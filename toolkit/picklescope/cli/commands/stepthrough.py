"""``picklescope stepthrough``: every line of a ``__getstate__`` / ``__setstate__`` with its exact memory cost.

Costly lines come first, ranked by *self* cost (what the line's own code allocated: its inclusive
rise minus what the traced functions it called added), ties by time; ``called from`` keeps the
call nesting visible. Lines whose own code costs under 1% of the payload are folded below
(``--all`` lists them). Columns: ``self`` the line's own cost, ``inclusive`` the largest rise of
RSS during one execution of the line (callees included), ``kept`` what its executions left
resident, ``peak`` the highest RSS while it ran (above the start of the call). The last line
names the line that costs the most.
"""

from __future__ import annotations

import argparse
from typing import Any

from picklescope.cli.commands.common import print_json, seconds
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError
from picklescope.investigate.stepthrough import StepThrough, line_row, stepthrough, where
from picklescope.views import table


def register(sub: Any) -> None:
    p = sub.add_parser("stepthrough", help="run a __getstate__/__setstate__ line by line with exact per-line memory")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--codec", default=None, help="step through this codec's method (see 'picklescope list')")
    what.add_argument("--function", default=None, metavar="MODULE:QUALNAME",
                      help="any function, e.g. verl.protocol:DataProto.__getstate__ or patch.py:getstate")
    p.add_argument("--state-codec", default=None,
                   help="with --function on a plain __setstate__ function: codec that makes its state (default numpy)")
    p.add_argument("--method", default="__getstate__", help="__getstate__ (default) or __setstate__")
    p.add_argument("--workload", default="flowgrpo", help="preset name or YAML path; default flowgrpo")
    p.add_argument("--scale", type=float, default=0.25, help="factor on the batch dimension; default 0.25")
    p.add_argument("--transport", default="pickle5-oob",
                   help="how a __setstate__ state travels first; default pickle5-oob")
    p.add_argument("--path", action="append", default=[], help="folder to put first on sys.path (repeatable)")
    p.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment variable for the child, e.g. VERL_DATAPROTO_SERIALIZATION_METHOD=numpy")
    p.add_argument("--plugin", action="append", default=[], help="plugin file or module with codecs (repeatable)")
    p.add_argument("--expand", action="append", default=[], help="also trace functions of this package (repeatable)")
    p.add_argument("--all", action="store_true", help="list every line, also the quiet ones (under 1%% of the payload)")
    p.add_argument("--timeout", type=seconds, default=None, help="wall-clock limit in seconds")
    p.add_argument("--json", action="store_true", help="print the step-through as one JSON object")
    p.set_defaults(func=main)


def rows_for_terminal(st: StepThrough, show_all: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Table rows, costly lines first (and how many quiet lines were folded away)."""
    costly, quiet = st.ranked()
    out = [line_row(st, r) for r in costly]
    if show_all:
        return out + [line_row(st, r) for r in quiet], 0
    return out, len(quiet)


def summary(st: StepThrough) -> str:
    """One sentence naming the line that costs the memory (or saying none does)."""
    c = st.culprit()
    p = st.payload_bytes or 1
    if c is None:
        return "no line added memory of its own"
    if c.self_bytes < 0.01 * p:
        return f"no line added 1% of the payload by itself (the most was {fmt_bytes(c.self_bytes)}, {where(c)})"
    what = (f"adds {fmt_bytes(c.self_added_bytes, signed=True)} ({c.self_added_bytes / p:.2f}x payload) by itself"
            if c.self_added_bytes >= c.self_retained_bytes else
            f"keeps {fmt_bytes(c.self_retained_bytes, signed=True)} ({c.self_retained_bytes / p:.2f}x payload) "
            f"over {c.hits} hits")
    return f"costliest line: {where(c)} in {c.function} {what}: {c.source}"


def main(args: argparse.Namespace) -> int:
    kw: dict[str, Any] = {}
    if args.timeout is not None:
        kw["timeout_s"] = args.timeout
    if args.codec is None and args.function is None:
        args.codec = "numpy-legacy"
    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PicklescopeError(f"--env {item!r} is not KEY=VALUE",
                                   "e.g. --env VERL_DATAPROTO_SERIALIZATION_METHOD=numpy")
        env[key] = value
    st = stepthrough(args.function, codec=args.codec or args.state_codec, method=args.method,
                     workload=args.workload, scale=args.scale, transport=args.transport, sys_path=args.path,
                     plugins=args.plugin, expand=args.expand, env=env, **kw)
    if args.json:
        print_json(st.to_dict())
        return 0 if st.outcome == "ok" else 1
    print(f"{st.target} {st.method} on {st.workload} x{st.scale:g} (payload {fmt_bytes(st.payload_bytes)}): "
          f"{st.outcome}" + (f" - {st.error}" if st.error else ""))
    if st.rows:
        rows, hidden = rows_for_terminal(st, args.all)
        print(table.render(rows) if rows else "(no line allocated 1% of the payload by itself)")
        if hidden:
            print(f"({hidden} quiet lines, each under 1% of the payload by itself, folded; --all lists them)")
        print(f"exact peak of the call: {fmt_bytes(st.peak_bytes)} above its start")
        print(summary(st))
    if st.traceback and st.outcome != "ok":
        print(st.traceback)
    return 0 if st.outcome == "ok" else 1
