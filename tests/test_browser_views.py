"""The views as a user meets them in JupyterLab: explorers that always draw, tables that fit.

A check in a real ``jupyter lab`` driven by Debian's Chromium (harness: ``tests/browser_lab.py``):

- five explorers in one notebook, each run three times: after every run the figure holds a trace
  whose last x is where the status line says the run ended, and the status line and the figure's
  title name the same run (its number, codec and outcome). Each run's time from the press of
  **run** to its final figure, as the browser saw it, goes to ``explorer_times.json``.

Every notebook's tables are checked against the width of their cells where the notebooks run in Lab
(``tests/test_browser.py``), so no notebook is executed a second time for it.

Without Chromium or Playwright the tests are skipped with the reason, except under CI (``CI=true``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from browser_lab import (  # noqa: E402
    LAB_SETTINGS,
    LAB_WIDTH,
    OUTPUT,
    WIDE_TABLES_JS,
    chromium,
    file_browser_open,
    lab_server,
    leftover_processes,
    require_browser,
    wait_cells_done,
)

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
CODECS = ["numpy", "numpy-legacy", "torch", "numpy", "numpy-legacy"]  # five explorers, one notebook
RUNS = 3
KERNEL_READY_S = 180
RUN_ALL_S = 300
RUN_S = 240  # one tiny run, pressed in the browser, on a loaded two-core machine

pytestmark = pytest.mark.browser


@pytest.fixture
def output_dir() -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT


def _wait_kernel_idle(page, timeout_s: float) -> None:
    """Wait for the status bar's kernel item to say Idle (accepting the kernel dialog if asked)."""
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if dialog.count():
            dialog.locator("button.jp-mod-accept").click()
        if page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle\b")).count():
            return
        time.sleep(0.25)
    raise AssertionError(f"kernel not idle within {timeout_s:.0f}s")


def _run_all(page, timeout_s: float) -> None:
    """Run All Cells and wait until every code cell has a number and the kernel is idle."""
    page.locator(".lm-MenuBar-item", has_text="Run").click()
    page.locator(".lm-Menu-item", has_text=re.compile(r"^Run All Cells")).click()
    wait_cells_done(page, timeout_s)


def _open(page, name: str) -> None:
    item = page.locator(".jp-DirListing-item", has_text=name)
    item.wait_for(timeout=60_000)
    item.dblclick()
    page.locator(".jp-NotebookPanel").first.wait_for(timeout=60_000)


# What plotly.js holds in an explorer's graph div: its title, and each trace's name and last x.
_FIGURE_JS = """el => {
  const gds = el.querySelectorAll('.js-plotly-plot');
  const gd = gds[gds.length - 1];
  if (!gd || !gd.data) return null;
  const last = t => { const xs = Array.from(t.x || []).filter(v => typeof v === 'number' && isFinite(v));
                      return xs.length ? xs[xs.length - 1] : null; };
  const title = gd.layout && gd.layout.title ? (gd.layout.title.text || gd.layout.title) : '';
  return {title: String(title || ''), plots: gds.length,
          traces: gd.data.map(t => ({name: String(t.name || ''), last_x: last(t)})),
          drawn: gd.querySelectorAll('.scatterlayer .trace').length};
}"""

_RECORD_STATUS_JS = """el => {
    el.__statuses = [];
    new MutationObserver(() => el.__statuses.push([performance.now(), el.textContent])).observe(
        el, {childList: true, subtree: true, characterData: true});
}"""

def _status(explorer) -> str:
    status = explorer.locator(".widget-html").first
    return (status.text_content() or "").strip() if status.count() else ""


_ENDED = re.compile(r"run (\d+) · (\S+) (finished|was killed|ran out|failed|could not run)[^:]*?"
                    r"(?: after ([\d.]+) s)?(?::|$)")


def _agree(status: str, figure: dict | None, number: int, codec: str) -> str | None:
    """None when the status line says run ``number`` of ``codec`` ended and the figure shows that run:
    its title names the same run, codec and outcome, and a trace ends where the status says the run
    ended (to the status line's 0.01 s). Otherwise what is wrong, for the message."""
    m = _ENDED.search(status)
    if not m or int(m.group(1)) != number or m.group(2) != codec:
        return f"status does not say run {number} of {codec} ended: {status!r}"
    if not figure or not figure["traces"]:
        return f"no trace in the figure under {status!r}: {figure}"
    title = figure["title"]
    if not title.startswith(f"run {number} · {codec} over"):
        return f"figure title {title!r} is not run {number} of {codec}"
    outcome = {"finished": "finished", "was killed": "killed"}.get(m.group(3), m.group(3))
    if outcome not in title:
        return f"status says {m.group(3)!r}, figure title says {title!r}"
    if m.group(4) is None:
        return f"status gives no end time: {status!r}"
    end = float(m.group(4))
    lasts = [t["last_x"] for t in figure["traces"] if t["last_x"] is not None]
    if not any(abs(x - end) <= 0.0051 for x in lasts):
        return f"no trace ends at {end} s (status); traces end at {sorted(set(round(x, 3) for x in lasts))}"
    if figure["drawn"] == 0:
        return "plotly holds traces but drew none"
    return None


