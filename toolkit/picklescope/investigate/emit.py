"""Turn a confirmed fix into a regression test for the verl repository, and check it both ways.

The emitted file is self-contained (pytest, torch, tensordict, numpy and ``verl.protocol`` only) so
it can be dropped into verl's ``tests/``. What it asserts comes from the confirm report, not from a
template of beliefs:

- if ``consolidate`` ran in the baseline's sender and not in the candidate's (numpy mode), a test
  that makes ``TensorDict.consolidate`` raise and still round-trips a batch in that mode;
- a test that the serialize-side peak stays under a bound, placed between the two measured peaks
  (a quarter of the way from the candidate's to the baseline's, as a fraction of the payload), and
  measured the way picklescope measures: the kernel's high-water mark (``VmHWM``, reset through
  ``/proc/self/clear_refs``), around one ``pickle.dumps`` of the transport the report used.

:func:`run_emitted` runs the file with pytest in a fresh interpreter against one installed verl
environment (optionally with the candidate patch applied through :mod:`picklescope.verl.pytest_patch`),
so "fails on the baseline, passes on the candidate" is checked, not assumed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from picklescope.core.leftovers import temp_name
from picklescope.errors import PicklescopeError
from picklescope.investigate.confirm import ConfirmReport
from picklescope.verl import envs
from picklescope.verl.codec import PATCH_ENV, split_name

TEST_PAYLOAD = 64 << 20
_HEADER = '''"""Regression test for DataProto serialization memory, emitted by ``picklescope confirm``.

{summary}

Self-contained: needs only pytest, torch, tensordict, numpy and verl. The peak test reads the
kernel's high-water mark of this process (Linux ``/proc``); elsewhere it is skipped.
"""

import gc
import os
import pickle

import numpy as np
import pytest
import torch

tensordict = pytest.importorskip("tensordict")
protocol = pytest.importorskip("verl.protocol")

MODE = {mode!r}
PAYLOAD_BYTES = {payload}
PEAK_BOUND = {bound}  # of the payload; measured: baseline {base_ratio:.3f}x, candidate {cand_ratio:.3f}x


def _data_proto(payload_bytes):
    """A deterministic batch: one float32 leaf carrying the payload, small int64 and bool leaves, strings."""
    rows = 256
    g = torch.Generator().manual_seed(0)
    td = tensordict.TensorDict(
        {{
            "hidden": torch.randn(rows, payload_bytes // (rows * 4), generator=g),
            "input_ids": torch.randint(0, 32000, (rows, 8), generator=g),
            "mask": torch.ones(rows, 8, dtype=torch.bool),
        }},
        batch_size=[rows],
    )
    uid = np.array([f"uid-{{i}}" for i in range(rows)], dtype=object)
    return protocol.DataProto(batch=td, non_tensor_batch={{"uid": uid}}, meta_info={{"step": 1}})


def _dumps(obj):
    buffers = []
    {dumps}
    return data, buffers


@pytest.fixture
def mode(monkeypatch):
    monkeypatch.setenv("VERL_DATAPROTO_SERIALIZATION_METHOD", MODE)
    return MODE
'''

_CONSOLIDATE = '''

def test_consolidate_is_not_called(mode, monkeypatch):
    """In numpy mode the numpy views are all that is sent: a consolidated copy would be thrown away."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("TensorDict.consolidate() called while serializing in numpy mode")

    monkeypatch.setattr(tensordict.TensorDict, "consolidate", refuse)
    dp = _data_proto(1 << 20)
    data, buffers = _dumps(dp)
    back = pickle.loads(data, buffers=buffers)
    for key in dp.batch.keys():
        assert torch.equal(back.batch[key], dp.batch[key]), key
    assert back.non_tensor_batch["uid"].tolist() == dp.non_tensor_batch["uid"].tolist()
    assert back.meta_info == dp.meta_info
'''

_PEAK = '''

def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    raise RuntimeError(field)


