"""Figures draw plain results; the timeline model round-trips through JSON without plotly."""

from __future__ import annotations

import ast
import inspect

import pytest

import picklescope as ps
from picklescope.investigate.stepthrough import StepThrough
from picklescope.measure.linetrace import LineRow
from picklescope.views import figures, timeline
from picklescope.views.timeline import RunTimeline

MiB = 1024**2


@pytest.fixture(scope="module")
def traced_tiny():
    return ps.run("numpy-legacy", "pickle5-oob", "tiny", 1.0, tracer="memray,tracemalloc")


def killed_result() -> ps.RunResult:
    """A run whose sender was killed inside consolidate, with a budget: a partial timeline."""
    sender = ps.Process("sender", baseline_bytes=100 * MiB, budget_bytes=60 * MiB, exit_code=-9)
    sender.timeline = ps.Series([0.0, 0.1, 0.2, 0.3], [100 * MiB, 110 * MiB, 150 * MiB, 170 * MiB])
    sender.steps = [ps.Step("pickle.dumps", 0.05, None, None, None),
                    ps.Step("consolidate", 0.06, None, None, None, depth=1)]
    receiver = ps.Process("receiver", baseline_bytes=90 * MiB)
    return ps.RunResult("numpy-legacy", "pickle5-oob", "flowgrpo", 0.25, 100 * MiB, outcome="oom-killed",
                        processes={"sender": sender, "receiver": receiver}, killed_side="sender",
                        killed_in_step="consolidate")


def test_timeline_model_round_trips_and_has_no_plotly(traced_tiny):
    tl = RunTimeline.from_result(traced_tiny)
    assert RunTimeline.from_json(tl.to_json()) == tl
    s = tl.sides["sender"]
    assert s.above_baseline().bytes[0] == traced_tiny.sender.timeline.bytes[0] - traced_tiny.sender.baseline_bytes
    assert [st.name for st in s.steps] == [st.name for st in traced_tiny.sender.steps]
    assert set(tl.tracer_series["sender"]) == {"memray", "tracemalloc"}  # the sampler is the RSS curve itself
    assert s.cycle_held_bytes == traced_tiny.sender.cycle_held_bytes
    assert tl.attribution and tl.tracers["memray"]["available"]
    imports = [n for n in ast.walk(ast.parse(inspect.getsource(timeline)))
               if isinstance(n, (ast.Import, ast.ImportFrom))]
    assert not any("plotly" in ast.dump(n) for n in imports)


def test_timeline_figure_draws_sides_steps_and_each_tracer(traced_tiny):
    fig = figures.timeline_figure(traced_tiny)
    names = [t.name for t in fig.data]
    assert "RSS, sampled every ~1 ms" in names and "exact step peak (VmHWM)" in names
    assert "what memray saw" in names and "what tracemalloc saw" in names
    rss = [t for t in fig.data if t.name == "RSS, sampled every ~1 ms"]
    assert len(rss) == 2 and {t.yaxis for t in rss} == {"y", "y2"}  # two rows, one per side
    n_steps = sum(len(s.steps) for s in traced_tiny.processes.values())
    steps = [sh for sh in fig.layout.shapes if sh.type == "rect" and sh.name != figures.SETUP_NAME]
    assert len(steps) == n_steps
    labels = {a.text for a in fig.layout.annotations}
    assert "consolidate" in labels or any("consolidate" in (t.text or ()) for t in fig.data if t.text)
    assert not any(sh.type == "line" and sh.line.color == "#D62728" and sh.y0 == sh.y1
                   for sh in fig.layout.shapes)  # no budget, no budget line
    hidden = figures.timeline_figure(traced_tiny, show_tracers=False)
    assert not any(t.name.startswith("what ") for t in hidden.data)


def test_killed_run_still_draws_its_partial_timeline_and_budget():
    fig = figures.timeline_figure(killed_result())
    budget = [sh for sh in fig.layout.shapes if sh.type == "line" and sh.y0 == sh.y1 == 60.0]
    assert budget, "budget line at 60 MiB above baseline"
    texts = {a.text for a in fig.layout.annotations}
    assert "killed in consolidate" in texts
    assert {"pickle.dumps (killed here)", "consolidate (killed here)"} <= texts
    # titles say what happened, in words, with the memory at death and the budget
    assert "sender killed in consolidate at 70.0 MiB (0.70x payload; budget 60.0 MiB)" in texts
    assert "receiver never started: the sender was killed first" in texts
    assert "nothing to draw: the receiver never received the bytes" in texts  # not an empty 0-1 MiB axis
    assert not any(t and ("no exact peak" in t or "unfinished" in t or "over none" in t) for t in texts)
    rects = [sh for sh in fig.layout.shapes if sh.type == "rect"]
    assert max(sh.x1 for sh in rects) == pytest.approx(0.3)  # unfinished steps drawn to the last sample
    rss = next(t for t in fig.data if t.name == "RSS, sampled every ~1 ms")
    assert list(rss.y) == [0.0, 10.0, 50.0, 70.0]


