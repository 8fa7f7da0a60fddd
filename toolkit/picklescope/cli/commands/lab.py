"""``picklescope lab [DIR]``: JupyterLab on a folder of notebooks, each ``.py`` opening as a notebook.

The folder gets the packaged notebooks first where they are missing (``picklescope notebooks``); files
already there are the user's and stay as they are. Lab opens the jupytext ``.py`` files as notebooks by
the packaged settings (``jupyter/overrides.d/picklescope.json``), handed over as defaults in a
configuration folder that exists only while Lab runs: nothing of the user's Jupyter set-up changes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from picklescope.core.leftovers import temp_name
from picklescope.core.paths import copy_notebooks, package_folder
from picklescope.errors import PicklescopeError

ORDER = 71
DEFAULT_DIR = "picklescope-notebooks"


def register(sub: Any) -> None:
    p = sub.add_parser("lab", help="open JupyterLab on a folder of the notebooks (copied there if missing)")
    p.add_argument("dir", nargs="?", default=DEFAULT_DIR, help=f"the folder; default ./{DEFAULT_DIR}")
    p.add_argument("jupyter_args", nargs=argparse.REMAINDER,
                   help="further arguments for 'jupyter lab' (e.g. --no-browser --port 8899)")
    p.set_defaults(func=main)


def _settings_config_dir(tmp: Path) -> Path:
    """A Jupyter configuration folder whose ``labconfig`` holds the packaged Lab settings as defaults."""
    settings = json.loads((package_folder("jupyter") / "overrides.d" / "picklescope.json").read_text())
    (tmp / "labconfig").mkdir(parents=True)
    (tmp / "labconfig" / "default_setting_overrides.json").write_text(json.dumps(settings, indent=1))
    return tmp


def main(args: argparse.Namespace) -> int:
    missing = [m for m in ("jupyterlab", "jupytext") if importlib.util.find_spec(m) is None]
    if missing:
        raise PicklescopeError(f"{' and '.join(missing)} not installed in this environment ({sys.executable})",
                               "pip install 'picklescope[notebooks]'")
    folder = Path(args.dir).expanduser()
    written = copy_notebooks(folder, keep=True)
    if written:
        print(f"copied {len(written)} file(s) into {folder}")
    extra = list(args.jupyter_args or [])
    if extra[:1] == ["--"]:
        extra = extra[1:]
    if hasattr(os, "getuid") and os.getuid() == 0 and "--allow-root" not in extra:
        # a container's default user is root; Jupyter refuses to start as root without this flag
        print("picklescope: running as root (user id 0), so JupyterLab gets --allow-root", file=sys.stderr)
        extra.append("--allow-root")
    tmp = Path(tempfile.mkdtemp(prefix=temp_name("picklescope-lab-")))  # named for the leftover check
    try:
        config = _settings_config_dir(tmp)
        paths = [str(config), *filter(None, os.environ.get("JUPYTER_CONFIG_PATH", "").split(os.pathsep))]
        env = dict(os.environ, JUPYTER_CONFIG_PATH=os.pathsep.join(paths))
        if not any(a.startswith("--KernelManager.transport") for a in extra):
            # kernels talk to Lab over local sockets in this run's private folder: no "running over TCP
            # without encryption" warning at each kernel start, and nothing else on the machine can connect
            extra += ["--KernelManager.transport=ipc", f"--KernelManager.ip={tmp / 'k'}"]
        proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--notebook-dir", str(folder), *extra], env=env)
        try:
            while True:
                try:
                    return proc.wait()
                except KeyboardInterrupt:
                    continue  # Lab got the same Ctrl-C and asks whether to shut down; it decides
        finally:
            if proc.poll() is None:  # SIGTERM to us, or an error: Lab goes too
                proc.terminate()
                try:
                    proc.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
