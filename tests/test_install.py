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
@pytest.mark.timeout(3600)  # torch's wheel unpacked and the notebooks' stack installed: minutes on a loaded machine
def test_a_user_install_keeps_torch_and_numpy_and_every_command_works(wheel, tmp_path):
    mod = _check_install()
    lines: list[str] = []
    summary = mod.check(sys.executable, "2.13.0", tmp_path, wheel=wheel, log=lines.append)
    assert summary.ok, "\n".join(lines)
    assert summary.torch_before.startswith("2.13.0") and summary.torch_after == summary.torch_before
    assert summary.numpy_after == summary.numpy_before
    assert len(summary.steps) == 9, "\n".join(lines)


def test_importing_the_probe_imports_nothing_heavy():
    """``import picklescope.capture`` (and the documented ``picklescope.investigate.capture``) in a job's start-up:
    no torch, numpy, plotly, Ray, tensordict, YAML or Jupyter until the probe records something. Its time is
    measured by benchmarks/probe_import.py (never asserted: it depends on the machine's load)."""
    heavy = ("torch", "numpy", "plotly", "ray", "tensordict", "yaml", "jupyter_client", "IPython", "psutil")
    for module in ("picklescope.capture", "picklescope.investigate.capture", "picklescope"):
        code = (f"import sys, {module}; print(sorted({{m.split('.')[0] for m in sys.modules}} & {set(heavy)!r}))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert out.stdout.strip() == "[]", f"import {module} imported {out.stdout.strip()}"
    code = "import picklescope, picklescope.capture as c; print(callable(c.install), picklescope.run.__module__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.stdout.split() == ["True", "picklescope.measure.runner"], out.stderr[-2000:]


def test_notebooks_command_copies_and_never_overwrites_a_users_edit(tmp_path, capsys):
    from picklescope import cli

    assert cli.main(["notebooks", str(tmp_path / "nb")]) == 0
    copied = sorted(p.name for p in (tmp_path / "nb").iterdir())
    assert copied == sorted([p.name for p in (ROOT / "notebooks").glob("*.py")] + ["jupytext.toml"])
    assert (tmp_path / "nb" / "01_reproduce_the_oom.py").read_bytes() == \
        (ROOT / "notebooks" / "01_reproduce_the_oom.py").read_bytes()
    assert cli.main(["notebooks", str(tmp_path / "nb")]) == 0  # the same files again: nothing to do
    assert "already holds these notebooks" in capsys.readouterr().out
    mine = tmp_path / "nb" / "01_reproduce_the_oom.py"
    mine.write_text("# my edits\n")
    assert cli.main(["notebooks", str(tmp_path / "nb")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "01_reproduce_the_oom.py" in err and "--force" in err, err
    assert mine.read_text() == "# my edits\n"
    (tmp_path / "file").write_text("x")
    assert cli.main(["notebooks", str(tmp_path / "file")]) == 2
    assert "is a file, not a folder" in capsys.readouterr().err
    assert cli.main(["notebooks", "--force", str(tmp_path / "nb")]) == 0
    assert mine.read_bytes() == (ROOT / "notebooks" / "01_reproduce_the_oom.py").read_bytes()


def test_lab_without_jupyterlab_says_what_to_install(tmp_path, monkeypatch, capsys):
    import importlib.util as util

    from picklescope import cli

    real = util.find_spec
    monkeypatch.setattr(util, "find_spec", lambda name, *a: None if name == "jupyterlab" else real(name, *a))
    assert cli.main(["lab", str(tmp_path / "nb")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "pip install 'picklescope[notebooks]'" in err, err
    assert not (tmp_path / "nb").exists(), "nothing is copied when Lab cannot start"


def _kernel_sockets(pid: int) -> list[str]:
    """The local sockets kernels bound in ``picklescope lab``'s private folder (process ``pid``)."""
    import os

    from picklescope.core import leftovers

    found = []
    for root in leftovers.temp_roots():
        for e in os.listdir(root):
            folder = os.path.join(root, e)
            if e.startswith("picklescope-lab-") and leftovers.creator_pid(folder) == pid and os.path.isdir(folder):
                found += [n for n in os.listdir(folder) if n.startswith("k-")]
    return found


def test_lab_starts_kernels_that_do_not_warn_of_unencrypted_tcp_and_leaves_nothing(tmp_path):
    """``picklescope lab`` as a user starts it: a kernel started through Lab binds its sockets, Lab's output
    never says the kernel runs over TCP without encryption (its kernels use local sockets in the
    command's private folder), and after SIGTERM nothing of the command is left in the temp folder."""
    import json
    import os
    import signal
    import time
    import urllib.request

    from picklescope.core import leftovers

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from browser_lab import free_port

    port, token = free_port(), "t" * 32
    p = subprocess.Popen([sys.executable, "-m", "picklescope", "lab", str(tmp_path / "nb"), "--", "--no-browser",
                          f"--port={port}", "--ip=127.0.0.1", f"--IdentityProvider.token={token}",
                          "--ServerApp.port_retries=0"],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)

    def call(path: str, method: str = "GET", body: bytes | None = None) -> dict:
        req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=body, method=method,
                                     headers={"Authorization": f"token {token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    try:
        deadline = time.monotonic() + 240  # Lab's start-up on a loaded two-core machine
        while True:
            assert p.poll() is None and time.monotonic() < deadline, "Lab did not answer"
            try:
                call("/api/status")
                break
            except OSError:
                time.sleep(0.5)
        kernel = call("/api/kernels", "POST", json.dumps({"name": "python3"}).encode())
        # the kernel binds its sockets (files k-<n> in the command's private folder) right after the
        # point where it would warn of TCP: once they exist, the warning would have been printed
        while len(_kernel_sockets(p.pid)) < 5:
            assert p.poll() is None and time.monotonic() < deadline + 120, "the kernel never bound its sockets"
            time.sleep(0.5)
        sockets_seen = _kernel_sockets(p.pid)
        call(f"/api/kernels/{kernel['id']}", "DELETE")
    finally:
        os.kill(p.pid, signal.SIGTERM)
        out, _ = p.communicate(timeout=120)
    assert "without encryption" not in out, out[-3000:]
    assert sockets_seen, "the kernel's sockets were not in the command's private folder"
    assert "Kernel started" in out, out[-3000:]
    assert [e for root in leftovers.temp_roots() for e in os.listdir(root)
            if leftovers.creator_pid(os.path.join(root, e)) == p.pid] == []
