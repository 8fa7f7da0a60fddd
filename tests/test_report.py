"""The main job end to end (``picklescope reproduce``) and its report: one HTML file that opens offline.

The investigation runs once, through the real CLI, on flowgrpo x0.1 (about 47 MiB of payload), and
every test reads what it wrote.
"""

from __future__ import annotations

import base64
import json
import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest

from picklescope import cli as main_cli
from picklescope.investigate import ray_matrix
from picklescope.investigate.reproduce import Investigation, budgeted_results, matrix_results, traced_results
from picklescope.ray import ray_available
from picklescope.views.report import prepare_out_dir, render

SCALE = "0.1"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "picklescope", *args], capture_output=True, text=True, timeout=900)


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory):
    out = tmp_path_factory.mktemp("reproduce") / "out"
    # --no-ray: the rows over a real Ray cluster are another area's, with tests of their own
    p = cli("reproduce", "--workload", "flowgrpo", "--scale", SCALE, "--out", str(out), "--no-ray")
    assert p.returncode == 0, p.stderr[-3000:]
    inv = Investigation.from_dict(json.loads((out / "results.json").read_text()))
    return p.stdout, inv, (out / "report.html").read_text(encoding="utf-8"), out


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each JSON figure block."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.figures: dict[str, str] = {}
        self._in: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags.append((tag, a))
        self._in = a.get("data-figure") if tag == "script" and a.get("type") == "application/json" else None

    def handle_data(self, data):
        if self._in:
            self.figures[self._in] = self.figures.get(self._in, "") + data

    def handle_endtag(self, tag):
        self._in = None


def parse(html: str) -> _Tags:
    t = _Tags()
    t.feed(html)
    return t


def values(v):
    """A plotly array, plain or base64-encoded ({dtype, bdata})."""
    if isinstance(v, dict) and "bdata" in v:
        return np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"]).tolist()
    return list(v)


def test_the_legacy_codec_is_oom_killed_where_the_fix_survives(reproduced):
    stdout, inv, html, _ = reproduced
    budgeted = {r.codec: r for r in budgeted_results(inv)}
    legacy, fixed = budgeted["numpy-legacy"], budgeted["numpy"]
    assert (legacy.outcome, legacy.killed_side, legacy.killed_in_step) == ("oom-killed", "sender", "consolidate")
    assert fixed.outcome == "ok" and fixed.sender.budget_bytes == legacy.sender.budget_bytes
    # the chosen budget lies between what the two codecs need
    need = {r.codec: r.headroom_bytes for r in matrix_results(inv) if r.transport == "pickle5-oob"}
    assert need["numpy"] < legacy.sender.budget_bytes < need["numpy-legacy"]
    headline = inv.headline
    assert "numpy-legacy was OOM-killed on the sender in step consolidate while numpy survived" in headline
    assert headline in stdout and headline.replace("'", "&#x27;") in html
    assert legacy.stack_at_death
    if legacy.stack_note is None:  # the kill landed inside the step: its stack is in the codec's own code
        assert "numpy_codec.py" in legacy.killed_at, legacy.stack_at_death
    else:  # a busy machine's watchdog saw the crossing after the step ended, and the result says so (the line
        # of a kill inside the step is checked with retries in test_budget.py)
        assert "had ended by the time the watchdog saw it" in legacy.stack_note, legacy.stack_note


def test_every_case_has_a_sender_headroom_in_the_table(reproduced):
    stdout, inv, html, _ = reproduced
    matrix = matrix_results(inv)
    assert {(r.codec, r.transport) for r in matrix} == {(c, t) for c in ("torch", "numpy-legacy", "numpy")
                                                        for t in ("pickle", "pickle5-oob")}
    header = next(line for line in stdout.splitlines() if line.startswith("codec"))
    assert "sender headroom" in header and "sender headroom" in html
    for r in matrix:
        h = r.headroom_detail
        assert r.headroom_bytes is not None and h["method"] in ("prediction confirmed", "worst run confirmed",
                                                                        "bisection"), h
        assert h["predicted_bytes"] == r.sender.peak_bytes
        assert r.headroom_bytes >= r.sender.peak_bytes - 0.01 * r.payload_bytes
    p = {(r.codec, r.transport): r.headroom_bytes / r.payload_bytes for r in matrix}
    assert p[("torch", "pickle5-oob")] > p[("numpy-legacy", "pickle5-oob")] > p[("numpy", "pickle5-oob")]


