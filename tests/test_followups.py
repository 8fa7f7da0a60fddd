"""Follow-ups on the run timeline figure and the explorer's status line.

- The y axis starts at the baseline: the set-up before it (hundreds of MiB below) is greyed and
  clipped instead of setting the range.
- Step labels of short consecutive steps (``pickle.dumps`` then ``handoff``) do not overlap: checked
  on the layout and in a real browser, where the text is actually measured.
- The explorer's status line displays as HTML in Jupyter and as plain text elsewhere.
- A small budget is labelled in a unit that fits it, with its payload multiple (not "0 MiB").
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

import pytest

import picklescope as ps
from picklescope.views import figures, label_layout
from picklescope.views.richtext import HtmlText, plain_text

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from browser_lab import CHROMIUM, CHROMIUM_ARGS, require_browser  # noqa: E402

MiB = 1024**2
KiB = 1024
STEP_NAMES = {"pickle.dumps", "__getstate__", "consolidate", "to_numpy", "handoff", "pickle.loads", "__setstate__",
              "frombuffer"}


@pytest.fixture(scope="module")
def budgeted_tiny():
    """numpy-legacy on tiny x0.25 with a 0.5x sender budget: a real run with set-up and a small budget."""
    return ps.run("numpy-legacy", "pickle5-oob", "tiny", 0.25, budget="0.5x")


def short_steps_result() -> ps.RunResult:
    """Shaped like numpy-legacy on flowgrpo x0.1: each side's set-up climbs from far below its
    baseline just before its steps, and the sender's steps are short and back to back."""
    t = [round(0.002 * k, 3) for k in range(0, 800)]
    sender = ps.Process("sender", baseline_bytes=400 * MiB, baseline_s=0.995, peak_bytes=47 * MiB)
    sender.timeline = ps.Series(t, [(0 if x < 0.97 else 400 if x < 1.0 else 447 if x < 1.2 else 400) * MiB
                                      for x in t])
    sender.steps = [ps.Step("pickle.dumps", 1.0, 1.035, 47 * MiB, 47 * MiB),
                    ps.Step("__getstate__", 1.0, 1.033, 47 * MiB, 47 * MiB, depth=1),
                    ps.Step("consolidate", 1.0, 1.03, 47 * MiB, 47 * MiB, depth=2),
                    ps.Step("to_numpy", 1.03, 1.033, 47 * MiB, 0, depth=2),
                    ps.Step("handoff", 1.035, 1.08, 47 * MiB, 0)]
    receiver = ps.Process("receiver", baseline_bytes=350 * MiB, baseline_s=1.449, peak_bytes=47 * MiB)
    receiver.timeline = ps.Series(t, [(300 if x < 1.3 else 350 if x < 1.45 else 397) * MiB for x in t])
    receiver.steps = [ps.Step("pickle.loads", 1.45, 1.48, 47 * MiB, 47 * MiB),
                      ps.Step("__setstate__", 1.45, 1.48, 47 * MiB, 47 * MiB, depth=1),
                      ps.Step("frombuffer", 1.451, 1.479, 47 * MiB, 47 * MiB, depth=2)]
    return ps.RunResult("numpy-legacy", "pickle5-oob", "flowgrpo", 0.1, 47 * MiB,
                        processes={"sender": sender, "receiver": receiver})


def y_range(fig, row: int = 1) -> list[float]:
    axis = fig.layout.yaxis if row == 1 else fig.layout[f"yaxis{row}"]
    return list(axis.range)


# -- 1. the y axis starts at the baseline ---------------------------------------------------------

def test_setup_before_the_baseline_does_not_set_the_y_range():
    fig = figures.timeline_figure(short_steps_result())
    x0, x1 = fig.layout.xaxis.range
    assert x0 < 0.97  # the set-up's climb is inside the window the figure opens on
    lo, hi = y_range(fig)
    assert -5.0 <= lo <= 0.0 and hi >= 47.0  # ... but its -400 MiB is off the axis
    lo, hi = y_range(fig, 2)
    assert -5.0 <= lo <= 0.0 and hi >= 47.0  # the receiver's -50 MiB too
    setup = [t for t in fig.data if t.name == figures.SETUP_NAME]
    assert len(setup) == 2 and min(setup[0].y) == -400.0  # still drawn (greyed), clipped by the range
    assert max(setup[0].x) < 0.995 and max(setup[1].x) < 1.449  # grey only before the baseline
    rss = next(t for t in fig.data if t.name == "RSS, sampled every ~1 ms")
    assert len(rss.x) == 800  # the black curve keeps every sample; the grey one is drawn over its set-up
    shades = [sh for sh in fig.layout.shapes if sh.name == figures.SETUP_NAME]
    assert [sh.x1 for sh in shades] == [0.995, 1.449]


def test_real_run_records_its_baseline_time_and_axis_starts_there(budgeted_tiny):
    r = budgeted_tiny
    fig = figures.timeline_figure(r)
    for row, side in enumerate(r.processes.values(), start=1):
        if not side.steps:
            assert side.name == "receiver" and side.baseline_s is None
            continue
        assert side.baseline_s is not None and side.baseline_s <= side.steps[0].start_s
        measured = side.above_baseline(side.baseline_s).bytes
        lo, hi = y_range(fig, row)
        assert min(0.0, min(measured) / MiB) - 1.0 <= lo <= 0.0
        curve = side.above_baseline()
        setup = [v for t, v in zip(curve.t_s, curve.bytes) if t < side.baseline_s]
        if setup and min(setup) / MiB < lo:  # the set-up dipped below the axis: drawn grey, not black
            assert any(t.name == figures.SETUP_NAME and t.yaxis == ("y" if row == 1 else f"y{row}") for t in fig.data)
    assert ps.RunResult.from_json(r.to_json()).sender.baseline_s == r.sender.baseline_s


