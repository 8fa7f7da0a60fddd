"""A real browser drives JupyterLab: the notebooks work where users use them.

Executing notebooks headless proves the code runs, not that an engineer sees a working explorer:
the widget front ends, plotly's rendering and jupytext's ``.py``-as-notebook opening can each fail
only in a browser. So this test starts ``jupyter lab`` with throwaway settings, opens
``04_switch_codecs_confirm_fix`` from its ``.py`` file as a notebook, runs it, switches the
explorer from ``numpy`` to ``numpy-legacy`` and checks what appears on screen; then it opens the
postmortem page exported from ``05_postmortem_template`` with the network blocked and checks that
its figure draws. Screenshots go to ``tests/output/browser/`` (or ``$PICKLESCOPE_BROWSER_OUTPUT``).

Without Chromium or Playwright the tests are skipped with the reason, except under CI
(``CI=true``), where a missing browser is a failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import subprocess
import sys
import time
from pathlib import Path

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
from notebook_params import LAB_PARAMETERS, small_copy  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
EXPLORER_NB = NOTEBOOKS / "04_switch_codecs_confirm_fix.py"
POSTMORTEM_NB = NOTEBOOKS / "05_postmortem_template.py"
KERNEL_READY_S = 120
RUN_ALL_S = 240
RUN_S = 180
_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


@pytest.fixture
def output_dir() -> Path:
    OUTPUT.mkdir(parents=True, exist_ok=True)
    return OUTPUT


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _bytes(text: str) -> int:
    """'234.5 MiB 2.05x' -> bytes of the first size in the cell."""
    m = re.search(r"([\d.]+)\s*(B|KiB|MiB|GiB|TiB)\b", text)
    assert m, f"no size in table cell {text!r}"
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def _table(explorer) -> list[dict[str, str]]:
    """The explorer's comparison table as rows of header -> cell text."""
    table = explorer.locator("table.picklescope-runs")
    if table.count() == 0:
        return []
    heads = [h.strip() for h in table.first.locator("thead th").all_text_contents()]
    rows = []
    for tr in table.first.locator("tbody tr").all():
        cells = [c.strip() for c in tr.locator("td").all_text_contents()]
        rows.append(dict(zip(heads, cells)))
    return rows


# The graph div of plotly.js carries its data and layout; read what is drawn, not what was sent.
_FIGURE_JS = """el => {
  const gd = el.querySelector('.js-plotly-plot');
  if (!gd || !gd.data) return null;
  const num = v => (typeof v === 'number' && isFinite(v)) ? v : null;
  const ys = t => Array.from(t.y || []).map(num).filter(v => v !== null);
  const title = gd.layout && gd.layout.title ? (gd.layout.title.text || gd.layout.title) : '';
  const notes = ((gd.layout && gd.layout.annotations) || []).map(a => String(a.text || ''));
  return {
    title: String(title || ''),
    annotations: notes,
    traces: gd.data.map(t => ({name: String(t.name || ''), n: ys(t).length,
                              ymax: ys(t).length ? Math.max(...ys(t)) : null,
                              visible: t.visible === undefined ? true : t.visible})),
    drawn: gd.querySelectorAll('.scatterlayer .trace, .barlayer .trace, g.table .table-control-view').length,
    text: gd.textContent || '',
  };
}"""


def _open_as_notebook(page, name: str) -> None:
    """Double-click ``name`` in the file browser, as a user would; jupytext must open it as a notebook."""
    item = page.locator(".jp-DirListing-item", has_text=name)
    item.wait_for(timeout=60_000)
    item.dblclick()
    opened = page.locator(".jp-NotebookPanel, .jp-FileEditor").first
    opened.wait_for(timeout=30_000)
    assert page.locator(".jp-NotebookPanel").count() == 1, (
        f"double-clicking {name} opened a text editor, not a notebook: jupytext's default viewer is missing")


