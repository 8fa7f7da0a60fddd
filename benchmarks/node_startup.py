"""How long does a node replay take to reach its first training step, on the machine as it is and busier?

Runs ``picklescope node`` (a cluster of its own, as a user's first replay does) as a command, once on
the machine as it is and once with ``--spin N`` processes spinning on the cores beside it, and reads
from its ``--json`` when the first training step began on the run's own clock (``training_steps[0]
.start_s``), when the baseline was taken, its outcome, its error line and its whole length. The load
average is read before each run; the machine is shared, so "as it is" is whatever else runs on it.

    python benchmarks/node_startup.py [--workload tiny] [--scale 1] [--workers 2] [--steps 2]
                                      [--timeout 600] [--spin 4]

Writes ``benchmarks/results/node_startup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def replay(args: argparse.Namespace) -> dict:
    """One ``picklescope node --json`` run: its figures and the load around it."""
    cmd = [sys.executable, "-m", "picklescope", "node", "--codec", "numpy", "--workload", args.workload, "--scale",
           str(args.scale), "--workers", str(args.workers), "--steps", str(args.steps), "--timeout",
           str(args.timeout), "--json"]
    load_before = os.getloadavg()[0]
    t = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t
    row = {"load_before": round(load_before, 1), "load_after": round(os.getloadavg()[0], 1),
           "exit": p.returncode, "command_wall_s": round(wall, 1)}
    if p.returncode in (0, 1) and p.stdout.strip():
        doc = json.loads(p.stdout)
        steps = doc["training_steps"]
        row.update(outcome=doc["outcome"], error=doc["node"]["error"], run_wall_s=doc["node"]["wall_s"],
                   first_step_s=round(steps[0]["start_s"], 1) if steps else None,
                   baseline_s=doc["node"]["baseline_s"])
    else:
        row.update(outcome="error", error=p.stderr.strip().splitlines()[-1] if p.stderr.strip() else None)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", default="tiny")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--spin", type=int, default=4, help="processes spinning beside the second run")
    args = ap.parse_args()
    rows = {"as it is": replay(args)}
    print("as it is:", rows["as it is"], flush=True)
    spin = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.spin)]
    try:
        time.sleep(5)  # let the spinners show in the load average
        rows[f"{args.spin} spinning"] = replay(args)
    finally:
        for s in spin:
            s.kill()
            s.wait()
    print(f"{args.spin} spinning:", rows[f"{args.spin} spinning"], flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "args": vars(args),
           "rows": rows}
    (RESULTS / "node_startup.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
