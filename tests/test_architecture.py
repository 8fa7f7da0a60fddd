"""The layers contract covers the whole package: a new module has to take a place in it.

``lint-imports`` (run by ``python3 dev.py test``) checks the layers of ``[tool.importlinter]`` in
``pyproject.toml`` (docs/architecture.md), but only for the modules the contract names: a module left
out of every layer could import anything. This test finds every module of the package on disk and
fails for one that no layer names (itself or a package containing it).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "toolkit" / "picklescope"
# Packages whose modules sit in different layers: their own __init__ holds only re-exports.
SPLIT_PACKAGES = {"picklescope", "picklescope.transports.ray", "picklescope.verl"}


def _contracts() -> list[dict]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]


def _layers() -> list[list[str]]:
    (layers,) = [c["layers"] for c in _contracts() if c["type"] == "layers"]
    return [[m.strip().strip("()") for m in re.split(r"[:|]", layer)] for layer in layers]


def _modules() -> set[str]:
    found = set()
    for path in PACKAGE_DIR.rglob("*.py"):
        parts = path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.add(".".join(parts))
    return found


def _covered(module: str, names: set[str]) -> bool:
    return any(module == n or module.startswith(n + ".") for n in names)


def test_every_module_is_in_a_layer():
    names = {n for layer in _layers() for n in layer}
    missing = sorted(m for m in _modules() - SPLIT_PACKAGES if not _covered(m, names))
    assert not missing, f"modules in no layer of [tool.importlinter] in pyproject.toml: {missing}"


def test_no_module_is_in_two_layers():
    seen: dict[str, int] = {}
    for i, layer in enumerate(_layers()):
        for name in layer:
            assert name not in seen, f"{name} is in layer {seen[name]} and layer {i}"
            seen[name] = i
    names = set(seen)
    nested = sorted((a, b) for a in names for b in names if b.startswith(a + "."))
    assert not nested, f"a layer names a package and another names a module inside it: {nested}"


def test_the_contracts_forbid_cycles_and_layer_breaks_without_exceptions():
    contracts = _contracts()
    assert {c["type"] for c in contracts} >= {"layers", "acyclic_siblings"}
    assert not [c["id"] for c in contracts if c.get("ignore_imports")], "a contract hides imports"