def _wait_kernel_idle(page, timeout_s: float) -> None:
    """Wait for the status bar's kernel item to say Idle (connected and ready, not just the dot)."""
    dialog = page.locator(".jp-Dialog", has_text="Select Kernel")
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if dialog.count():  # a notebook without kernel metadata asks; the default is this Python
            dialog.locator("button.jp-mod-accept").click()
        if page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle\b")).count():
            return
        time.sleep(0.25)
    raise AssertionError(f"kernel not idle within {timeout_s:.0f}s; status bar: "
                         f"{page.locator('.jp-StatusBar-Widget').all_inner_texts()}")


def _finished_leftovers(*runs) -> list[str]:
    """Processes of the server/browser ``runs`` (or Jupyter/Chromium children of this test) still alive.

    Checked twice over: every process each run recorded (kernels detach from the server, so they
    would not show up as our descendants once orphaned), and this test's own descendants by name.
    """
    def left() -> list[str]:
        return sorted({*leftover_processes(), *(p for r in runs for p in r.leftovers())})

    deadline = time.monotonic() + 10
    found = left()
    while found and time.monotonic() < deadline:
        time.sleep(0.5)
        found = left()
    return found


def _sender_peak_in_figure(figure: dict | None) -> int | None:
    """The exact sender peak the figure's subplot title shows ("sender: peaked at 93.1 MiB ...")."""
    for note in (figure or {}).get("annotations", []):
        m = re.match(r"\s*sender: peaked at ([\d.]+) MiB", note)
        if m:
            return int(float(m.group(1)) * _UNITS["MiB"])
    return None


_RECORD_STATUS_JS = """el => {
    el.__statuses = [];
    new MutationObserver(() => el.__statuses.push(el.textContent)).observe(
        el, {childList: true, subtree: true, characterData: true});
}"""


def _status(explorer) -> str:
    """The explorer's status line (the HTML widget beside the run button)."""
    status = explorer.locator(".widget-html").first  # the controls have none; the table comes after it
    return (status.text_content() or "").strip() if status.count() else ""


def _budgeted_kill(page, explorer, run_button, output_dir: Path) -> dict:
    """Type 0.5 into the budget slider's readout, run numpy-legacy, return the new row and status."""
    label = page.locator("label", has_text=re.compile(r"sender budget"))
    slider = explorer.locator(".widget-slider", has=label)
    readout = slider.locator(".widget-readout")
    readout.click()
    page.keyboard.press("Control+A")
    page.keyboard.type("0.5")
    page.keyboard.press("Enter")
    page.wait_for_timeout(500)
    n = len(_table(explorer))
    run_button.click()
    deadline = time.monotonic() + RUN_S
    busy = explorer.locator("button.jupyter-button", has_text=re.compile(r"running"))
    while len(_table(explorer)) <= n or busy.count():
        assert time.monotonic() < deadline, f"no budgeted row within {RUN_S}s; status: {_status(explorer)}"
        time.sleep(0.5)
    explorer.screenshot(path=str(output_dir / "explorer_budget_kill.png"))
    return {"readout": readout.text_content(), "row": _table(explorer)[-1], "status": _status(explorer)}


