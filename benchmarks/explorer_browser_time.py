"""Time from pressing the explorer's run button to its final figure, measured in the browser.

``python benchmarks/explorer_browser_time.py [--workload flowgrpo] [--scale 0.1] [--codec numpy] [--repeat 4]``

``explorer_time.py`` stops its clock in the kernel, when the figure has been sent. A person waits
longer: the frame must reach the browser and be drawn. Here a real JupyterLab (1400 px window, file
browser open) runs one explorer in Debian's Chromium under Playwright; each press of **run** is timed
until the browser's plotly holds the figure of that run (its title names the run, a trace ends where
the status line says the run ended). Also recorded: how long after the press the status line first
said "running". The first press includes the forkserver's start. Prints and writes one JSON object
with every press and the machine's load average before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--workload", default="flowgrpo")
    ap.add_argument("--scale", type=float, default=0.1)
    ap.add_argument("--codec", default="numpy")
    ap.add_argument("--repeat", type=int, default=4)
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "explorer_browser_time.json"))
    args = ap.parse_args()

    import nbformat
    from browser_lab import LAB_SETTINGS, LAB_WIDTH, browser_unavailable, chromium, file_browser_open, lab_server
    from test_browser_views import _open, _press_and_wait, _run_all, _wait_kernel_idle

    why = browser_unavailable()
    if why:
        raise SystemExit(f"this benchmark needs a browser: {why}")
    load_before = os.getloadavg()
    presses = []
    # not named "picklescope-...": every run sweeps such folders whose creator has ended
    with tempfile.TemporaryDirectory(prefix="explorer-browser-bench-") as tmp:
        work = Path(tmp)
        root = work / "root"
        root.mkdir()
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
            "from picklescope.views.widgets import Explorer\n"
            f"explorer = Explorer(codec={args.codec!r}, workload={args.workload!r}, scale={args.scale!r})\n"
            "explorer")], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                    "language": "python"}})
        nbformat.write(nb, str(root / "explorer.ipynb"))
        with lab_server(root, work / "lab", user_settings=LAB_SETTINGS) as server, \
                chromium(work, viewport=LAB_WIDTH) as browser:
            page = browser.context.new_page()
            page.goto(server.url("lab"))
            _open(page, "explorer.ipynb")
            file_browser_open(page)
            _wait_kernel_idle(page, 180)
            _run_all(page, 300)
            codec_label = page.locator("label", has_text=re.compile(r"^\s*codec\s*$"))
            explorer = page.locator(".jp-OutputArea-output").filter(
                has=page.locator(".widget-dropdown", has=codec_label)).first
            for n in range(1, args.repeat + 1):
                got = _press_and_wait(page, explorer, n, args.codec)
                presses.append({k: got[k] for k in ("run", "press_to_final_figure_s", "press_to_running_ms",
                                                    "problem")})
            server.remember_children()
    doc = {"workload": args.workload, "scale": args.scale, "codec": args.codec, "presses": presses,
           "load_average_before": load_before, "load_average_after": os.getloadavg(), "cpus": os.cpu_count()}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2))
    print(json.dumps(doc, indent=2))
    return 0 if all(p["problem"] is None for p in presses) else 1


if __name__ == "__main__":
    raise SystemExit(main())
