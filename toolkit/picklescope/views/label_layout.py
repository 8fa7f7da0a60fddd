"""Where the step names go on a timeline, so that no two labels overlap.

A step's label sits centred over its band, one row per nesting depth. That collides when two
steps at the same depth are short and back to back (``pickle.dumps`` then ``handoff`` on a small
batch): the text is wider than the bands. The figure cannot measure text (the browser lays it
out later, at a width the notebook decides), so the width is estimated from the character count
at a conservative plot width, and a label that would touch one already placed in its row moves
down to the next free row. Labels that find no free row are left out; their step's name stays in
the hover of its exact-peak line. Pure geometry, no plotly: the figure module draws the result.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

CHAR_PX = 6.0  # average advance of a 10 px Open Sans character (plotly's default font), rounded up
GAP_PX = 8.0  # clear space kept between two labels in a row
PLOT_PX = 540.0  # plot area of a default 700 px plotly figure; wider notebooks only add room
MAX_ROWS = 5


@dataclass(frozen=True)
class Label:
    """One step label to place: its text and the band it names, in data units (seconds)."""

    text: str
    start: float
    end: float
    depth: int = 0
    key: str = ""  # what the caller knows the step by (its name, for its colour)


@dataclass(frozen=True)
class Placed:
    """A label with the row it goes in (0 is the top row) and the x extent its text covers."""

    label: Label
    row: int
    x: float
    lo: float
    hi: float


def text_width(text: str, span: float, plot_px: float = PLOT_PX) -> float:
    """Estimated width of ``text`` in data units on an x axis showing ``span`` over ``plot_px``."""
    return (len(text) * CHAR_PX + GAP_PX) * span / plot_px


def place(labels: Sequence[Label], x0: float, x1: float, *, plot_px: float = PLOT_PX,
          max_rows: int = MAX_ROWS) -> list[Placed]:
    """Rows for ``labels`` in the window ``[x0, x1]`` such that no two in a row overlap.

    Each label starts looking at the row of its depth (so nesting still reads top-down) and takes
    the first row below it where its text touches no label already placed, centred on its band or
    slid right as long as the text still begins over the band; labels are placed in the order of
    their steps' starts, so an enclosing step keeps its row. Labels of steps outside
    the window, or with no free row, are not returned.
    """
    span = max(x1 - x0, 1e-9)
    rows: list[list[tuple[float, float]]] = [[] for _ in range(max_rows)]
    placed: list[Placed] = []
    for lab in sorted(labels, key=lambda b: (b.start, b.depth)):
        lo_b, hi_b = max(lab.start, x0), min(lab.end, x1)
        if hi_b < lo_b:
            continue  # the step is outside the window
        half = text_width(lab.text, span, plot_px) / 2
        for row in range(min(lab.depth, max_rows - 1), max_rows):
            x = _fit(rows[row], (lo_b + hi_b) / 2, half, lo_b, hi_b)
            if x is not None:
                rows[row].append((x - half, x + half))
                placed.append(Placed(lab, row, x, x - half, x + half))
                break
    return placed


def _fit(taken: list[tuple[float, float]], x: float, half: float, start: float, end: float) -> float | None:
    """Where in a row a label centred on ``x`` can go: there, or slid right until it clears its
    left neighbours while its text still begins over its own band (``start``..``end``)."""
    def free(c: float) -> bool:
        return all(c + half <= a or c - half >= b for a, b in taken)

    if free(x):
        return x
    blocking = [b for a, b in taken if a < x + half and b > x - half]
    slid = max(blocking) + half
    return slid if slid - half <= end and free(slid) else None


def rows_used(placed: Sequence[Placed]) -> int:
    """How many label rows the placement needs (0 when there is nothing to label)."""
    return max((p.row + 1 for p in placed), default=0)
