"""What lets the suite run on several pytest-xdist workers at once (docs/testing.md, "Workers").

Two workers (or two notebooks) share one cache and one leftover check. These are the pieces that
would race: the verl cache's install of one version, and the leftover check that must run once, in
the controller, after every worker has ended.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from picklescope.core import leftovers
from picklescope.errors import PicklescopeError
from picklescope.measure import pytest_leftovers
from picklescope.verl import envs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
import conftest  # noqa: E402


def _fake_env(version: str) -> envs.VerlEnv:
    """What a finished install leaves: the folder with verl/protocol.py and its install.json."""
    root = envs.verl_root() / f"verl-{version}"
    (root / "site" / "verl").mkdir(parents=True)
    (root / "site" / "verl" / "protocol.py").write_text("class DataProto: ...\n")
    env = envs.VerlEnv(version, version, "pypi", str(root), time.time(), 0.1, ())
    envs._write_env(env)
    return env


def test_a_second_install_of_one_version_waits_for_the_first_and_reuses_it(tmp_path, monkeypatch):
    """The second installer blocks on the cache's lock while the first fills the folder, then finds the
    version installed and installs nothing (without the lock it would delete and refill the folder the
    first one's process is reading)."""
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path / "cache"))
    installs: list[str] = []
    monkeypatch.setattr(envs, "_install_version", lambda v, d, i: installs.append(v) or _fake_env(v))
    holding, release = threading.Event(), threading.Event()

    def first() -> None:
        with envs._installing("0.9.0"):
            holding.set()
            release.wait(60)
            _fake_env("0.9.0")

    t = threading.Thread(target=first)
    t.start()
    assert holding.wait(60)
    got: list[envs.VerlEnv] = []
    second = threading.Thread(target=lambda: got.append(envs.install_version("0.9.0")))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "the second install did not wait for the lock held by the first"
    release.set()
    t.join(60)
    second.join(60)
    assert got and got[0].version == "0.9.0" and got[0].root.endswith("verl-0.9.0")
    assert installs == [], "the second install ran pip again after the first had finished"
    assert envs.install_version("0.9.1").version == "0.9.1" and installs == ["0.9.1"]


class _NoReporter:
    def get_plugin(self, name: str) -> None:
        return None


class _Config:
    def __init__(self, worker: bool) -> None:
        self.stash = pytest.Stash()
        self.pluginmanager = _NoReporter()
        if worker:
            self.workerinput = {"workerid": "gw0"}


class _Session:
    def __init__(self, worker: bool) -> None:
        self.config = _Config(worker)
        self.exitstatus = 0


def test_a_stuck_install_is_named_after_the_wait_not_waited_for_forever(tmp_path, monkeypatch):
    """A second installer whose first is stuck (a hung pip) gets one line with the holder's pid once the
    lock's wait is over; a checkout registered under a label waits for that label's lock the same way."""
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(envs, "LOCK_WAIT_S", 0.5)
    checkout = tmp_path / "repo" / "verl"
    checkout.mkdir(parents=True)
    (checkout / "protocol.py").write_text("")
    for label, install in (("0.9.0", lambda: envs.install_version("0.9.0")),
                           ("local", lambda: envs.install_source(tmp_path / "repo", label="local"))):
        holding, release = threading.Event(), threading.Event()

        def first(label: str = label, holding: threading.Event = holding, release: threading.Event = release) -> None:
            with envs._installing(label):
                holding.set()
                release.wait(60)

        t = threading.Thread(target=first)
        t.start()
        try:
            assert holding.wait(60)
            # flock is per open file: a second open in this process contends as another process would
            with pytest.raises(PicklescopeError) as err:
                install()
            assert f"process {os.getpid()}" in str(err.value) and repr(label) in str(err.value), str(err.value)
        finally:
            release.set()
            t.join(60)
    assert envs.install_source(tmp_path / "repo", label="local").label == "local"


def test_a_worker_neither_marks_nor_checks_the_controller_does(monkeypatch):
    """A worker keeps the controller's marker (so its children are found by the controller's one check)
    and only stops its own forkserver at the end; outside xdist the plugin marks and checks as before."""
    monkeypatch.setenv(leftovers.SESSION_ENV, "controller-marker")
    calls: list[str] = []
    monkeypatch.setattr(pytest_leftovers.launcher, "shutdown", lambda: calls.append("shutdown"))
    monkeypatch.setattr(pytest_leftovers.leftovers, "check", lambda snap: calls.append("check") or leftovers.Report())
    worker = _Session(worker=True)
    pytest_leftovers.pytest_sessionstart(worker)
    assert os.environ[leftovers.SESSION_ENV] == "controller-marker"
    pytest_leftovers.pytest_sessionfinish(worker, 0)
    assert calls == ["shutdown"]
    controller = _Session(worker=False)
    pytest_leftovers.pytest_sessionstart(controller)
    assert os.environ[leftovers.SESSION_ENV] != "controller-marker"
    pytest_leftovers.pytest_sessionfinish(controller, 0)
    assert calls == ["shutdown", "shutdown", "check"]


