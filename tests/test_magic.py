"""The IPython magics in an in-process shell: isolated cells, budgets, kernel imports, candidate codecs."""

from __future__ import annotations

import os

import psutil
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

from picklescope.core.units import MiB
from picklescope.views.magic import kernel_imports


@pytest.fixture(scope="module")
def ip():
    start_ipython()  # the process-wide test shell: a no-op once another test file started it
    shell = InteractiveShell.instance()
    shell.run_cell("%load_ext picklescope", store_history=True)
    shell.run_cell("import numpy as np\nimport json as js\nfrom collections import OrderedDict", store_history=True)
    return shell


def _run(ip, cell: str):
    res = ip.run_cell(cell, store_history=True)
    if res.error_before_exec or res.error_in_exec:
        raise res.error_before_exec or res.error_in_exec
    return ip.user_ns["picklescope_result"]


def test_cell_beyond_its_budget_is_oom_killed_and_the_kernel_lives_on(ip, capsys):
    kernel_pid = os.getpid()
    # 256 MiB per step, pages touched (np.ones): the first step crosses the 96 MiB budget a third of the
    # way in, so the kill lands while line 3 is still allocating even when the sampler is late by
    # tens of milliseconds on a loaded machine (with 32 MiB steps a late kill could show line 2)
    r = _run(ip, "%%picklescope --budget 96MiB\nparts = []\nfor i in range(4):\n"
                 "    parts.append(np.ones(256 * 2**20 // 8))\nprint('survived', len(parts))\n")
    assert r.outcome == "oom-killed"
    assert r.killed_side == "cell" and r.killed_in_step == "cell"
    assert r.enforcement == "watchdog"
    assert r.processes["cell"].peak_bytes > 96 * MiB
    assert "picklescope_cell.py" in (r.stack_at_death or "")  # the cell's own frame, from faulthandler
    assert r.killed_at_line == 3  # parts.append(np.ones(...)), the line that allocates
    child = r.processes["cell"].pid
    assert child != kernel_pid and r.processes["cell"].exit_code == -9
    try:
        assert psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        pass  # reaped: gone
    captured = capsys.readouterr()
    out = captured.out
    assert "survived" not in out and "killed: out of memory" in out
    # one block: the line numbered as in the cell the user sees (the magic line is line 1), quoted;
    # the stack folded inside the block with the same numbering; nothing on stderr
    assert "while running line 4 of this cell: parts.append(np.ones(256 * 2**20 // 8))" in out
    assert 'File "this cell", line 4' in out and "picklescope_cell.py" not in out
    assert captured.err == ""
    # the kernel process is the same one and still executes code
    assert os.getpid() == kernel_pid
    after = ip.run_cell("alive = 40 + 2", store_history=True)
    assert after.success and ip.user_ns["alive"] == 42


def test_cell_peak_is_exact_and_kernel_imports_come_along(ip, capsys):
    # uses np, js and OrderedDict without importing them: the kernel's imports were re-run in the child
    r = _run(ip, "%%picklescope\nx = np.ones(48 * 2**20 // 8)\nprint(js.dumps(OrderedDict(n=x.nbytes)))\n")
    assert r.outcome == "ok", r.error
    peak = r.processes["cell"].peak_bytes
    assert 46 * MiB <= peak <= 52 * MiB  # exact (VmHWM) peak of one 48 MiB array, above the baseline
    assert r.processes["cell"].timeline.bytes, "the parent sampled the child"
    assert r.import_errors == []
    out = capsys.readouterr().out
    assert f'{{"n": {48 * MiB}}}' in out
    # held memory fully accounted for: the cycle-held part and the rest, each explained
    assert "freed only by gc.collect()" in out and "still in use after the collection" in out


def test_cell_error_is_reported_not_raised(ip, capsys):
    r = _run(ip, "%%picklescope\nraise ValueError('from the child')\n")
    assert r.outcome == "error" and "ValueError: from the child" in r.error
    captured = capsys.readouterr()
    assert captured.err == ""  # the cell's failure is the result, shown in the block, not a red stderr box
    assert "failed at line 2 of this cell: ValueError: from the child" in captured.out
    assert 'File "this cell", line 2' in captured.out and "raise ValueError('from the child')" in captured.out


def test_kernel_imports_keeps_aliases_and_skips_relative_and_future(ip):
    ip.run_cell("from __future__ import annotations\nimport os.path as osp\nx = 1", store_history=True)
    stmts = kernel_imports(ip)
    assert "import numpy as np" in stmts and "from collections import OrderedDict" in stmts
    assert "import os.path as osp" in stmts
    assert not any("__future__" in s for s in stmts)
    assert len(stmts) == len(set(stmts))


def test_budget_must_be_bytes_and_magics_are_refused(ip):
    with pytest.raises(UsageError, match="no payload"):
        ip.run_cell_magic("picklescope", "--budget 1.5x", "x = 1")
    with pytest.raises(UsageError, match="not a size"):
        ip.run_cell_magic("picklescope", "--budget lots", "x = 1")
    with pytest.raises(UsageError, match="magics"):
        ip.run_cell_magic("picklescope", "", "%time x = 1")


def test_codec_defined_in_a_cell_runs_in_the_children(ip):
    import picklescope

    ip.run_cell(
        "%%picklescope_codec\n"
        "from picklescope.codecs.numpy_codec import NumpyLegacyCodec\n\n"
        "class MovedBranchFirst(NumpyLegacyCodec):\n"
        "    name = 'candidate-test'\n"
        "    def before_views(self, b):\n"
        "        pass  # the fix: no discarded consolidate\n",
        store_history=True,
    )
    plugins = ip.user_ns["picklescope_plugins"]
    r = picklescope.run("candidate-test", "pickle5-oob", "tiny", 1.0, plugins=plugins)
    assert r.outcome == "ok", r.error
    assert r.roundtrip["ok"] is True
    assert r.sender.step("__getstate__") is not None and r.sender.step("consolidate") is None


def test_cell_tracer_shows_what_tracemalloc_misses(ip):
    ip.run_cell("import torch", store_history=True)
    r = _run(ip, "%%picklescope --tracer tracemalloc\nt = torch.ones(32 * 2**18)\nb = bytearray(b'x' * (8 * 2**20))\n")
    assert r.outcome == "ok" and r.tracer == "sampler,tracemalloc"
    seen, exact = r.tracers["tracemalloc"]["peak_bytes"], r.processes["cell"].peak_bytes
    assert exact >= 38 * MiB  # 32 MiB tensor + 8 MiB bytes (+ the temporary b'x' * n)
    assert 7 * MiB <= seen <= 20 * MiB  # the Python buffers only: the torch tensor is invisible to it
