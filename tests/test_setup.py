"""The set-up files stay true: ranges in pyproject.toml (picklescope installs into a user's own verl
environment), exact versions of this repository's runs in constraints.txt, environment.yml in step with
both, and every data file the package needs declared as package data."""

from __future__ import annotations

import fnmatch
import re
import sys
import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "toolkit" / "picklescope"
HOST_PACKAGES = {"torch", "numpy", "tensordict", "ray"}  # what a verl environment already holds


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pyproject_requirements() -> set[str]:
    data = _project()
    reqs = set(data["dependencies"])
    for extra in data["optional-dependencies"].values():
        reqs |= {r for r in extra if not r.startswith("picklescope")}
    return reqs


def _constraints() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[name.strip().lower()] = version.strip()
    return pins


def test_environment_yml_pip_list_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {p for p in pip if p not in ("-e .", "-c constraints.txt")}
    assert listed == _pyproject_requirements()
    assert "-e ." in pip
    assert "-c constraints.txt" in pip, "conda users get the same exact versions as dev.py"
    assert "python=3.11" in env["dependencies"]


def test_no_exact_pins_of_what_the_host_environment_holds():
    """`pip install picklescope` must not replace a verl environment's torch, numpy, tensordict or Ray."""
    for req in map(Requirement, _pyproject_requirements()):
        assert not any(s.operator in ("==", "===") for s in req.specifier), f"{req} is pinned in pyproject.toml"
    named = {Requirement(r).name for r in _project()["dependencies"]}
    assert HOST_PACKAGES - {"ray"} <= named


def test_python_310_to_313_are_allowed():
    spec = SpecifierSet(_project()["requires-python"])
    for minor in (10, 11, 12, 13):
        assert Version(f"3.{minor}.0") in spec, f"3.{minor}"
    assert Version("3.9.18") not in spec


def test_torch_is_pinned_for_this_repository_only():
    pins = _constraints()
    assert pins["torch"] == "2.13.0"
    assert 'TORCH = "torch==2.13.0"' in (ROOT / "dev.py").read_text()
    assert re.search(r'"-c", str\(CONSTRAINTS\), "-e"', (ROOT / "dev.py").read_text()), "dev.py installs with them"
    assert set(pins) >= HOST_PACKAGES


def test_the_set_up_leaves_out_the_iri_checker_that_costs_every_ray_process_a_second():
    """jsonschema 4.25+ installs rfc3987-syntax with its format-nongpl extra and imports it at its own import,
    building about 35 Lark parsers: 1.2 s of CPU in every process that imports Ray or nbformat
    (python-jsonschema/jsonschema#1428; docs/testing.md, "The set-up's pin of jsonschema"). The set-up pins
    jsonschema below that, whose import leaves the module alone (installed or not)."""
    import jsonschema  # noqa: F401  (imported here for what it imports)

    assert Version(_constraints()["jsonschema"]) < Version("4.25")
    assert "rfc3987_syntax" not in sys.modules


def test_the_constraints_lie_inside_the_ranges():
    pins = _constraints()
    for req in map(Requirement, _pyproject_requirements()):
        if req.name.lower() in pins:
            assert req.specifier.contains(pins[req.name.lower()], prereleases=True), f"{req} vs {pins[req.name]}"


def test_every_data_file_is_package_data():
    """The presets, blobs, notebooks, Lab settings, docs (the postmortem inlines the glossary) and the report
    template are declared as package data
    (the wheel's listing is checked by tests/test_install.py); the checkout's links point at the folders."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    patterns = setuptools["package-data"]
    assert setuptools["packages"]["find"].get("namespaces") is False
    for link in ("data", "notebooks", "jupyter", "docs"):
        assert (PACKAGE / link).is_symlink() and (PACKAGE / link).resolve() == ROOT / link, link
    wanted = {PACKAGE: [*(ROOT / "data").rglob("*"), *(ROOT / "notebooks").glob("*"), *(ROOT / "jupyter").rglob("*"),
                       *(ROOT / "docs").glob("*.md")],
              PACKAGE / "views": list((PACKAGE / "views" / "templates").rglob("*"))}
    for base, files in wanted.items():
        package = ".".join(base.relative_to(PACKAGE.parent).parts)
        for f in files:
            if not f.is_file() or "__pycache__" in f.parts:
                continue
            rel = str(f.relative_to(ROOT)) if base == PACKAGE else str(f.relative_to(base))
            assert any(fnmatch.fnmatch(rel, p) for p in patterns[package]), f"{rel} is not package data of {package}"
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("*.py"))
    assert len(notebooks) == 6, notebooks


def test_readme_quickstart_has_the_two_commands_ci_uses():
    readme = (ROOT / "README.md").read_text()
    assert "python3 dev.py reproduce" in readme
    assert "python3 dev.py test" in readme
    assert "python3 dev.py test" in (ROOT / ".ci" / "run").read_text()


def test_readme_says_how_to_install_into_an_existing_environment():
    readme = (ROOT / "README.md").read_text()
    assert "pip install picklescope[all]" in readme