def _drive_explorer(page, server, output_dir: Path) -> dict:
    """Open notebook 04, run it, switch the explorer to numpy-legacy and run; returns what was seen."""
    page.goto(server.url("lab"))
    _open_as_notebook(page, EXPLORER_NB.name)
    _wait_kernel_idle(page, KERNEL_READY_S)

    page.locator(".lm-MenuBar-item", has_text="Run").click()
    page.locator(".lm-Menu-item", has_text=re.compile(r"^Run All Cells")).click()
    t_run_all = time.monotonic()
    wait_cells_done(page, RUN_ALL_S)
    run_all_s = time.monotonic() - t_run_all
    server.remember_children()

    # ``has`` locators match inside each candidate, so the label locator is relative.
    codec_label = page.locator("label", has_text=re.compile(r"^\s*codec\s*$"))
    codec_box = page.locator(".widget-dropdown", has=codec_label)
    explorer = page.locator(".jp-OutputArea-output").filter(has=codec_box).last
    explorer.wait_for(timeout=30_000)
    codec = explorer.locator(".widget-dropdown", has=codec_label).locator("select")
    run_button = explorer.locator("button.jupyter-button", has_text=re.compile(r"^\s*run\s*$"))
    run_button.wait_for(timeout=RUN_S * 1000)  # a run started by the notebook itself must end first
    start_codec = codec.input_value()

    rows0 = _table(explorer)
    figure0 = explorer.evaluate(_FIGURE_JS)
    codec.select_option("numpy-legacy")
    # every text the status line takes, however briefly (a 47 MiB consolidate lasts a few ms)
    explorer.locator(".widget-html").first.evaluate(_RECORD_STATUS_JS)
    run_button.click()
    t_click = time.monotonic()
    deadline = t_click + RUN_S
    during: list[dict[str, str]] = []  # what the status line and the figure said while the run went
    # while a run goes the button reads "running..." (so ``run_button`` matches nothing): poll that one
    busy = explorer.locator("button.jupyter-button", has_text=re.compile(r"running"))
    while len(_table(explorer)) <= len(rows0) or busy.count():
        assert time.monotonic() < deadline, (
            f"no new row within {RUN_S}s; status: {explorer.locator('.widget-html').all_text_contents()}")
        if busy.count():
            fig = explorer.evaluate(_FIGURE_JS) or {}
            status = _status(explorer)
            if busy.count():  # still running after the reads: what they saw was said during the run
                during.append({"status": status, "title": fig.get("title", "")})
        time.sleep(0.2)
    rows1 = _table(explorer)
    recorded = [t.strip() for t in explorer.locator(".widget-html").first.evaluate("el => el.__statuses || []")]
    # the run's texts, then its verdict: nothing before the verdict may skip "running", nothing after it differs
    cut = next((i for i, t in enumerate(recorded) if "running" not in t), len(recorded))
    assert len(set(recorded[cut:])) <= 1, f"the status changed after the run had ended: {recorded[cut:]}"
    during += [{"status": t, "title": ""} for t in recorded[:cut]]
    # The figure is updated in place from the kernel; wait until it shows the finished run's peak.
    want = _bytes(rows1[-1].get("sender peak", "")) if rows1[-1].get("sender peak", "-") != "-" else None
    figure1 = explorer.evaluate(_FIGURE_JS)
    while time.monotonic() < deadline and not (
            figure1 and "numpy-legacy" in figure1["title"] and _sender_peak_in_figure(figure1) is not None
            and want is not None and abs(_sender_peak_in_figure(figure1) - want) <= 0.11 * 2**20 + want / 200):
        time.sleep(0.5)
        figure1 = explorer.evaluate(_FIGURE_JS)
    run_s = time.monotonic() - t_click
    server.remember_children()

    explorer.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_timeout(300)
    page.screenshot(path=str(output_dir / "explorer_numpy-legacy_page.png"))
    explorer.screenshot(path=str(output_dir / "explorer_numpy-legacy.png"))
    killed = _budgeted_kill(page, explorer, run_button, output_dir)
    seen = {"start_codec": start_codec, "rows_before": rows0, "rows_after": rows1, "figure_before": figure0,
            "figure_after": figure1, "run_all_s": round(run_all_s, 1), "numpy_legacy_run_s": round(run_s, 1),
            "during_run": during, "budgeted_kill": killed}
    (output_dir / "explorer_state.json").write_text(json.dumps(seen, indent=2))
    return seen


