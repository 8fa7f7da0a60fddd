"""Harness for the browser tests: a throwaway JupyterLab server and Debian's Chromium under Playwright.

Why a harness of its own: the browser test must behave like a user's session (a real ``jupyter lab``,
a real Chromium) without touching the user's Jupyter settings, and it must leave nothing running.
So the server gets fresh config, data, runtime and home folders, is started in its own process
group, and is stopped by that group's id; every process it spawned (kernels, and the run children
the kernel starts) is recorded before the stop and killed by pid if it outlived the server.
Playwright's own browser download does not work on these machines, so Chromium comes from Debian.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import own_processes  # beside this file: the tests that import this module put tests/ on the path
import psutil

CHROMIUM = Path(os.environ.get("PICKLESCOPE_CHROMIUM", "/usr/bin/chromium"))
# Flags for a headless Chromium that reaches nothing but the addresses the test gives it.
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
    "--disable-dev-shm-usage",
]


def browser_unavailable() -> str | None:
    """Why the browser test cannot run on this machine, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError as exc:
        return f"playwright is not installed ({exc}); install the test extra: pip install -e '.[test]'"
    if not (CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK)):
        return f"no Chromium at {CHROMIUM}; install Debian's: apt-get install chromium"
    return None


def require_browser() -> None:
    """Skip with the reason on a user's machine without a browser; fail under CI (it installs one)."""
    import pytest

    why = browser_unavailable()
    if why is None:
        return
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run the browser check, but {why}")
    pytest.skip(why)


def free_port() -> int:
    """A TCP port on the loopback address that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    try:
        p = psutil.Process(pid)
        return p.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def stop_processes(procs: list[psutil.Process], grace_s: float = 5.0) -> None:
    """SIGTERM each process still alive, then SIGKILL what is left after ``grace_s``.

    psutil.Process objects (not bare pids) are used so that a pid reused by an unrelated process
    after ours ended is never signalled: psutil checks the creation time first.
    """
    live = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running():
                p.terminate()
                live.append(p)
    _gone, alive = psutil.wait_procs(live, timeout=grace_s)
    for p in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.kill()
    psutil.wait_procs(alive, timeout=grace_s)


def still_running(procs: list[psutil.Process]) -> list[str]:
    """Those of ``procs`` that are still alive (zombies count as gone), described for a message."""
    out = []
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(f"{p.pid}: {' '.join(p.cmdline())[:200]}")
    return out


@dataclass
class LabServer:
    """A running ``jupyter lab`` with throwaway settings; ``url(path)`` adds the token."""

    proc: subprocess.Popen
    port: int
    token: str
    home: Path
    log_path: Path
    spawned: dict[int, psutil.Process] = field(default_factory=dict)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, path: str = "lab") -> str:
        sep = "&" if "?" in path else "?"
        return f"{self.base}/{path.lstrip('/')}{sep}token={self.token}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def remember_children(self) -> None:
        """Record every live descendant of the server (kernels start their own sessions)."""
        with contextlib.suppress(psutil.NoSuchProcess):
            for c in psutil.Process(self.proc.pid).children(recursive=True):
                self.spawned.setdefault(c.pid, c)

    def stop(self) -> None:
        """Stop the server's process group, then anything it spawned that outlived it."""
        self.remember_children()
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        # Kernels run in sessions of their own, so the group kill may miss them and their children.
        stop_processes(list(self.spawned.values()))

    def leftovers(self) -> list[str]:
        """The server or any process it was seen to spawn, if still alive after :meth:`stop`."""
        return still_running(list(self.spawned.values())) + ([] if self.proc.poll() is not None else
                                                              [f"{self.proc.pid}: jupyter lab"])


def lab_environment(root: Path) -> dict[str, str]:
    """Environment for a server whose settings, data and home are all under ``root``."""
    dirs = {name: root / name for name in ("config", "data", "runtime", "home", "ipython")}
    for d in dirs.values():
        d.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    for var in list(env):  # a parent's Jupyter or IPython settings must not leak into the test
        if var.startswith(("JUPYTER", "JPY_", "IPYTHON")):
            env.pop(var)
    bindir = str(Path(sys.executable).parent)
    env.update(
        JUPYTER_CONFIG_DIR=str(dirs["config"]), JUPYTER_DATA_DIR=str(dirs["data"]),
        JUPYTER_RUNTIME_DIR=str(dirs["runtime"]), HOME=str(dirs["home"]), IPYTHONDIR=str(dirs["ipython"]),
        JUPYTER_PLATFORM_DIRS="1", PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONUNBUFFERED="1",
    )
    env.pop("VIRTUAL_ENV", None)
    return env


def write_user_settings(config_dir: Path, settings: dict[str, dict]) -> None:
    """Write JupyterLab user settings (plugin id -> values) into a throwaway config dir."""
    import json

    for plugin, values in settings.items():
        package, name = plugin.rsplit(":", 1)
        path = config_dir / "lab" / "user-settings" / package / f"{name}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values, indent=2))


