"""Where does the test suite's CPU go? The CPU time of the processes its tests start most often.

On two cores the suite is bound by CPU (docs/testing.md, "Workers"), and most of it is Python processes
starting, not checks. This measures, on the machine as it is, the user + system CPU seconds of:

- a Python that imports ``torch``, one that imports ``ray`` (every CLI child, kernel and Ray worker pays
  one or both), and one that imports ``picklescope.investigate.node`` (what a node replay's processes load);
- a local Ray cluster's start (``LocalCluster``, the suite's ``ray_cluster``): every process of its tree,
  per kind (``ray start``, GCS, raylet, agents);
- one node replay joined to that cluster (``--workers`` workers): the CPU its worker actors used, per worker.

Each figure is read from the kernel (``psutil``'s CPU times of each live process, and of a finished child
through ``getrusage``); the ratios compare a worker or a cluster with a bare ``import torch`` measured in the
same run. The load average before and after is recorded: on a shared machine CPU seconds vary less than wall
time, but a loaded machine still adds some (cache misses, page faults).

    python benchmarks/process_cpu.py [--workers 2] [--repeat 3]

Writes ``benchmarks/results/process_cpu.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
from pathlib import Path

import psutil

RESULTS = Path(__file__).resolve().parent / "results"
IMPORTS = {"python": "pass", "torch": "import torch", "ray": "import ray",
           "picklescope.investigate.node": "import picklescope.investigate.node"}


def child_cpu(code: str) -> float:
    """CPU seconds (user + system) of ``python -c code`` and its children, from ``getrusage``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-c", code], check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def tree_cpu(root: int) -> dict[str, dict]:
    """Per kind of process under ``root`` (its name, or its Ray title such as ``ray::NodeWorker``): count
    and CPU seconds, of the processes alive now."""
    kinds: dict[str, dict] = {}
    top = psutil.Process(root)
    for p in (top, *top.children(recursive=True)):
        try:
            argv = p.cmdline()
            cpu = sum(p.cpu_times()[:2])
            name = p.name()
        except psutil.Error:
            continue
        kind = argv[0] if argv and argv[0].startswith("ray::") else name
        if name.startswith("python"):  # named by the module or script it runs
            script = next((a for a in argv[1:] if a.endswith(".py") or "." in a and not a.startswith("-")), "")
            kind = "ray start" if "ray.scripts.scripts" in argv else Path(script).name or name
        k = kinds.setdefault(kind, {"count": 0, "cpu_s": 0.0})
        k["count"] += 1
        k["cpu_s"] = round(k["cpu_s"] + cpu, 2)
    return kinds


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="runs of each import (the median is kept)")
    args = ap.parse_args()

    from picklescope.investigate.node import node
    from picklescope.ray.local_cluster import LocalCluster

    load = [round(os.getloadavg()[0], 1)]
    imports = {name: round(statistics.median(child_cpu(code) for _ in range(args.repeat)), 2)
               for name, code in IMPORTS.items()}
    cluster = LocalCluster(object_store_bytes=512 * 2**20, num_cpus=3).start()
    try:
        started = tree_cpu(cluster.proc.pid)
        r = node("numpy", workload="flowgrpo", scale=0.05, workers=args.workers, steps=2, gc="off",
                 ray_address=cluster.address)
        after = tree_cpu(cluster.proc.pid)
    finally:
        cluster.stop()
    load.append(round(os.getloadavg()[0], 1))
    workers = after.get("ray::NodeWorker", {"count": 0, "cpu_s": 0.0})
    per_worker = workers["cpu_s"] / workers["count"] if workers["count"] else None
    cluster_cpu = round(sum(k["cpu_s"] for k in started.values()), 2)
    doc = {
        "machine": {"cores": os.cpu_count(), "memory_gib": round(psutil.virtual_memory().total / 2**30),
                    "python": platform.python_version(), "load_average": load},
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "imports_cpu_s": imports,
        "cluster_start": {"per_kind": started, "cpu_s": cluster_cpu},
        "replay": {"outcome": r.outcome, "workers": args.workers, "worker_cpu_s": per_worker},
        "ratios_to_import_torch": {
            "cluster_start": round(cluster_cpu / imports["torch"], 1),
            "one_worker": round(per_worker / imports["torch"], 1) if per_worker else None,
        },
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "process_cpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