def test_explorer_switches_codec_in_jupyterlab(output_dir, tmp_path):
    require_browser()
    assert EXPLORER_NB.is_file(), f"{EXPLORER_NB.relative_to(REPO)} does not exist"
    before_sha = _sha(EXPLORER_NB)
    console: list[str] = []
    with lab_server(NOTEBOOKS, tmp_path / "lab", user_settings=LAB_SETTINGS) as server, \
            chromium(tmp_path, viewport=(1500, 2000)) as browser:  # tall: the whole explorer in one shot
        page = browser.context.new_page()
        page.on("console", lambda m: console.append(f"{m.type}: {m.text}"))
        page.on("pageerror", lambda e: console.append(f"pageerror: {e}"))
        try:
            seen = _drive_explorer(page, server, output_dir)
        except BaseException:
            with contextlib.suppress(Exception):  # keep the original error if the page is gone too
                page.screenshot(path=str(output_dir / "explorer_FAILED.png"))
            raise
        finally:
            (output_dir / "explorer_console.log").write_text("\n".join(console))
            (output_dir / "jupyter-lab.log").write_text(server.log())

    seen["processes_stopped"] = {"jupyter server and what it spawned": 1 + len(server.spawned),
                                 "playwright driver and chromium": len(browser.procs)}
    (output_dir / "explorer_state.json").write_text(json.dumps(seen, indent=2))
    assert _finished_leftovers(server, browser) == [], "processes the test started are still running"
    assert _sha(EXPLORER_NB) == before_sha, "the browser session changed the notebook's .py file"

    # The explorer opened on numpy; the table gained one row: numpy-legacy, with the higher sender peak.
    assert seen["start_codec"] == "numpy", f"the explorer started on {seen['start_codec']!r}, not numpy"
    rows0, rows1 = seen["rows_before"], seen["rows_after"]
    assert len(rows1) == len(rows0) + 1, (rows0, rows1)
    new = rows1[-1]
    assert new["codec"] == "numpy-legacy", new
    assert new["outcome"].startswith("ok"), new
    fixed = [r for r in rows1[:-1] if r.get("codec") == "numpy"]
    assert fixed, f"no numpy row to compare with in the table: {rows1}"
    legacy_peak = _bytes(new["sender peak"])
    assert all(legacy_peak > _bytes(r["sender peak"]) for r in fixed), (new, fixed)

    # The plot shows the new run: plotly.js holds and draws new traces, titled for numpy-legacy,
    # with the same exact sender peak as the table's new row.
    figure0, figure1 = seen["figure_before"], seen["figure_after"]
    assert figure1 is not None and figure1["traces"], f"no plotly figure in the explorer: {figure1}"
    assert figure1["drawn"] > 0 and any(t["n"] > 0 for t in figure1["traces"]), figure1
    assert figure1 != figure0, "the figure did not change after the numpy-legacy run"
    assert "numpy-legacy" in figure1["title"], f"the figure's title does not name numpy-legacy: {figure1['title']}"
    shown = _sender_peak_in_figure(figure1)
    assert shown is not None and abs(shown - legacy_peak) <= 0.11 * 2**20 + legacy_peak / 200, (
        f"the figure shows sender peak {shown}, the table {new['sender peak']}")

    # While the run went, nothing said "ok" and the status named a side's current step.
    during = seen["during_run"]
    assert during, "the run ended before the status could be read"
    for d in during:
        assert "running" in d["status"] and not re.search(r"\bok\b", d["status"] + " " + d["title"]), d
    steps = r"(consolidate|pickle\.dumps|__getstate__|to_numpy|handoff|pickle\.loads|__setstate__|frombuffer)"
    assert any(re.search(r"(sender|receiver): " + steps, d["status"]) for d in during), during

    # A budgeted kill: the row and the status show the step, the memory at death and the budget.
    killed = seen["budgeted_kill"]
    row = killed["row"]
    assert row["outcome"].startswith("oom-killed"), killed
    assert re.search(r"killed in consolidate at [\d.]+ MiB", row["sender peak"]) and "budget" in row["sender peak"], row
    assert re.search(r"killed in consolidate at [\d.]+ MiB", killed["status"]) and "budget" in killed["status"], killed


