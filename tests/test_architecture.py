"""The layers contract covers the whole package: a new module has to take a place in it.

``lint-imports`` (run by ``python3 dev.py test``) checks the layers of ``[tool.importlinter]`` in
``pyproject.toml`` (docs/architecture.md), but only for the modules the contract names: a module left
out of every layer could import anything. This test finds every module of the package on disk and
fails for one that no layer names (itself or a package containing it).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "toolkit" / "picklescope"
# Packages whose modules sit in different layers: their own __init__ holds only a docstring or re-exports.
SPLIT_PACKAGES = {"picklescope", "picklescope.investigate", "picklescope.measure", "picklescope.verl",
                  "picklescope.views"}


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


def test_siblings_of_a_layer_are_independent():
    """Siblings are joined with ``|`` only (they may not import each other, so no cycle forms among them); no row
    uses ``:``, which would let two siblings use each other."""
    (layers,) = [c["layers"] for c in _contracts() if c["type"] == "layers"]
    joined = [" ".join(layer.split()) for layer in layers if ":" in layer]
    assert joined == [], joined


def test_the_top_level_holds_at_most_eight_modules():
    top = sorted(p.name for p in PACKAGE_DIR.glob("*.py"))
    assert len(top) <= 8, f"the package's top level is for its entry points and public data only: {top}"


def test_every_module_sits_in_a_subpackage_named_for_its_layer():
    """Each subpackage's modules are in the layers its docstring names: no module is filed by accident."""
    layer_of = {n: i for i, layer in enumerate(_layers()) for n in layer}
    for sub, allowed in {"views": range(2, 9), "investigate": range(9, 12), "measure": range(12, 18),
                         "core": range(21, 22)}.items():
        for path in (PACKAGE_DIR / sub).glob("*.py"):
            if path.stem == "__init__":
                continue
            name = f"picklescope.{sub}.{path.stem}"
            i = next((layer_of[n] for n in layer_of if name == n or name.startswith(n + ".")), None)
            assert i in allowed, f"{name} is in layer {i}, not one of the {sub} layers {list(allowed)}"


def test_the_package_has_no_old_module_names():
    """Modules are found where they are: no meta-path finder maps names from before the subpackages (the
    package was never released under them), and ``picklescope.node`` is the replay function."""
    import importlib
    import sys

    import picklescope

    for old in ("picklescope.runner", "picklescope.figures", "picklescope.cgroup"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(old)
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("picklescope")]
    assert callable(picklescope.node) and picklescope.node.__module__.startswith("picklescope.investigate.node")


def test_one_place_sets_an_outcome():
    """Every result's outcome is set by ``measure.verdicts.conclude`` (docs/architecture.md, step 11 of a run's life).

    The scan reads the source as code (ast): an assignment to an ``outcome`` attribute anywhere else fails,
    except the explorer's live snapshot, which is labelled "running" while its run goes on and is no result."""
    import ast

    setters = []
    for path in PACKAGE_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for sub in ast.walk(t):
                    if isinstance(sub, ast.Attribute) and sub.attr == "outcome":
                        setters.append(f"{path.relative_to(PACKAGE_DIR)}:{node.lineno}")
    assert [s for s in setters if not s.startswith("views/widgets.py")] == [
        s for s in setters if s.startswith("measure/verdicts.py")], setters
    assert len([s for s in setters if s.startswith("measure/verdicts.py")]) == 1, setters


def _import_cycles() -> list[list[str]]:
    """The groups of modules of the package that import each other in a ring (strongly connected components of
    grimp's graph, which counts imports inside functions as well as at the top: what import-linter checks)."""
    import grimp

    graph = grimp.build_graph("picklescope", exclude_type_checking_imports=True, cache_dir=None)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph.modules):  # Tarjan's algorithm, iterative: the graph is a few hundred modules deep
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                elif child in on_stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.append(member)
                    if member == module:
                        break
                if len(group) > 1:
                    found.append(sorted(group))
    return found


def test_no_two_modules_of_the_package_import_each_other_even_inside_functions():
    """No import cycle anywhere in the package, counting the imports inside functions that the layers contract
    between siblings of one layer lets through (``:`` in pyproject.toml). A ring such as batch -> codecs ->
    batch runs only because one of its imports waits inside a function; it still ties the modules together."""
    cycles = _import_cycles()
    assert not cycles, "modules that import each other (directly or through others):\n" + "\n".join(
        " <-> ".join(group) for group in cycles)


