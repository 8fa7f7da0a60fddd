"""Full-page screenshots of every executed notebook and of the report, for a reviewer without Lab.

``python scripts/screenshots.py [--small] [--only 01,02] [--out out/screenshots]``

Each notebook of ``notebooks/`` is executed headless (papermill, through :mod:`picklescope.views.nbrun`,
at its own default parameters, or tiny ones with ``--small``) into ``out/screenshots/``, exported
as offline HTML (:mod:`picklescope.views.offline_html`: figures inline), and opened in Debian's Chromium
under Playwright, driven by its executable path with the same headless flags as the browser test;
the whole page is captured as ``NN_name.png``. The page is as wide as a notebook's cells are in
JupyterLab in a 1400 px window with the file browser open (``LAB_PAGE_WIDTH``), so a table or figure
too wide for Lab is too wide here as well. The postmortem's ``report.html`` (written by notebook
05 into its ``out_dir``) is captured as ``report.png``. An exported page cannot hold a live widget,
so the explorer of notebook 04 is also run in a real JupyterLab at that window size and captured
after one run (``04_explorer.png``). Everything lands under ``out/``, which git ignores, so the
checkout stays clean.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
TINY = {"workload": "tiny", "scale": 1.0}
# Lab's output cells are 968 px wide in a 1400 px window with the file browser open (measured by
# tests/test_browser.py, all_notebooks.json); nbconvert's page adds 122 px around its cells
LAB_PAGE_WIDTH = 968 + 122
SMALL = {
    "01_reproduce_the_oom": TINY,
    "02_step_through_getstate": {**TINY, "codecs": ["numpy-legacy", "numpy"]},
    "03_allocation_timelines": {**TINY, "cycle_mib": 8, "show_ray": False},
    "04_switch_codecs_confirm_fix": TINY,
    "05_postmortem_template": {**TINY, "headroom": False},
}


def execute(stem: str, out: Path, small: bool) -> Path:
    """Run one notebook with its parameters into ``out``; returns the HTML export."""
    from picklescope.views import nbrun
    from picklescope.views.offline_html import export_html
    from picklescope.views.postmortem import as_document

    params = dict(SMALL.get(stem, {})) if small else {}
    if stem == "05_postmortem_template":
        params["out_dir"] = str(out / "postmortem")
    nb = nbrun.execute(nbrun.notebook_path(stem), out / f"{stem}.ipynb", params, cwd=out, timeout_s=1800)
    html = out / f"{stem}.html"
    if stem == "05_postmortem_template":  # as `picklescope postmortem` exports it: a document, no prompts
        export_html(as_document(nb), html, prompts=False)
    else:
        export_html(nb, html)
    return html


def shoot(pages: list[tuple[Path, Path]], work: Path) -> None:
    """Open each HTML page in Chromium and save a full-page screenshot."""
    from browser_lab import browser_unavailable, chromium

    why = browser_unavailable()
    if why:
        raise SystemExit(f"screenshots need a browser: {why}")
    with chromium(work, viewport=(LAB_PAGE_WIDTH, 1000)) as browser:
        for html, png in pages:
            page = browser.context.new_page()
            # a page with plotly.js inline is large: on a busy machine its load event can take minutes
            page.goto(html.as_uri(), wait_until="load", timeout=300_000)
            page.wait_for_timeout(1500)  # plotly draws after load
            page.screenshot(path=str(png), full_page=True)
            page.close()
            print(f"wrote {png.relative_to(REPO) if png.is_relative_to(REPO) else png}")


def explorer_in_lab(out: Path, work: Path, small: bool) -> Path:
    """Notebook 04's explorer, run once in JupyterLab (1400 px, file browser open); its screenshot."""
    import re

    import nbformat
    from browser_lab import LAB_SETTINGS, LAB_WIDTH, chromium, file_browser_open, lab_server
    from test_browser_views import _open, _press_and_wait, _run_all, _wait_kernel_idle

    root = work / "lab-root"
    root.mkdir(parents=True, exist_ok=True)
    params = TINY if small else {"workload": "flowgrpo", "scale": 0.1}  # notebook 04's own defaults
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from picklescope.views.widgets import Explorer\n"
        f"explorer = Explorer(codec='numpy-legacy', workload={params['workload']!r}, scale={params['scale']!r})\n"
        "explorer")], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, str(root / "explorer.ipynb"))
    png = out / "04_explorer.png"
    with lab_server(root, work / "lab", user_settings=LAB_SETTINGS) as server, \
            chromium(work, viewport=(LAB_WIDTH[0], 1300)) as browser:
        page = browser.context.new_page()
        page.goto(server.url("lab"))
        _open(page, "explorer.ipynb")
        file_browser_open(page)
        _wait_kernel_idle(page, 180)
        _run_all(page, 300)
        codec_label = page.locator("label", has_text=re.compile(r"^\s*codec\s*$"))
        explorer = page.locator(".jp-OutputArea-output").filter(has=page.locator(".widget-dropdown", has=codec_label))
        got = _press_and_wait(page, explorer.first, 1, "numpy-legacy")
        page.locator(".jp-NotebookPanel .jp-Cell").first.evaluate("el => el.scrollIntoView({block: 'start'})")
        page.wait_for_timeout(500)
        page.screenshot(path=str(png))
        server.remember_children()
    print(f"wrote {png.relative_to(REPO) if png.is_relative_to(REPO) else png}: press to final figure "
          f"{got['press_to_final_figure_s']} s" + (f" ({got['problem']})" if got["problem"] else ""))
    return png


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(REPO / "out" / "screenshots"))
    ap.add_argument("--small", action="store_true", help="tiny workloads (fast), not the notebooks' defaults")
    ap.add_argument("--only", default="", help="comma-separated notebook number prefixes, e.g. 01,02")
    args = ap.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    stems = sorted(p.stem for p in (REPO / "notebooks").glob("*.py"))
    if args.only:
        stems = [s for s in stems if s.split("_")[0] in args.only.split(",")]
    pages = []
    for stem in stems:
        t0 = time.monotonic()
        html = execute(stem, out, args.small)
        print(f"executed {stem} in {time.monotonic() - t0:.0f} s")
        pages.append((html, out / f"{stem}.png"))
    report = out / "postmortem" / "report.html"
    if report.is_file():
        pages.append((report, out / "report.png"))
    shoot(pages, out / "browser")
    if any(s.startswith("04") for s in stems):
        explorer_in_lab(out, out / "browser", args.small)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
