"""How much faster is verl's numpy mode than its torch mode across a real Ray boundary?

The seed (verl PR 3425) measured a 6400x20480 float32 tensor from a Ray driver to 16 workers:
torch 2.58 s serialize + 0.74 s deserialize = 3.32 s, numpy 0.0006 s + 1.32 s = 1.32 s, a ratio
numpy/torch of 0.40. This benchmark measures the same ratio on one machine with the ``ray``
transport (driver ``ray.put`` -> actor ``ray.get``, both sides in their own processes) on the seed
workload scaled to about 128 MiB, and puts it next to the time of one plain copy of the payload
(``memcpy`` into fresh pages, and into pages already touched), the unit every step is made of.

All runs share one local cluster (started once, joined through ``ray_address`` like a real one).
Rounds alternate the codecs so a drift of the shared machine hits both alike; the ratio is given as
the median of per-round ratios and as the ratio of the best times (contention only ever adds time).

    python benchmarks/ray_ratio.py [--rounds 3] [--scale 0.256] [--out benchmarks/results/ray_ratio.json]
"""

from __future__ import annotations

import argparse
import json
import mmap
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from picklescope import run
from picklescope.ray.local_cluster import LocalCluster

WORKLOAD = "seed-6400x20480"
CODECS = ("numpy", "torch")
SEED = {"torch_s": 2.58 + 0.74, "numpy_s": 0.0006 + 1.32}


def memcpy_s(nbytes: int, repeats: int = 5) -> dict[str, float]:
    """Best time of one copy of ``nbytes``: into fresh private pages, into touched pages, and into fresh
    shared-memory pages (a new ``/dev/shm`` file, as the object store's are) and out of them again
    through a second mapping (as a worker reads the store)."""
    src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
    fresh, warm, shm_in, shm_out = [], [], [], []
    for _ in range(repeats):
        with mmap.mmap(-1, nbytes) as anon:  # a new anonymous mapping: every page faults on first write
            dst = np.frombuffer(anon, np.uint8)
            t = time.perf_counter()
            np.copyto(dst, src)
            fresh.append(time.perf_counter() - t)
            t = time.perf_counter()
            np.copyto(dst, src)
            warm.append(time.perf_counter() - t)
            del dst
        with tempfile.TemporaryFile(dir="/dev/shm") as f:
            f.truncate(nbytes)
            with mmap.mmap(f.fileno(), nbytes) as m:
                t = time.perf_counter()
                np.copyto(np.frombuffer(m, np.uint8), src)
                shm_in.append(time.perf_counter() - t)
            with mmap.mmap(f.fileno(), nbytes, prot=mmap.PROT_READ) as m2, mmap.mmap(-1, nbytes) as anon:
                view, out = np.frombuffer(m2, np.uint8), np.frombuffer(anon, np.uint8)
                t = time.perf_counter()
                np.copyto(out, view)
                shm_out.append(time.perf_counter() - t)
                del view, out
    return {"fresh_pages_s": min(fresh), "touched_pages_s": min(warm), "into_fresh_shm_s": min(shm_in),
            "out_of_shm_into_fresh_s": min(shm_out)}


