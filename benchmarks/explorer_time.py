"""Time from pressing the explorer's run button to its final figure, as a user in a notebook sees it.

``python benchmarks/explorer_time.py [--workload flowgrpo] [--scale 0.1] [--repeat 3]``

The explorer is built in this process (as in a kernel), the button is clicked, and the clock stops
when the run's final figure has been drawn (the background thread ends right after it). The first
press includes the warm forkserver's own start; later presses are what a user waits for when
switching codecs. The same case through a plain ``picklescope.run`` is timed between presses, so
the view's own share (press minus plain run) is separated from the two measured processes'. Prints
one JSON object with every press, every plain run and the machine's load average.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="flowgrpo")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--codec", default="numpy")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "explorer_time.json"))
    args = ap.parse_args()
    from picklescope.views.widgets import Explorer

    ex = Explorer(codec=args.codec, workload=args.workload, scale=args.scale)
    import picklescope as ps

    presses, plain = [], []
    load = [os.getloadavg()[0]]
    for i in range(args.repeat):
        t0 = time.monotonic()
        ex.button.click()
        ex.wait(600)
        presses.append(round(time.monotonic() - t0, 3))
        assert ex.results[-1].outcome == "ok", ex.status.value
        if i:  # after the first press the forkserver is warm for both
            t0 = time.monotonic()
            ps.run(args.codec, "pickle5-oob", args.workload, args.scale)
            plain.append(round(time.monotonic() - t0, 3))
    load.append(os.getloadavg()[0])
    doc = {"workload": args.workload, "scale": args.scale, "codec": args.codec,
           "press_to_final_figure_s": presses, "plain_run_s": plain, "load_average": load, "cpus": os.cpu_count()}
    print(json.dumps(doc))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
