"""The set-up files stay true: environment.yml's pip list matches pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def _pyproject_requirements() -> set[str]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    reqs = set(data["dependencies"])
    for extra in data["optional-dependencies"].values():
        reqs |= {r for r in extra if not r.startswith("picklescope")}
    return reqs


def test_environment_yml_pip_list_matches_pyproject():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    listed = {p for p in pip if p != "-e ."}
    assert listed == _pyproject_requirements()
    assert "-e ." in pip
    assert "python=3.11" in env["dependencies"]


def test_torch_is_pinned_everywhere():
    assert "torch==2.13.0" in _pyproject_requirements()
    assert 'TORCH = "torch==2.13.0"' in (ROOT / "dev.py").read_text()


def test_readme_quickstart_has_the_two_commands_ci_uses():
    readme = (ROOT / "README.md").read_text()
    assert "python3 dev.py reproduce" in readme
    assert "python3 dev.py test" in readme
    assert "python3 dev.py test" in (ROOT / ".ci" / "run").read_text()
