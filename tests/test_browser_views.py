"""The views as a user meets them in JupyterLab: explorers that always draw, tables that fit.

Two checks in a real ``jupyter lab`` driven by Debian's Chromium (harness: ``tests/browser_lab.py``):

- five explorers in one notebook, each run three times: after every run the figure holds a trace
  whose last x is where the status line says the run ended, and the status line and the figure's
  title name the same run (its number, codec and outcome). Each run's time from the press of
  **run** to its final figure, as the browser saw it, goes to ``explorer_times.json``.
- every notebook, executed with tiny parameters and opened in Lab at 1400 px with the file browser
  open (Lab's default): no table is wider than the cell it sits in.

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
from browser_lab import chromium, lab_server, leftover_processes, require_browser, wait_cells_done  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
OUTPUT = Path(os.environ.get("PICKLESCOPE_BROWSER_OUTPUT", REPO / "tests" / "output" / "browser"))
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
}
LAB_WIDTH = (1400, 1000)  # a laptop's browser window; the file browser stays open, as Lab opens it
CODECS = ["numpy", "numpy-legacy", "torch", "numpy", "numpy-legacy"]  # five explorers, one notebook
RUNS = 3
KERNEL_READY_S = 180
RUN_ALL_S = 300
RUN_S = 240  # one tiny run, pressed in the browser, on a loaded two-core machine
TINY = {"workload": "tiny", "scale": 1.0}
# every notebook at a size that runs in seconds (the same figures and tables as at full size)
SMALL = {
    "01_reproduce_the_oom": TINY,
    "02_step_through_getstate": {**TINY, "codecs": ["numpy-legacy", "numpy"]},
    "03_allocation_timelines": {**TINY, "cycle_mib": 8, "show_ray": False},
    "04_switch_codecs_confirm_fix": TINY,
    "05_postmortem_template": {**TINY, "headroom": False},
    "06_node_replay": {"workload": "flowgrpo", "scale": 0.05, "workers": 2, "steps": 2, "gc_modes": ["off"]},
}

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


def _file_browser_open(page) -> bool:
    """Open the left file browser if it is closed (Lab opens with it shown); True when it is shown."""
    panel = page.locator("#filebrowser")
    if not panel.is_visible():
        page.locator(".jp-SideBar [data-id='filebrowser']").first.click()
        page.wait_for_timeout(500)
    return panel.is_visible()


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

# Tables wider than the output cell they are in: what a user would have to scroll sideways to read.
_WIDE_TABLES_JS = """() => {
  const out = [];
  document.querySelectorAll('.jp-OutputArea-output table').forEach(t => {
    const cell = t.closest('.jp-OutputArea-output');
    if (!t.offsetParent || !cell) return;  // folded (details) or not rendered
    const w = t.getBoundingClientRect().width, room = cell.getBoundingClientRect().width;
    if (w > room + 1) out.push({table: (t.querySelector('thead') || t).textContent.slice(0, 120),
                                 width: Math.round(w), cell: Math.round(room)});
  });
  return out;
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
            browser_open = _file_browser_open(page)
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
            wide = page.evaluate(_WIDE_TABLES_JS)
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


def _execute_small(out: Path) -> tuple[list[Path], dict[str, str]]:
    """Every notebook executed headless with tiny parameters, saved with its outputs into ``out``.

    A notebook that fails is kept as far as it ran (papermill saves it), so its tables are checked
    too; the failures are returned (name -> error) for the test to report."""
    from papermill.exceptions import PapermillExecutionError

    from picklescope.views import nbrun

    done, failed = [], {}
    for src in sorted(NOTEBOOKS.glob("*.py")):
        params = dict(SMALL.get(src.stem, TINY))
        if src.stem == "05_postmortem_template":
            params["out_dir"] = str(out / "postmortem")
        path = out / f"{src.stem}.ipynb"
        try:
            nbrun.execute(src, path, params, cwd=out, timeout_s=900)
        except PapermillExecutionError as exc:
            failed[src.stem] = f"{exc.ename}: {str(exc.evalue).splitlines()[0][:200]}"
        if path.is_file():
            done.append(path)
    return done, failed


def test_every_notebooks_tables_fit_lab_at_1400_px(output_dir, tmp_path):
    require_browser()
    root = tmp_path / "root"
    root.mkdir()
    executed, failed = _execute_small(root)
    wide: dict[str, list] = {}
    counted: dict[str, int] = {}
    widths: dict[str, int] = {}  # an output cell's width: what a figure or table has in Lab at this size
    with lab_server(root, tmp_path / "lab", user_settings=LAB_SETTINGS) as server, \
            chromium(tmp_path, viewport=LAB_WIDTH) as browser:
        page = browser.context.new_page()
        page.goto(server.url("lab"))
        for path in executed:
            _dismiss_dialogs(page)
            _open(page, path.name)
            assert _file_browser_open(page), "the file browser was not open beside the notebook"
            page.locator(".jp-NotebookPanel .jp-OutputArea-output").first.wait_for(timeout=60_000)
            page.wait_for_timeout(1500)
            # scroll through so that Lab renders every cell (it skips cells far out of view)
            cells = page.locator(".jp-NotebookPanel .jp-Cell")
            bad: list = []
            for k in range(cells.count()):
                cells.nth(k).scroll_into_view_if_needed()
                bad += [w for w in page.evaluate(_WIDE_TABLES_JS) if w not in bad]
            counted[path.stem] = page.evaluate("() => document.querySelectorAll('.jp-OutputArea-output table').length")
            widths[path.stem] = page.evaluate(
                "() => Math.round(document.querySelector('.jp-OutputArea-output').getBoundingClientRect().width)")
            wide[path.stem] = bad
            page.screenshot(path=str(output_dir / f"{path.stem}_tables_1400.png"))
            page.locator(".lm-MenuBar-item", has_text="File").click()
            page.locator(".lm-Menu-item", has_text=re.compile(r"^Close Tab")).click()
            page.wait_for_timeout(500)
            dialog = page.locator(".jp-Dialog")
            if dialog.count():
                dialog.locator("button", has_text=re.compile("Discard|Don't Save|No")).first.click()
        server.remember_children()
    seen = {"wide": wide, "tables": counted, "cell_width": widths, "failed": failed}
    (output_dir / "tables_1400.json").write_text(json.dumps(seen, indent=2))
    assert not {*leftover_processes(), *server.leftovers(), *browser.leftovers()}, "processes left running"
    assert sum(counted.values()) > 0, "no table was rendered in any notebook"
    assert all(not v for v in wide.values()), {k: v for k, v in wide.items() if v}
    assert not failed, f"notebooks that did not run to the end (their tables up to there were checked): {failed}"
