"""Every notebook executes headless with tiny parameters; the postmortem exports to offline HTML;
JupyterLab serves the notebooks' .py files as notebooks."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import urllib.request
from pathlib import Path

import jupytext
import pytest

from picklescope import cli
from picklescope.views import nbrun
from picklescope.views.offline_html import external_references

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from browser_lab import lab_server  # noqa: E402
from notebook_params import PARAMETERS, POSTMORTEM  # noqa: E402  (shared with the browser test)

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
# 05 runs through `picklescope postmortem` (the session's `postmortem_export`), as a user runs it
CHROMIUM = Path(os.environ.get("PICKLESCOPE_CHROMIUM", "/usr/bin/chromium"))


def _stdout(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []) if o.get("name") == "stdout")


def _shown(nb) -> str:
    """Everything a cell printed or displayed, as plain text."""
    out = []
    for c in nb.cells:
        for o in c.get("outputs", []):
            out.append(o.get("text", "") if o.get("name") == "stdout" else str(o.get("data", {}).get("text/plain", "")))
    return "\n".join(out)


def _html(nb) -> str:
    return "\n".join(str(o.get("data", {}).get("text/html", "")) for c in nb.cells for o in c.get("outputs", []))


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


def test_the_first_cell_points_to_the_answer_and_the_answer_is_there():
    """A reader short on time finds the answer from the first screen: the link's target heading exists."""
    for path in sorted(NOTEBOOKS.glob("*.py")):
        if path.stem == POSTMORTEM:  # the postmortem opens with its verdict instead
            continue
        nb = jupytext.read(path)
        assert "[The answer](#The-answer)" in nb.cells[0].source, path.name
        headings = [c.source.splitlines()[0] for c in nb.cells if c.cell_type == "markdown" and c.source]
        assert "## The answer" in headings, path.name
        last_heading = [h for h in headings if h.startswith("## ")][-1]
        assert last_heading == "## The answer", (path.name, last_heading)


@pytest.fixture(scope="module")
def executed(executed_notebooks):
    """All notebooks run once per session (``executed_notebooks`` in tests/conftest.py, which JupyterLab's
    test opens too): stem -> executed notebook, or the exception that stopped it."""
    return executed_notebooks.results


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
        legacy = next(line for line in _shown(nb).splitlines() if "numpy-legacy" in line and "__getstate__" in line)
        assert "consolidate()" in legacy
        # the legacy step-through's table: the consolidate line is the first row
        page = _html(nb)
        first_row = page[page.index("<tbody>", page.index("NumpyLegacyCodec")):]
        first_row = first_row[:first_row.index("</tr>")]
        assert "consolidate()" in first_row, first_row
        assert "step 3 of" in out  # the step reveal was clicked three times
    elif stem == "03_allocation_timelines":
        assert "in step consolidate (sender)" in _shown(nb)  # memray's largest row
        assert "gc.collect() freed 24 MiB" in _shown(nb)  # three 8 MiB consolidates, freed only by the collector
    elif stem == "06_node_replay":
        budget_table = _html(nb)[_html(nb).index("above the node&#x27;s baseline, collector off"):]
        legacy_row, fixed_row = budget_table.split("</tr>")[1:3]  # after the header row
        assert "numpy-legacy" in legacy_row and "killed " in legacy_row and " in training step " in legacy_row
        assert "numpy" in fixed_row and ">ok<" in fixed_row, fixed_row
        assert "cluster stopped, left: []" in out
        # how the rows are cut among the workers, printed before the replays (a worker with fewer rows holds less)
        assert re.search(r"^\d+ rows, cut \d+(, \d+)* among the workers", out, re.MULTILINE), out[:600]
        answer = _shown(nb)  # the last answer quotes the driver's own and exact peaks, the growth and the kill
        assert "the driver's own memory (the object store apart) peaked at" in answer, answer
        assert "its exact peak, object-store pages included, was" in answer and "driver grew" in answer
        assert "was killed (" in answer and "completed every step" in answer
        # section 5: the same batch and budget on the TransferQueue plane, each kind of process's own peak
        assert "On verl's TransferQueue data plane the driver's own memory peaked at 0.0" in answer, answer
        assert "the storage units held 1.0" in answer or "the storage units held 0.9" in answer, answer
        assert "Under the same budget, the TransferQueue replay " in answer
        # the section's yes or no comes first, with the training steps that prove it
        verdict = re.search(r"^Would the TransferQueue plane have saved this node\? (Yes|No|The question did not "
                            r"arise)[:,] .*?(training step \d+|every training step)", out, re.MULTILINE | re.DOTALL)
        assert verdict and out.index(verdict.group(0)) < out.index("transferqueue "), out
        line = (r"^transferqueue +(ok|killed \S+ in training step \d+): node peak [\d.]+x, driver 0\.0\dx, "
                r"producer [\d.]+x, workers [\d.]+x \(sum\), storage units [\d.]+x \(sum\)")
        assert re.search(line, out.replace("\n    ", " "), re.MULTILINE), out  # the notebook wraps it at 96
        planes = [x for x in out.splitlines() if "(sum)" in x or "above baselines:" in x]
        assert planes and max(len(x) for x in planes) <= 100, planes  # Lab's output beside the file browser
    elif stem == "04_switch_codecs_confirm_fix":
        shown = _shown(nb)  # the answers are paragraphs (text/html), plain text beside them
        assert "round trip was exact" in shown and "1.00x the payload lower than numpy-legacy" in shown
        assert "<b>" not in out  # the explorer's status line is displayed, not printed as raw HTML
        status = [o["data"] for c in nb.cells for o in c.get("outputs", [])
                  if re.search(r"<b>run \d+ · numpy finished after [\d.]+ s</b>: the sender peaked at",
                               str(o.get("data", {}).get("text/html", "")))]
        assert status and "<" not in str(status[0]["text/plain"])  # rendered in Jupyter, plain elsewhere


