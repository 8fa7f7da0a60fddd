"""What does ``import picklescope.capture`` cost a training job's start-up? Time and what it pulls in.

Each round starts a fresh interpreter with ``python -X importtime -c "import picklescope.capture"``
and reads two things from the report Python writes: the cumulative time of the ``picklescope.capture``
line (the whole statement: the package, the alias and the probe module, with every module they
import), and whether torch, numpy, plotly, Ray, tensordict or Jupyter appear at all. Python's own
start-up (``site``) is outside the statement and not counted. Medians and minimum over rounds; the
load average before and after is recorded, since under load one round can take several times another.

    python benchmarks/probe_import.py [--rounds 21] [--module picklescope.capture]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results" / "probe_import.json"
HEAVY = ("torch", "numpy", "plotly", "ray", "tensordict", "jupyter_client", "IPython", "yaml")
_LINE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)$")


def cpu_ms(module: str) -> float:
    """CPU time of the import statement in a fresh interpreter (barely moved by other processes' load)."""
    code = f"import time; t = time.process_time(); import {module}; print((time.process_time() - t) * 1000)"
    return float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                                check=True).stdout)


def one_round(module: str) -> tuple[float, list[str]]:
    """(the statement's cumulative import time in ms, heavy top-level packages it imported)."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-c", f"import {module}"], capture_output=True, text=True,
                       timeout=600, check=True)
    total_us, heavy = None, set()
    for line in p.stderr.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        name = m.group(4)
        if name.split(".")[0] in HEAVY:
            heavy.add(name.split(".")[0])
        if name == module and not m.group(3):
            total_us = int(m.group(2))
    if total_us is None:
        raise SystemExit(f"probe_import: no top-level line for {module} in python -X importtime's report")
    return total_us / 1000, sorted(heavy)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--module", default="picklescope.capture")
    args = ap.parse_args()
    load_before = os.getloadavg()[0]
    times, cpu, heavy = [], [], set()
    for _ in range(args.rounds):
        ms, found = one_round(args.module)
        times.append(ms)
        heavy.update(found)
        cpu.append(cpu_ms(args.module))
    load_after = os.getloadavg()[0]
    out = {
        "module": args.module, "rounds": args.rounds, "median_ms": round(statistics.median(times), 1),
        "min_ms": round(min(times), 1), "max_ms": round(max(times), 1), "heavy_imported": sorted(heavy),
        "cpu_median_ms": round(statistics.median(cpu), 1), "cpu_ms": [round(t, 1) for t in cpu],
        "times_ms": [round(t, 1) for t in times], "load_average": [round(load_before, 1), round(load_after, 1)],
        "python": platform.python_version(), "cores": os.cpu_count(),
    }
    print(f"import {args.module}: median {out['median_ms']} ms, min {out['min_ms']} ms, max {out['max_ms']} ms over "
          f"{args.rounds} fresh interpreters (-X importtime); CPU time of the statement: median "
          f"{out['cpu_median_ms']} ms; heavy packages imported: {', '.join(out['heavy_imported']) or 'none'}; "
          f"load average {load_before:.1f} -> {load_after:.1f}")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
