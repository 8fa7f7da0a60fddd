"""What does watching cost? Time with each tracer against no tracing at all, in the same process.

Each round runs every tracer once on the same case (codec x transport x workload), in an order that
rotates from round to round, so a drift of the shared machine hits every tracer alike. Two times
per run:

- work: ``pickle.dumps`` in the sender plus ``pickle.loads`` in the receiver, the measured code a
  tracer can slow down (its hooks, its line of the GIL, its sampling of ``/proc``);
- run: the whole run's wall time, including a tracer's start-up and the parent reading its files.

Two estimates of a tracer's ratio to tracer "none": the median over rounds of (its time / the time
of "none" in the same round), and the ratio of the best (smallest) times, which a busy machine
disturbs least since contention only ever adds time. Both are printed with the spread of the
per-round ratios; when they disagree, the machine was too busy to tell. One untimed warm-up run per
case comes first (the first run after start pays for cold caches). Tracer "none" turns even the
parent's RSS sampling off; exact per-step peaks (``VmHWM``) are part of every run, so they are in
the baseline.

    python benchmarks/overhead.py [--rounds 5] [--out benchmarks/results/overhead.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

from picklescope import run

CASES = [("numpy-legacy", "pickle5-oob", "flowgrpo", 0.5), ("torch", "pickle", "flowgrpo", 0.5),
         ("torch", "pickle", "seed-6400x20480", 0.25)]
TRACERS = ["none", "sampler", "memray", "tracemalloc", "torch-profiler"]
GOALS = {"sampler": 1.15, "memray": 1.3}  # of the work time, on these big-buffer workloads


def one(case: tuple[str, str, str, float], tracer: str) -> dict:
    codec, transport, workload, scale = case
    r = run(codec, transport, workload, scale, tracer=tracer)
    work = None if r.serialize_s is None or r.deserialize_s is None else r.serialize_s + r.deserialize_s
    return {"tracer": tracer, "outcome": r.outcome, "error": r.error, "work_s": work, "run_s": r.wall_s,
            "payload_bytes": r.payload_bytes, "sender_peak_bytes": r.sender.peak_bytes}


def ratios(runs: list[dict], tracer: str, key: str) -> list[float]:
    """Per-round ratios of ``tracer`` to ``none`` (rounds where both worked)."""
    out = []
    for rnd in sorted({r["round"] for r in runs}):
        base = next((r[key] for r in runs if r["round"] == rnd and r["tracer"] == "none"), None)
        mine = next((r[key] for r in runs if r["round"] == rnd and r["tracer"] == tracer), None)
        if base and mine:
            out.append(mine / base)
    return out


def best_ratio(runs: list[dict], tracer: str, key: str) -> float | None:
    mine = [r[key] for r in runs if r["tracer"] == tracer and r[key]]
    base = [r[key] for r in runs if r["tracer"] == "none" and r[key]]
    return min(mine) / min(base) if mine and base else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tracers", default=",".join(TRACERS))
    ap.add_argument("--quick", action="store_true", help="one small case, two rounds (a smoke run)")
    ap.add_argument("--out", default="benchmarks/results/overhead.json")
    args = ap.parse_args(argv)
    tracers = args.tracers.split(",")
    if "none" not in tracers:
        tracers.insert(0, "none")
    cases = [("numpy-legacy", "pickle5-oob", "flowgrpo", 0.1)] if args.quick else CASES
    rounds = 2 if args.quick else args.rounds
    started = time.monotonic()
    report = []
    for case in cases:
        runs: list[dict] = []
        one(case, "none")  # warm-up, not recorded
        for rnd in range(rounds):
            order = tracers[rnd % len(tracers):] + tracers[:rnd % len(tracers)]
            for tracer in order:
                runs.append({"round": rnd, **one(case, tracer)})
        summary = {}
        for tracer in tracers:
            if tracer == "none":
                continue
            work, whole = ratios(runs, tracer, "work_s"), ratios(runs, tracer, "run_s")
            summary[tracer] = {"work_ratio": statistics.median(work) if work else None,
                               "work_best_ratio": best_ratio(runs, tracer, "work_s"),
                               "run_ratio": statistics.median(whole) if whole else None,
                               "work_ratios": work, "goal": GOALS.get(tracer)}
        report.append({"codec": case[0], "transport": case[1], "workload": case[2], "scale": case[3],
                       "payload_bytes": runs[0]["payload_bytes"], "summary": summary, "runs": runs})
        label = f"{case[0]} over {case[1]} on {case[2]} x{case[3]:g}"
        print(label)
        for tracer, s in summary.items():
            met = s["work_ratio"] is not None and s["goal"] is not None and s["work_ratio"] <= s["goal"]
            met = met and (s["work_best_ratio"] or 0) <= (s["goal"] or 0)
            goal = f" (goal <= {s['goal']:.2f}x: {'met' if met else 'NOT met'})" if s["goal"] else ""
            w = "-" if s["work_ratio"] is None else f"{s['work_ratio']:.2f}x"
            b = "-" if s["work_best_ratio"] is None else f"{s['work_best_ratio']:.2f}x"
            spread = f"{min(s['work_ratios']):.2f}-{max(s['work_ratios']):.2f}" if s["work_ratios"] else "-"
            a = "-" if s["run_ratio"] is None else f"{s['run_ratio']:.2f}x"
            print(f"  {tracer:<15} work {w:>6} (best-of {b:>6}, rounds {spread:>9})  whole run {a:>6}{goal}")
        failed = [r for r in runs if r["outcome"] != "ok"]
        if failed:
            print(f"  {len(failed)} runs did not finish ok: {failed[0]['error']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": rounds, "tracers": tracers, "python": platform.python_version(),
                               "machine": platform.machine(), "seconds": time.monotonic() - started,
                               "cases": report}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