@contextlib.contextmanager
def lab_server(root_dir: Path, work: Path, extra_args: list[str] | None = None,
               user_settings: dict[str, dict] | None = None, timeout_s: float = 90.0) -> Iterator[LabServer]:
    """Start ``jupyter lab`` on ``root_dir`` with every setting under ``work``; stop it on exit."""
    env = lab_environment(work)
    if user_settings:
        write_user_settings(Path(env["JUPYTER_CONFIG_DIR"]), user_settings)
    port, token = free_port(), secrets.token_hex(16)
    log_path = work / "jupyter-lab.log"
    cmd = [
        sys.executable, "-m", "jupyter", "lab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
        f"--ServerApp.root_dir={root_dir}", f"--IdentityProvider.token={token}",
        "--ServerApp.port_retries=0", "--LabApp.news_url=", "--LabApp.check_for_updates_class="
        "jupyterlab.NeverCheckForUpdate", "--LabApp.extension_manager=readonly",
        "--ServerApp.terminals_enabled=False",
        # as `picklescope lab` starts Lab: kernels over local sockets, so none warns of unencrypted TCP
        "--KernelManager.transport=ipc", f"--KernelManager.ip={work / 'k'}", *(extra_args or []),
    ]
    if os.geteuid() == 0:  # CI runs as root
        cmd.append("--allow-root")
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, env=env, cwd=work, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    server = LabServer(proc, port, token, Path(env["HOME"]), log_path)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {proc.returncode}:\n{server.log()[-4000:]}")
            try:
                with urllib.request.urlopen(server.url("api/status"), timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"jupyter lab did not answer within {timeout_s:.0f}s:\n{server.log()[-4000:]}")
            time.sleep(0.3)
        yield server
    finally:
        server.stop()


@dataclass
class BrowserRun:
    """Playwright's BrowserContext and every process (driver, Chromium) seen under it."""

    context: Any
    procs: dict[int, psutil.Process] = field(default_factory=dict)

    def leftovers(self) -> list[str]:
        return still_running(list(self.procs.values()))


@contextlib.contextmanager
def chromium(work: Path, viewport: tuple[int, int] = (1500, 1100)) -> Iterator[BrowserRun]:
    """Debian's Chromium under Playwright with a fresh profile, closed and its processes stopped on exit.

    A persistent context is how Playwright takes a profile folder of our choosing (it refuses a
    ``--user-data-dir`` flag). Whatever Chromium or Playwright's driver left running is killed by pid.
    """
    from playwright.sync_api import sync_playwright

    profile = work / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    me = psutil.Process()
    before = {c.pid for c in me.children()}
    pw = sync_playwright().start()
    driver = [c for c in me.children() if c.pid not in before]  # Playwright's driver; Chromium is under it
    run = BrowserRun(context=None)
    try:
        run.context = pw.chromium.launch_persistent_context(
            str(profile), executable_path=str(CHROMIUM), args=CHROMIUM_ARGS, headless=True,
            viewport={"width": viewport[0], "height": viewport[1]}, accept_downloads=False)
        yield run
    finally:
        for d in driver:
            with contextlib.suppress(psutil.NoSuchProcess):
                run.procs.update({p.pid: p for p in (d, *d.children(recursive=True))})
        if run.context is not None:
            with contextlib.suppress(Exception):
                run.context.close()
        with contextlib.suppress(Exception):
            pw.stop()
        stop_processes(list(run.procs.values()))
        shutil.rmtree(profile, ignore_errors=True)


def leftover_processes(names: tuple[str, ...] = ("jupyter", "chrom", "ipykernel", "node")) -> list[str]:
    """Descendants of this process whose command line mentions one of ``names`` (should be none); the
    session's shared Ray cluster is not one of them (tests/own_processes.py)."""
    found = []
    for c in own_processes.descendants():
        with contextlib.suppress(psutil.NoSuchProcess):
            if not _pid_alive(c.pid):
                continue
            cmd = " ".join(c.cmdline()) or c.name()
            if any(n in cmd for n in names):
                found.append(f"{c.pid}: {cmd[:200]}")
    return found


def wait_cells_done(page, timeout_s: float) -> None:
    """Wait until no code cell is queued or running ([*]) and every one has run; fail on an error (a cell's
    error output). Used by every test that runs a notebook in Lab."""
    deadline = time.monotonic() + timeout_s
    prompts = page.locator(".jp-NotebookPanel .jp-CodeCell .jp-InputArea-prompt")
    # textContent, not innerText: cells scrolled out of view are skipped by rendering (content-visibility).
    stable_since = None
    while time.monotonic() < deadline:
        texts = [t.strip() for t in prompts.all_text_contents()]
        done = bool(texts) and all(re.fullmatch(r"\[\d+\]:", t) for t in texts)
        if done and page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle\b")).count():
            stable_since = stable_since or time.monotonic()
            if time.monotonic() - stable_since > 1.5:
                break
        else:
            stable_since = None
        time.sleep(0.3)
    else:
        raise AssertionError(f"cells did not finish within {timeout_s:.0f}s; prompts: {texts}")
    errors = page.locator(".jp-NotebookPanel [data-mime-type='application/vnd.jupyter.error']")
    assert errors.count() == 0, "a cell raised:\n" + "\n".join(errors.all_text_contents())[-3000:]


LAB_WIDTH = (1400, 1000)  # a laptop's browser window; the file browser stays open, as Lab opens it


def file_browser_open(page) -> bool:
    """Open the left file browser if it is closed (Lab opens with it shown); True when it is shown."""
    panel = page.locator("#filebrowser")
    if not panel.is_visible():
        page.locator(".jp-SideBar [data-id='filebrowser']").first.click()
        page.wait_for_timeout(500)
    return panel.is_visible()


# Tables wider than the output cell they are in: what a user would have to scroll sideways to read.
WIDE_TABLES_JS = """() => {
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


OUTPUT = Path(os.environ.get("PICKLESCOPE_BROWSER_OUTPUT", Path(__file__).resolve().parent / "output" / "browser"))
# No news pop-up over the notebook, and no autosave: the .py file in the repo must stay as it is.
LAB_SETTINGS = {
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
}
