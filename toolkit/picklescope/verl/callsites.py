"""The step-through of ``__getstate__`` / ``__setstate__`` for a confirm report.

Two sources, kept apart so the report never passes one off as the other:

- measured call sites (always): the run's ``consolidate`` steps carry the file, line and function
  that called ``TensorDict.consolidate`` (recorded by the instrumentation in
  :mod:`picklescope.verl.loader`) and the exact memory that call added. The function's source is
  read from the very file the child imported (parsed, not run), with those lines marked.
- a line-by-line trace, when the project's line tracer (``picklescope.investigate.stepthrough``) is present:
  asked for each function over the same workload in a child with the same verl. When it is missing,
  the report says so.
"""

from __future__ import annotations

import ast
import importlib
import linecache
from pathlib import Path
from typing import Any

from picklescope.core.units import fmt_bytes


def call_sites(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ``consolidate`` calls of one run, from its raw step events (file, line, memory added)."""
    out = []
    for ev in events:
        if ev.get("type") == "step_end" and ev.get("name") == "consolidate" and ev.get("file"):
            text = linecache.getline(ev["file"], ev["line"]).strip() if ev.get("line") else ""
            out.append({"side": ev["side"], "file": ev["file"], "line": ev.get("line"),
                        "function": ev.get("function"), "source": text, "added_bytes": ev.get("added_bytes"),
                        "peak_bytes": ev.get("peak_bytes")})
    return out


def function_source(path: str, name: str, cls: str | None = "DataProto") -> dict[str, Any] | None:
    """``cls.name`` (or top-level ``name``) in ``path``: first line and source lines, parsed only."""
    try:
        text = Path(path).read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    body = tree.body
    if cls is not None:
        klass = next((n for n in body if isinstance(n, ast.ClassDef) and n.name == cls), None)
        body = klass.body if klass is not None else []
    fn = next((n for n in body if isinstance(n, ast.FunctionDef) and n.name == name), None)
    if fn is None:
        return None
    lines = text.splitlines()[fn.lineno - 1: fn.end_lineno]
    return {"file": path, "first_line": fn.lineno, "lines": lines}


def listing(src: dict[str, Any] | None, sites: list[dict[str, Any]]) -> list[str]:
    """The function's lines with the measured consolidate calls marked (``>>``) and their cost."""
    if src is None:
        return ["(source not found)"]
    marks: dict[int, list[dict[str, Any]]] = {}
    for s in sites:
        if s["file"] == src["file"]:
            marks.setdefault(s["line"], []).append(s)
    out = []
    for i, line in enumerate(src["lines"]):
        no = src["first_line"] + i
        hit = marks.get(no)
        note = ""
        if hit:
            added = max(h["added_bytes"] or 0 for h in hit)
            note = f"   << consolidate ran here, +{fmt_bytes(added)} ({len(hit)} call{'s' * (len(hit) > 1)})"
        out.append(f"{'>>' if hit else '  '} {no:5d}  {line}{note}")
    return out


def sources_for(role_file: str, patch: str | None, patched: list[str]) -> dict[str, dict[str, Any] | None]:
    """Where each function of a codec comes from: the patch file for what it replaced, else verl."""
    out = {}
    for name in ("__getstate__", "__setstate__"):
        if patch and name in patched:
            out[name] = function_source(patch, name, cls=None)
        else:
            out[name] = function_source(role_file, name)
    return out


def line_tracer() -> tuple[Any | None, str]:
    """The project's line-by-line tracer module if this build has one, else (None, why not)."""
    try:
        return importlib.import_module("picklescope.investigate.stepthrough"), ""
    except ImportError as exc:
        return None, f"picklescope.investigate.stepthrough is not available in this build ({exc})"


def _row(r: Any) -> dict[str, Any]:
    return {"file": r.filename, "line": r.lineno, "function": r.function, "source": r.source,
            "added_bytes": r.added_bytes, "self_bytes": r.self_bytes, "depth": r.depth, "hits": r.hits}


def trace(codec: str, workload: str, scale: float, transport: str, env: dict[str, str],
          files: list[str], methods: tuple[str, ...] = ("__getstate__", "__setstate__")) -> dict[str, Any]:
    """A line-by-line trace of the codec's functions on the same case, or why there is none.

    ``files`` are the sources the report cares about (verl's ``protocol.py``, the patch): the line
    there that added the most is reported as the culprit, next to the tracer's own pick.
    """
    mod, reason = line_tracer()
    if mod is None:
        return {"available": False, "reason": reason}
    out: dict[str, Any] = {"available": True, "methods": {}}
    for method in methods:
        try:
            st = mod.stepthrough(codec=codec, method=method, workload=workload, scale=scale,
                                 transport=transport, env=env)
        except Exception as exc:  # noqa: BLE001 - the report says what failed instead of failing
            out["methods"][method] = {"outcome": "error", "error": f"{type(exc).__name__}: {exc}"}
            continue
        ours = [r for r in st.rows if r.filename in files]
        top = max(ours, key=lambda r: (r.self_bytes, r.time_s), default=None)  # its own code's cost
        culprit = st.culprit()
        costly, _quiet = st.ranked()
        big = [_row(r) for r in costly]  # costliest first, by what each line's own code added
        out["methods"][method] = {
            "outcome": st.outcome, "error": st.error, "peak_bytes": st.peak_bytes, "lines": len(st.rows),
            "culprit": _row(culprit) if culprit else None,
            "top_line_in_code": _row(top) if top is not None and top.self_bytes > 0 else None,
            "costly_lines": big,
        }
    return out