def _postmortem_pages(out: Path) -> list[Path]:
    """Every HTML page the postmortem export (``picklescope postmortem``, run once per session by the
    ``postmortem_export`` fixture of tests/conftest.py) wrote."""
    pages = sorted(out.rglob("*.html"))
    assert out / "postmortem.html" in pages, f"picklescope postmortem wrote no postmortem.html, only {pages}"
    return pages


# Every plotly graph div on the page: how many traces plotly.js holds, and how many it drew.
_PAGE_FIGURES_JS = """() => Array.from(document.querySelectorAll('.js-plotly-plot')).map(gd => ({
    traces: (gd.data || []).length,
    drawn: gd.querySelectorAll('.scatterlayer .trace, .barlayer .trace, g.table .table-control-view').length,
    svg: gd.querySelectorAll('.main-svg').length}))"""


def test_postmortem_html_renders_offline(output_dir, tmp_path, postmortem_export):
    require_browser()
    assert POSTMORTEM_NB.is_file(), f"{POSTMORTEM_NB.relative_to(REPO)} does not exist"
    pages = _postmortem_pages(postmortem_export)
    seen: dict[str, dict] = {}

    with chromium(tmp_path) as browser:
        for path in pages:
            attempted: list[str] = []
            errors: list[str] = []

            def block(route, attempted=attempted) -> None:
                """Let the page's own file through; record and refuse everything else."""
                if route.request.url.startswith("file:"):
                    route.continue_()
                else:
                    attempted.append(route.request.url)
                    route.abort("internetdisconnected")

            page = browser.context.new_page()
            page.route("**/*", block)
            page.on("pageerror", lambda e, errors=errors: errors.append(str(e)))
            page.goto(path.as_uri(), wait_until="load")
            try:
                page.locator(".js-plotly-plot .main-svg").first.wait_for(timeout=30_000)
            except Exception as exc:
                errors.append(f"no plotly figure drew within 30 s: {exc}")
            figures = page.evaluate(_PAGE_FIGURES_JS)
            if figures:
                page.locator(".js-plotly-plot").first.evaluate("el => el.scrollIntoView({block: 'start'})")
            page.screenshot(path=str(output_dir / f"{path.stem}_offline.png"))
            seen[path.name] = {"page": str(path), "figures": figures, "blocked_requests": attempted,
                               "page_errors": errors}
            page.close()
    (output_dir / "postmortem_offline.json").write_text(json.dumps(seen, indent=2))
    assert _finished_leftovers(browser) == [], "processes the test started are still running"

    for name, got in seen.items():
        figures = got["figures"]
        assert figures, f"{name}: no plotly figure on the page"
        assert all(f["traces"] > 0 and f["drawn"] > 0 and f["svg"] > 0 for f in figures), (name, figures)
        assert got["blocked_requests"] == [], f"{name} tried to reach the network: {got['blocked_requests']}"
        assert got["page_errors"] == [], f"{name} raised: {got['page_errors']}"




def _git_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO, capture_output=True,
                          text=True, check=True).stdout


def _new_files_not_ignored(folder: Path, before: set[str]) -> list[str]:
    """Files that appeared in ``folder`` (a copy of notebooks/) that git would not ignore in notebooks/."""
    new = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    new = [n for n in new if n not in before]
    return [n for n in new if subprocess.run(["git", "check-ignore", "-q", "--no-index", f"notebooks/{n}"],
                                             cwd=REPO).returncode != 0]


def _legacy_stepthrough_first_row(page) -> str:
    """Text of the first body row of notebook 02's legacy __getstate__ step-through table."""
    out = page.locator(".jp-OutputArea-output").filter(has_text="NumpyLegacyCodec.getstate").filter(
        has=page.locator("table")).first
    out.wait_for(timeout=30_000)
    return out.locator("table tbody tr").first.text_content() or ""


