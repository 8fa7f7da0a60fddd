"""What does the capture probe add to the call it watches? Its time against the call's own, ~100 MiB batch.

The probe (:mod:`picklescope.capture`) wraps ``__getstate__``; on a recorded call it reads
``VmRSS``, resets ``VmHWM``, runs the call, reads both again, describes the batch and writes one
workload file and one JSON line. This script builds a ~100 MiB batch in this process (flowgrpo, the
preset shaped like the batches that took verl nodes down) and, for each codec, alternates per round:

- the call without the probe (``Batch.__getstate__`` as the codec defines it);
- the call with the probe installed (limit 1, a fresh folder each time): the time the caller sees,
  and the call's own time as the probe measured it around the original method.

The probe's cost per recorded call is (caller's time - own time), its share the cost divided by the
own time; medians over rounds. ``gc.collect()`` runs between calls, outside every timing, so the
reference cycle ``consolidate()`` leaves behind is collected alike in both arms. After ``limit``
calls the original method is put back, so later calls cost nothing extra (checked: the attribute
is the original function again).

    python benchmarks/capture_overhead.py [--rounds 7] [--scale 0.215] [--out benchmarks/results/capture_overhead.json]
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

from picklescope import capture
from picklescope.batch import Batch, set_active_codec
from picklescope.workloads import load_workload

CODECS = ["numpy-legacy", "torch", "numpy"]
TARGET = "picklescope.batch:Batch.__getstate__"


def _plain(b: Batch) -> tuple[float, float]:
    c0, t0 = time.thread_time(), time.perf_counter()
    state = b.__getstate__()
    dt, dc = time.perf_counter() - t0, time.thread_time() - c0
    del state
    return dt, dc


def _probed(b: Batch, folder: Path) -> tuple[float, float, dict]:
    probe = capture.install(folder, limit=1, target=TARGET)
    c0, t0 = time.thread_time(), time.perf_counter()
    state = b.__getstate__()
    dt, dc = time.perf_counter() - t0, time.thread_time() - c0
    del state
    if probe.error or not probe.records:
        raise SystemExit(f"the probe did not record: {probe.error}")
    if Batch.__dict__["__getstate__"] is not probe._original:
        raise SystemExit("the probe did not put the original method back")
    rec = probe.records[0]
    rec["caller_s"], rec["caller_cpu_s"] = dt, dc
    return dt, rec["wall_s"], rec


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
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
            _plain(b)  # warm-up: first-call costs (page faults of the allocator, imports) land in no arm
            gc.collect()
            plain, plain_cpu, seen, own, extra, own_cpu, extra_cpu = [], [], [], [], [], [], []
            for r in range(args.rounds):
                order = ("plain", "probed") if r % 2 == 0 else ("probed", "plain")
                for arm in order:
                    gc.collect()
                    if arm == "plain":
                        dt, dc = _plain(b)
                        plain.append(dt)
                        plain_cpu.append(dc)
                    else:
                        folder = tmp / f"{codec}-{r}"
                        dt, own_s, rec = _probed(b, folder)
                        seen.append(dt)
                        own.append(own_s)
                        extra.append(dt - own_s)
                        own_cpu.append(rec["cpu_s"])
                        extra_cpu.append(rec["caller_cpu_s"] - rec["cpu_s"])
                        shutil.rmtree(folder, ignore_errors=True)
            med_own, med_extra = statistics.median(own), statistics.median(extra)
            cpu_own, cpu_extra = statistics.median(own_cpu), statistics.median(extra_cpu)
            row = {"codec": codec, "plain_s": statistics.median(plain), "plain_cpu_s": statistics.median(plain_cpu),
                   "probed_caller_s": statistics.median(seen), "probed_own_s": med_own, "probe_cost_s": med_extra,
                   "probe_share_of_own": med_extra / med_own, "probed_own_cpu_s": cpu_own,
                   "probe_cost_cpu_s": cpu_extra, "probe_cpu_share_of_own_cpu": cpu_extra / cpu_own,
                   "probe_cost_s_all": extra, "probe_cost_cpu_s_all": extra_cpu, "own_s_all": own,
                   "plain_s_all": plain, "peak_x_payload_last": rec["peak_x_payload"]}
            rows.append(row)
            print(f"{codec:<13} own {med_own * 1e3:8.2f} ms wall, {cpu_own * 1e3:8.2f} ms cpu "
                  f"(unprobed {row['plain_s'] * 1e3:8.2f} ms)  probe +{med_extra * 1e3:6.2f} ms wall "
                  f"= {100 * row['probe_share_of_own']:6.2f}%, +{cpu_extra * 1e3:6.2f} ms cpu "
                  f"= {100 * row['probe_cpu_share_of_own_cpu']:6.2f}% of the call  "
                  f"peak {rec['peak_x_payload']:.2f}x payload", flush=True)
    finally:
        set_active_codec(None)
        shutil.rmtree(tmp, ignore_errors=True)
    out = {"payload_bytes": payload, "workload": "flowgrpo", "scale": args.scale, "rounds": args.rounds,
           "machine": {"cores": os.cpu_count(), "python": platform.python_version(),
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
