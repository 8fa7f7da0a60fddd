"""Shared fixtures and the test tiers (docs/testing.md).

Tiers. Every test gets the markers of what it needs, given here at collection so that a new test is
sorted without being told (``pytest --markers`` lists them):

- ``ray``: starts or joins a real Ray cluster (asks for ``ray_cluster``, starts a ``LocalCluster``, runs
  the ``ray`` transport, or lives in a file :data:`FILE_MARKERS` marks for Ray);
- ``browser``: drives Chromium (it, or a private helper of its module, calls ``require_browser`` or
  ``chromium`` of ``tests/browser_lab.py``; or it lives in ``test_browser*.py``);
- ``verl``: needs real verl wheels installed (asks for ``verl_envs``, as every such test does, or is a
  bad-input case whose ``needs`` installs a verl);
- ``fault``: kills or interrupts parents on purpose and checks what is left (see :data:`FILE_MARKERS`);
- ``slow``: measured workloads of 100+ MiB and other long runs (given by hand, or in :data:`SLOW`).

- ``quick``: the core checks a change most often breaks, run by ``python3 dev.py test --quick``
  (:data:`QUICK`): the tests of :data:`QUICK_FILES` that no marker above marks and that start no Python
  child of their own (units, one measured run per codec, the CLI's bad inputs handled in-process, the
  architecture and event contracts).

``python3 dev.py test`` runs everything. A test may also carry any of these markers itself.

Shared fixtures (session-scoped: made once per run, whichever test first asks):

- ``ray_cluster``: one local Ray cluster for every test that can join one (pass ``cluster.address`` as
  ``ray_address``). A test that must own its cluster (start-up faults, the default path that starts and
  ends a cluster of the run's own, a store whose pages must start empty) says why beside it.
- ``flowgrpo_quarter``: every built-in codec over both in-process transports on flowgrpo x0.25.
- ``verl_envs``: verl 0.9.0 and 0.9.1 installed (once per cache), ``{label: env}``.
- ``postmortem_export``: ``picklescope postmortem`` run once on the tiny workload, the folder it wrote;
  read by the headless notebook tests and by the browser's offline check.
- ``executed_notebooks``: every notebook run once headless at its small parameters; the headless tests
  check what each printed, and JupyterLab opens the same executed notebooks to check what a person sees.
"""

from __future__ import annotations

import contextlib
import inspect
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from picklescope import cli

# After the last test: no process and no temporary of the session may be left (fails the session).
from picklescope.measure.pytest_leftovers import pytest_sessionfinish, pytest_sessionstart  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
import own_processes  # noqa: E402

os.environ.setdefault("RAY_AUTH_MODE", "disabled")

# The Ctrl-C tests send SIGINT to commands they start. A suite started in the background of a shell without job
# control (``cmd &`` in a script) inherits SIGINT as ignored, and every command would inherit that too and never
# hear its Ctrl-C. A handler of this process's own is reset to the default in each command it starts.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

MiB = 1024**2
TIERS = ("ray", "browser", "verl", "fault", "slow")
QUICK = "quick and not (" + " or ".join(TIERS) + ")"  # the -m expression of `dev.py test --quick`
# The files of the quick tier. Each of the others starts its own processes for most of its tests (a CLI
# in a child, budgets searched, runs repeated in fresh forkservers, kernels, tracers), which the full run
# pays for; a bad-input case that must run `python -m picklescope` in a child (it sets environment
# variables) is left to the full run too.
QUICK_FILES = ("test_architecture.py", "test_basics.py", "test_bad_input.py", "test_cli.py", "test_codecs.py",
               "test_events.py", "test_runs.py", "test_ray_bad_input.py", "test_ray_transferqueue.py",
               "test_setup.py", "test_tiers.py", "test_parallel_suite.py", "test_predict.py", "test_predict_store.py")

# Files whose every test carries these markers.
FILE_MARKERS: dict[str, tuple[str, ...]] = {
    "test_ray.py": ("ray",),
    "test_node.py": ("ray",),
    "test_browser.py": ("browser",),
    "test_browser_views.py": ("browser",),
    "test_verl.py": ("verl",),
    "test_interrupts.py": ("fault",),  # real parents interrupted and killed at every point of a run
    "test_leftovers.py": ("fault",),  # sessions that leave children, orphans and killed clusters behind
}
# Tests too long for the quick tier that no other marker covers: node id prefixes (file::name).
SLOW = (
    "test_notebooks.py::test_notebook_executes_headless",  # each notebook in a kernel of its own
    "test_notebooks.py::test_notebooks_write_only_under_out",
    "test_notebooks.py::test_postmortem_",  # the postmortem notebook, run once by `postmortem_export`
    "test_report.py::",  # `picklescope reproduce` on flowgrpo x0.1: every codec, budget and tracer
)
_BROWSER = re.compile(r"\brequire_browser\(|\bchromium\(|_browser_missing\(|sync_playwright\(")
_RAY = re.compile(r"\bLocalCluster\(")
_CHILD = re.compile(r"\bsubprocess\.(run|Popen|call|check_output)\(")


