"""``picklescope stepthrough``: every line of a ``__getstate__`` / ``__setstate__`` with its exact memory cost.

Columns: ``added`` is the largest rise of RSS during one execution of the line (callees included),
``kept`` what the line's executions left resident in total, ``peak`` the highest RSS while it ran
(above the start of the call). The last line names the line that costs the most.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import table
from ..errors import PicklescopeError
from ..stepthrough import StepThrough, stepthrough
from ..units import fmt_bytes
from .common import print_json, seconds

ORDER = 20
QUIET_ADDED = 0.01  # nested lines adding less than this share of the payload ...
QUIET_TIME = 0.02  # ... and taking less than this share of the time are hidden unless --all


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
    p.add_argument("--all", action="store_true", help="show every line, also quiet nested ones")
    p.add_argument("--timeout", type=seconds, default=None, help="wall-clock limit in seconds")
    p.add_argument("--json", action="store_true", help="print the step-through as one JSON object")
    p.set_defaults(func=main)


def _where(row: Any) -> str:
    return f"{os.path.basename(row.filename)}:{row.lineno}"


def rows_for_terminal(st: StepThrough, show_all: bool = False) -> tuple[list[dict[str, Any]], int]:
    """Table rows (and how many quiet nested lines were hidden)."""
    p = st.payload_bytes or 1
    total_t = sum(r.time_s for r in st.rows if r.depth == 0) or 1.0
    out, hidden = [], 0
    for r in st.rows:
        quiet = r.depth > 0 and r.cost_bytes < QUIET_ADDED * p and r.time_s < QUIET_TIME * total_t
        if quiet and not show_all:
            hidden += 1
            continue
        code = "  " * r.depth + r.source
        out.append({"line": _where(r), "code": code if len(code) <= 72 else code[:71] + "~", "hits": r.hits,
                    "seconds": f"{r.time_s:.4f}", "added": fmt_bytes(r.added_bytes, signed=True),
                    "x payload": f"{r.added_bytes / p:.3f}x", "kept": fmt_bytes(r.retained_bytes, signed=True),
                    "peak": fmt_bytes(r.peak_bytes)})
    return out, hidden


def summary(st: StepThrough) -> str:
    """One sentence naming the line that costs the memory (or saying none does)."""
    c = st.culprit()
    p = st.payload_bytes or 1
    if c is None:
        return "no line added memory"
    what = (f"adds {fmt_bytes(c.added_bytes, signed=True)} ({c.added_bytes / p:.2f}x payload)"
            if c.added_bytes >= c.retained_bytes else
            f"keeps {fmt_bytes(c.retained_bytes, signed=True)} ({c.retained_bytes / p:.2f}x payload) "
            f"over {c.hits} hits")
    return f"largest: {_where(c)} in {c.function} {what}: {c.source}"


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
        print(table.render(rows))
        if hidden:
            print(f"({hidden} quiet nested lines hidden; --all shows them)")
        print(f"exact peak of the call: {fmt_bytes(st.peak_bytes)} above its start")
        print(summary(st))
    if st.traceback and st.outcome != "ok":
        print(st.traceback)
    return 0 if st.outcome == "ok" else 1
