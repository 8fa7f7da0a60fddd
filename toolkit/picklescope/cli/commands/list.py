"""``picklescope list``: what codecs, transports and workloads exist."""

from __future__ import annotations

import argparse
from typing import Any

from picklescope.codecs import CODECS
from picklescope.codecs.base import MeasuresItsGaps
from picklescope.core.units import fmt_bytes
from picklescope.tracers import availability
from picklescope.transports import TRANSPORTS
from picklescope.workloads.spec import available_workloads, load_workload

ORDER = 5


def register(sub: Any) -> None:
    p = sub.add_parser("list", help="list codecs, transports and workloads")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    print("codecs:")
    for name in CODECS:
        c = CODECS.get(name)
        gaps = ", ".join(u.feature for u in c.unsupported) or "none"
        note = c.capabilities_note if isinstance(c, MeasuresItsGaps) else None
        print(f"  {name:<14} {c.description}  [{note or 'cannot carry: ' + gaps}]")
    print("transports:")
    for name in TRANSPORTS:
        t = TRANSPORTS.get(name)
        print(f"  {name:<14} {t.summary}")  # says why one cannot run here
    print("workloads (payload at scale 1):")
    for name in available_workloads():
        w = load_workload(name)
        print(f"  {name:<16} {fmt_bytes(w.payload_bytes()):>10}  {w.description}")

    print("tracers (--tracer; several with commas, or all):")
    for name, t in availability().items():
        state = "" if t["available"] else f"  [not available: {t['reason']}]"
        print(f"  {name:<14} {t['description']}{state}")
    return 0
