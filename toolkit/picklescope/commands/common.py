"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..workloads import DEFAULT_WORKLOAD

ORDER = 999


def register(sub: Any) -> None:
    """Not a command: shared helpers only."""


def add_run_args(p: argparse.ArgumentParser, codec: bool = True) -> None:
    if codec:
        p.add_argument("--codec", default="numpy", help="codec (see 'picklescope list'); default numpy")
    p.add_argument("--transport", default="pickle5-oob", help="transport; default pickle5-oob")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help=f"preset name or YAML path; default {DEFAULT_WORKLOAD}")
    p.add_argument("--scale", type=float, default=None, help="factor on the batch dimension; default 0.25")
    p.add_argument("--timeout", type=float, default=None, help="wall-clock limit per run in seconds")


def run_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if getattr(args, "timeout", None) is not None:
        kw["timeout_s"] = args.timeout
    return kw


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=None)
    sys.stdout.write("\n")
