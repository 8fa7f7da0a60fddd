"""picklescope as a user installs it: a wheel, into an environment that already holds torch.

The wheel's metadata and listing are checked on every run (building it takes seconds). The slow test
installs it into a new virtual environment with torch 2.13.0 (the local CPU wheel) and numpy already
there, and runs the commands a user runs from a folder outside the checkout; it is
``scripts/check_install.py`` for this Python (the script does the same for other Pythons and torch
versions, outside the test command: benchmarks/README.md#install-checks).
"""

from __future__ import annotations

import email
import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[1]
HOST_PACKAGES = {"torch", "numpy", "tensordict", "ray"}


def _check_install():
    spec = importlib.util.spec_from_file_location("check_install", ROOT / "scripts" / "check_install.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up by name
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return _check_install().build_wheel(tmp_path_factory.mktemp("dist"))


def test_wheel_lists_presets_template_notebooks_and_blobs(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for preset in (ROOT / "data" / "workloads").glob("*.yaml"):
        assert f"picklescope/data/workloads/{preset.name}" in names
    for blob in (ROOT / "data" / "blobs").iterdir():
        assert f"picklescope/data/blobs/{blob.name}" in names
    notebooks = sorted(n for n in names if n.startswith("picklescope/notebooks/") and n.endswith(".py"))
    assert [n.rsplit("/", 1)[1] for n in notebooks] == sorted(p.name for p in (ROOT / "notebooks").glob("*.py"))
    assert len(notebooks) == 6
    assert "picklescope/notebooks/jupytext.toml" in names
    assert "picklescope/views/templates/picklescope_offline/index.html.j2" in names
    assert "picklescope/jupyter/overrides.d/picklescope.json" in names


def test_wheel_metadata_pins_nothing_the_host_holds_and_allows_310_to_313(wheel):
    z = zipfile.ZipFile(wheel)
    (meta_name,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
    meta = email.message_from_bytes(z.read(meta_name))
    python = SpecifierSet(meta["Requires-Python"])
    assert all(f"3.{m}.0" in python for m in (10, 11, 12, 13)) and "3.9.0" not in python
    reqs = [Requirement(r) for r in meta.get_all("Requires-Dist")]
    assert {r.name for r in reqs} >= HOST_PACKAGES
    for r in reqs:
        if r.name in HOST_PACKAGES:
            assert not any(s.operator in ("==", "===") for s in r.specifier), f"the wheel pins {r}"


def test_package_data_is_found_by_importlib_resources_from_a_zip(wheel, tmp_path):
    """A zipped package (the wheel on sys.path) extracts its data folders once into the user's cache."""
    code = ("import picklescope, picklescope.workloads.spec as s; from picklescope.views import nbrun;"
            "assert '.whl' in picklescope.__file__, picklescope.__file__;"
            "print(s.available_workloads(), len(list(nbrun.NOTEBOOK_DIR.glob('*.py'))), s.WORKLOAD_DIR)")
    env = {"PYTHONPATH": str(wheel), "XDG_CACHE_HOME": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    presets, notebooks, folder = out.stdout.rsplit(" ", 2)
    assert "'tiny'" in presets and "'flowgrpo'" in presets and notebooks == "6"
    assert folder.strip().startswith(str(tmp_path / "cache" / "picklescope")), folder


@pytest.mark.slow
def test_a_user_install_keeps_torch_and_numpy_and_every_command_works(wheel, tmp_path):
    mod = _check_install()
    lines: list[str] = []
    summary = mod.check(sys.executable, "2.13.0", tmp_path, wheel=wheel, log=lines.append)
    assert summary.ok, "\n".join(lines)
    assert summary.torch_before.startswith("2.13.0") and summary.torch_after == summary.torch_before
    assert summary.numpy_after == summary.numpy_before
    assert len(summary.steps) == 9, "\n".join(lines)
