"""Arguments shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from typing import Any

from picklescope.core.units import seconds as checked_seconds
from picklescope.errors import PicklescopeError
from picklescope.workloads.spec import DEFAULT_WORKLOAD

ORDER = 999


def register(sub: Any) -> None:
    """Not a command: shared helpers only."""


def seconds(text: str) -> float:
    """argparse type of ``--timeout``: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise PicklescopeError(f"--timeout {text!r} is not a number of seconds", "use e.g. --timeout 300") from None
    if not (math.isfinite(value) and value > 0):
        raise PicklescopeError(f"--timeout {text!r} must be a positive number of seconds",
                               "use e.g. --timeout 300 (the default is generous: 900)")
    return value


def idle_seconds(flag: str, example: str, what: str) -> Callable[[str], float]:
    """An argparse type for a duration that may be zero (``--step-gap``, ``--worker-compute``): the API's own
    check (:func:`picklescope.core.units.seconds`) with ``flag`` and an ``example`` value in its
    one line, so that the flag and the keyword accept and refuse the same values."""
    def parse(text: str) -> float:
        return checked_seconds(flag, text, f"{flag} {example}", what)
    return parse


def add_worker_compute(p: argparse.ArgumentParser) -> None:
    """``--worker-compute``, the same for ``node`` (which replays it) and ``predict`` (which models it and
    replays it in a check), so that a prediction can be replayed with the same options."""
    p.add_argument("--worker-compute", type=idle_seconds("--worker-compute", "2",
                                                         "seconds each worker holds its chunk, computing"),
                   default=0.0, help="seconds each worker holds its chunk after reading it, a stand-in for its "
                                     "compute: workers that compute longer than the controller takes to send every "
                                     "chunk (a training step's do) all hold theirs at once (docs/node.md); default 0")


def repeat_count(text: str) -> int:
    """argparse type of ``--repeat``: a whole number of runs, at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise PicklescopeError(f"--repeat {text!r} is not a whole number of runs", "use e.g. --repeat 5") from None
    if not 1 <= value <= 1000:
        raise PicklescopeError(f"--repeat {text!r} must be from 1 to 1000", "use e.g. --repeat 5") from None
    return value


def add_run_args(p: argparse.ArgumentParser, codec: bool = True) -> None:
    if codec:
        p.add_argument("--codec", default="numpy", help="codec (see 'picklescope list'); default numpy")
    p.add_argument("--transport", default="pickle5-oob", help="transport; default pickle5-oob")
    p.add_argument("--workload", default=DEFAULT_WORKLOAD, help=f"preset name or YAML path; default {DEFAULT_WORKLOAD}")
    p.add_argument("--scale", type=float, default=None, help="factor on the batch dimension; default 0.25")
    p.add_argument("--timeout", type=seconds, default=None, help="wall-clock limit per run in seconds")
    p.add_argument("--tracer", default=None,
                   help="sampler (default, always on), memray, memray-native, tracemalloc, torch-profiler, "
                        "several joined by commas, or all")
    p.add_argument("--ray-address", default=None,
                   help="transports ray, ray-arg, transferqueue: join this Ray cluster (host:port) instead of "
                        "starting a local one for the run")
    add_handoff_arg(p)


def add_handoff_arg(p: argparse.ArgumentParser) -> None:
    """``--handoff-dir``: where the sender writes the hand-off when ``/dev/shm`` is too small for it."""
    p.add_argument("--handoff-dir", default=None, metavar="DIR",
                   help="write the hand-off file to this folder (on disk) instead of /dev/shm, e.g. when "
                        "/dev/shm is smaller than the payload (Docker's default is 64 MiB)")


def run_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kw: dict[str, Any] = {}
    if getattr(args, "timeout", None) is not None:
        kw["timeout_s"] = args.timeout
    if getattr(args, "tracer", None) is not None:
        kw["tracer"] = args.tracer
    if getattr(args, "handoff_dir", None):
        kw["handoff_dir"] = args.handoff_dir
    if getattr(args, "ray_address", None):
        kw["transport_options"] = {"ray_address": args.ray_address}
    return kw


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=None)
    sys.stdout.write("\n")