def _source(item: pytest.Item) -> str:
    """The test's code and that of the module's private helpers it calls (one level down)."""
    fn = getattr(item, "function", None)
    try:
        text = inspect.getsource(fn)
    except (OSError, TypeError):
        return ""
    module = inspect.getmodule(fn)
    for name in set(re.findall(r"\b(_[A-Za-z]\w*)\(", text)):
        helper = getattr(module, name, None)
        if inspect.isfunction(helper):
            with contextlib.suppress(OSError, TypeError):
                text += inspect.getsource(helper)
    return text


def tiers_of(item: pytest.Item) -> set[str]:
    """The tier markers ``item`` gets: from its file, the fixtures it asks for and its code."""
    path = Path(str(item.fspath))
    found = set(FILE_MARKERS.get(path.name, ()))
    fixtures = set(getattr(item, "fixturenames", ()))
    source = _source(item)
    if "ray_cluster" in fixtures or _RAY.search(source):
        found.add("ray")
    if _BROWSER.search(source):
        found.add("browser")
    spec = getattr(item, "callspec", None)
    needs = [n for v in (spec.params.values() if spec else ()) for n in (getattr(v, "needs", None) or ())]
    if "verl_envs" in fixtures or any(str(n).startswith("verl") for n in needs):  # a case that installs verl
        found.add("verl")
    if any(item.nodeid.split("/")[-1].startswith(prefix) for prefix in SLOW):
        found.add("slow")
    # a test that starts a Python of its own (`python -m picklescope`, a shell pipe, a measuring script)
    # pays for importing torch in it: the full run has those
    in_child = bool(_CHILD.search(source)) or any(getattr(v, "subprocess", False) is True
                                                  for v in (spec.params.values() if spec else ()))
    if path.name in QUICK_FILES and not found and not in_child:
        found.add("quick")
    return found


# Workers (pytest-xdist, `dev.py test` starts them with `--dist loadgroup`, scheduled by GroupScheduling
# below): each file is one group, so its module-scoped fixtures are made once, on one worker. A worker takes
# the next group when it is free, in the order of the items: the files that take longest start first, so that
# no long file is left to run alone at the end. COST is their pytest time in seconds (a `--durations=0` run of
# the suite on two workers, summed per group: the d51c35c row of benchmarks/README.md, "The test suite"); a
# group not listed (under 20 s) counts 0. A test named "file::test" is a group of its own: the long tests of
# a file that share no module-scoped fixture with the rest of it (its module fixtures are made again for it,
# on its worker). A group name of SHARED (below) stands for its files together.
COST: dict[str, float] = {
    "notebooks": 519.0,
    "test_node.py": 309.0,
    "test_predict.py": 291.0,
    "test_node_transferqueue.py": 226.0,
    "test_interrupts.py": 186.0,
    "test_verl.py": 165.0,
    "test_node_ray_faults.py": 149.0,
    "test_ray.py": 139.0,
    "test_node.py::test_real_verl_0_9_0_grows_and_0_9_1_does_not": 121.0,
    "test_ray_startup.py": 115.0,
    "test_install.py": 114.0,
    "test_node_controller.py": 108.0,
    "test_workload_from.py": 101.0,
    "test_budget.py": 80.0,
    "test_leftovers.py": 74.0,
    "test_hostile_inspect.py": 70.0,
    "test_bad_input.py": 59.0,
    "test_report.py": 57.0,
    "flowgrpo_quarter": 57.0,
    "test_node_ray_monitor.py": 56.0,
    "test_node.py::test_interrupted_or_killed_parent_leaves_no_process_or_file": 54.0,
    "test_browser_views.py": 49.0,
    "test_node.py::test_reproduce_replays_the_node_pair_on_one_node_of_its_ray_cluster_and_its_report_shows_it": 49.0,
    "test_node.py::test_two_node_cluster_groups_processes_by_ray_node_and_takes_a_workload_path": 38.0,
    "test_tmpdir_commands.py": 26.0,
    "test_node_series_modes.py": 24.0,
    "test_capture.py": 23.0,
}


