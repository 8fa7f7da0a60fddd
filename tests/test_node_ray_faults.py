"""``picklescope node --enforcement ray`` on its fault paths: the command interrupted or killed mid-run.

The run makes two memory cgroups (the start one and the watched one, named after the command's pid),
a private mount namespace in its driver, a Ray cluster and temporaries in ``/tmp`` and ``/dev/shm``.
Whether the command is interrupted (SIGINT), terminated (SIGTERM) or killed (SIGKILL, no handler of its
own runs), none of it may outlive it: no Ray process, no cgroup, no file. The helpers are the node
replay's fault test's (tests/test_node.py).
"""

from __future__ import annotations

import glob
import os
import signal
import sys
from pathlib import Path

import pytest

from picklescope.core import cgroup
from picklescope.ray import ray_available

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from test_node import SMALL, _cmd, _ours, _start_running, left_nothing, workers_up  # noqa: E402
from test_node_ray_monitor import _usable  # noqa: E402

pytestmark = [pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'picklescope[ray]')"),
              pytest.mark.ray]

SIGNALS = {"ctrl-c": signal.SIGINT, "sigterm": signal.SIGTERM, "sigkill": signal.SIGKILL}


def _left(pid: int) -> list[str]:
    """What a command with this pid left: its temporaries in /tmp (or TMPDIR) and /dev/shm, its cgroups."""
    found = _ours(pid)
    if os.path.isdir("/dev/shm"):
        found += glob.glob(f"/dev/shm/*-{pid}-*")
    base, _ = cgroup.support()
    if base is not None:
        found += glob.glob(os.path.join(base, f"picklescope-{pid}-*"))
    return found


@pytest.mark.parametrize("how,controller", [("ctrl-c", "process"), ("sigterm", "actor"), ("sigkill", "process"),
                                            ("sigkill", "actor")])
def test_interrupted_or_killed_ray_enforced_run_leaves_no_process_cgroup_or_file(how, controller):
    why = _usable()
    if why:
        pytest.skip(f"--enforcement ray is unavailable here: {why}")
    # a budget far above what the fixed codec's node holds: the run is in its training steps when it is stopped
    p, procs = _start_running(["node", *SMALL, "--steps", "1000", "--enforcement", "ray", "--node-budget", "100x",
                               "--controller", controller], workers_up(2))
    try:
        assert any("TaskRunner" in " ".join(_cmd(q)) for q in procs) == (controller == "actor")
        cgroups = [c for c in _left(p.pid) if c.startswith("/sys/fs/cgroup")]
        assert len(cgroups) == 2, f"the run's start and watched cgroups should exist while it runs: {cgroups}"
        os.kill(p.pid, SIGNALS[how])
        p.wait(timeout=120)
        left_nothing(p, procs, _left, interrupted=how == "ctrl-c")
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
