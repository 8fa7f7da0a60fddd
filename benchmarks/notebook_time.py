"""How long does "Run All" of a notebook take, at its default parameters, headless?

Runs each notebook named on the command line top to bottom with the project's own runner
(:func:`picklescope.views.nbrun.execute`: papermill on this interpreter, a fresh kernel, the notebook's
own parameters unless ``--param NAME=VALUE`` changes one) and reports the whole wall time (kernel start
and shutdown included) with the slowest cells (papermill's per-cell ``duration``) and the machine's
load average before and after. A notebook that fails is reported with its error line, never a time.

    python benchmarks/notebook_time.py 06_node_replay 03_allocation_timelines [--top 5]
                                       [--param show_ray=False] [--out benchmarks/results/notebook_time.json]

Each run's executed notebook is written under ``out/notebook_time/`` (ignored by git).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import time
from pathlib import Path

from picklescope.errors import PicklescopeError
from picklescope.views import nbrun

REPO = Path(__file__).resolve().parents[1]


def first_line(cell: dict) -> str:
    """The cell's first line of code that is not a comment (what names the cell in the report)."""
    for line in "".join(cell.get("source", "")).splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            return line.strip()[:70]
    return "".join(cell.get("source", "")).strip().splitlines()[0][:70] if cell.get("source") else ""


def time_notebook(stem: str, params: dict, top: int, out: Path) -> dict:
    """One headless Run All of ``stem``: its wall time, its slowest cells and the load around it."""
    out.mkdir(parents=True, exist_ok=True)
    row: dict = {"notebook": stem, "parameters": params, "load_before": [round(x, 2) for x in os.getloadavg()]}
    t = time.monotonic()
    try:
        nb = nbrun.execute(nbrun.notebook_path(stem), out / f"{Path(stem).stem}.ipynb", params, cwd=out, timeout_s=1800)
    except Exception as exc:  # noqa: BLE001 - reported as such: a failed run has no Run All time
        row.update(outcome="error", error=str(exc).strip().splitlines()[-1] if str(exc).strip() else repr(exc))
        nb = None
    row["wall_s"] = round(time.monotonic() - t, 1)
    row["load_after"] = [round(x, 2) for x in os.getloadavg()]
    if nb is not None:
        cells = [(c["metadata"].get("papermill", {}).get("duration") or 0.0, first_line(c))
                 for c in nb.cells if c.cell_type == "code"]
        row.update(outcome="ok", cells_s=round(sum(d for d, _ in cells), 1),
                   slowest=[{"s": round(d, 1), "cell": src} for d, src in sorted(cells, reverse=True)[:top]])
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("notebooks", nargs="+", help="notebook stems (06_node_replay) or paths")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                    help="a parameter to change (a Python literal); the defaults otherwise")
    ap.add_argument("--top", type=int, default=5, help="how many of the slowest cells to list")
    ap.add_argument("--out", type=Path, help="also write the rows to this JSON file")
    args = ap.parse_args()
    params = {}
    for p in args.param:
        name, _, value = p.partition("=")
        try:
            params[name] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            ap.error(f"--param {p}: the value must be a Python literal (a number, a string in quotes, a list)")
    for stem in args.notebooks:  # every name checked before the first (long) run
        try:
            nbrun.notebook_path(stem)
        except PicklescopeError as exc:
            ap.error(str(exc))
    rows = []
    for stem in args.notebooks:
        row = time_notebook(stem, params, args.top, REPO / "out" / "notebook_time")
        rows.append(row)
        print(json.dumps(row, indent=1), flush=True)
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")
    return 0 if all(r["outcome"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