def _explorer_notebook(path: Path) -> None:
    cells = [nbformat.v4.new_code_cell(
        "from picklescope.views.widgets import Explorer\n"
        f"explorers = [Explorer(codec=c, workload='tiny', scale=1.0) for c in {CODECS!r}]")]
    cells += [nbformat.v4.new_code_cell(f"explorers[{i}]") for i in range(len(CODECS))]
    nb = nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})
    nbformat.write(nb, str(path))


def _dismiss_dialogs(page) -> list[str]:
    """Close any dialog Lab put over the notebook (it would take the click); what they said."""
    said = []
    dialogs = page.locator(".jp-Dialog")
    for _ in range(3):
        if not dialogs.count():
            break
        said.append((dialogs.first.text_content() or "").strip()[:200])
        page.keyboard.press("Escape")
        page.wait_for_timeout(300)
    return said


def _press_and_wait(page, explorer, number: int, codec: str) -> dict:
    """Press run in ``explorer`` and wait for run ``number``'s final figure; what was seen, and when."""
    dialogs = _dismiss_dialogs(page)
    explorer.scroll_into_view_if_needed()
    run_button = explorer.locator("button.jupyter-button", has_text=re.compile(r"^\s*run\s*$"))
    run_button.wait_for(timeout=RUN_S * 1000)
    status_el = explorer.locator(".widget-html").first
    status_el.evaluate(_RECORD_STATUS_JS)
    t_click_page = explorer.evaluate("() => performance.now()")
    run_button.click()
    t_click = time.monotonic()
    empty_under_finished = 0
    problem, figure, status = "not finished", None, ""
    while time.monotonic() - t_click < RUN_S:
        status = _status(explorer)
        figure = explorer.evaluate(_FIGURE_JS)
        problem = _agree(status, figure, number, codec)
        if problem is None:
            break
        if _ENDED.search(status) and f"run {number} ·" in status and not (figure or {}).get("traces"):
            empty_under_finished += 1  # a finished status above empty axes, even for a moment
        time.sleep(0.1)
    t_final = time.monotonic()
    recorded = status_el.evaluate("el => el.__statuses || []")
    first_change = next(((t, text.strip()) for t, text in recorded if t >= t_click_page), None)
    return {"run": number, "codec": codec, "problem": problem, "status": status, "figure": figure,
            "press_to_final_figure_s": round(t_final - t_click, 2),
            "press_to_running_ms": None if first_change is None else round(first_change[0] - t_click_page),
            "first_status_after_press": None if first_change is None else first_change[1],
            "empty_under_finished": empty_under_finished, "dialogs_closed": dialogs}


def test_five_explorers_always_draw_the_run_their_status_names(output_dir, tmp_path):
    require_browser()
    root = tmp_path / "root"
    root.mkdir()
    _explorer_notebook(root / "explorers.ipynb")
    seen: list[dict] = []
    wide: list[dict] = []
    with lab_server(root, tmp_path / "lab", user_settings=LAB_SETTINGS) as server, \
            chromium(tmp_path, viewport=LAB_WIDTH) as browser:
        page = browser.context.new_page()
        try:
            page.goto(server.url("lab"))
            _open(page, "explorers.ipynb")
            browser_open = file_browser_open(page)
            _wait_kernel_idle(page, KERNEL_READY_S)
            _run_all(page, RUN_ALL_S)
            server.remember_children()
            codec_label = page.locator("label", has_text=re.compile(r"^\s*codec\s*$"))
            explorers = page.locator(".jp-OutputArea-output").filter(
                has=page.locator(".widget-dropdown", has=codec_label))
            assert explorers.count() == len(CODECS), f"{explorers.count()} explorers on the page"
            for number in range(1, RUNS + 1):
                for i, codec in enumerate(CODECS):
                    got = _press_and_wait(page, explorers.nth(i), number, codec)
                    got["explorer"] = i
                    seen.append(got)
                    server.remember_children()
                    if got["problem"] is not None:
                        explorers.nth(i).screenshot(path=str(output_dir / f"explorer_{i}_run_{number}_FAILED.png"))
            wide = page.evaluate(WIDE_TABLES_JS)
            explorers.nth(0).scroll_into_view_if_needed()
            explorers.nth(0).screenshot(path=str(output_dir / "five_explorers_first.png"))
        finally:
            with contextlib.suppress(Exception):
                (output_dir / "explorer_times.json").write_text(json.dumps(
                    {"load_average": os.getloadavg(), "runs": seen}, indent=2))
    assert not {*leftover_processes(), *server.leftovers(), *browser.leftovers()}, "processes left running"

    assert browser_open, "the file browser was not open beside the notebook"
    assert len(seen) == RUNS * len(CODECS)
    bad = [(s["explorer"], s["run"], s["problem"]) for s in seen if s["problem"] is not None]
    assert not bad, bad
    assert all(s["empty_under_finished"] == 0 for s in seen), [s for s in seen if s["empty_under_finished"]]
    # at the press the status changes to "running" first, never to anything else
    firsts = [s["first_status_after_press"] for s in seen]
    assert all(f is not None and f.startswith("running run ") for f in firsts), firsts
    assert wide == [], f"explorer tables wider than their cell at {LAB_WIDTH[0]} px: {wide}"
