"""The test tiers and the notebooks' small parameters (tests/conftest.py, tests/notebook_params.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import jupytext
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from notebook_params import LAB_PARAMETERS, small_copy, with_parameters  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
TIERS = {"ray", "browser", "verl", "fault", "slow"}
CELL = ('# %% [markdown]\n# Title\n\n# %% tags=["parameters"]\nworkload = "flowgrpo"  # a preset\nsteps = 4\n\n'
        "# %%\nx = 1\n")


def test_parameters_are_replaced_and_their_comments_kept():
    text = with_parameters(CELL, {"workload": "tiny", "steps": 2})
    assert "workload = 'tiny'  # a preset\n" in text and "steps = 2\n" in text
    assert text.replace("workload = 'tiny'", 'workload = "flowgrpo"').replace("steps = 2", "steps = 4") == CELL


def test_a_parameter_the_cell_does_not_assign_is_refused():
    with pytest.raises(ValueError, match="no 'scale'"):
        with_parameters(CELL, {"scale": 1.0})
    with pytest.raises(ValueError, match="parameters"):
        with_parameters("# %%\nx = 1\n", {"x": 2})


def test_the_small_copy_of_every_notebook_runs_with_its_small_parameters(tmp_path):
    folder = small_copy(REPO / "notebooks", tmp_path / "nb")
    for stem, values in LAB_PARAMETERS.items():
        nb = jupytext.read(folder / f"{stem}.py")
        params = next(c for c in nb.cells if c.cell_type == "code")
        assert params.metadata.get("tags") == ["parameters"], stem
        scope: dict = {}
        exec(params.source, scope)  # the cell only assigns literals
        assert {k: scope[k] for k in values} == values, stem


def test_the_quick_tier_holds_no_heavier_test(request):
    items = request.session.items
    quick = [i for i in items if i.get_closest_marker("quick")]
    heavy = [i.nodeid for i in quick if {m.name for m in i.iter_markers()} & TIERS]
    assert heavy == []
    # whatever this run collected: every test of a tier file carries its tier
    for item in items:
        name = Path(str(item.fspath)).name
        if name in ("test_ray.py", "test_node.py"):
            assert item.get_closest_marker("ray"), item.nodeid
        if name == "test_browser.py":
            assert item.get_closest_marker("browser"), item.nodeid
        if "verl_envs" in getattr(item, "fixturenames", ()):
            assert item.get_closest_marker("verl"), item.nodeid
