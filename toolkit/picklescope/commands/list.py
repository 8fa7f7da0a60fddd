"""``picklescope list``: what codecs, transports and workloads exist."""

from __future__ import annotations

import argparse
from typing import Any

from ..codecs import CODECS
from ..transports import TRANSPORTS
from ..units import fmt_bytes
from ..workloads import available_workloads, load_workload

ORDER = 5


def register(sub: Any) -> None:
    p = sub.add_parser("list", help="list codecs, transports and workloads")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    print("codecs:")
    for name in CODECS:
        c = CODECS.get(name)
        gaps = ", ".join(u.feature for u in c.unsupported) or "none"
        print(f"  {name:<14} {c.description}  [cannot carry: {gaps}]")
    print("transports:")
    for name in TRANSPORTS:
        print(f"  {name:<14} {TRANSPORTS.get(name).description}")
    print("workloads (payload at scale 1):")
    for name in available_workloads():
        w = load_workload(name)
        print(f"  {name:<16} {fmt_bytes(w.payload_bytes()):>10}  {w.description}")
    return 0
