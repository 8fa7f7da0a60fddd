"""A short message kept as HTML that Jupyter renders and a terminal prints as plain text.

Widgets hold their messages as HTML (``widgets.HTML.value``: ``"<b>ok</b>: numpy sender peak
..."``). Printing that value shows the tags; returning the raw string shows its repr. Wrapping it
in :class:`HtmlText` gives Jupyter a ``text/html`` view (rendered) and everything else a
``text/plain`` one (tags dropped, entities decoded), so one cell reads right in a notebook, in
papermill output and in a terminal.
"""

from __future__ import annotations

from html.parser import HTMLParser

_BREAKS = {"br", "p", "div", "tr", "li"}


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []

    def handle_data(self, data: str) -> None:
        self.parts.append(data)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BREAKS and self.parts:
            self.parts.append("\n")


def plain_text(fragment: str) -> str:
    """``fragment`` without its tags, with entities decoded (``&lt;`` -> ``<``)."""
    parser = _Text()
    parser.feed(fragment)
    parser.close()
    return "".join(parser.parts).strip()


class HtmlText:
    """An HTML fragment that displays as HTML in Jupyter and as plain text anywhere else."""

    def __init__(self, html: str) -> None:
        self.html = html

    def _repr_html_(self) -> str:
        return self.html

    def __str__(self) -> str:
        return plain_text(self.html)

    def __repr__(self) -> str:
        return str(self)


def sentence(text: str, *, strong: bool = False) -> HtmlText:
    """One plain sentence shown as a paragraph: printed text in a notebook wraps mid-word at the
    output's width (``"i / t sees"``), a paragraph wraps between words like the prose around it.
    Text between backticks is drawn as code (printed as plain text, the code reads as it is)."""
    import html
    import re

    # `code` between backticks is shown as code, as in the markdown around it (never as backticks)
    body = re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
    return HtmlText(f"<p style='margin:4px 0'>{'<b>' + body + '</b>' if strong else body}</p>")