def _tables_that_do_not_fit(page) -> dict:
    """Scroll through the notebook (Lab renders only cells near the view) and collect every table wider
    than its output cell; also how many tables there are and how wide an output cell is."""
    cells = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Cell")  # the notebook in front
    wide: list = []
    for k in range(cells.count()):
        cells.nth(k).scroll_into_view_if_needed()
        wide += [w for w in page.evaluate(WIDE_TABLES_JS) if w not in wide]
    tables = page.evaluate("() => document.querySelectorAll('.jp-NotebookPanel .jp-OutputArea-output table').length")
    width = page.evaluate("() => { const o = document.querySelector('.jp-NotebookPanel .jp-OutputArea-output');"
                          " return o ? Math.round(o.getBoundingClientRect().width) : null; }")
    return {"wide": wide, "tables": tables, "cell_width": width}


def _close_tab(page) -> None:
    """Shut the notebook's kernel down and close its tab, discarding nothing a save has not written."""
    page.locator(".lm-MenuBar-item", has_text="Kernel").click()
    page.locator(".lm-Menu-item", has_text=re.compile(r"^Shut Down Kernel")).click()
    page.wait_for_timeout(1000)
    page.locator(".lm-MenuBar-item", has_text="File").click()
    page.locator(".lm-Menu-item", has_text=re.compile(r"^Close Tab")).click()
    dialog = page.locator(".jp-Dialog")
    if dialog.count():
        dialog.locator("button", has_text=re.compile("Discard|Don't Save|No")).first.click()
    page.wait_for_timeout(500)


