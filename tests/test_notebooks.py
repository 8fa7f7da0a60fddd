"""Every notebook executes headless with tiny parameters; the postmortem exports to offline HTML;
JupyterLab serves the notebooks' .py files as notebooks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import jupytext
import pytest

from picklescope import cli, nbrun
from picklescope.offline_html import external_references

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from browser_lab import lab_server  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
TINY = {"workload": "tiny", "scale": 1.0}
PARAMETERS = {
    "01_reproduce_the_oom": TINY,
    "02_step_through_getstate": {**TINY, "codecs": ["numpy-legacy", "numpy"]},
    "03_allocation_timelines": {**TINY, "cycle_mib": 8},
    "04_switch_codecs_confirm_fix": TINY,
    # 05 runs through `picklescope postmortem` below, as a user runs it
}
POSTMORTEM = "05_postmortem_template"
CHROMIUM = Path(os.environ.get("PICKLESCOPE_CHROMIUM", "/usr/bin/chromium"))


def _stdout(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stdout")


def test_every_notebook_is_parameterized_and_tested():
    stems = sorted(p.stem for p in NOTEBOOKS.glob("*.py"))
    assert stems == sorted([*PARAMETERS, POSTMORTEM])
    for stem in stems:
        nb = jupytext.read(NOTEBOOKS / f"{stem}.py")
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code[0].metadata.get("tags") == ["parameters"], stem
        assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# "), stem
        params = dict(PARAMETERS.get(stem, {}))
        for name in params:
            assert f"{name} = " in code[0].source, f"{stem} has no parameter {name}"


@pytest.fixture(scope="module")
def executed(tmp_path_factory):
    """All notebooks run once, two at a time (each in its own kernel; the machine has two cores)."""
    from concurrent.futures import ThreadPoolExecutor

    out = tmp_path_factory.mktemp("notebooks")

    def one(stem: str):
        try:
            return nbrun.execute(NOTEBOOKS / f"{stem}.py", out / f"{stem}.ipynb", PARAMETERS[stem], timeout_s=600)
        except Exception as exc:  # reported by the test of that notebook
            return exc

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(PARAMETERS, pool.map(one, PARAMETERS)))


@pytest.mark.parametrize("stem", list(PARAMETERS))
def test_notebook_executes_headless(stem, executed):
    nb = executed[stem]
    if isinstance(nb, Exception):
        raise nb
    out = _stdout(nb)
    if stem == "01_reproduce_the_oom":
        assert "verdicts: {'numpy-legacy': 'oom-killed', 'numpy': 'ok'}" in out
        assert "numpy-legacy: oom-killed on the sender in step consolidate" in out
    elif stem == "02_step_through_getstate":
        legacy = next(line for line in out.splitlines() if "numpy-legacy __getstate__" in line)
        assert "consolidate()" in legacy
        assert "step 3 of" in out  # the step reveal was clicked three times
    elif stem == "03_allocation_timelines":
        assert "in step consolidate (sender)" in out  # memray's largest row
        assert "gc.collect() freed 24 MiB" in out  # three 8 MiB consolidates, freed only by the collector
    elif stem == "04_switch_codecs_confirm_fix":
        assert "round trip exact" in out and "+1.00x payload lower than numpy-legacy" in out
        assert "<b>" not in out  # the explorer's status line is displayed, not printed as raw HTML
        status = [o["data"] for c in nb.cells for o in c.get("outputs", [])
                  if "<b>ok</b>: numpy sender peak" in str(o.get("data", {}).get("text/html", ""))]
        assert status and "<" not in str(status[0]["text/plain"])  # rendered in Jupyter, plain elsewhere


@pytest.fixture(scope="module")
def postmortem(tmp_path_factory):
    out = tmp_path_factory.mktemp("postmortem")
    rc = cli.main(["postmortem", "--workload", "tiny", "--codecs", "numpy-legacy,numpy", "--budget", "0.5x",
                   "--scale", "1", "--no-headroom", "--out", str(out)])
    assert rc == 0
    return out


def test_postmortem_html_is_offline_with_figures_inline(postmortem):
    html = (postmortem / "postmortem.html").read_text()
    assert external_references(html) == []
    assert html.count("Plotly.newPlot(") >= 3  # two budgeted timelines and the comparison, data inline
    assert '"name":"RSS, sampled every ~1 ms"' in html.replace(": ", ":")
    assert "numpy-legacy was OOM-killed on the sender in step consolidate" in html
    assert "Postmortem: host memory spent serializing a training batch" in html
    nb = json.loads((postmortem / "postmortem.ipynb").read_text())
    assert nb["cells"][1]["metadata"]["tags"] == ["parameters"]
    assert (postmortem / "report.html").is_file() and (postmortem / "results.json").is_file()


def test_postmortem_refuses_to_overwrite(postmortem, capsys):
    rc = cli.main(["postmortem", "--workload", "tiny", "--codecs", "numpy", "--out", str(postmortem)])
    assert rc == 2 and "not empty" in capsys.readouterr().err


def _browser_missing() -> str | None:
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"playwright is not installed ({exc})"
    if not os.access(CHROMIUM, os.X_OK):
        return f"no Chromium at {CHROMIUM} (apt-get install chromium)"
    return None


def test_postmortem_html_renders_figures_with_the_network_blocked(postmortem, tmp_path):
    why = _browser_missing()
    if why:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run the browser check, but {why}")
        pytest.skip(why)
    from playwright.sync_api import sync_playwright

    requests: list[str] = []
    errors: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:")
                       else (requests.append(r.request.url), r.abort()))
            page.goto((postmortem / "postmortem.html").as_uri())
            page.wait_for_selector(".js-plotly-plot .main-svg", timeout=30_000)
            drawn = page.locator(".js-plotly-plot").count()
            traces = page.locator(".js-plotly-plot .scatterlayer .trace, .js-plotly-plot .barlayer .trace").count()
            page.screenshot(path=str(tmp_path / "postmortem.png"), full_page=True)
        finally:
            browser.close()
    assert requests == [] and errors == []
    assert drawn >= 3 and traces >= drawn


def test_jupytext_is_an_enabled_server_extension():
    jupyter = Path(sys.executable).with_name("jupyter")
    out = subprocess.run([str(jupyter), "server", "extension", "list"], capture_output=True, text=True, timeout=120)
    text = out.stdout + out.stderr
    assert "jupytext" in text and "enabled" in text.split("jupytext", 1)[1][:40], text


def test_lab_serves_the_py_files_as_notebooks(tmp_path):
    """The settings dev.py installs make .py open with jupytext's notebook viewer, and the server
    reads each notebook's .py as a notebook with its parameters cell."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("dev", REPO / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(dev)
    dev.VENV = tmp_path / "venv"  # install into a throwaway prefix, not the real venv
    dev.install_lab_settings()
    settings_dir = tmp_path / "venv" / "share" / "jupyter" / "lab" / "settings"
    assert (settings_dir / "overrides.d" / "picklescope.json").is_file()
    with lab_server(NOTEBOOKS, tmp_path / "lab", extra_args=[f"--LabApp.app_settings_dir={settings_dir}"]) as lab:
        with urllib.request.urlopen(lab.url("lab/api/settings/@jupyterlab/docmanager-extension:plugin")) as r:
            schema = json.load(r)["schema"]
        assert schema["properties"]["defaultViewers"]["default"]["python"] == "Jupytext Notebook"
        with urllib.request.urlopen(lab.url("api/contents/01_reproduce_the_oom.py?type=notebook&content=1")) as r:
            model = json.load(r)
    assert model["type"] == "notebook"
    cells = model["content"]["cells"]
    assert any(c["metadata"].get("tags") == ["parameters"] for c in cells)
    assert model["content"]["metadata"]["kernelspec"]["name"] == "python3"
