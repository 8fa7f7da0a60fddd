"""How exact are the per-step peaks? Compare them with an independent kernel reading.

A normal run resets the kernel's high-water mark (``VmHWM``) at every step boundary and folds it into
every open step, so nested steps all get exact peaks. If that bookkeeping were wrong, a step's peak
would be too low or too high. This benchmark re-runs the same codec x transport once per step in a
fresh pair of processes whose meter does one reset at that step's start and one read at its end, and
nothing else (``steps.ProbeMeter``), and reports the difference as a fraction of the payload.

    python benchmarks/fidelity.py [--workload flowgrpo] [--scale 0.25] [--out benchmarks/results/fidelity.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

from picklescope import run
from picklescope.investigate.reproduce import BUILTIN_CODECS, IN_PROCESS_TRANSPORTS

GOAL = 0.03  # of payload


def measure(codec: str, transport: str, workload: str, scale: float) -> list[dict]:
    """Rows (side, step, reported, independent, error/payload) for one codec x transport."""
    normal = run(codec, transport, workload, scale)
    payload = normal.payload_bytes
    rows = []
    for side_name, side in normal.processes.items():
        targets = [None] + list(dict.fromkeys(s.name for s in side.steps))
        for target in targets:
            probes: list[dict] = []
            run(codec, transport, workload, scale, probe={side_name: target},
                on_event=lambda ev, sink=probes: sink.append(ev) if ev.get("type") == "probe" else None)
            if not probes:
                continue
            reported = side.peak_bytes if target is None else side.step(target).peak_bytes
            independent = probes[0]["peak_bytes"]
            rows.append({"codec": codec, "transport": transport, "side": side_name,
                         "step": target or "(whole side)", "reported_bytes": reported,
                         "independent_bytes": independent, "payload_bytes": payload,
                         "error_of_payload": (reported - independent) / payload})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="flowgrpo")
    ap.add_argument("--scale", type=float, default=0.25)
    ap.add_argument("--out", default="benchmarks/results/fidelity.json")
    args = ap.parse_args(argv)
    rows = []
    for codec in BUILTIN_CODECS:
        for transport in IN_PROCESS_TRANSPORTS:
            got = measure(codec, transport, args.workload, args.scale)
            rows += got
            worst = max(abs(r["error_of_payload"]) for r in got)
            print(f"{codec:>13} over {transport:<12} {len(got):2d} readings, worst |error| {worst:.2%} of payload",
                  flush=True)
    errors = [abs(r["error_of_payload"]) for r in rows]
    summary = {"readings": len(rows), "max_abs_error_of_payload": max(errors),
               "mean_abs_error_of_payload": sum(errors) / len(errors), "goal_of_payload": GOAL,
               "within_goal": max(errors) <= GOAL}
    print(f"{len(rows)} readings: max |error| {summary['max_abs_error_of_payload']:.2%} of payload, "
          f"mean {summary['mean_abs_error_of_payload']:.2%} (goal {GOAL:.0%})")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"workload": args.workload, "scale": args.scale, "python": platform.python_version(),
                               "summary": summary, "rows": rows}, indent=1))
    print(f"wrote {out}")
    return 0 if summary["within_goal"] else 1


if __name__ == "__main__":
    sys.exit(main())
