"""Peaks that vary from run to run: measured as a range (``repeat=N``), and headroom covers the worst run.

The rules are checked on scripted results first (so they can fail on a wrong rule whatever the
machine does), then on real runs.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import picklescope as ps
from picklescope.core.result import Process, RunResult, Step, Variation
from picklescope.errors import PicklescopeError
from picklescope.investigate import headroom as headroom_mod
from picklescope.views.table import variation_rows, variation_summary

MiB = 1 << 20


def _result(sender_peak: int, payload: int = 100 * MiB, outcome: str = "ok") -> RunResult:
    sender = Process("sender", peak_bytes=sender_peak, steps=[Step("pickle.dumps", 0.0, 1.0, sender_peak, sender_peak)])
    receiver = Process("receiver", peak_bytes=2 * payload)
    return RunResult("numpy-legacy", "pickle", "flowgrpo", 0.05, payload, outcome=outcome,
                     processes={"sender": sender, "receiver": receiver})


def test_variation_is_min_median_max_of_every_exact_peak():
    runs = [_result(264 * MiB), _result(300 * MiB), _result(264 * MiB)]
    v = Variation.of(runs)
    sender = v.peak("sender")
    assert (sender.min, sender.median, sender.max) == (264 * MiB, 264 * MiB, 300 * MiB)
    assert sender.varies and v.varies
    assert not v.peak("receiver").varies  # 2.00x in every run
    assert v.peak("sender: pickle.dumps").values == [264 * MiB, 300 * MiB, 264 * MiB]


def test_a_spread_under_one_percent_of_the_payload_does_not_vary():
    v = Variation.of([_result(300 * MiB), _result(300 * MiB + MiB // 2)])  # 0.5% of a 100 MiB payload
    assert not v.varies
    v = Variation.of([_result(300 * MiB), _result(302 * MiB)])  # 2%
    assert v.varies


def test_variation_survives_json():
    r = _result(300 * MiB)
    r.variation = Variation.of([_result(264 * MiB), r])
    d = json.loads(r.to_json())
    assert d["variation"]["varies"] is True
    sender = next(p for p in d["variation"]["peaks"] if p["name"] == "sender")
    assert (sender["min_bytes"], sender["max_bytes"]) == (264 * MiB, 300 * MiB)
    back = RunResult.from_dict(d)
    assert back.variation.peak("sender").values == [264 * MiB, 300 * MiB]


def test_the_views_name_both_values():
    r = _result(300 * MiB)
    r.variation = Variation.of([_result(264 * MiB), r, _result(264 * MiB)])
    text = variation_summary(r)
    assert "VARIES" in text and "2.64x in 2 of 3" in text and "3.00x in 1 of 3" in text
    rows = {row["peak"]: row for row in variation_rows(r)}
    assert rows["sender"]["min"] == "2.64x" and rows["sender"]["max"] == "3.00x" and rows["sender"]["varies"]


def _scripted_headroom(monkeypatch, peaks: list[int], payload: int = 100 * MiB):
    """find_headroom over a case whose successive runs peak at ``peaks`` (cycled): a budget kills a run
    exactly when that run's peak is over it, as the watchdog does."""
    calls = {"n": 0}

    def fake_run(codec, transport, workload, scale, budget=None, repeat=1, **kw):
        results = []
        for _ in range(repeat):
            peak = peaks[calls["n"] % len(peaks)]
            calls["n"] += 1
            limit = None if budget is None else budget.resolve(payload)
            r = _result(peak, payload, "oom-killed" if limit is not None and peak > limit else "ok")
            r.killed_side = "sender" if r.outcome == "oom-killed" else None
            results.append(r)
        worst = max(results, key=lambda r: r.sender.peak_bytes)
        if repeat > 1:
            worst.variation = Variation.of(results)
        return worst

    class _Spec:
        name = "flowgrpo"

        def payload_bytes(self, scale):
            return payload

    monkeypatch.setattr(headroom_mod, "run", fake_run)
    monkeypatch.setattr("picklescope.workloads.spec.load_workload", lambda w: _Spec())
    return headroom_mod.find_headroom("numpy-legacy", "pickle", "flowgrpo", 0.05, repeat=3)


def test_headroom_covers_the_worst_run_when_a_lower_draw_survives_below_it(monkeypatch):
    # three unbudgeted runs: 2.64x, 3.00x, 2.64x; then above (survives) and below (draws 2.64x: survives)
    h = _scripted_headroom(monkeypatch, [264 * MiB, 300 * MiB, 264 * MiB, 264 * MiB, 264 * MiB])
    assert h.varies and h.predicted_bytes == 300 * MiB and h.peak_min_bytes == 264 * MiB
    assert h.headroom_bytes >= 300 * MiB  # never under a peak that was measured
    assert h.method == "worst run confirmed"
    assert "varies" in h.describe() and "2.64x to 3.00x" in h.describe()


def test_headroom_of_a_steady_peak_is_confirmed_on_both_sides(monkeypatch):
    h = _scripted_headroom(monkeypatch, [300 * MiB])
    assert not h.varies and h.method == "prediction confirmed"
    assert h.killed_below_bytes < 300 * MiB <= h.headroom_bytes
    assert h.headroom_bytes - h.killed_below_bytes <= h.resolution_bytes


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3", 10**6])
def test_repeat_must_be_a_whole_number_of_runs(bad):
    with pytest.raises(PicklescopeError):
        ps.run("numpy", "pickle5-oob", "tiny", 1.0, repeat=bad)


def test_repeat_runs_the_case_in_fresh_processes_and_keeps_the_worst():
    r = ps.run("numpy-legacy", "pickle", "tiny", 1.0, repeat=3)
    v = r.variation
    assert v is not None and v.runs == 3 and v.outcomes == ["ok"] * 3
    assert r.sender.peak_bytes == v.peak("sender").max  # the run kept is the worst
    # every run's children came from a forkserver of their own (a new address-space layout each time)
    assert len(v.forkserver_pids) == 3 and len(set(v.forkserver_pids)) == 3 and None not in v.forkserver_pids


def test_run_command_reports_the_range_and_refuses_a_bad_count():
    p = subprocess.run([sys.executable, "-m", "picklescope", "run", "--codec", "numpy", "--workload", "tiny",
                        "--scale", "1", "--repeat", "2", "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["variation"]["runs"] == 2 and {"min_bytes", "median_bytes", "max_bytes"} <= set(d["variation"]["peaks"][0])
    p = subprocess.run([sys.executable, "-m", "picklescope", "run", "--repeat", "zero"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "--repeat" in p.stderr
