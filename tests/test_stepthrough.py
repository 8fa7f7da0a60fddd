"""Line-by-line step-through of any __getstate__ / __setstate__, with exact memory per line.

Figures are ratios to the payload of the same step-through; no time is asserted.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from picklescope.errors import PicklescopeError
from picklescope.investigate.stepthrough import StepThrough, stepthrough

HOLDER = '''
"""A class of the user's own, shaped like verl's DataProto (pre-fix): one wasted copy, then views."""


class Holder:
    def __init__(self, batch, non_tensor_batch, meta_info):
        self.batch = batch
        self.non_tensor_batch = non_tensor_batch
        self.meta_info = meta_info

    def __getstate__(self):
        wasted = self.batch.contiguous().consolidate()
        del wasted
        return {"batch": self.batch, "meta_info": self.meta_info}

    def __setstate__(self, state):
        self.meta_info = state["meta_info"]
        self.batch = state["batch"].clone()
'''

PATCH = '''
def getstate(self):
    """A candidate patch: no consolidate at all."""
    return {"batch": self.batch, "meta_info": self.meta_info}
'''


@pytest.fixture(scope="module")
def legacy():
    return stepthrough(codec="numpy-legacy", workload="flowgrpo", scale=0.25)


@pytest.fixture(scope="module")
def fixed():
    return stepthrough(codec="numpy", workload="flowgrpo", scale=0.25)


@pytest.fixture(scope="module")
def user_code(tmp_path_factory):
    d = tmp_path_factory.mktemp("usercode")
    (d / "holder_mod.py").write_text(textwrap.dedent(HOLDER))
    (d / "patch_mod.py").write_text(textwrap.dedent(PATCH))
    return d


def share(n, st):
    return n / st.payload_bytes


def test_numpy_legacy_getstate_names_the_consolidate_line(legacy):
    assert legacy.outcome == "ok", legacy.error
    line = legacy.culprit()
    assert "consolidate()" in line.source and line.function.endswith("before_views")
    assert abs(share(line.added_bytes, legacy) - 1.0) < 0.05
    assert line.hits == 1 and line.peak_bytes >= line.added_bytes
    # only that line and the lines that called it carry the copy
    heavy = [r for r in legacy.rows if share(r.added_bytes, legacy) > 0.02]
    assert all(r.depth <= line.depth for r in heavy) and line in heavy
    assert {r.depth for r in legacy.rows} >= {0, 1, 2}
    assert abs(share(legacy.peak_bytes, legacy) - 1.0) < 0.05


def test_numpy_getstate_has_no_line_above_two_percent(fixed):
    assert fixed.outcome == "ok", fixed.error
    assert fixed.rows
    worst = max(fixed.rows, key=lambda r: r.cost_bytes)
    assert share(worst.cost_bytes, fixed) < 0.02, (worst.source, worst.added_bytes, worst.retained_bytes)
    assert any("_leaf_to_numpy" in r.source for r in fixed.rows)


def test_codec_setstate_shows_the_receivers_bytearray_copy():
    st = stepthrough(codec="numpy", method="__setstate__", workload="flowgrpo", scale=0.05)
    assert st.outcome == "ok", st.error
    line = st.culprit()
    assert "bytearray" in line.source and line.hits > 1  # one copy per leaf, kept
    assert abs(share(line.retained_bytes, st) - 1.0) < 0.05


def test_a_users_own_class_is_stepped_through(user_code):
    # consolidate() has a fixed cost of ~3 MiB on top of the copy: a scale where that is small
    st = stepthrough(function="holder_mod:Holder.__getstate__", workload="flowgrpo", scale=0.1,
                     sys_path=[str(user_code)])
    assert st.outcome == "ok", st.error
    assert [r.source for r in st.rows if r.depth == 0] == [
        "wasted = self.batch.contiguous().consolidate()", "del wasted",
        'return {"batch": self.batch, "meta_info": self.meta_info}']
    consolidate, delete, ret = st.rows[:3]
    assert "consolidate()" in consolidate.source and abs(share(consolidate.added_bytes, st) - 1.0) < 0.1
    assert share(ret.added_bytes, st) < 0.02
    back = stepthrough(function="holder_mod:Holder.__setstate__", workload="flowgrpo", scale=0.1,
                       sys_path=[str(user_code)])
    assert back.outcome == "ok", back.error and back.method == "__setstate__"
    clone = back.culprit()
    assert "clone()" in clone.source and abs(share(clone.added_bytes, back) - 1.0) < 0.1


def test_a_candidate_patch_file_is_stepped_through(user_code):
    st = stepthrough(function=f"{user_code / 'patch_mod.py'}:getstate", workload="tiny", scale=1)
    assert st.outcome == "ok", st.error
    assert [r.source for r in st.rows] == ['return {"batch": self.batch, "meta_info": self.meta_info}']


def test_failures_are_reported_not_raised():
    st = stepthrough(function="json:loads", workload="tiny", scale=1)  # resolves, then fails when called
    assert st.outcome == "error" and "TypeError" in st.error
    with pytest.raises(PicklescopeError, match="cannot be imported"):  # a target that does not resolve
        stepthrough(function="no_such_module_here:f", workload="tiny", scale=1)
    with pytest.raises(PicklescopeError):
        stepthrough()
    with pytest.raises(PicklescopeError):
        stepthrough(codec="numpy", method="__reduce__")


def test_stepthrough_round_trips_as_plain_data(legacy):
    back = StepThrough.from_dict(json.loads(legacy.to_json()))
    assert back == legacy and back.culprit() == legacy.culprit()


def test_cli_prints_the_table_and_names_the_line():
    p = subprocess.run([sys.executable, "-m", "picklescope", "stepthrough", "--codec", "numpy-legacy",
                        "--workload", "flowgrpo", "--scale", "0.1"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    assert "x payload" in p.stdout and "consolidate()" in p.stdout
    lines = p.stdout.strip().splitlines()
    last = lines[-1]
    assert last.startswith("costliest line: numpy_codec.py:") and "consolidate()" in last
    first_row = lines[lines.index(next(ln for ln in lines if ln.startswith("-----"))) + 1]
    assert first_row.startswith("numpy_codec.py:") and "consolidate()" in first_row, first_row
    assert 0.95 < float(re.search(r"\(([0-9.]+)x payload\)", last).group(1)) < 1.1, last


def test_torch_codec_names_the_lines_that_allocate_not_the_wrapper():
    """Ranked by self cost: consolidate() and torch.save carry one payload each; the wrapper that
    calls them (inclusive 2x) has no cost of its own and is folded with the quiet lines."""
    p = subprocess.run([sys.executable, "-m", "picklescope", "stepthrough", "--codec", "torch", "--workload",
                        "flowgrpo", "--scale", "0.1", "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    costly = [r for r in d["rows"] if not r["quiet"]]
    assert {r["source"] for r in costly} == {"td = td.consolidate()", "torch.save(td, buffer)"}, costly
    for r in costly:
        assert abs(r["self_bytes"] / d["payload_bytes"] - 1.0) < 0.1
    wrapper = next(r for r in d["rows"] if r["source"] == "return self.encode(b)")
    assert wrapper["quiet"] and wrapper["added_bytes"] > 1.8 * d["payload_bytes"]
    assert wrapper["self_bytes"] < 0.01 * d["payload_bytes"]
    assert d["culprit"]["source"] in {r["source"] for r in costly}
    # the nesting stays visible: torch.save was called from the line that called save()
    save = next(r for r in costly if "torch.save" in r["source"])
    caller = next(r for r in d["rows"] if r["order"] == save["caller"])
    assert "self.save(td)" in caller["source"]


def test_ranked_puts_costly_lines_first_and_keeps_the_rest_in_order(legacy):
    costly, quiet = legacy.ranked()
    assert costly[0] is legacy.culprit() and "consolidate()" in costly[0].source
    assert [r.order for r in quiet] == sorted(r.order for r in quiet)
    assert all(r.self_bytes < 0.01 * legacy.payload_bytes for r in quiet)
    path = [c.function for c in legacy.call_path(costly[0])]
    assert path[0].endswith("getstate") and path[-1].endswith("encode"), path
    # the JSON lists rows in the same ranked order
    assert [r["order"] for r in legacy.to_dict()["rows"]] == [r.order for r in costly + quiet]


def test_real_verl_getstate_puts_protocols_consolidate_line_first(verl_envs):
    """verl 0.9.0's own DataProto.__getstate__ (downloaded from PyPI into the cache) in numpy mode."""
    env = verl_envs["0.9.0"]
    st = stepthrough(function="verl.protocol:DataProto.__getstate__", workload="flowgrpo", scale=0.1,
                     sys_path=[str(env.site)], env={"VERL_DATAPROTO_SERIALIZATION_METHOD": "numpy"})
    assert st.outcome == "ok", st.error
    costly, _quiet = st.ranked()
    assert costly and costly[0].filename.endswith("protocol.py") and "consolidate()" in costly[0].source
    assert abs(costly[0].self_bytes / st.payload_bytes - 1.0) < 0.1