def test_every_group_of_the_worker_schedule_exists():
    """The schedule (conftest.COST) lists the files and tests that take longest so that they start first;
    a name in it that is no test file or test any more would silently fall to the default place."""
    folder = Path(conftest.__file__).parent
    assert set(conftest.SHARED) and all((folder / f).is_file() for f in conftest.SHARED), conftest.SHARED
    stale = []
    for name in conftest.COST:
        if name in conftest.SHARED.values():  # a group of several files, checked above
            continue
        file, _, test = name.partition("::")
        path = folder / file
        if not path.is_file() or (test and f"def {test}(" not in path.read_text()):
            stale.append(name)
    assert stale == [], f"conftest.COST names files or tests that do not exist: {stale}"


PROBE = '''
import os
import subprocess
import pytest

@pytest.fixture(scope="module")
def made():
    with open(os.environ["PS_GROUP_PROBE"], "a") as f:
        f.write(f"setup {__name__.rsplit('.', 1)[-1]} {os.environ.get('PYTEST_XDIST_WORKER')}\\n")

@pytest.mark.parametrize("k", range(6))
def test_one(made, k):
    with open(os.environ["PS_GROUP_PROBE"], "a") as f:
        f.write(f"test {__name__.rsplit('.', 1)[-1]} {os.environ.get('PYTEST_XDIST_WORKER')}\\n")
'''


def test_on_real_workers_each_file_runs_on_one_worker_and_makes_its_module_fixtures_once(tmp_path):
    """Two files of six tests, each with a module-scoped fixture, on two real workers with ``--dist
    loadgroup`` as ``dev.py test`` runs them: every test of a file runs on one worker, and each file's
    fixture is made once. With xdist's own loadgroup on pytest 9.2 (pytest-dev/pytest-xdist#1386), or a
    group read in the controller only, each test is a group of its own and a file's tests are spread."""
    folder = tmp_path / "suite"
    folder.mkdir()
    # the suite's own collection hook, loaded by path (this folder's conftest is a module of its own)
    (folder / "conftest.py").write_text(
        "import importlib.util\n"
        f"_spec = importlib.util.spec_from_file_location('suite_conftest', {conftest.__file__!r})\n"
        "_suite = importlib.util.module_from_spec(_spec)\n_spec.loader.exec_module(_suite)\n"
        "pytest_collection_modifyitems = _suite.pytest_collection_modifyitems\n"
        "pytest_xdist_make_scheduler = _suite.pytest_xdist_make_scheduler\n")
    for name in ("test_first.py", "test_second.py"):
        (folder / name).write_text(PROBE)
    out = tmp_path / "probe.txt"
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist",
                        "loadgroup", "--import-mode=importlib", "--rootdir", str(folder), "-c", os.devnull,
                        "--basetemp", str(tmp_path / "bt"), str(folder)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PS_GROUP_PROBE": str(out)})
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    lines = [ln.split() for ln in out.read_text().splitlines()]
    assert len(lines) == 14, lines  # 12 tests, 2 set-ups
    for module in ("test_first", "test_second"):
        setups = [w for kind, m, w in lines if kind == "setup" and m == module]
        workers = {w for kind, m, w in lines if kind == "test" and m == module}
        assert len(setups) == 1 and workers == set(setups), (module, lines)
        assert setups[0] in ("gw0", "gw1"), lines


def test_a_child_runs_in_the_environment_its_parent_has_when_it_starts_it(monkeypatch):
    """One forkserver serves every run of a test process (or a kernel), and it keeps the environment of the
    moment it started. A test that set ``PICKLESCOPE_CACHE`` to a folder of its own and happened to start the
    worker's forkserver left that folder in every later child: the worker's real verl runs then named the
    installed versions unknown codecs (``unknown codec 'verl-0.9.1:numpy'``). Each child gets its parent's
    environment of the moment it starts (``launcher.start``)."""
    from picklescope.measure import launcher
    from picklescope.verl.childcall import call

    monkeypatch.setenv("PICKLESCOPE_CACHE", "/nonexistent/the-forkservers-cache")
    launcher.warm_up()  # running already, or started now under the first setting
    monkeypatch.setenv("PICKLESCOPE_CACHE", "/nonexistent/set-after-the-forkserver-started")
    monkeypatch.setenv("PICKLESCOPE_PROBE", "now")
    assert call("os.getenv", key="PICKLESCOPE_CACHE") == "/nonexistent/set-after-the-forkserver-started"
    assert call("os.getenv", key="PICKLESCOPE_PROBE") == "now"
    monkeypatch.delenv("PICKLESCOPE_PROBE")
    assert call("os.getenv", key="PICKLESCOPE_PROBE") is None