def test_report_shows_what_each_tracker_saw(reproduced):
    """One unbudgeted legacy run carries every tracker; the report tabulates each one's view."""
    _, inv, html, _ = reproduced
    (traced,) = traced_results(inv)
    assert traced.codec == "numpy-legacy" and {"sampler", "tracemalloc"} <= set(traced.tracers)
    section = html.split("What each tracker saw", 1)[1].split("<h2>", 1)[0]
    for name, entry in traced.tracers.items():
        assert f"<td>{name}</td>" in section
        assert ("<td>yes</td>" if entry["available"] else "<td>no</td>") in section
    if traced.attribution:  # memray ran: who allocated the peak
        assert "Where the peak of numpy-legacy over pickle5-oob came from" in html


def test_report_references_nothing_on_the_network(reproduced):
    _, _, html, _ = reproduced
    tags = parse(html)
    for tag, attrs in tags.tags:
        for key in ("src", "href"):
            value = (attrs.get(key) or "").strip().lower()
            assert not value.startswith(("http:", "https:", "//")), (tag, attrs)
        if tag == "script":
            assert "src" not in attrs  # plotly.js and the loader are inline
        assert tag not in ("link", "iframe", "img")
    assert not re.search(r"@import|url\(\s*['\"]?(?:https?:)?//", html, re.IGNORECASE)
    assert "Plotly.newPlot" in html and html.count("<script") >= 3


def test_figures_data_is_inline_and_matches_the_results(reproduced):
    _, inv, html, _ = reproduced
    tags = parse(html)
    divs = [a["id"] for t, a in tags.tags if t == "div" and "figure" in (a.get("class") or "").split()]
    assert divs and sorted(divs) == sorted(tags.figures)
    assert "Figure unavailable" not in html
    figs = {k: json.loads(v) for k, v in tags.figures.items()}
    assert all(f["data"] for f in figs.values())
    # the killed legacy run's timeline: its RSS curve as sampled, and a budget line at its budget
    legacy = next(r for r in budgeted_results(inv) if r.codec == "numpy-legacy")
    t = legacy.sender.timeline.t_s
    base = legacy.sender.baseline_bytes
    budget_mib = legacy.sender.budget_bytes / 2**20
    found = False
    for f in figs.values():
        for tr in f["data"]:
            if tr.get("x") is None or tr.get("y") is None:
                continue
            x = values(tr["x"])
            if len(x) == len(t) and np.allclose(x, t):
                ys = values(tr["y"])
                assert np.allclose(ys, [(v - (base or 0)) / 2**20 for v in legacy.sender.timeline.bytes],
                                   atol=0.01) or np.allclose(ys, [v / 2**20 for v in legacy.sender.timeline.bytes],
                                                            atol=0.01)
                shapes = f["layout"].get("shapes", [])
                assert any(abs((s.get("y0") or 0) - budget_mib) < 0.01 for s in shapes)
                found = True
    assert found, "the killed run's sampled timeline is not inline in the report"


def test_names_from_user_input_are_escaped(reproduced):
    _, inv, _, _ = reproduced
    evil = "<script>alert('x')</script>"
    inv.workload = evil
    inv.headline = f"headline {evil}"
    inv.command = f"picklescope reproduce --workload '{evil}'"
    inv.environment["platform"] = evil
    for r in inv.results:
        r.codec = "<img src=x onerror=alert(1)>"
        r.workload = evil
        r.error = evil if r.error else None
        # what a plugin codec's exception and a killed child's stack can carry
        r.original_error = evil if r.original_error else None
        r.stack_at_death = f"{evil}\n{r.stack_at_death}" if r.stack_at_death else None
        if r.killed_at:
            r.killed_at = evil
        for entry in (r.tracers or {}).values():
            if isinstance(entry, dict):
                entry["reason"] = evil
                entry["notes"] = [evil]
        for side in r.processes.values():
            for st in side.steps:
                st.name = evil
    html = render(inv)
    assert evil not in html and "<img src=x" not in html
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in html
    for _, text in parse(html).figures.items():
        assert "<" not in text  # figure JSON cannot close its script element


