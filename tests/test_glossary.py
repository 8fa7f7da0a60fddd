"""docs/glossary.md defines every column header the toolkit prints and every term of the README's
table of what a run reports.

The headers are collected from the code itself (dict keys of the functions that build table rows,
rows handed straight to a table renderer, plotly table headers), so a new column without a
definition fails here.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLKIT = REPO / "toolkit" / "picklescope"
GLOSSARY = REPO / "docs" / "glossary.md"
RENDERERS = {"render", "_table", "Table", "html_table"}


def _strings(node: ast.AST) -> list[str]:
    return [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]


def _dict_keys(node: ast.AST) -> set[str]:
    keys: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Dict):
            keys |= {k.value for k in n.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
        elif isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant) and \
                        isinstance(t.slice.value, str) and isinstance(t.value, ast.Name) and t.value.id == "row":
                    keys.add(t.slice.value)
    return keys


def printed_headers() -> dict[str, str]:
    """header -> the file that prints it."""
    found: dict[str, str] = {}
    for path in sorted(TOOLKIT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        rel = path.relative_to(REPO).as_posix()
        for node in ast.walk(tree):
            keys: set[str] = set()
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and re.search(r"(^|_)(rows?|table|html)($|_)",
                                                                                       node.name):
                keys = {k for k in _dict_keys(node)}
            elif isinstance(node, ast.Call):
                name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
                if name in RENDERERS and node.args:
                    keys = _dict_keys(node.args[0])
                for kw in node.keywords:  # plotly: go.Table(header={"values": [...]})
                    if kw.arg == "header" and isinstance(kw.value, ast.Dict):
                        for k, v in zip(kw.value.keys, kw.value.values):
                            if isinstance(k, ast.Constant) and k.value == "values" and isinstance(v, ast.List):
                                keys |= set(_strings(v))
            for k in keys:
                found.setdefault(k, rel)
    return found


# keys of row dicts that are plumbing, not printed headers (rows carried as data between functions)
NOT_HEADERS = {"bytes", "stack", "values", "file", "function", "source", "added_bytes", "depth", "n_allocations",
               "allocator", "ray_address", "address", "plotly_js",
               "peak_bytes", "caller", "order", "self_bytes", "quiet", "type", "name", "side_name"}


def _glossary_terms() -> set[str]:
    text = GLOSSARY.read_text()
    terms = set()
    for m in re.finditer(r"^\|\s*([^|]+?)\s*\|", text, re.M):
        terms.add(m.group(1).strip().lower())
        for t in m.group(1).split(" / "):
            terms.add(t.strip().strip("`").lower())
    for m in re.finditer(r"^\*\*(.+?)\*\*", text, re.M):
        for t in m.group(1).split(" / "):
            terms.add(t.strip().strip("`").lower())
    return terms


def test_the_collector_finds_the_known_tables():
    headers = printed_headers()
    # a sanity check on the collector itself: these come from three different modules
    assert {"sender peak", "cycle-held", "x payload", "self", "inclusive", "called from"} <= set(headers)


def test_every_printed_column_header_is_in_the_glossary():
    terms = _glossary_terms()
    missing = sorted(f"{h!r} ({where})" for h, where in printed_headers().items()
                     if h not in NOT_HEADERS and h.lower() not in terms)
    assert missing == [], "define these in docs/glossary.md: " + ", ".join(missing)


def test_the_readmes_terms_and_the_words_of_the_incident_are_defined():
    terms = _glossary_terms()
    readme = (REPO / "README.md").read_text()
    block = readme[readme.index("## What a run reports"):]
    block = block[:block.index("\n## ", 5)]
    for m in re.finditer(r"^\|\s*([^|]+?)\s*\|", block, re.M):
        for t in re.split(r"\s*/\s*", m.group(1)):
            t = re.sub(r"\s*\(.*\)$", "", t.strip("` ")).lower()
            if t and t not in ("term", "---"):
                assert t in terms, f"README term {t!r} is not in docs/glossary.md"
    for t in ("verl", "dataproto", "numpy mode", "torch mode", "ray", "payload", "baseline", "vmhwm", "rss", "held",
              "cycle-held", "pickle5-oob", "headroom", "flowgrpo", "consolidate", "object store", "self",
              "inclusive"):
        assert t in terms, t


def test_every_notebook_links_the_glossary_in_its_first_cell():
    import jupytext

    for path in sorted((REPO / "notebooks").glob("*.py")):
        nb = jupytext.read(path)
        assert "../docs/glossary.md" in nb.cells[0].source, path.name
