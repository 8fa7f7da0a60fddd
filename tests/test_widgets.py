"""The explorer and the step reveal, driven in an in-process IPython shell as a user would."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing.globalipapp import start_ipython

from picklescope.core.units import MiB


@pytest.fixture(scope="module")
def ip():
    start_ipython()  # the process-wide test shell: a no-op once another test file started it
    return InteractiveShell.instance()


def _data_json(fig) -> str:
    """The figure's traces as JSON text (samples are numpy arrays, which do not compare with ``!=``)."""
    import plotly.io as pio

    return pio.to_json({"data": [t.to_plotly_json() for t in fig.data]})


def _sender_rss_max(fig) -> float:
    """Highest sampled RSS (MiB above baseline) on the sender's row of a timeline figure."""
    traces = [t for t in fig.data if (t.name or "").startswith("RSS") and t.yaxis in (None, "y")]
    assert traces, [(t.name, t.yaxis) for t in fig.data]
    return max(max((v for v in t.y if v is not None), default=0.0) for t in traces)


@pytest.fixture(scope="module")
def switched(ip):
    """numpy, then numpy-legacy, through the explorer's own controls (flowgrpo x0.1, about 47 MiB)."""
    ip.run_cell("from picklescope.views.widgets import Explorer\n"
                "ex = Explorer(codec='numpy', transport='pickle5-oob', workload='flowgrpo', scale=0.1)\nex",
                store_history=True)
    ex = ip.user_ns["ex"]
    frames: list[bool] = []
    live: list[tuple[str, str]] = []  # (status, figure title) at every partial frame
    draw = ex._draw

    def counting(r, final=False):
        frames.append(all(s.peak_bytes is not None for s in r.processes.values()))
        draw(r, final)
        if not final:
            live.append((ex.status.value, ex.figure.layout.title.text or ""))

    ex._draw = counting
    statuses: list[str] = []  # every text the status line took, however briefly
    ex.status.observe(lambda change: statuses.append(change["new"]), names="value")
    ex.button.click()
    during = {"running": ex.running, "disabled": ex.button.disabled, "codec_disabled": ex.codec.disabled,
              "second_start": ex.start(), "status": ex.status.value}
    ex.wait(600)
    first = {"rss_max": _sender_rss_max(ex.figure), "data": _data_json(ex.figure),
             "frames": list(frames)}
    ip.run_cell("ex.codec.value = 'numpy-legacy'", store_history=True)
    ex.button.click()
    ex.wait(600)
    ex.live = live
    ex.statuses = statuses
    return ex, during, first, frames


def test_switching_to_legacy_adds_a_row_one_payload_higher(switched):
    ex, _, first, _ = switched
    assert [r.codec for r in ex.results] == ["numpy", "numpy-legacy"]
    assert all(r.outcome == "ok" for r in ex.results), [r.error for r in ex.results]
    fixed, legacy = ex.results
    diff = (legacy.sender.peak_bytes - fixed.sender.peak_bytes) / legacy.payload_bytes
    assert 0.85 <= diff <= 1.2, diff  # the discarded consolidate: about one payload
    assert ex.table.value.count("<tr>") == 3  # header + one row per run
    assert "numpy-legacy" in ex.table.value.split("<tbody>")[1]


def test_figure_data_updated_in_place(switched):
    ex, _, first, _ = switched
    assert _data_json(ex.figure) != first["data"]
    legacy = ex.results[-1]
    rise = _sender_rss_max(ex.figure) - first["rss_max"]
    assert 0.8 <= rise * MiB / legacy.payload_bytes <= 1.3, rise  # the sender's curve gained the copy
    assert "numpy-legacy" in ex.figure.layout.title.text


def test_figure_redrawn_while_the_run_streams(switched):
    _, _, first, frames = switched
    # partial frames (a side not finished yet) were drawn before each run's final frame
    assert first["frames"].count(False) >= 1 and first["frames"][-1] is True
    assert frames.count(False) > first["frames"].count(False)


def test_while_running_nothing_says_ok_and_the_status_names_a_step(switched):
    import re

    ex = switched[0]
    assert ex.live, "no partial frame was drawn"
    for status, title in ex.live:
        assert "running" in status and (not title or "running" in title), (status, title)
        assert not re.search(r"\bok\b", status + " " + title), (status, title)
    steps = ("consolidate", "pickle.dumps", "__getstate__", "to_numpy", "handoff", "pickle.loads", "__setstate__",
             "frombuffer")
    running = [st for st in ex.statuses if "running" in st]
    for st in running:
        assert not re.search(r"\bok\b", st), st
    named = [st for st in running if re.search(r"(sender|receiver): (" + "|".join(map(re.escape, steps)) + ")", st)]
    assert named, running


def test_controls_show_a_run_and_refuse_a_second(switched):
    ex, during, _, _ = switched
    assert during["running"] and during["disabled"] and during["codec_disabled"]
    assert during["second_start"] is None
    assert "already going" in during["status"]
    assert not ex.running and not ex.button.disabled and ex.button.description == "run"


