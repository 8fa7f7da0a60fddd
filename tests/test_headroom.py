"""Headroom: the smallest sender budget each codec survives, predicted and then confirmed by real kills."""

from __future__ import annotations

import json
import subprocess
import sys

import picklescope as ps
from picklescope.investigate.headroom import find_headroom


def test_legacy_needs_one_payload_more_than_the_fix(flowgrpo_quarter):
    """The legacy numpy mode pays one full copy (verl PR #7539): its headroom minus the fix's is 1.0x payload."""
    legacy_peak = flowgrpo_quarter[("numpy-legacy", "pickle5-oob")].sender.peak_bytes
    fixed_peak = flowgrpo_quarter[("numpy", "pickle5-oob")].sender.peak_bytes
    legacy = find_headroom("numpy-legacy", "pickle5-oob", "flowgrpo", 0.25, peak_bytes=legacy_peak)
    fixed = find_headroom("numpy", "pickle5-oob", "flowgrpo", 0.25, peak_bytes=fixed_peak)
    assert legacy.method == fixed.method == "prediction confirmed", (legacy.runs, fixed.runs)
    assert abs(legacy.multiple - fixed.multiple - 1.0) <= 0.05
    # confirmed by one run just above (survives) and one just below (killed in consolidate)
    assert [r["outcome"] for r in legacy.runs] == ["ok", "oom-killed"]
    assert legacy.runs[1]["killed_in_step"] == "consolidate"
    assert legacy.headroom_bytes - legacy.killed_below_bytes <= legacy.resolution_bytes  # 2% of payload
    assert legacy.killed_below_bytes < legacy_peak <= legacy.headroom_bytes
    # the fix needs less than the resolution: nothing below it to kill
    assert fixed.multiple <= 0.02 and fixed.killed_below_bytes is None


def test_a_wrong_prediction_falls_back_to_bisection():
    scale = 0.05
    truth = ps.run("numpy-legacy", "pickle5-oob", "flowgrpo", scale)
    assert truth.outcome == "ok"
    h = find_headroom("numpy-legacy", "pickle5-oob", "flowgrpo", scale, peak_bytes=int(0.9 * truth.payload_bytes))
    assert h.method == "bisection" and h.error is None, h.runs
    assert h.runs[0]["outcome"] == "oom-killed"  # "just above" the wrong prediction was killed
    assert h.headroom_bytes - h.killed_below_bytes <= h.resolution_bytes
    # the bracket holds the real exact peak (a few hundred KiB of run-to-run noise allowed)
    slack = 0.005 * truth.payload_bytes
    assert h.killed_below_bytes - slack < truth.sender.peak_bytes <= h.headroom_bytes + slack


def test_headroom_command_prints_json():
    p = subprocess.run([sys.executable, "-m", "picklescope", "headroom", "--codec", "numpy-legacy", "--workload",
                        "flowgrpo", "--scale", "0.05", "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["codec"] == "numpy-legacy" and d["method"] in ("prediction confirmed", "bisection")
    assert 0.9 < d["multiple"] < 1.3  # one full copy plus a fixed overhead that matters at this small scale
    assert d["runs"] and all(r["outcome"] in ("ok", "oom-killed") for r in d["runs"])


def test_a_survived_budget_under_a_measured_peak_is_a_varying_peak(monkeypatch):
    """A budget only kills, it changes no allocation: surviving below a measured exact peak means this
    run drew a smaller peak (in-band pickle's peak varies, docs/varying_peaks.md). The headroom must
    still cover the worst measured run, not bisect down to the lucky draw."""
    from picklescope.core.result import Process, RunResult
    from picklescope.investigate import headroom
    from picklescope.workloads import load_workload

    payload = load_workload("flowgrpo").payload_bytes(0.05)
    worst, lucky = int(3.00 * payload), int(2.64 * payload)

    def fake_run(codec, transport, workload, scale, budget=None, **kw):
        limit = budget.bytes
        r = RunResult(codec=codec, transport=transport, workload=workload, scale=scale, payload_bytes=payload,
                      processes={"sender": Process("sender"), "receiver": Process("receiver")})
        if lucky <= limit:
            r.outcome, r.sender.peak_bytes = "ok", lucky
        else:
            r.outcome, r.killed_side = "oom-killed", "sender"
        return r

    monkeypatch.setattr(headroom, "run", fake_run)
    h = headroom.find_headroom("numpy-legacy", "pickle", "flowgrpo", 0.05, peak_bytes=worst, peak_min_bytes=worst)
    assert h.method == "worst run confirmed" and h.varies, h.runs
    assert h.headroom_bytes >= worst and h.peak_min_bytes == lucky
    assert len(h.runs) == 2  # no bisection towards the lucky draw