# Files that share a costly session fixture run as one group, so that one worker makes it: a session
# fixture is made once per worker that asks for it. Running every notebook headless
# (``executed_notebooks``, with ``postmortem_export`` beside it) is the most costly set-up of the suite,
# and ``flowgrpo_quarter`` the most costly of the quick tier.
SHARED: dict[str, str] = {
    "test_notebooks.py": "notebooks", "test_browser.py": "notebooks",
    **dict.fromkeys(("test_headroom.py", "test_runs.py", "test_safe_loading.py", "test_tracers.py"),
                    "flowgrpo_quarter"),
}


def group_of(nodeid: str) -> str:
    """The worker group of a test, from its node id alone (the controller's scheduler sees only ids):
    ``file::test`` when COST lists that test, the file's SHARED group name, else the file's name."""
    path, _, rest = nodeid.partition("::")
    name = path.rsplit("/", 1)[-1]
    own = f"{name}::{rest.split('[', 1)[0]}"
    return own if own in COST else SHARED.get(name, name)


def _schedule(items: list[pytest.Item]) -> None:
    """Put the costliest groups first, stable within a group (each worker collects, in the same order)."""
    groups = {id(item): group_of(item.nodeid) for item in items}
    first = {}
    for k, item in enumerate(items):
        first.setdefault(groups[id(item)], k)
    items.sort(key=lambda item: (-COST.get(groups[id(item)], 0.0), first[groups[id(item)]]))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        have = {m.name for m in item.iter_markers()}
        for name in sorted(tiers_of(item) - have):
            item.add_marker(getattr(pytest.mark, name))
    if grouped(config):
        _schedule(items)


def grouped(config: pytest.Config) -> bool:
    """Whether this process collects for ``--dist loadgroup``. The items are collected by each worker, not
    by the controller, and xdist sets a worker's ``dist`` to "no" and its ``loadgroup`` to True."""
    if not config.pluginmanager.hasplugin("xdist"):
        return False
    return bool(getattr(config.option, "loadgroup", False)) or config.getoption("dist", "no") == "loadgroup"


try:
    from xdist.scheduler import LoadScopeScheduling
except ImportError:  # pytest-xdist is not installed: the suite runs in one process
    LoadScopeScheduling = None


if LoadScopeScheduling is not None:

    class GroupScheduling(LoadScopeScheduling):
        """``--dist loadgroup`` with the groups of :func:`group_of`, read from each test's node id.

        xdist's own loadgroup reads ``xdist_group`` marks in the workers and passes them to the
        controller by appending ``@group`` to each node id, which pytest 9.2 no longer lets a plugin
        change (pytest-dev/pytest-xdist#1386): every test became a group of its own, and a module's
        fixtures were made again on each worker its tests landed on. The group is computed where the
        schedule is made instead. Groups are handed out in the collection's order (costliest first,
        :func:`_schedule`), not reordered by their number of tests."""

        def __init__(self, config: pytest.Config, log: object = None) -> None:
            super().__init__(config, log)
            config.option.loadscopereorder = False

        def _split_scope(self, nodeid: str) -> str:  # the extension point xdist's own loadgroup overrides
            return group_of(nodeid)

    @pytest.hookimpl(optionalhook=True)  # `-p no:xdist` runs without the hook's spec
    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
        """The suite's schedule for ``--dist loadgroup`` (``dev.py test`` passes it); others are xdist's."""
        if config.getoption("dist", "no") == "loadgroup":
            return GroupScheduling(config, log)
        return None


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster for the session (joined like a real one: pass ``.address`` as ``ray_address``).

    Started on first use, stopped after the last test; nothing of it may be left. Ray's own start-up
    deadlines are sometimes missed on a loaded two-core machine: the start's own policy tries again."""
    from picklescope.ray import ray_available

    if not ray_available():
        pytest.skip("ray is not installed (pip install 'picklescope[ray]')")
    from picklescope.ray.local_cluster import LocalCluster

    # LocalCluster.start tries up to four times within its own deadlines (ray/startup.py) and raises
    # one sentence with the reason and the load average when no try came up
    c = LocalCluster(object_store_bytes=1024 * MiB, num_cpus=3).start()
    own_processes.share(c.proc.pid)  # a test that counts what it left running leaves this tree out
    yield c
    report = c.stop()
    own_processes.unshare(c.proc.pid)
    assert report["remaining"] == [], report