def test_out_folder_with_other_files_is_refused_before_any_run(tmp_path):
    folder = tmp_path / "busy"
    folder.mkdir()
    (folder / "notes.txt").write_text("keep me")
    p = cli("reproduce", "--workload", "tiny", "--out", str(folder))
    assert p.returncode == 2 and "--force" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert sorted(os.listdir(folder)) == ["notes.txt"]
    again = tmp_path / "again"
    again.mkdir()
    (again / "report.html").write_text("old")
    (again / "results.json").write_text("{}")
    assert prepare_out_dir(str(again)) == str(again)  # a previous run's own files may be replaced
    assert prepare_out_dir(str(folder), force=True) == str(folder)


def test_report_draws_offline_in_a_browser(reproduced, tmp_path):
    """With every non-file request blocked, each figure draws (plotly.js is inline)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from browser_lab import chromium, require_browser

    require_browser()
    _, _, html, out = reproduced
    n_figs = len(parse(html).figures)
    attempted: list[str] = []
    with chromium(tmp_path) as browser:
        ctx = getattr(browser, "context", browser)  # the harness yields a run holding the context

        def block(route) -> None:
            if route.request.url.startswith("file://"):
                route.continue_()
            else:
                attempted.append(route.request.url)
                route.abort("internetdisconnected")

        ctx.route("**/*", block)
        page = ctx.new_page()
        page.goto((out / "report.html").as_uri())
        page.wait_for_function(f"document.querySelectorAll('.figure .main-svg').length >= {n_figs}", timeout=60000)
        drawn = page.evaluate("Array.from(document.querySelectorAll('.figure')).filter("
                              "d => d.querySelector('.main-svg')).length")
    assert attempted == []
    assert drawn == n_figs


RAY_START_FAILURE = ("The current node timed out during startup. This could happen because some of the Ray "
                     "processes failed to startup.\nCheck the logs in /tmp/ray/session_latest/logs for details.\n"
                     "  File \"ray/_private/node.py\", line 312, in __init__")


def test_a_ray_lane_that_fails_is_one_sentence_in_the_terminal_and_the_report(tmp_path, monkeypatch, capsys):
    """Ray forced to fail at start-up (as on a loaded machine): the in-process rows stand; the terminal
    gives one line saying the Ray rows did not run and why, the report says it too, no traceback."""
    if not ray_available():
        pytest.skip("ray is not installed: there is no Ray lane to fail")

    def cluster_fails(*_a, **_k):
        raise Exception(RAY_START_FAILURE)  # what Ray raises, several lines long

    monkeypatch.setattr(ray_matrix, "cluster_rows", cluster_fails)
    out = tmp_path / "out"
    rc = main_cli.main(["reproduce", "--workload", "tiny", "--scale", "1", "--no-headroom", "--no-trace",
                        "--repeat", "1", "--no-node", "--out", str(out)])
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-2000:]
    said = [line for line in captured.out.splitlines() if "Ray" in line or "ray" in line.split()]
    assert len(said) == 1, said
    assert said[0].startswith("the Ray rows did not run: Exception: The current node timed out during startup"), said
    assert "load average was" in said[0] and "Check the logs" not in said[0]
    assert "Traceback" not in captured.out + captured.err and "node.py" not in captured.out + captured.err
    html = (out / "report.html").read_text(encoding="utf-8")
    assert "The Ray rows did not run: Exception: The current node timed out during startup" in html
    assert "No node replay: the Ray rows did not run" in html
    assert "Traceback" not in html and "node.py" not in html
    inv = Investigation.from_dict(json.loads((out / "results.json").read_text()))
    assert {r.transport for r in matrix_results(inv)} == {"pickle", "pickle5-oob"}  # the rest stood
    assert re.search(r"\d+ runs \(6 cases", html), re.findall(r"Payload[^<]*", html)
