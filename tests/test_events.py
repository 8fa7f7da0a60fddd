"""The run protocol (``toolkit/picklescope/core/events.py``) declares every event the package sends.

Events are plain dicts at run time, so nothing stops a producer from sending a kind or a key the
protocol module does not describe; these tests do. The source is scanned for every event kind a
producer builds (``{"type": "done", ...}`` or ``Done(type="done", ...)``) and every kind a consumer
compares against (``kind == "done"``, ``ev.get("type") in (...)``); then real runs (two sides, the
cell magic's child, a probe run, an in-child tracer) record what crossed the pipes, and every event
must carry its kind's required keys and no key its kind leaves undeclared.
"""

from __future__ import annotations

import re
import typing
from pathlib import Path

import pytest

import picklescope as ps
from picklescope.core import events
from picklescope.measure.cellrun import run_cell

PACKAGE = Path(__file__).resolve().parents[1] / "toolkit" / "picklescope"
PRODUCED = [
    re.compile(r'"type":\s*"([A-Za-z_]+)"'),  # a dict literal
    re.compile(r'\b[A-Z]\w*\(\s*type="([A-Za-z_]+)"'),  # a TypedDict call
]
# An event's type read from ``ev`` / ``msg``, or from ``kind`` in a module that sets ``kind`` from an event.
EV_TYPE = r'\b(?:ev|msg)(?:\.get\("type"\)|\["type"\])'
KIND_FROM_EVENT = re.compile(r'\bkind\b[^=\n]*=[^\n]*' + EV_TYPE)


def _sources() -> list[tuple[Path, str]]:
    # views draw, they send no event (their {"type": ...} dicts are plotly shapes)
    return [(p, p.read_text()) for p in sorted(PACKAGE.rglob("*.py"))
            if p.name != "events.py" and p.parent.name != "views"]


def _kinds_in_source() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path, text in _sources():
        where = str(path.relative_to(PACKAGE))
        read = rf'(?:{EV_TYPE}|\bkind)' if KIND_FROM_EVENT.search(text) else EV_TYPE
        names = [m for rx in PRODUCED for m in rx.findall(text)]
        names += re.findall(read + r'\s*(?:==|!=)\s*"([A-Za-z_]+)"', text)
        for group in re.findall(read + r'\s*(?:not\s+)?in\s*\(([^)]*)\)', text):
            names += re.findall(r'"([A-Za-z_]+)"', group)
        for name in names:
            found.setdefault(name, set()).add(where)
    return found


def test_the_scan_finds_the_known_producers():
    """The scan is not vacuous: it sees the kinds the meter and the runner are known to send."""
    found = _kinds_in_source()
    assert {"baseline", "step_start", "step_end", "done", "go", "release", "hello"} <= set(found)
    assert "core/steps.py" in found["step_end"]
    assert "measure/runner.py" in found["go"]
    assert "ray/orchestrate.py" in found["store_process"]  # read by a consumer (kind == ...)
    assert "investigate/node/driver.py" in found["finished"]


def test_every_kind_in_the_source_is_declared():
    undeclared = {name: sorted(where) for name, where in _kinds_in_source().items() if name not in events.KINDS}
    assert not undeclared, f"event kinds sent or read but not declared in core/events.py: {undeclared}"


def test_kinds_match_their_classes_and_the_union():
    union = set(typing.get_args(events.Event))
    assert set(events.KINDS.values()) == union
    for name, cls in events.KINDS.items():
        assert "type" in cls.__required_keys__, name
        (literal,) = typing.get_args(typing.get_type_hints(cls)["type"])
        assert literal == name, f"{cls.__name__}'s type is {literal!r}, KINDS says {name!r}"
        assert cls.__doc__ and len(cls.__doc__) > 40, f"{cls.__name__} needs a docstring: who sends it, when, why"


def test_undeclared_keys_sees_a_missing_and_an_extra_key():
    missing, extra = events.undeclared_keys({"type": "baseline", "side": "sender", "t_s": 0.0, "surprise": 1})
    assert missing == {"baseline_bytes"} and extra == {"surprise"}


def _check(received: list[dict]) -> dict[str, int]:
    seen: dict[str, int] = {}
    problems = []
    for ev in received:
        assert ev.get("type") in events.KINDS, f"undeclared kind {ev.get('type')!r}: {ev}"
        missing, extra = events.undeclared_keys(ev)
        if missing or extra:
            problems.append(f"{ev['type']}: missing {sorted(missing)}, undeclared {sorted(extra)}")
        if ev["type"] == "done" and ev.get("handoff"):
            missing, extra = _keys(events.Handoff, ev["handoff"])
            if missing or extra:
                problems.append(f"done.handoff: missing {sorted(missing)}, undeclared {sorted(extra)}")
        seen[ev["type"]] = seen.get(ev["type"], 0) + 1
    assert not problems, "\n".join(problems)
    return seen


def _keys(cls: type, d: dict) -> tuple[set[str], set[str]]:
    required, declared = cls.__required_keys__, cls.__required_keys__ | cls.__optional_keys__
    return set(required) - set(d), set(d) - set(declared)


def test_a_real_run_sends_only_declared_keys():
    received: list[dict] = []
    r = ps.run("numpy", "pickle", "tiny", 1.0, on_event=received.append, tracer="sampler,tracemalloc")
    assert r.outcome == "ok", r.error
    seen = _check(received)
    for kind in ("ready", "waiting", "baseline", "step_start", "step_end", "done", "tracer"):
        assert seen.get(kind), f"a two-sided run sent no {kind!r} event: {seen}"
    assert seen["done"] == 2
    assert any(ev.get("tracer_points") for ev in received if ev["type"] == "step_end")


def test_a_probe_run_sends_only_declared_keys():
    received: list[dict] = []
    r = ps.run("numpy", "pickle", "tiny", 1.0, on_event=received.append, probe={"sender": None})
    assert r.outcome == "ok", r.error
    assert _check(received).get("probe") == 1


@pytest.mark.filterwarnings("ignore")
def test_a_cell_sends_only_declared_keys():
    received: list[dict] = []
    r = run_cell("print('hello')\nraise ValueError('on purpose')", on_event=received.append)
    assert r.outcome == "error"
    seen = _check(received)
    for kind in ("ready", "output", "baseline", "step_start", "step_end", "error", "done"):
        assert seen.get(kind), f"the cell's child sent no {kind!r} event: {seen}"
