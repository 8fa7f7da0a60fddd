"""Figures that show in JupyterLab and survive export to a single HTML file that opens offline.

Two traps make exported notebooks lose their plotly figures. Under a headless kernel (papermill,
nbclient) plotly picks a renderer whose output only a live JupyterLab can draw, so nbconvert writes
an empty cell without a warning. And plotly's own "notebook" renderer adds a MathJax ``<script src>``
from a CDN, so the file is not offline. Here each figure is displayed as two representations: the
plotly JSON mimetype (JupyterLab draws it with its plotly extension) and an HTML ``div`` whose script
calls ``Plotly.newPlot`` (what nbconvert keeps). The exporter's template puts plotly.js inline in the
page head once, and leaves out every CDN script of JupyterLab's template.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from picklescope.core.paths import package_folder

RENDERER = "picklescope_html"
TEMPLATE_DIR = package_folder("views", "templates")  # package data; a real folder even when zipped
TEMPLATE = "picklescope_offline"
_EXTERNAL = re.compile(
    r"<(?:script|link|img|iframe)\b[^>]*\b(?:src|href)\s*=\s*[\"']?(?:https?:)?//"  # a fetched element
    r"|url\(\s*[\"']?(?:https?:)?//"  # a CSS resource
    r"|@import\s+[\"']?(?:url\()?\s*[\"']?(?:https?:)?//",  # a CSS import
    re.IGNORECASE)


def _renderer_class() -> type:
    from plotly.io._base_renderers import MimetypeRenderer

    class OfflineHtmlRenderer(MimetypeRenderer):
        """A plotly ``div`` plus a ``Plotly.newPlot`` call; plotly.js itself comes from the page."""

        def to_mimebundle(self, fig_dict: dict[str, Any]) -> dict[str, str]:
            from plotly.io import to_html

            html = to_html(fig_dict, include_plotlyjs=False, include_mathjax=False, full_html=False,
                           default_width="100%", default_height=480, validate=False)
            return {"text/html": html}

    return OfflineHtmlRenderer


def use_offline_renderer() -> str:
    """Make plotly figures display as JSON (for JupyterLab) plus offline-exportable HTML."""
    import plotly.io as pio

    if RENDERER not in pio.renderers:
        pio.renderers[RENDERER] = _renderer_class()()
    pio.renderers.default = f"plotly_mimetype+{RENDERER}"
    return pio.renderers.default


def external_references(html: str) -> list[str]:
    """Every script, stylesheet, image, frame or CSS resource the page would fetch from the network."""
    return [m.group(0) for m in _EXTERNAL.finditer(html)]


def export_html(notebook: Any, out_path: str | Path, *, prompts: bool = True) -> Path:
    """Write an executed notebook (a path or a NotebookNode) as one offline HTML file; ``prompts=False``
    leaves out the ``In [n]:`` / ``Out[n]:`` prompts (a document, not a notebook session).

    Raises ``RuntimeError`` if the page would still fetch anything from the network, so an export
    that would open blank offline is never handed to a user.
    """
    import nbformat
    from nbconvert import HTMLExporter
    from plotly.offline import get_plotlyjs

    nb = nbformat.read(str(notebook), as_version=4) if isinstance(notebook, (str, Path)) else notebook
    exporter = HTMLExporter(template_name=TEMPLATE, extra_template_basedirs=[str(TEMPLATE_DIR)],
                            exclude_input_prompt=not prompts, exclude_output_prompt=not prompts)
    body, _ = exporter.from_notebook_node(nb, resources={"plotly_js": get_plotlyjs()})
    bad = external_references(body)
    if bad:
        raise RuntimeError(f"the exported HTML still references the network: {bad[:3]}")
    out = Path(out_path)
    out.write_text(body, encoding="utf-8")
    return out