@pytest.fixture(scope="session")
def flowgrpo_quarter():
    """Every built-in codec over both in-process transports on flowgrpo x0.25, measured once."""
    from picklescope.investigate.reproduce import matrix

    inv = matrix("flowgrpo", 0.25)
    return {(r.codec, r.transport): r for r in inv.results}


SAMPLER_GAP_S = 0.020  # the longest the parent's sampling thread may go between two samples of a run


def dumps_gap(run) -> float:
    """The longest interval between two samples of ``run``'s sender that touches its ``pickle.dumps`` step."""
    dumps, t = run.sender.step("pickle.dumps"), run.sender.timeline.t_s
    return max(b - a for a, b in zip(t, t[1:]) if b >= dumps.start_s and a <= dumps.end_s)


@pytest.fixture(scope="session")
def steady_torch_pickle(flowgrpo_quarter):
    """flowgrpo x0.25 through torch over pickle, as ``flowgrpo_quarter`` measured it, or, where the sampler went
    SAMPLER_GAP_S or longer without a sample during ``pickle.dumps`` there, the steadiest of up to two runs more:
    on a loaded 2-core machine the suite's other worker can hold the sampling thread off a core for tens of ms in
    any one run (33 ms once, and the sampled curve then missed the peak by 16%), and the checks on this run are
    of the sampler, not of the machine's load. ``.gaps`` keeps every try's longest gap, ``.run`` the steadiest."""
    from types import SimpleNamespace

    import picklescope as ps

    runs = [flowgrpo_quarter[("torch", "pickle")]]
    while len(runs) < 3 and dumps_gap(runs[-1]) >= SAMPLER_GAP_S:
        runs.append(ps.run("torch", "pickle", "flowgrpo", 0.25))
    return SimpleNamespace(run=min(runs, key=dumps_gap), gaps=[dumps_gap(r) for r in runs])


@pytest.fixture(scope="session")
def verl_envs():
    """verl 0.9.0 and 0.9.1 from PyPI through the CLI (a no-op when already in the cache), {label: env}.

    Every test of real verl asks for this rather than skipping when the cache is empty: on a fresh
    machine the cache is empty until the first of them runs, and a skip would hide the check."""
    p = subprocess.run([sys.executable, "-m", "picklescope", "verl", "install", "0.9.0", "0.9.1"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    from picklescope.verl import envs

    found = {e.label: e for e in envs.installed() if e.label in ("0.9.0", "0.9.1")}
    assert set(found) == {"0.9.0", "0.9.1"}, found
    return found


@pytest.fixture(scope="session")
def postmortem_export(tmp_path_factory) -> Path:
    """``picklescope postmortem`` on the tiny workload, run once: numpy-legacy and numpy under a 0.5x sender
    budget (the legacy codec is OOM-killed in consolidate), without headroom. The folder holds
    postmortem.html, postmortem.ipynb, report.html and results.json."""
    out = tmp_path_factory.mktemp("postmortem")
    rc = cli.main(["postmortem", "--workload", "tiny", "--codecs", "numpy-legacy,numpy", "--budget", "0.5x",
                   "--scale", "1", "--no-headroom", "--out", str(out)])
    assert rc == 0
    return out


@pytest.fixture(scope="session")
def executed_notebooks(tmp_path_factory):
    """Every notebook of ``tests/notebook_params.PARAMETERS`` run once, two at a time (each in its own
    kernel; the machine has two cores): ``.folder`` holds ``<stem>.ipynb``, ``.results`` maps each stem to
    its executed notebook, or to the exception that stopped it (reported by the tests that read it)."""
    from concurrent.futures import ThreadPoolExecutor
    from types import SimpleNamespace

    from notebook_params import PARAMETERS

    from picklescope.views import nbrun

    notebooks = Path(__file__).resolve().parents[1] / "notebooks"
    out = tmp_path_factory.mktemp("notebooks")

    def one(stem: str):
        try:
            return nbrun.execute(notebooks / f"{stem}.py", out / f"{stem}.ipynb", PARAMETERS[stem], timeout_s=600)
        except Exception as exc:  # reported by the test of that notebook
            return exc

    with ThreadPoolExecutor(max_workers=2) as pool:
        return SimpleNamespace(folder=out, results=dict(zip(PARAMETERS, pool.map(one, PARAMETERS))))