def test_every_notebook_shows_its_outputs_in_lab_saves_back_and_leaves_the_checkout_clean(
        output_dir, tmp_path, executed_notebooks, postmortem_export):
    """Open each notebook's executed copy in Lab and look at it as a person does; open each notebook's
    ``.py``, save it (Ctrl+S) and close it: saving writes each ``.py`` back byte for byte, no tracked file
    changes, nothing new appears outside ignored folders; notebook 02's legacy table leads with the
    consolidate line; and at 1400 px with the file browser open (Lab's default) no table is wider than
    the output cell it sits in (what a user would have to scroll sideways to read).

    The notebooks run once per suite: ``executed_notebooks`` (tests/conftest.py) runs them headless at
    the small parameters of tests/notebook_params.py, and the headless tests check what they printed; the
    postmortem notebook is the one ``postmortem_export`` ran. Lab opens those executed notebooks, signed
    as trusted (as a person's own run is), so their HTML and figures render as they did for them; the
    explorer's live widgets are driven in Lab by ``test_explorer_switches_codec_in_jupyterlab``. Lab opens
    a copy of notebooks/ whose parameters cells hold the same small values; whatever Lab writes into the
    copy must be what git ignores in notebooks/."""
    require_browser()
    import nbformat
    from nbformat.sign import NotebookNotary

    before = _git_status()  # the tree may hold others' work in progress: compare, do not demand empty
    shas = {p.name: _sha(p) for p in sorted(NOTEBOOKS.glob("*.py"))}
    assert {Path(n).stem for n in shas} == set(LAB_PARAMETERS), "a notebook has no small parameters"
    failed = {stem: repr(nb) for stem, nb in executed_notebooks.results.items() if isinstance(nb, Exception)}
    assert failed == {}, f"notebooks that did not run headless (see their headless tests): {failed}"
    folder = small_copy(NOTEBOOKS, tmp_path / "notebooks")
    copies = {p.name: _sha(p) for p in sorted(folder.glob("*.py"))}
    assert copies.keys() == shas.keys() and all(copies[n] != shas[n] for n in shas), "parameters not written"
    # the executed notebooks, in a folder of their own (a same-named .ipynb beside a .py is jupytext's pair)
    shown = folder / "executed"
    shown.mkdir()
    (tmp_path / "lab" / "data").mkdir(parents=True)  # the server's own JUPYTER_DATA_DIR (lab_environment)
    notary = NotebookNotary(data_dir=str(tmp_path / "lab" / "data"))
    sources = {Path(n).stem: executed_notebooks.folder / f"{Path(n).stem}.ipynb" for n in shas}
    sources[Path(POSTMORTEM_NB).stem] = postmortem_export / "postmortem.ipynb"
    for stem, src in sources.items():
        nb = nbformat.read(src, as_version=4)
        notary.sign(nb)
        nbformat.write(nb, shown / f"{stem}.ipynb")
    in_copy = {p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()}
    settings = {**LAB_SETTINGS, "@jupyterlab/docmanager-extension:plugin": {"autosave": False}}
    seen: dict[str, dict] = {}
    with lab_server(folder, tmp_path / "lab", user_settings=settings) as server, \
            chromium(tmp_path, viewport=LAB_WIDTH) as browser:
        page = browser.context.new_page()
        for name in shas:
            stem = Path(name).stem
            page.goto(server.url(f"lab/tree/executed/{stem}.ipynb?reset"))  # ?reset: no tab of the last one
            page.locator(".jp-NotebookPanel").first.wait_for(timeout=60_000)
            assert file_browser_open(page), "the file browser was not open beside the notebook"
            _wait_kernel_idle(page, KERNEL_READY_S)
            seen[name] = {"parameters": LAB_PARAMETERS[stem]}
            if stem.startswith("02_"):
                seen[name]["legacy_first_row"] = _legacy_stepthrough_first_row(page)
            seen[name].update(_tables_that_do_not_fit(page))
            page.screenshot(path=str(output_dir / f"{stem}_lab_{LAB_WIDTH[0]}.png"))
            server.remember_children()
            _close_tab(page)
        page.goto(server.url("lab?reset"))  # no tab restored from the last page
        for name in shas:
            _open_as_notebook(page, name)
            _wait_kernel_idle(page, KERNEL_READY_S)
            server.remember_children()
            page.keyboard.press("Control+s")  # what a user does; jupytext writes the .py back
            page.wait_for_timeout(1500)
            _close_tab(page)
    (output_dir / "all_notebooks.json").write_text(json.dumps(seen, indent=2))
    assert _finished_leftovers(server, browser) == [], "processes the test started are still running"
    assert {p: _sha(NOTEBOOKS / p) for p in shas} == shas, "running or saving a notebook changed its .py file"
    assert {p: _sha(folder / p) for p in copies} == copies, "saving a notebook in Lab did not write its .py back"
    stray = _new_files_not_ignored(folder, in_copy)
    assert stray == [], f"opening the notebooks in Lab wrote files that git would not ignore in notebooks/: {stray}"
    # On a clean checkout `git status --porcelain` stays empty. Other work in the tree may change it
    # meanwhile, so what must not appear is anything the notebooks could have written.
    after = _git_status()
    if not before:  # a clean checkout (CI's fresh clone) must stay exactly clean
        assert after == "", f"the notebooks changed the checkout: {after.splitlines()}"
    new = set(after.splitlines()) - set(before.splitlines())
    ours = [e for e in new if "notebooks/" in e or e.endswith((".html", ".json", ".ipynb", ".png"))]
    assert ours == [], f"the notebooks left files in the checkout: {ours}"
    assert "without encryption" not in server.log(), "a kernel warned that it runs over TCP without encryption"
    assert sum(s["tables"] for s in seen.values()) > 0, "no table was rendered in any notebook"
    wide = {n: s["wide"] for n, s in seen.items() if s["wide"]}
    assert wide == {}, f"tables wider than their cell at {LAB_WIDTH[0]} px: {wide}"
    first = seen["02_step_through_getstate.py"]["legacy_first_row"]
    assert "consolidate()" in first, f"the legacy step-through table does not lead with consolidate: {first!r}"
