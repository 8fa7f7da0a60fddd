"""Commands leave nothing in ``/tmp`` or ``TMPDIR`` when ``TMPDIR`` points elsewhere.

tests/test_leftovers.py checks ``run`` (in-process transports and Ray) and tests/test_node.py the node
replay on a busy machine; these are the other kinds of path: a command that imports tensordict in its
own process (``capabilities``, where torch's ``torchinductor_<user>`` folder would appear), a blob
loaded in a child (``inspect --as``), a trusted load in a child (``workload from --trust``), the
line-by-line step-through and a budgeted run killed by the watchdog. Each runs with ``/tmp`` replaced by an
empty private one (tests/private_tmp.py), so the listing afterwards is the command's alone.
"""

from __future__ import annotations

import os
import pickle
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from private_tmp import private_tmp, unshare_works  # noqa: E402

COMMANDS = {
    "capabilities": ["capabilities", "--codec", "numpy"],
    "inspect-as": ["inspect", "{in}/batch.pkl", "--as", "numpy", "--trust"],
    "workload-from-trust": ["workload", "from", "{in}/td.pkl", "--trust", "--out", "{in}/w.yaml"],
    "stepthrough": ["stepthrough", "--codec", "numpy-legacy", "--workload", "tiny"],
    "run-killed": ["run", "--codec", "numpy-legacy", "--workload", "tiny", "--budget", "0.5x"],
}


@pytest.mark.skipif(not unshare_works(), reason="needs 'unshare --mount' and tmpfs mounts (root, or a user namespace)")
@pytest.mark.parametrize("name", list(COMMANDS))
def test_a_command_leaves_nothing_in_tmp_or_tmpdir(name):
    import torch

    from picklescope.batch import set_active_codec
    from picklescope.workloads import load_workload

    inputs = Path(tempfile.mkdtemp(prefix="ps-in-", dir="/var/tmp"))  # outside /tmp, which the command will not see
    with open(inputs / "td.pkl", "wb") as f:
        pickle.dump({"x": torch.zeros(4, 3), "y": torch.ones(4, 2)}, f)
    set_active_codec("numpy")
    try:
        (inputs / "batch.pkl").write_bytes(pickle.dumps(load_workload("tiny").build(0.25), protocol=4))
    finally:
        set_active_codec(None)
    args = [a.replace("{in}", str(inputs)) for a in COMMANDS[name]]
    tmpdir = tempfile.mkdtemp(prefix="ps-t-", dir="/var/tmp")  # a fresh TMPDIR, outside /tmp
    try:
        rc, out, err, left = private_tmp([sys.executable, "-m", "picklescope", *args], tmpdir, 900)
        in_tmpdir = os.listdir(tmpdir)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
        shutil.rmtree(inputs, ignore_errors=True)
    assert rc == 0, (rc, out[-2000:], err[-2000:])
    if name == "run-killed":
        assert "oom-killed" in out, out[-2000:]  # the path through the watchdog's kill was taken
    assert left == [], f"left in /tmp: {left}"
    assert in_tmpdir == [], f"left in TMPDIR: {in_tmpdir}"  # torchinductor_* included
