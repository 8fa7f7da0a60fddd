"""A shareable postmortem: the parameterized notebook, executed headless, exported as offline HTML.

The postmortem is a notebook (``notebooks/05_postmortem_template.py``) rather than a fixed report so
an engineer can open the executed ``.ipynb``, change a cell and keep investigating. This module only
validates the parameters, runs that notebook with papermill in a kernel on this interpreter, and
exports it with :mod:`picklescope.views.offline_html`, so the HTML opens offline with its figures. The
notebook itself also writes the toolkit's report (``report.html``) and ``results.json`` from the same
investigation, so the two views never disagree.

The HTML is written for people who will read it, not run it: the verdict and the parameters come
first, code cells and their ``In``/``Out`` prompts are hidden (the ``.ipynb`` beside it keeps them and
stays runnable), and the template's parameters cell and papermill's injected copy of it are left out
of the document. The HTML travels alone, so links to the project's docs would point nowhere: the
glossary is appended to the document and its links point there; a link to another doc keeps its
words and names the file.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from picklescope.codecs import CODECS
from picklescope.core.paths import package_folder
from picklescope.core.units import parse_size
from picklescope.errors import PicklescopeError
from picklescope.investigate.reproduce import default_scale
from picklescope.tracers import parse_tracers
from picklescope.transports import TRANSPORTS
from picklescope.views import nbrun
from picklescope.views.offline_html import export_html
from picklescope.workloads.spec import load_workload

TEMPLATE = "05_postmortem_template"
OUTPUT_NAMES = ("postmortem.ipynb", "postmortem.html", "report.html", "results.json")


@dataclass
class Postmortem:
    """Where the executed notebook and its HTML export were written, and with what parameters."""

    notebook: Path
    html: Path
    parameters: dict[str, Any] = field(default_factory=dict)


def parameters(workload: str, codecs: list[str] | tuple[str, ...], budget: str | None, *,
               scale: float | None = None, transport: str = "pickle5-oob", headroom: bool = True,
               trace: str | None = "all", ray: bool = False) -> dict[str, Any]:
    """Check every name and size before a kernel starts; returns papermill's parameters."""
    if not codecs:
        raise PicklescopeError("no codecs given", "name at least one, e.g. --codecs numpy-legacy,numpy")
    for c in codecs:
        CODECS.get(c)
    TRANSPORTS.get(transport)
    load_workload(workload)
    if trace is not None:
        parse_tracers(trace)
    if budget is not None:
        parse_size(budget, "--budget")
    if scale is None:
        scale = default_scale(workload)
    if not Path(workload).is_absolute() and Path(workload).is_file():
        workload = str(Path(workload).resolve())  # the notebook runs in the output folder
    return {"workload": str(workload), "codecs": list(codecs), "budget": budget, "scale": float(scale),
            "transport": transport, "headroom": bool(headroom), "trace": trace, "ray": bool(ray)}


def _check_out_dir(out: Path, force: bool) -> None:
    if out.exists() and not out.is_dir():
        raise PicklescopeError(f"--out {out} is a file", "give a folder")
    if out.is_dir() and not force:
        others = [p.name for p in out.iterdir() if p.name not in OUTPUT_NAMES]
        ours = [p.name for p in out.iterdir() if p.name in OUTPUT_NAMES]
        if others or ours:
            raise PicklescopeError(f"--out {out} is not empty ({', '.join(sorted(others + ours)[:5])})",
                                   "give a new or empty folder, or --force to overwrite the postmortem files")


def render(workload: str, codecs: list[str] | tuple[str, ...], budget: str | None, out_dir: str | Path, *,
           scale: float | None = None, transport: str = "pickle5-oob", headroom: bool = True,
           trace: str | None = "all", ray: bool = False, force: bool = False, timeout_s: float = 1800.0) -> Postmortem:
    """Execute the postmortem notebook with these parameters and export it; see the module doc."""
    from papermill.exceptions import PapermillExecutionError


    params = parameters(workload, codecs, budget, scale=scale, transport=transport, headroom=headroom, trace=trace,
                        ray=ray)
    params["out_dir"] = "."  # report.html and results.json beside the notebook, in the --out folder
    out = Path(out_dir)
    _check_out_dir(out, force)
    out.mkdir(parents=True, exist_ok=True)
    nb_path, html_path = out / OUTPUT_NAMES[0], out / OUTPUT_NAMES[1]
    try:
        nb = nbrun.execute(nbrun.notebook_path(TEMPLATE), nb_path, params, cwd=out, timeout_s=timeout_s)
    except PapermillExecutionError as exc:
        raise PicklescopeError(
            f"the postmortem notebook failed in cell {exc.exec_count}: {exc.ename}: {exc.evalue}",
            f"open {nb_path} to see the cell and its traceback",
        ) from None
    export_html(as_document(nb), html_path, prompts=False)
    return Postmortem(nb_path, html_path, params)


def as_document(nb: Any) -> Any:
    """A copy of the executed notebook that reads as a document: parameter cells dropped (their
    values are in the verdict's table) and every code cell's source hidden, outputs kept."""
    import copy

    import nbformat

    doc = copy.deepcopy(nb)
    glossary = _glossary_markdown()
    cells = []
    for cell in doc.cells:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell.cell_type == "code" and ("parameters" in tags or "injected-parameters" in tags):
            continue
        if cell.cell_type == "code":
            cell.metadata.setdefault("transient", {})["remove_source"] = True
            if not cell.get("outputs"):
                continue
        if cell.cell_type == "markdown":
            cell.source = local_links(cell.source, glossary is not None)
        cells.append(cell)
    if glossary is not None:
        cells.append(nbformat.v4.new_markdown_cell(glossary))
    doc.cells = cells
    return doc


_LINK = re.compile(r"\[([^\]]+)\]\((?:\.\./)?(?:docs/)?([\w.-]+\.md)(?:#([\w-]+))?\)")


def _anchor(heading: str) -> str:
    """The id nbconvert gives a markdown heading ("The situation" -> "The-situation")."""
    return re.sub(r"\s+", "-", heading.strip())


def _glossary_headings() -> dict[str, str]:
    """GitHub-style slug of each glossary heading ("the-situation") -> its text ("The situation")."""
    path = package_folder("docs") / "glossary.md"
    out = {}
    if path.is_file():
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("## "):
                text = line[3:].strip()
                slug = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
                out[slug] = text
    return out


def local_links(markdown: str, glossary_inlined: bool) -> str:
    """Links to the project's docs made to work in a file read on its own: a glossary link points at
    the glossary appended to the document; any other doc keeps its words and names the file."""
    headings = _glossary_headings() if glossary_inlined else {}

    def fix(m: re.Match[str]) -> str:
        text, doc, slug = m.group(1), m.group(2), m.group(3)
        if doc == "glossary.md" and glossary_inlined:
            target = headings.get(slug or "", "Glossary")
            return f"[{text}](#{_anchor(target)})"
        return f"{text} (docs/{doc} in picklescope)"

    return _LINK.sub(fix, markdown)


def _glossary_markdown() -> str | None:
    """The project's glossary as one markdown cell (its headings one level down), or None without it."""
    path = package_folder("docs") / "glossary.md"
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").splitlines()
    body = [("#" + line) if line.startswith("#") and not line.startswith("# ") else line for line in lines]
    body = ["## Glossary" if line.startswith("# ") else line for line in body]
    return local_links("\n".join(body), glossary_inlined=False).replace(" (docs/glossary.md in picklescope)", "")