@pytest.fixture(scope="module")
def postmortem(postmortem_export):
    """The postmortem exported once per session (tests/conftest.py), also opened by the browser test."""
    return postmortem_export


def test_postmortem_html_is_offline_with_figures_inline(postmortem):
    html = (postmortem / "postmortem.html").read_text()
    assert external_references(html) == []
    assert html.count("Plotly.newPlot(") >= 3  # two budgeted timelines and the comparison, data inline
    assert '"name":"RSS, sampled every ~1 ms"' in html.replace(": ", ":")
    assert "numpy-legacy was OOM-killed on the sender in step consolidate" in html
    assert "Postmortem: host memory spent serializing a training batch" in html
    # a document: verdict first, no code, no parameters cell (twice or once); the parameters as a table
    assert "import json" not in html and "workload = " not in html
    assert html.index("Verdict") < html.index("numpy-legacy was OOM-killed") < html.index("Which codec survives")
    assert "sender budget" in html and "0.5x" in html
    nb = json.loads((postmortem / "postmortem.ipynb").read_text())
    assert nb["cells"][1]["metadata"]["tags"] == ["parameters"]
    assert any("import json" in "".join(c["source"]) for c in nb["cells"])  # the notebook keeps its code
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


def test_saving_a_notebook_through_jupytext_writes_the_file_back_byte_for_byte(tmp_path):
    """What Lab does on save: jupytext's contents manager turns the notebook model (here with an
    output and Lab's own cell metadata added, as after running a cell) back into the .py."""
    import shutil

    from jupytext import TextFileContentsManager

    for p in NOTEBOOKS.iterdir():
        if p.is_file():
            shutil.copy(p, tmp_path / p.name)
    cm = TextFileContentsManager(root_dir=str(tmp_path))
    for p in sorted(NOTEBOOKS.glob("*.py")):
        model = cm.get(p.name, content=True, type="notebook")
        for cell in model["content"].cells:
            if cell.cell_type == "code":
                cell.outputs = [{"output_type": "stream", "name": "stdout", "text": "ran\n"}]
                cell.execution_count = 1
                cell.metadata["execution"] = {"iopub.status.idle": "2026-01-01T00:00:00Z"}
                cell.metadata["trusted"] = True
        cm.save(model, p.name)
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), p.name