def test_budget_kill_lands_in_the_table_and_the_kernel_lives(ip, switched):
    ex = switched[0]
    pid = os.getpid()
    ex.run_with(codec="numpy-legacy", budget=0.5)
    ex.wait(600)
    r = ex.results[-1]
    assert r.outcome == "oom-killed" and r.killed_side == "sender" and r.killed_in_step == "consolidate"
    assert "oom-killed" in ex.table.value and "kernel is still running" in ex.status.value, ex.status.value
    death = r.memory_at_death_bytes
    assert death is not None and death > 0.4 * r.payload_bytes
    row = ex.table.value.split("<tr>")[-1]
    assert "killed in consolidate at " in row and "budget " in row
    assert "killed in consolidate at " in ex.status.value and "budget " in ex.status.value
    assert os.getpid() == pid and ip.run_cell("1 + 1").result == 2
    ex.budget.value = 0.0


def test_unknown_control_is_refused(switched):
    from picklescope.errors import PicklescopeError

    with pytest.raises(PicklescopeError, match="no control"):
        switched[0].run_with(colour="red")


def test_step_reveal_shows_one_step_at_a_time(switched):
    from picklescope.views.stepper import StepReveal

    legacy = switched[0].results[1]
    rv = StepReveal(legacy)
    assert rv.index == -1 and rv.prev_button.disabled
    names = [st.name for _, st in rv.sequence]
    assert "consolidate" in names and names.index("consolidate") < names.index("__getstate__")  # inner first
    shown, ends = [], []
    while not rv.next_button.disabled:
        rv.next_button.click()
        shown.append(rv.caption.value)
        xs = [x for t in rv.figure.data if (t.name or "").startswith("RSS") for x in t.x]
        ends.append(max(xs))
        assert max(xs) <= rv.sequence[rv.index][1].end_s + 1e-9  # nothing after the revealed step is drawn
    assert len(shown) == len(rv.sequence) and ends == sorted(ends)
    i = names.index("consolidate")
    assert f"step {i + 1} of {len(names)}" in shown[i] and "consolidate" in shown[i] and "x payload" in shown[i]
    rv.prev_button.click()
    assert rv.index == len(rv.sequence) - 2


def test_a_workload_file_joins_the_menu(tmp_path):
    """A converted or captured workload file is offered like a preset; a bad path is refused in one line."""
    from picklescope.errors import PicklescopeError
    from picklescope.views.widgets import Explorer

    mine = tmp_path / "mine.yaml"
    mine.write_text((Path(__file__).resolve().parents[1] / "data" / "workloads" / "tiny.yaml").read_text())
    ex = Explorer(workload=str(mine))
    assert ex.workload.value == str(mine) and ex.settings()["workload"] == str(mine)
    assert "flowgrpo" in ex.workload.options  # the presets are still there
    with pytest.raises(PicklescopeError):
        ex.offer_workload(str(tmp_path / "missing.yaml"))
    assert ex.workload.value == str(mine)


def test_a_table_aligns_whole_columns_and_says_which_runs_had_a_budget():
    from picklescope.views import table

    html = table.html_table([{"what": "python", "value": "3.11.7"}, {"what": "platform", "value": "Linux x86_64"},
                             {"what": "cpus", "value": "2"}, {"n": "1.5 MiB"}])
    assert "text-align:right" in html.split("1.5 MiB")[0].rsplit("<td", 1)[1]  # an all-number column
    assert "3.11.7" in html and "text-align:right" not in html.split("3.11.7")[0].rsplit("<td", 1)[1]
    folded_only = table.html_table([], caption="nothing costly", folded=[{"line": "a.py:1"}], folded_label="1 quiet")
    assert "<thead>" in folded_only and folded_only.count("<table") == 1  # no empty table above the folded rows


def test_a_run_that_fails_is_one_line_in_the_status_and_no_empty_axes(monkeypatch):
    """A Ray start-up failure (forced here) reaches the explorer as one line: the status says which run
    failed and why, the figure says the same instead of showing an older run or empty axes."""
    from picklescope.measure import runner
    from picklescope.views.widgets import Explorer

    def ray_fails(*_a, **_k):
        raise Exception("The current node timed out during startup.\nCheck the logs in /tmp/ray for details.")

    monkeypatch.setattr(runner, "run", ray_fails)
    ex = Explorer(workload="tiny", scale=1.0, transport="ray")
    ex.start()
    ex.wait(120)
    status = ex.summary()
    assert str(status).startswith("run 1 failed: Exception: The current node timed out during startup"), str(status)
    assert "\n" not in str(status) and "Check the logs" not in str(status)
    assert not ex.figure.data and "run 1 failed" in ex.figure.layout.title.text
    assert len(ex.plot.outputs) == 1 and not ex.results and not ex.button.disabled
