"""How far does ``picklescope predict`` move between draws of its fit, against every held-out replay there is?

Each replay is one draw of the allocator's and the object store's state. ``predict_checks.py`` compares one
draw of the fit with one held-out replay; this reads several caches of replays (``PICKLESCOPE_CACHE`` folders
that ``predict_checks.py`` or ``predict`` filled, each a draw) and predicts the held-out size from each draw's
fit, cut to its first ``--fit-steps`` steps where its replays ran more, against the held-out replays of every
draw. Under the default collector the controller's growth comes from the draw's own collector-off replays
(as ``predict`` takes it from its own cache), or where the draw has none from those of ``--off`` (default: the
first cache), or, with ``--no-held``, from the default collector's replays alone.

    python benchmarks/predict_draws.py --caches DIR1,DIR2 [--off DIR] [--workload flowgrpo]
        [--codec numpy-legacy] [--gc default] [--fit-steps 6,10] [--no-held] [--out FILE]

Nothing is replayed: the figures are ratios of the cached replays' own measurements, read in this run.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
from pathlib import Path

from picklescope.investigate.predict import model as model_mod
from picklescope.investigate.predict.fit import Replay
from picklescope.investigate.predict.prediction import leaf_row_bytes, play_node
from picklescope.workloads.spec import load_workload

RESULTS = Path(__file__).resolve().parent / "results"


def cached(folder: str, workload: str, codec: str, gc: str) -> list[Replay]:
    """Every ``ok`` replay of ``codec`` under ``gc`` on ``workload`` in one cache folder."""
    out = []
    for f in sorted((Path(folder) / "predict").glob("*.json")):
        try:
            r = Replay.from_dict(json.loads(f.read_text()))
        except (TypeError, ValueError, KeyError):
            continue
        if (r.workload, r.codec, r.gc, r.outcome) == (workload, codec, gc, "ok") and r.per_step:
            out.append(r)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--caches", required=True, help="comma-separated cache folders, one draw each")
    ap.add_argument("--off", default=None, help="the cache whose collector-off replays give the growth")
    ap.add_argument("--workload", default="flowgrpo")
    ap.add_argument("--codec", default="numpy-legacy")
    ap.add_argument("--gc", default="default")
    ap.add_argument("--held-out-scale", type=float, default=0.5)
    ap.add_argument("--fit-steps", default="6")
    ap.add_argument("--no-held", action="store_true")
    ap.add_argument("--out", default=str(RESULTS / "predict_draws.json"))
    args = ap.parse_args()
    wl = load_workload(args.workload)
    rows = leaf_row_bytes(wl)
    caches = args.caches.split(",")
    held_out = [(c, r) for c in caches for r in cached(c, wl.name, args.codec, args.gc)
                if r.scale == args.held_out_scale]
    def off_model(cache: str) -> tuple[model_mod.Model | None, str | None]:
        """The collector-off fit of ``cache``, or where it has none, of ``--off``, and the folder it came from
        (None, None: ``--no-held``)."""
        if args.gc == "off" or args.no_held:
            return None, None
        for folder in (cache, args.off or caches[0]):
            reps = [r for r in cached(folder, wl.name, args.codec, "off") if r.scale != args.held_out_scale]
            if reps:
                return model_mod.fit(reps, rows), Path(folder).name
        raise SystemExit(f"no collector-off replays of {args.codec} in {cache} nor in --off")

    out = []
    for cache in caches:
        off, off_from = off_model(cache)
        fits = [r for r in cached(cache, wl.name, args.codec, args.gc) if r.scale != args.held_out_scale]
        for n in (int(s) for s in args.fit_steps.split(",")):
            if len(fits) < 2 or any(len(r.per_step) < n for r in fits):
                continue
            cut = [dataclasses.replace(r, steps=n, per_step=r.per_step[:n]) for r in fits]
            m = model_mod.fit(cut, rows, off) if off is not None else model_mod.fit(cut, rows)
            for source, h in held_out:
                played = play_node(m, wl, h.rows, h.payload_bytes, h.workers, h.steps, {}, None, 0.95,
                                   store_capacity=None, compute_s=2.0)
                pc, pn = played["peaks"]["controller"], played["node_peak"]
                mc, mn = h.controller_own_peak_bytes or 0, h.node_peak_bytes or 0
                row = {"fit_cache": Path(cache).name, "off_fit_cache": off_from, "fit_steps": n,
                       "held_out_cache": Path(source).name,
                       "release_share": round(m.release_share, 3), "payload_bytes": h.payload_bytes,
                       "node_peak": {"predicted": pn, "measured": mn,
                                     "error": round((pn - mn) / mn, 4) if mn else None},
                       "controller_peak": {"predicted": pc, "measured": mc,
                                           "error": round((pc - mc) / mc, 4) if mc else None}}
                out.append(row)
                p = h.payload_bytes
                print(f"fit {Path(cache).name} ({n} steps) vs held-out {Path(source).name}: node {pn / p:.2f}x vs "
                      f"{mn / p:.2f}x ({row['node_peak']['error']:+.1%}); controller {pc / p:.2f}x vs {mc / p:.2f}x "
                      f"({row['controller_peak']['error']:+.1%})", flush=True)
    doc = {"machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "workload": wl.name,
           "codec": args.codec, "gc": args.gc, "rows": out}
    Path(args.out).write_text(json.dumps(doc, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
