"""What does the capture probe add to the call it watches? Its time against the call's own, ~100 MiB batch.

The probe (:mod:`picklescope.investigate.capture`) wraps ``__getstate__``. On a recorded call, the call waits
for the measurement only: the high-water reset, the kernel's counters read before and after, the
clocks, and a shallow copy of the batch's containers; describing the batch and writing the files
happen on the probe's thread after the call. This script builds a ~100 MiB batch in this process
(flowgrpo, the preset shaped like the batches that took verl nodes down) and, for each codec,
alternates per round (the order flips every round):

- the call without the probe (``Batch.__getstate__`` as the codec defines it);
- the call with the probe installed (limit 1, a fresh folder each time): the time the caller sees,
  and the call's own time as the probe measured it around the original method.

The probe's cost on the call is (caller's time - own time) per probed call, its share that cost
divided by the own time; medians over rounds. The difference of the two arms' medians is reported
too (noisier: two independent samples). The probe thread's work per record (describing, the YAML,
three small files) is reported as CPU time, off the call: the process pays it once per recorded call,
the call does not wait for it. Installing, waiting for the thread to finish (``probe.remove()``) and
``gc.collect()`` run between calls, outside every timing. After ``limit`` calls the original method
is put back, so later calls cost nothing (checked: the attribute is the original function again).

A collection before every call leaves the caches cold: whatever runs first after it (the probe's
reset, or the call itself when there is no probe) pays tens of microseconds more. So the same
measurement is also timed on calls made back to back ("back to back": the least a recorded call can
cost, since the reset and the reads are the record itself).

    python benchmarks/capture_overhead.py [--rounds 15] [--fast-rounds 401] [--scale 0.215]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

from picklescope.batch import Batch, set_active_codec
from picklescope.investigate import capture
from picklescope.workloads.spec import load_workload

CODECS = ["numpy-legacy", "torch", "numpy"]
TARGET = "picklescope.batch:Batch.__getstate__"
GOAL = 0.01


def _plain(b: Batch) -> float:
    t0 = time.perf_counter()
    state = b.__getstate__()
    dt = time.perf_counter() - t0
    del state
    return dt


def _measured(b: Batch, meter: capture.Meter) -> tuple[float, float]:
    """The call with only the measurement the probe exists to take, the probe's own ``Meter``."""
    pc, tt = time.perf_counter, time.thread_time
    t0 = pc()
    meter.before()
    c1, t1 = tt(), pc()
    state = b.__getstate__()
    t2, c2 = pc(), tt()
    meter.after()
    t3 = pc()
    del state, c1, c2
    return t3 - t0, t2 - t1


def _probed(b: Batch, folder: Path) -> tuple[float, dict]:
    probe = capture.install(folder, limit=1, target=TARGET)
    t0 = time.perf_counter()
    state = b.__getstate__()
    dt = time.perf_counter() - t0
    del state
    probe.remove()  # waits for the probe's thread: outside the timing
    if probe.error or not probe.records:
        raise SystemExit(f"the probe did not record: {probe.error}")
    if Batch.__dict__["__getstate__"] is not probe._original:
        raise SystemExit("the probe did not put the original method back")
    rec = probe.records[0]
    if "workload_error" in rec or not rec["peak_exact"]:
        raise SystemExit(f"the probe recorded no structure or no exact peak: {rec}")
    return dt, rec