def test_notebooks_write_only_under_out(executed, tmp_path):
    """A notebook's files go to the ignored out/ folder, never beside the tracked notebooks."""
    for path in ("notebooks/out/report.html", "out/screenshots/x.png"):
        assert subprocess.run(["git", "check-ignore", "-q", path], cwd=REPO).returncode == 0, path
    first = next(nb for nb in executed.values() if not isinstance(nb, Exception))
    folder = Path(first.metadata.papermill.output_path).parent
    strays = [p.relative_to(folder).as_posix() for p in folder.rglob("*")
              if p.is_file() and p.suffix != ".ipynb" and p.relative_to(folder).parts[0] != "out"]
    assert strays == []
    # the postmortem template, run as in Lab (its parameters as written), puts its files in out/
    nb = nbrun.execute(NOTEBOOKS / f"{POSTMORTEM}.py", tmp_path / "pm.ipynb",
                       {"workload": "tiny", "scale": 1.0, "codecs": ["numpy"], "budget": None,
                        "headroom": False, "trace": None}, timeout_s=600)
    assert nb is not None
    made = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert made == ["out/postmortem/report.html", "out/postmortem/results.json", "pm.ipynb"], made


def test_lab_settings_turn_off_the_news_popup():
    schema = json.loads((REPO / ".venv/share/jupyter/lab/schemas/@jupyterlab/apputils-extension/notification.json")
                        .read_text())
    settings = json.loads((REPO / "jupyter/overrides.d/picklescope.json").read_text())
    news = settings["@jupyterlab/apputils-extension:notification"]
    allowed = [c["const"] for c in schema["properties"]["fetchNews"]["oneOf"]]
    assert news["fetchNews"] in allowed and news["fetchNews"] == "false"
    assert news["checkForUpdates"] is False


KILLED_KERNEL = '''# %%
import os, signal
import picklescope as ps
from picklescope.measure import launcher

launcher.warm_up()  # the kernel's forkserver and its picklescope-mp-<kernel pid> folder
open(os.environ["PICKLESCOPE_TEST_PID_FILE"], "w").write(str(os.getpid()))
# %%
os.killpg(os.getpgid(0), signal.SIGKILL)  # what jupyter_client does to a kernel that is slow to shut down
'''


def test_a_kernel_killed_with_its_forkserver_leaves_no_temporaries(tmp_path, monkeypatch):
    """SIGKILL to the kernel's process group gives neither the kernel nor its forkserver a chance to
    remove the kernel's multiprocessing folder; ``nbrun.execute`` sweeps it when the kernel is gone."""
    import glob
    import tempfile

    src = tmp_path / "killed.py"
    src.write_text(KILLED_KERNEL)
    pid_file = tmp_path / "kernel.pid"
    monkeypatch.setenv("PICKLESCOPE_TEST_PID_FILE", str(pid_file))
    with pytest.raises(RuntimeError, match="Kernel died"):  # nbclient.exceptions.DeadKernelError
        nbrun.execute(src, tmp_path / "killed.ipynb")
    pid = int(pid_file.read_text())
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"picklescope-*-{pid}-*")) == []


