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

import pytest

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


# ---------------------------------------------------------------------------------------------
# Each glossary term is defined, or linked to the glossary, where a notebook first uses it.

# Glossary entries that are everyday words, read in their everyday sense in the notebooks' prose
# ("the next step", "this line", "an error"); the glossary lists them because a table column
# carries that name, not because a reader needs them explained.
EVERYDAY = {"line", "code", "step", "error", "status", "ok", "case", "feature", "method", "seconds", "side",
            "added", "hits", "kept", "region", "leaf", "writable", "available", "sees", "#", "mib", "peak",
            "outcome", "timeout", "runs", "min", "median", "max", "spread", "varies", "called from",
            "x payload", "sender peak", "receiver peak", "killed at", "memory at death", "peak seen",
            "min / median / max", "serialize s", "deserialize s", "why not", "caveats", "why not / caveats",
            "stack (innermost first)", "confirming runs", "replica codecs", "kernel (exact)", "exact peak",
            "sender headroom", "self x payload", "culprit", "costliest line", "quiet line", "blind spot",
            "the bug", "the fix", "oom", "sampler", "tracer", "tracker", "scale", "round trip", "attribution",
            "serialization", "deserialization", "timeline", "workload", "tiny", "p", "sender / receiver",
            "memory-error"}
GLOSSARY_LINK = re.compile(r"\]\((?:\.\./)?docs/glossary\.md(#[\w-]*)?\)|\]\(\.\./docs/glossary\.md(#[\w-]*)?\)")


def glossary_anchors() -> set[str]:
    """The anchors GitHub and Lab give the glossary's headings."""
    out = set()
    for m in re.finditer(r"^#+\s+(.+)$", GLOSSARY.read_text(), re.M):
        out.add(re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-"))
    return out


def checked_terms() -> list[str]:
    """Glossary terms a newcomer would not know, longest first (so 'numpy mode' wins over 'numpy')."""
    terms = {t for t in _glossary_terms() if t and t not in EVERYDAY and not t.startswith("`")}
    return sorted(terms, key=len, reverse=True)


def _sentences(markdown: str) -> list[str]:
    """Prose sentences of a markdown text; fenced code blocks are drawings, not prose."""
    prose = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    prose = re.sub(r"^#.*$", " ", prose, flags=re.M)  # a title names the subject; the prose below defines it
    return [s for s in re.split(r"(?<=[.!?])\s+|(?<=:)\s+(?=[A-Z*`(\[])|\n\s*\n", prose) if s.strip()]


def _occurs(term: str, sentence: str, start: int = 0) -> re.Match | None:
    words = r"\s+".join(re.escape(w) for w in term.split())  # a term may wrap onto the next line
    return re.compile(rf"(?<![\w-]){words}(?:s|es)?(?![\w-])", re.I).search(sentence, start)


def undefined_first_uses(markdown_cells: list[str]) -> list[str]:
    """Terms whose first use in these cells is neither a definition nor linked to the glossary.

    A definition is the term set in italics or bold at that first use (the notebooks' convention for
    "this is what the word means", followed by its meaning) or followed by its meaning in
    parentheses; a link is a sentence that links docs/glossary.md. An anchor in such a link must be
    one of the glossary's headings."""
    anchors = glossary_anchors()
    problems, seen = [], set()
    for cell in markdown_cells:
        for sentence in _sentences(cell):
            spans = [m.span() for m in re.finditer(r"\*\*[^*]+\*\*|\*[^*]+\*", sentence)]  # bold, italics
            code = [m.span() for m in re.finditer(r"`[^`]+`", sentence)]  # inline code, not prose
            for m in GLOSSARY_LINK.finditer(sentence):
                anchor = (m.group(1) or m.group(2) or "#")[1:]
                if anchor and anchor not in anchors:
                    problems.append(f"link to a missing glossary anchor #{anchor}")
            for term in checked_terms():
                if term in seen:
                    continue
                hit = _occurs(term, sentence)
                # in code, a name used as a prefix (`gc.collect()`) is not the term; `consolidate()` is
                while hit is not None and any(a <= hit.start() < b for a, b in code) \
                        and sentence[hit.end():hit.end() + 1] == ".":
                    hit = _occurs(term, sentence, hit.end())
                if hit is None:
                    continue
                seen.add(term)
                emphasised = any(a <= hit.start() and hit.end() <= b for a, b in spans)
                explained = re.match(r"(?:s|es)?`?\s+\((?!\))", sentence[hit.end():])  # "the payload (the bytes...)"
                if not (emphasised or explained or GLOSSARY_LINK.search(sentence)):
                    problems.append(f"{term!r} first used without a definition or glossary link: "
                                    f"{sentence.strip()[:120]!r}")
    return problems


def test_the_first_use_check_can_fail():
    assert undefined_first_uses(["The payload is big."]) != []
    assert undefined_first_uses(["The *payload* is the batch's tensor bytes. The payload is big."]) == []
    assert undefined_first_uses(["The [payload](../docs/glossary.md#measures) is big."]) == []
    assert undefined_first_uses(["The [payload](../docs/glossary.md#no-such-heading) is big."]) != []
    assert undefined_first_uses(["RSS went up.", "*RSS* is resident memory."]) != []  # defined too late
    assert undefined_first_uses(["Run `gc.collect()` then the gc ran."]) != []  # prose after the code counts
    assert undefined_first_uses(["Run `gc.collect()` now."]) == []  # code is not a use of the word


NOTEBOOKS = sorted((REPO / "notebooks").glob("*.py"))
# a notebook that is known to use a term before defining it (strict: the mark must go once it is fixed)
NOT_YET: set[str] = set()


@pytest.mark.parametrize("path", [pytest.param(p, id=p.stem, marks=[pytest.mark.xfail(
    strict=True, reason="terms used before they are defined")] if p.name in NOT_YET else []) for p in NOTEBOOKS])
def test_each_glossary_term_is_defined_or_linked_at_its_first_use(path):
    import jupytext

    cells = [c.source for c in jupytext.read(path).cells if c.cell_type == "markdown"]
    problems = undefined_first_uses(cells)
    assert problems == [], f"{path.name}:\n" + "\n".join(problems)