# -- 2. step labels do not overlap -----------------------------------------------------------------

def test_label_layout_puts_overlapping_labels_in_different_rows():
    labels = [label_layout.Label("pickle.dumps", 1.0, 1.03), label_layout.Label("handoff", 1.03, 1.08)]
    placed = label_layout.place(labels, 0.95, 1.13)
    assert len(placed) == 2
    a, b = placed
    assert a.row != b.row or a.hi <= b.lo or b.hi <= a.lo
    wide = label_layout.place(labels, 0.95, 1.13, plot_px=5000)  # plenty of room: both stay in the top row
    assert [p.row for p in wide] == [0, 0]


def _label_boxes(fig, width: int, tmp_path: Path) -> list[dict]:
    """Chromium's bounding boxes of the step labels of ``fig`` drawn ``width`` px wide."""
    require_browser()
    from playwright.sync_api import sync_playwright

    page_file = tmp_path / f"timeline_{width}.html"
    fig.write_html(str(page_file), include_plotlyjs=True, full_html=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": 900})
            page.goto(page_file.as_uri())
            page.wait_for_selector("g.annotation")
            boxes = page.evaluate("""() => Array.from(document.querySelectorAll('g.annotation')).map(g => {
                const r = g.querySelector('text').getBoundingClientRect();
                return {text: g.textContent, left: r.left, right: r.right, top: r.top, bottom: r.bottom};
            })""")
        finally:
            browser.close()
    return [b for b in boxes if b["text"].split(" (")[0] in STEP_NAMES]


def _overlaps(boxes: list[dict]) -> list[tuple[str, str]]:
    return [(a["text"], b["text"]) for a, b in itertools.combinations(boxes, 2)
            if a["left"] < b["right"] - 0.5 and b["left"] < a["right"] - 0.5
            and a["top"] < b["bottom"] - 0.5 and b["top"] < a["bottom"] - 0.5]


def test_short_consecutive_step_labels_do_not_overlap_in_a_browser(tmp_path, budgeted_tiny):
    fig = figures.timeline_figure(short_steps_result())
    boxes = _label_boxes(fig, 700, tmp_path)  # 700 px: plotly's default figure width
    assert {b["text"] for b in boxes} >= {"pickle.dumps", "handoff"}
    assert _overlaps(boxes) == []
    real = _label_boxes(figures.timeline_figure(budgeted_tiny), 700, tmp_path)
    assert real and _overlaps(real) == []


# -- 3. the explorer's status line -------------------------------------------------------------------

def test_explorer_summary_renders_html_in_jupyter_and_plain_text_elsewhere():
    from IPython.core.formatters import DisplayFormatter

    from picklescope.views.widgets import Explorer

    ex = Explorer(workload="tiny", scale=1.0)
    ex.status.value = "<b>ok</b>: numpy sender peak 4.0 KiB = 0.00x payload &amp; <i>done</i>"
    shown = ex.summary()
    bundle, _meta = DisplayFormatter().format(shown)
    assert bundle["text/html"] == ex.status.value  # Jupyter renders the tags
    assert bundle["text/plain"] == "ok: numpy sender peak 4.0 KiB = 0.00x payload & done"  # terminals read text
    assert str(shown) == bundle["text/plain"]
    assert plain_text("a<br>b &lt;c&gt;") == "a\nb <c>"
    assert str(HtmlText("<i>ready</i>")) == "ready"


# -- 4. a small budget's label -------------------------------------------------------------------------

def test_budget_label_has_a_fitting_unit_and_the_payload_multiple(budgeted_tiny):
    r = budgeted_tiny
    budget = r.sender.budget_bytes
    assert budget is not None and budget < MiB  # 0.5x of tiny x0.25: well under one MiB
    texts = [a.text for a in figures.timeline_figure(r).layout.annotations if a.text.startswith("budget ")]
    assert texts == [f"budget {budget / KiB:.1f} KiB (0.50x payload)"]
    assert figures.budget_text(int(1.2 * MiB), int(2.4 * MiB)) == "budget 1.2 MiB (0.50x payload)"
    assert figures.budget_text(300 * MiB, 0) == "budget 300.0 MiB"


def test_user_text_in_figures_is_shown_literally_not_as_plotly_html():
    """plotly renders <b>, <a href>, <br> in labels: names from plugins and workloads are escaped."""
    from picklescope.views.figures import timeline_figure

    r = short_steps_result()
    r.codec, r.workload = "<b>mine</b>", "<a href='http://x'>w</a>"
    r.processes["sender"].steps[0].name = "a<br>b"
    fig = timeline_figure(r)
    title = fig.layout.title.text
    assert "<b>" not in title and "&lt;b&gt;mine&lt;/b&gt;" in title and "&lt;a href" in title
    texts = [a.text for a in fig.layout.annotations]
    assert any("a&lt;br&gt;b" in t for t in texts) and not any("a<br>b" in t for t in texts)