def one(codec: str, scale: float, address: str) -> dict:
    r = run(codec, "ray", WORKLOAD, scale, transport_options={"ray_address": address})
    steps = {}
    for side in r.processes.values():
        for st in side.steps:
            steps.setdefault(f"{side.name}:{st.name}", st.duration_s)
    work = None if r.serialize_s is None or r.deserialize_s is None else r.serialize_s + r.deserialize_s
    return {"codec": codec, "outcome": r.outcome, "error": r.error, "put_s": r.serialize_s, "get_s": r.deserialize_s,
            "put_get_s": work, "payload_bytes": r.payload_bytes, "steps_s": steps,
            "sender_peak_bytes": r.sender.peak_bytes, "receiver_peak_bytes": r.receiver.peak_bytes,
            "serialize_s": r.sender_cost["serialize_s"],
            "store_write_s": r.sender_cost["store_write_s"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--scale", type=float, default=0.256)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "ray_ratio.json"))
    args = ap.parse_args(argv)
    runs: list[dict] = []
    t0 = time.monotonic()
    with LocalCluster(object_store_bytes=640 * 1024**2) as cluster:
        for rnd in range(args.rounds):
            for codec in (CODECS if rnd % 2 == 0 else CODECS[::-1]):
                row = one(codec, args.scale, cluster.address)
                row["round"] = rnd
                runs.append(row)
                print(f"round {rnd} {codec:>5}: put {row['put_s']}, get {row['get_s']} ({row['outcome']})",
                      file=sys.stderr)
    cleanup = cluster.report
    ok = [r for r in runs if r["outcome"] == "ok" and r["put_get_s"]]
    per_round = []
    for rnd in range(args.rounds):
        n = next((r["put_get_s"] for r in ok if r["round"] == rnd and r["codec"] == "numpy"), None)
        t = next((r["put_get_s"] for r in ok if r["round"] == rnd and r["codec"] == "torch"), None)
        if n and t:
            per_round.append(n / t)
    best = {c: min((r["put_get_s"] for r in ok if r["codec"] == c), default=None) for c in CODECS}
    payload = runs[0]["payload_bytes"]
    copy = memcpy_s(payload)

    def median_step(codec: str, key: str) -> float | None:
        vals = [r["steps_s"].get(key) for r in ok if r["codec"] == codec and r["steps_s"].get(key) is not None]
        return statistics.median(vals) if vals else None

    steps_of_interest = ["sender:ray.serialize", "sender:object-store write", "receiver:ray.get",
                         "receiver:frombuffer", "receiver:torch.load", "sender:consolidate", "sender:torch.save"]
    summary = {
        "payload_bytes": payload,
        "ratio_numpy_over_torch_median": statistics.median(per_round) if per_round else None,
        "ratio_numpy_over_torch_best": best["numpy"] / best["torch"] if best["numpy"] and best["torch"] else None,
        "per_round_ratios": per_round,
        "best_put_get_s": best,
        "seed_ratio": SEED["numpy_s"] / SEED["torch_s"],
        "seed": SEED,
        "memcpy": copy,
        "put_get_in_memcpys": {c: best[c] / copy["fresh_pages_s"] if best[c] else None for c in CODECS},
        "median_steps_s": {c: {k: median_step(c, k) for k in steps_of_interest if median_step(c, k) is not None}
                           for c in CODECS},
        "cluster_cleanup": cleanup,
    }
    out = {"summary": summary, "runs": runs, "machine": {"python": platform.python_version(),
                                                         "platform": platform.platform()},
           "wall_s": time.monotonic() - t0, "date": time.strftime("%Y-%m-%d")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1))
    s = summary
    print(f"payload {payload / 2**20:.1f} MiB; one memcpy: {copy['fresh_pages_s']:.3f} s into fresh pages, "
          f"{copy['touched_pages_s']:.3f} s into touched pages, {copy['into_fresh_shm_s']:.3f} s into fresh "
          f"/dev/shm pages, {copy['out_of_shm_into_fresh_s']:.3f} s from those into fresh pages")
    for c in CODECS:
        if best[c]:
            print(f"{c:>5}: best put+get {best[c]:.3f} s = {s['put_get_in_memcpys'][c]:.1f} memcpys")
    if s["ratio_numpy_over_torch_median"] is not None:
        print(f"numpy/torch put+get: median {s['ratio_numpy_over_torch_median']:.2f} "
              f"(rounds {', '.join(f'{x:.2f}' for x in per_round)}), best-time {s['ratio_numpy_over_torch_best']:.2f}; "
              f"seed {s['seed_ratio']:.2f}")
    print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