def test_a_kill_that_lands_after_the_last_sample_draws_no_step_after_the_kill():
    """On a small batch the budget is crossed in consolidate, but the SIGKILL lands a few ms later,
    after the sender began its next step and after the parent's last RSS sample: the kill line
    goes at the last sign of life, every band ends at or before it, and the labels say both."""
    r = killed_result()
    r.sender.steps = [ps.Step("pickle.dumps", 0.05, None, None, None),
                      ps.Step("consolidate", 0.06, 0.25, 70 * MiB, 70 * MiB, depth=1),
                      ps.Step("handoff", 0.34, None, None, None, depth=1)]  # after the last sample (0.3)
    fig = figures.timeline_figure(r)
    kill = [sh.x0 for sh in fig.layout.shapes if sh.type == "line" and sh.x0 == sh.x1]
    assert kill == [pytest.approx(0.34)]
    steps = [sh for sh in fig.layout.shapes if sh.type == "rect" and sh.x0 >= 0.05]
    assert steps and all(sh.x1 <= kill[0] + 1e-4 for sh in steps)
    texts = {a.text for a in fig.layout.annotations}
    assert "killed in handoff (over its budget since consolidate)" in texts
    assert any(t and t.startswith("sender killed in handoff (over its budget since consolidate) at 70.0 MiB")
               for t in texts), texts


def test_a_single_side_result_draws_one_row():
    cell = ps.Process("cell", baseline_bytes=0)
    cell.timeline = ps.Series([0.0, 1.0], [0, MiB])
    r = ps.RunResult("cell", "-", "cell", 1.0, 0, processes={"cell": cell})
    fig = figures.timeline_figure(r)
    assert [t.yaxis for t in fig.data] == ["y"]


def test_comparison_groups_codecs_by_transport():
    runs = []
    for codec, transport, peak in [("numpy", "pickle", 2), ("numpy", "pickle5-oob", 0), ("torch", "pickle", 3)]:
        sides = {n: ps.Process(n, peak_bytes=peak * MiB, held_bytes=MiB, cycle_held_bytes=0)
                 for n in ("sender", "receiver")}
        runs.append(ps.RunResult(codec, transport, "tiny", 1.0, MiB,
                                 processes=sides, serialize_s=0.1, deserialize_s=0.2))
    fig = figures.comparison_figure(runs + [runs[0].to_dict()])
    assert fig.layout.barmode == "group"
    assert {t.name for t in fig.data} == {"pickle", "pickle5-oob"}
    assert len(fig.data) == 2 * 5  # transports x panels
    peak_pickle = next(t for t in fig.data if t.name == "pickle" and t.xaxis == "x")
    assert list(peak_pickle.x) == ["numpy", "torch", "numpy"] and list(peak_pickle.y) == [2.0, 3.0, 2.0]


def test_attribution_as_table_and_icicle(traced_tiny):
    table = figures.attribution_figure(traced_tiny)
    cells = table.data[0].cells.values
    assert cells[3][0] in ("consolidate", "frombuffer") and float(cells[0][0]) > 0
    icicle = figures.attribution_figure(traced_tiny, kind="icicle")
    assert icicle.data[0].type == "icicle" and "live at the peak" in icicle.data[0].labels
    empty = figures.attribution_figure(killed_result())
    assert "tracer='memray'" in empty.layout.annotations[0].text


def test_stepthrough_figure_ranks_by_self_cost_and_draws_quiet_lines_neutral():
    # line 9 is a wrapper: 6 MiB with its callee, 0 of its own; line 3 allocates 5 MiB itself;
    # line 12 adds 8 KiB (under 1% of the payload): folded, never in the alarm colour
    rows = [LineRow(0, 0, "f", "m", "/x/m.py", 9, "return wrap(a)", 1, 0.03, 6 * MiB, 6 * MiB, 6 * MiB, 0, 0),
            LineRow(1, 1, "g", "m", "/x/m.py", 3, "a = make()", 1, 0.01, 5 * MiB, 5 * MiB, 5 * MiB,
                    5 * MiB, 5 * MiB, 0),
            LineRow(2, 1, "g", "m", "/x/m.py", 12, "b = tiny()", 2, 0.02, 8192, 8192, 5 * MiB, 8192, 8192, 0)]
    st = StepThrough("m:f", "__getstate__", "tiny", 1.0, 5 * MiB, rows=rows)
    fig = figures.stepthrough_figure(st)
    inclusive, own, took = fig.data
    assert own.y[0].startswith("m.py:3") and "· a = make()" in own.y[0]
    assert own.x[0] == 5.0 and own.marker.color[0] == figures.ALARM_COLOR and list(own.text)[0] == "1.00x"
    assert own.y[-1].startswith("2 quiet lines") and own.marker.color[-1] == figures.QUIET_COLOR
    assert figures.ALARM_COLOR not in list(own.marker.color)[1:]
    assert inclusive.x[0] == 5.0 and took.x[0] == 10.0
    # two figures side by side share one absolute scale
    scale = figures.stepthrough_scale([st, StepThrough("m:h", "__getstate__", "tiny", 1.0, 5 * MiB, rows=rows[2:])])
    small = figures.stepthrough_figure(rows[2:], payload_bytes=5 * MiB, scale_bytes=scale)
    assert tuple(small.layout.xaxis.range) == (0, 6 * 1.05)


def test_a_failed_ray_run_is_one_sentence_not_an_empty_figure():
    """Notebook 03 shows this sentence instead of drawing a three-panel figure with nothing in it."""
    from picklescope.core.result import RunResult
    from picklescope.views.ray_figure import failed_sentence

    r = RunResult(codec="numpy", transport="ray", workload="tiny", scale=1.0, payload_bytes=2**20, outcome="error",
                  error="sender: Exception: The current node timed out during startup. This could happen because "
                        "some of the Ray processes failed to startup.\nCheck the logs in /tmp/ray for details.")
    text = failed_sentence(r)
    assert "\n" not in text and "Check the logs" not in text
    assert text.startswith("The Ray section did not run: numpy over ray failed (Exception: The current node timed out")
    assert text.endswith("nothing is drawn for it.")
