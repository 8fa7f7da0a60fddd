"""How long the main job takes from a cold start: ``picklescope reproduce`` in a fresh interpreter.

Cold means what a user gets on the first call: a new Python process (torch imported from scratch)
and a new forkserver. The venv is assumed to exist (``dev.py`` creates it once). The machine's load
average is recorded before and after, because on a shared 2-core machine the wall time depends more
on the neighbours than on picklescope; compare runs only with similar load. Writes
``benchmarks/results/reproduce_time.json``.

    python benchmarks/reproduce_time.py [--repeat N] [-- extra reproduce arguments]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def one(extra: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out")
        load_before = os.getloadavg()
        t0 = time.monotonic()
        p = subprocess.run([sys.executable, "-m", "picklescope", "reproduce", "--out", out, *extra],
                           capture_output=True, text=True)
        wall = time.monotonic() - t0
        load_after = os.getloadavg()
        runs = nodes = None
        if p.returncode == 0:
            with open(os.path.join(out, "results.json")) as f:
                d = json.load(f)
            runs = len(d["results"]) + sum(len((r.get("headroom_detail") or {}).get("runs", []))
                                           for r in d["results"])
            nodes = len(d.get("nodes", []))
    return {"wall_s": round(wall, 2), "returncode": p.returncode, "runs": runs, "node_replays": nodes,
            "load_before": [round(x, 2) for x in load_before], "load_after": [round(x, 2) for x in load_after],
            "headline": p.stdout.strip().splitlines()[-2] if p.returncode == 0 else p.stderr[-500:]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("extra", nargs="*", help="arguments passed on to picklescope reproduce (after --)")
    args = ap.parse_args()
    rows = [one(args.extra) for _ in range(args.repeat)]
    for r in rows:
        print(f"reproduce: {r['wall_s']} s, {r['runs']} runs and {r['node_replays']} node replays, "
              f"load average before {r['load_before'][0]} "
              f"after {r['load_after'][0]} on {os.cpu_count()} CPUs (rc {r['returncode']})")
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "reproduce_time.json"
    out.write_text(json.dumps({"cpus": os.cpu_count(), "args": args.extra, "runs": rows}, indent=1))
    print(f"wrote {out}")
    return 0 if all(r["returncode"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