def test_serialize_peak_is_bounded(mode):
    """pickle.dumps of a batch must not need a copy of its payload ({transport})."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pytest.skip("this kernel does not let a process reset its peak (/proc/self/clear_refs)")
    dp = _data_proto(PAYLOAD_BYTES)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    start = _status("VmRSS:")
    data, buffers = _dumps(dp)
    peak = _status("VmHWM:") - start
    assert peak < PEAK_BOUND * PAYLOAD_BYTES, (
        f"serializing added {{peak / 2**20:.1f}} MiB at peak, over {{PEAK_BOUND:.2f}}x of the "
        f"{{PAYLOAD_BYTES / 2**20:.0f}} MiB payload"
    )
'''


def peak_bound(rep: ConfirmReport) -> float:
    """A quarter of the way from the candidate's sender peak to the baseline's, as a fraction of payload."""
    p = rep.payload_bytes
    b, c = rep.baseline.result.sender.peak_bytes / p, rep.candidate.result.sender.peak_bytes / p
    return round(c + 0.25 * (b - c), 3)


def emit_test(rep: ConfirmReport, path: str | os.PathLike) -> Path:
    """Write the regression test for ``rep`` to ``path``; refuses when there is nothing to pin."""
    if not rep.ok:
        raise PicklescopeError(f"the candidate is not confirmed ({rep.verdict})",
                               "a regression test pins a confirmed fix; fix the candidate first")
    _, mode, _ = split_name(rep.baseline.codec)
    p = rep.payload_bytes
    base_ratio = rep.baseline.result.sender.peak_bytes / p
    cand_ratio = rep.candidate.result.sender.peak_bytes / p
    base_sites = [s for s in rep.baseline.call_sites if s["side"] == "sender"]
    cand_sites = [s for s in rep.candidate.call_sites if s["side"] == "sender"]
    where = ", ".join(f"{Path(s['file']).parent.name}/{Path(s['file']).name}:{s['line']}" for s in base_sites)
    summary = (f"Measured {time.strftime('%Y-%m-%d')}: baseline {rep.baseline.codec} vs candidate "
               f"{rep.candidate.codec} on {rep.workload} x{rep.scale:g} over {rep.transport}: sender peak "
               f"{base_ratio:.2f}x -> {cand_ratio:.2f}x of the payload"
               + (f"; the baseline consolidated at {where}, the candidate never did." if base_sites and not
                  cand_sites else ".") + "\nFails on the baseline, passes with the fix.")
    oob = rep.transport == "pickle5-oob"
    dumps = ("data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)" if oob
             else "data = pickle.dumps(obj, protocol=4)")
    text = _HEADER.format(summary=summary, mode=mode, payload=TEST_PAYLOAD, bound=peak_bound(rep),
                          base_ratio=base_ratio, cand_ratio=cand_ratio, dumps=dumps)
    if mode == "numpy" and base_sites and not cand_sites:
        text += _CONSOLIDATE
    text += _PEAK.format(transport="protocol 5, out-of-band buffers" if oob else "protocol 4, in-band")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    return out


@dataclass
class EmittedRun:
    label: str
    patch: str | None
    passed: bool
    returncode: int
    output: str


def run_emitted(path: str | os.PathLike, label: str, patch: str | None = None, timeout_s: float = 600) -> EmittedRun:
    """Run the emitted test with pytest against verl ``label`` (and ``patch``) in a fresh interpreter."""
    env_dir = envs.get_env(label)
    src = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix=temp_name("picklescope-emitted-")) as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n")
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PICKLESCOPE_VERL", "PYTEST_"))}
        env["PYTHONPATH"] = os.pathsep.join([str(env_dir.site), *filter(None, [env.get("PYTHONPATH")])])
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(ini), "--rootdir", tmp]
        if patch:
            env[PATCH_ENV] = patch
            cmd += ["-p", "picklescope.verl.pytest_patch"]
        proc = subprocess.run([*cmd, str(src)], capture_output=True, text=True, env=env, cwd=tmp, timeout=timeout_s)
    out = proc.stdout + proc.stderr
    return EmittedRun(label, patch, proc.returncode == 0, proc.returncode, out)