def test_the_cycle_finder_finds_a_ring(tmp_path, monkeypatch):
    """The search above can fail: a three-module ring inside a throwaway package is found, its tail is not."""
    pkg = tmp_path / "ringpkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from ringpkg import b\n")
    (pkg / "b.py").write_text("from ringpkg import c\n")
    (pkg / "c.py").write_text("import ringpkg.a\n")
    (pkg / "d.py").write_text("import ringpkg.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import grimp

    real = grimp.build_graph
    monkeypatch.setattr(grimp, "build_graph", lambda _name, **kw: real("ringpkg", **kw))
    assert _import_cycles() == [["ringpkg.a", "ringpkg.b", "ringpkg.c"]]


def _function_level_imports() -> list[tuple[str, int, bool]]:
    """Every import of a picklescope module inside a function: (file, line, whether a comment says why), read as
    code (ast), so imports for type hints and code inside strings do not count."""
    import ast

    found = []
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        lines = path.read_text().splitlines()
        tree = ast.parse("\n".join(lines), str(path))
        functions = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for node in {id(i): i for f in functions for i in ast.walk(f)}.values():
            if isinstance(node, ast.ImportFrom):
                names = ["." if node.level else node.module or ""]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            if any(n == "." or n.split(".")[0] == "picklescope" for n in names):
                said = "#" in lines[node.lineno - 1] or lines[node.lineno - 2].strip().startswith("#")
                found.append((str(path.relative_to(PACKAGE_DIR)), node.lineno, said))
    return sorted(found)


def test_at_most_five_imports_inside_functions_each_saying_why():
    """An import inside a function hides a dependency until it runs; one is kept only to defer a heavy third-party
    package that the importer's own importers must not pay for, with a comment naming it."""
    found = _function_level_imports()
    assert len(found) <= 5, found
    assert all(said for *_, said in found), [f"{path}:{line}" for path, line, said in found if not said]


def _cycles_between_children_of_the_package() -> list[tuple[str, str]]:
    """Imports whose removal would leave the children of ``picklescope`` (its subpackages and top-level modules,
    each taken whole) without a cycle: what an ``acyclic_siblings`` contract on ``picklescope`` itself reports."""
    import grimp

    graph = grimp.build_graph("picklescope", exclude_type_checking_imports=True, cache_dir=None)
    return sorted(graph.nominate_cycle_breakers("picklescope"))


def test_the_children_of_the_package_import_each_other_in_no_cycle():
    """The subpackages taken whole form no ring, imports inside functions included (``acyclic_siblings`` on
    ``picklescope`` in pyproject.toml sees only module-level ones)."""
    breakers = _cycles_between_children_of_the_package()
    assert not breakers, "imports that close a cycle between children of picklescope: " + ", ".join(
        f"{a} -> {b}" for a, b in breakers)


def test_the_architecture_picture_is_drawn_from_the_code():
    """docs/architecture.md's picture names every module in its row of the layers contract; it is regenerated
    by scripts/architecture_picture.py, so a module added or moved without redrawing it fails here."""
    script = ROOT / "scripts" / "architecture_picture.py"
    r = subprocess.run([sys.executable, str(script), "--check"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300).stdout
    assert "in no layer" not in out and "measure.engine" in out and "core/{" in out, out


def test_one_module_builds_the_session_and_waits_on_the_children():
    """The run lifecycle is written once (measure/engine.py): no other module constructs a Session or
    calls its follow loop; runner, cellrun, the Ray pair and the node replay go through MeasuredRun."""
    found = {}
    for path in PACKAGE_DIR.rglob("*.py"):
        text = path.read_text()
        hits = [w for w in ("Session(", ".follow(") if any(w in line and not line.lstrip().startswith(("#", '"'))
                                                          for line in text.splitlines())]
        if hits:
            found[str(path.relative_to(PACKAGE_DIR))] = hits
    assert found == {"measure/engine.py": ["Session(", ".follow("]}, found
    for user in ("measure/runner.py", "measure/cellrun.py", "ray/orchestrate.py",
                 "investigate/node/parent.py"):
        assert "MeasuredRun(" in (PACKAGE_DIR / user).read_text(), user