def _memory_gib() -> float:
    with open("/proc/meminfo") as f:
        return int(f.readline().split()[1]) / 2**20


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=15, help="rounds for calls of 5 ms or more")
    p.add_argument("--fast-rounds", type=int, default=401, help="rounds for calls under 5 ms")
    p.add_argument("--scale", type=float, default=0.215, help="flowgrpo scale (0.215 is ~100 MiB)")
    p.add_argument("--out", default=str(Path(__file__).parent / "results" / "capture_overhead.json"))
    args = p.parse_args(argv)
    w = load_workload("flowgrpo")
    b = w.build(args.scale)
    payload = w.payload_bytes(args.scale)
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="capture-overhead-"))
    rows = []
    t_start = time.monotonic()
    try:
        for codec in CODECS:
            set_active_codec(codec)
            first = min(_plain(b) for _ in range(3))  # warm-up: first-call costs land in no arm
            rounds = args.rounds if first >= 0.005 else args.fast_rounds
            gc.collect()
            meter = capture.Meter()
            plain, seen, own, extra, thread_cpu, sources, floor = [], [], [], [], [], set(), []
            arms = ("plain", "measured", "probed")
            for r in range(rounds):
                for arm in arms[r % 3:] + arms[:r % 3]:  # each arm goes first, second and third in turn
                    gc.collect()
                    if arm == "plain":
                        plain.append(_plain(b))
                        continue
                    if arm == "measured":
                        caller, inner = _measured(b, meter)
                        floor.append(caller - inner)
                        continue
                    folder = tmp / f"{codec}-{r}"
                    dt, rec = _probed(b, folder)
                    seen.append(dt)
                    own.append(rec["wall_s"])
                    extra.append(dt - rec["wall_s"])
                    thread_cpu.append(rec["probe_cpu_s"])
                    sources.add(rec["peak_source"])
                    shutil.rmtree(folder, ignore_errors=True)
            # the same measurement on calls made back to back (caches warm, no collection between them):
            # the least a recorded call can cost, since the reset and the reads are the record itself
            warm_floor, warm_own = [], []
            for r in range(rounds):
                if r % 20 == 0:
                    gc.collect()  # the legacy codec's cycles, outside the timed calls
                    _measured(b, meter)  # the call after a collection is not a warm one
                caller, inner = _measured(b, meter)
                warm_floor.append(caller - inner)
                warm_own.append(inner)
            meter.close()
            med_own, med_extra, med_floor = statistics.median(own), statistics.median(extra), statistics.median(floor)
            arms_diff = statistics.median(seen) - statistics.median(plain)
            beyond = med_extra - med_floor
            row = {"codec": codec, "rounds": rounds, "plain_s": statistics.median(plain),
                   "probed_caller_s": statistics.median(seen), "probed_own_s": med_own,
                   "probe_cost_s": med_extra, "probe_share_of_own": med_extra / med_own,
                   "probe_cost_p90_s": statistics.quantiles(extra, n=10)[-1],
                   "measurement_s": med_floor, "measurement_share_of_own": med_floor / med_own,
                   "beyond_measurement_s": beyond, "beyond_measurement_share": beyond / med_own,
                   "arms_difference_s": arms_diff, "arms_difference_share": arms_diff / statistics.median(plain),
                   "meets_1pct": med_extra / med_own <= GOAL, "meets_1pct_beyond_measurement": beyond / med_own <= GOAL,
                   "probe_thread_cpu_s": statistics.median(thread_cpu), "peak_sources": sorted(sources),
                   "peak_x_payload_last": rec["peak_x_payload"], "probe_cost_s_all": extra, "own_s_all": own,
                   "measurement_s_all": floor, "plain_s_all": plain,
                   "warm_measurement_s": statistics.median(warm_floor), "warm_own_s": statistics.median(warm_own),
                   "warm_measurement_share": statistics.median(warm_floor) / statistics.median(warm_own)}
            rows.append(row)
            print(f"{codec:<13} {rounds:4d} rounds  own {med_own * 1e3:8.3f} ms (unprobed {row['plain_s'] * 1e3:8.3f})"
                  f"  probe on the call +{med_extra * 1e6:6.1f} us = {100 * row['probe_share_of_own']:5.2f}%"
                  f" (the measurement {med_floor * 1e6:5.1f} us, the rest {beyond * 1e6:5.1f} us"
                  f" = {100 * row['beyond_measurement_share']:5.2f}%)"
                  f" (arms differ by {100 * row['arms_difference_share']:+6.2f}%)  off the call"
                  f" {row['probe_thread_cpu_s'] * 1e3:5.2f} ms cpu  peak {rec['peak_x_payload']:.2f}x payload"
                  f" ({'/'.join(sorted(sources))}); back to back: the measurement"
                  f" {row['warm_measurement_s'] * 1e6:5.1f} us of a {row['warm_own_s'] * 1e3:.3f} ms call"
                  f" = {100 * row['warm_measurement_share']:5.2f}%", flush=True)
    finally:
        set_active_codec(None)
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"payload_bytes": payload, "workload": "flowgrpo", "scale": args.scale, "goal_share": GOAL,
           "machine": {"cores": os.cpu_count(), "memory_gib": round(_memory_gib(), 1),
                       "python": platform.python_version(), "kernel": platform.release(),
                       "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
           "date": time.strftime("%Y-%m-%d", time.gmtime()), "wall_s": time.monotonic() - t_start,
           "command": "python benchmarks/capture_overhead.py " + " ".join(sys.argv[1:] if argv is None else argv),
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"payload {payload / 2**20:.1f} MiB; load average {load_before[0]:.1f} -> {os.getloadavg()[0]:.1f}; "
          f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
