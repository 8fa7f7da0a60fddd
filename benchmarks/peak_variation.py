"""How often a varying peak takes each of its values, and what decides it.

``numpy-legacy`` over in-band ``pickle`` on flowgrpo x0.05 has an exact sender peak that is not the
same from run to run. This benchmark runs the case ``--repeat`` times (each run in fresh children)
under four conditions, each in a fresh interpreter with a fresh forkserver, and counts each value
(rounded to 0.01x payload):

- ``default``: as a user runs it (``--repeat``: every run's children come from a freshly started
  forkserver, a new process with its own address-space layout, as every production worker is);
- ``one-forkserver``: the same number of runs, all forked from one forkserver (``picklescope.run``
  called in a loop in one process);
- ``no-aslr``: the same, with the kernel's address-space layout randomization turned off for the
  process tree (``setarch -R``, inherited by the forkserver and every child);
- ``no-aslr-fixed-hash``: also with Python's hash seed fixed (``PYTHONHASHSEED=0``), so the
  forkserver's imports allocate in the same order on every start;
- ``mmap-threshold-128k`` / ``mmap-threshold-32m``: glibc's mmap threshold fixed by
  ``MALLOC_MMAP_THRESHOLD_`` (which also turns off its dynamic adjustment);
- ``scale-0.25``: the default condition on a batch five times larger (buffers above glibc's largest
  dynamic threshold of 32 MiB are always mmap'ed).

Writes ``benchmarks/results/peak_variation.json``; prints ratios only.

    python benchmarks/peak_variation.py [--repeat 20] [--codec numpy-legacy] [--transport pickle]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def one_condition(name: str, codec: str, transport: str, scale: float, repeat: int, env: dict[str, str],
                  prefix: list[str]) -> dict:
    cmd = [*prefix, sys.executable, "-m", "picklescope", "run", "--codec", codec, "--transport", transport,
           "--workload", "flowgrpo", "--scale", str(scale), "--repeat", str(repeat), "--json"]
    t0 = time.monotonic()
    load = os.getloadavg()[0]
    p = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if p.returncode != 0:
        return {"condition": name, "error": p.stderr.strip().splitlines()[-1:] or [f"exit {p.returncode}"]}
    return _row(name, scale, json.loads(p.stdout), t0, load)


ONE_FORKSERVER = """
import json, sys
import picklescope as ps
from picklescope.core.result import Variation
codec, transport, scale, n = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
runs = [ps.run(codec, transport, "flowgrpo", scale) for _ in range(n)]
r = runs[-1]
r.variation = Variation.of(runs)
print(r.to_json())
"""


def one_forkserver(codec: str, transport: str, scale: float, repeat: int) -> dict:
    """Like one_condition, but every run forked from the same forkserver."""
    t0 = time.monotonic()
    load = os.getloadavg()[0]
    p = subprocess.run([sys.executable, "-c", ONE_FORKSERVER, codec, transport, str(scale), str(repeat)],
                       capture_output=True, text=True)
    if p.returncode != 0:
        return {"condition": "one-forkserver", "error": p.stderr.strip().splitlines()[-1:] or ["failed"]}
    d = json.loads(p.stdout)
    return _row("one-forkserver", scale, d, t0, load)


def _row(name: str, scale: float, d: dict, t0: float, load: float) -> dict:
    payload = d["payload_bytes"]
    sender = next(pk for pk in d["variation"]["peaks"] if pk["name"] == "sender")
    values = [round(v / payload, 2) for v in sender["values"]]
    counts = collections.Counter(values)
    return {"condition": name, "scale": scale, "runs": len(values), "payload_bytes": payload,
            "counts": {f"{k:.2f}x": n for k, n in sorted(counts.items())}, "values_x": values,
            "varies": d["variation"]["varies"], "wall_s": round(time.monotonic() - t0, 1), "load_average": load}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--codec", default="numpy-legacy")
    ap.add_argument("--transport", default="pickle")
    ap.add_argument("--only", default=None, help="comma-separated condition names")
    args = ap.parse_args()
    setarch = shutil.which("setarch")
    conditions = [
        ("default", 0.05, {}, []),
        ("one-forkserver", 0.05, {}, []),
        ("no-aslr", 0.05, {}, [setarch, "-R"] if setarch else None),
        ("no-aslr-fixed-hash", 0.05, {"PYTHONHASHSEED": "0"}, [setarch, "-R"] if setarch else None),
        ("mmap-threshold-128k", 0.05, {"MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}, []),
        ("mmap-threshold-32m", 0.05, {"MALLOC_MMAP_THRESHOLD_": str(32 * 1024 * 1024)}, []),
        ("scale-0.25", 0.25, {}, []),
    ]
    only = set(args.only.split(",")) if args.only else None
    rows = []
    for name, scale, env, prefix in conditions:
        if only and name not in only:
            continue
        if prefix is None:
            rows.append({"condition": name, "error": ["setarch not found"]})
            continue
        if name == "one-forkserver":
            row = one_forkserver(args.codec, args.transport, scale, args.repeat)
        else:
            row = one_condition(name, args.codec, args.transport, scale, args.repeat, env, prefix)
        rows.append(row)
        if "error" in row:
            print(f"{name}: not measured: {row['error'][0]}", flush=True)
        else:
            seen = ", ".join(f"{k} in {n}" for k, n in row["counts"].items())
            print(f"{name} (x{scale:g}): {seen} of {row['runs']} runs "
                  f"(load average {row['load_average']:.1f})", flush=True)
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / "peak_variation.json"
    if only and out.is_file():  # --only re-measures some conditions: keep the others' rows
        kept = [r for r in json.loads(out.read_text()).get("conditions", []) if r["condition"] not in only]
        rows = kept + rows
    out.write_text(json.dumps({"cpus": os.cpu_count(), "codec": args.codec, "transport": args.transport,
                               "repeat": args.repeat, "conditions": rows}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