def test_a_kernels_forkserver_is_outside_its_process_group_so_shutdown_does_not_wait_on_zombies(tmp_path):
    """ipykernel's shutdown sends SIGTERM to every child in the kernel's process group and waits while any is
    left. A forkserver or resource tracker ended that way is a zombie nothing reaps, which it counts as alive:
    a shutdown or restart then took about 30 s, or Jupyter killed the kernel at its 5 s and its
    ``picklescope-mp-*`` folder stayed (posit-dev/positron#3381 shows the same ipykernel behaviour). In a
    kernel, picklescope starts both in a session of their own (``launcher._in_kernel``): they are not in the
    kernel's group, and after the kernel's own shutdown neither is left, nor the kernel's folder. (Its time is
    not asserted: the machine may be busy.)"""
    import asyncio
    import glob
    import tempfile
    import time

    import psutil

    async def run() -> tuple[int, list[str], list[tuple[str, int, int]], float]:
        km = nbrun._kernel_manager_class(str(tmp_path))()
        await km.start_kernel()
        kc = km.client()
        kc.start_channels()
        try:
            await kc.wait_for_ready(timeout=600)
            reply = await kc.execute_interactive("from picklescope.measure import launcher\nlauncher.warm_up()",
                                                 timeout=600)
            assert reply["content"]["status"] == "ok", reply["content"]
            kernel = psutil.Process(km.provisioner.pid)
            deadline = time.monotonic() + 300  # their Python runs its first line (os.setsid) after it starts
            while True:
                kids = [(" ".join(c.cmdline())[:120], c.pid, os.getpgid(c.pid)) for c in kernel.children()]
                if all(pgid != kernel.pid for _, _, pgid in kids) or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
        finally:
            kc.stop_channels()
            t = time.monotonic()
            await km.shutdown_kernel(now=False)
        return kernel.pid, [c for c, _, _ in kids], kids, time.monotonic() - t

    kpid, cmds, kids, shutdown_s = asyncio.run(run())
    assert any("forkserver" in c for c in cmds) and any("resource_tracker" in c for c in cmds), cmds
    assert all(pgid != kpid for _, _, pgid in kids), (kpid, kids)  # the kernel leads its own group
    alive = []
    for _, pid, _ in kids:
        try:
            alive.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    _, left = psutil.wait_procs(alive, timeout=300)  # they end once they read the end of the kernel's pipe
    assert left == [], (left, kids, f"shutdown took {shutdown_s:.1f} s")
    assert glob.glob(os.path.join(tempfile.gettempdir(), f"picklescope-mp-{kpid}-*")) == [], \
        f"the kernel did not remove its folder: it was killed (shutdown took {shutdown_s:.1f} s)"


_SHARED_CLUSTER_FAILS = r"""
import sys
from picklescope.ray import local_cluster
from picklescope.ray.startup import RayStartError

def refuse(self, timeout_s=None):
    raise RayStartError(12.0, ["the raylet did not come up (made to fail by the test)"], 9.5)

local_cluster.LocalCluster.start = refuse
src = open(sys.argv[1]).read()
for name, value in (("scale", "0.05"), ("workers", "2"), ("steps", "2"),  # as the suite's small parameters
                    ("data_planes", "False")):  # section 5's own clusters: tests/test_node_transferqueue.py
    src = src.replace(f"\n{name} = ", f"\n{name} = {value}  # ", 1)
exec(compile(src, sys.argv[1], "exec"), {"__name__": "__main__"})
"""


@pytest.mark.ray
@pytest.mark.slow
def test_notebook_06_says_in_one_sentence_when_its_shared_cluster_does_not_start_and_goes_on(tmp_path):
    """A busy machine can take longer to start Ray than Ray allows: the cell that starts the notebook's
    shared cluster says so in one sentence, each series then starts a cluster of its own, the answer still
    comes, and no Ray process is left."""
    script = tmp_path / "fails.py"
    script.write_text(_SHARED_CLUSTER_FAILS)
    p = subprocess.run([sys.executable, str(script), str(NOTEBOOKS / "06_node_replay.py")], capture_output=True,
                       text=True, timeout=1800, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = p.stdout.splitlines()
    said = [ln for ln in lines if ln.startswith("The shared cluster is not used: the local Ray cluster did not start")]
    assert len(said) == 1 and "made to fail by the test" in said[0] and "cluster of its own" in said[0], lines[:5]
    assert "Traceback" not in p.stdout + p.stderr
    assert any(ln.startswith("On a node of a driver and 2 workers") and "Under a node budget of" in ln
               for ln in lines), lines[-8:]  # the answer, with its budgeted pair
    assert not any(ln.startswith("cluster stopped") for ln in lines)
