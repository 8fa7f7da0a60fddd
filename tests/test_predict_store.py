"""``picklescope predict``: the object store in a prediction, a bounded high-water mark, and its capacity
(Ray's default for the node, or ``--store-capacity``: the cluster's ``object_store_memory``). The fitting
math on synthetic plain data (no processes), with the synthetic replays of tests/test_predict.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from picklescope.errors import PicklescopeError
from picklescope.investigate.predict import model as model_mod
from picklescope.investigate.predict import prediction

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from test_predict import MiB, _flowgrpo_batch, fit_set  # noqa: E402


def test_the_store_is_a_high_water_mark_within_its_capacity():
    """The store holds the controller's held steps' objects (a payload per step, freed at each release
    every third step). Its pages are never given back, so after a release its level stays at the highest it
    has been, and the next steps reuse those pages; and it never holds more than its capacity (Ray spills
    the rest to disk). Without a capacity given, ``resolve_store_capacity`` takes the one Ray gives the node
    (0.3 of its memory, at most 200 GB) and ``play_node`` bounds the store by it."""
    reps = fit_set(release_every=3)
    for rep in reps:
        for s in rep.per_step:
            s.end["store"] = s.peak["store"] = s.end["controller"] - rep.chunk_bytes  # the held steps only
            s.end["node"] = s.peak["node"] = s.end["controller"] + s.end["workers"] + s.end["store"]
    m = model_mod.fit(reps)
    pay = 200 * MiB
    store = [lvl / pay for lvl, _ in m.play(pay, 64, 4, 6, 2)["store"]]
    assert store == pytest.approx([1, 2, 2, 2, 3, 3], abs=1e-3)
    capped = m.play(pay, 64, 4, 6, 2, store_capacity=2.5 * pay)
    assert [lvl / pay for lvl, _ in capped["store"]] == pytest.approx([1, 2, 2, 2, 2.5, 2.5], abs=1e-3)
    assert all(peak <= 2.5 * pay for _, peak in capped["store"])
    ctl = [lvl for lvl, _ in capped["controller"]]
    assert [lvl for lvl, _ in capped["node"]][4] == pytest.approx(ctl[4] + capped["workers"][4][0] + 2.5 * pay)
    assert prediction.ray_store_capacity(1507 * 10**9) == 200 * 10**9
    assert prediction.ray_store_capacity(100 * 10**9) == 30 * 10**9 and prediction.ray_store_capacity(None) is None
    wl, per_row, pay = _flowgrpo_batch(512)
    reps = fit_set()  # the collector off: the store keeps a payload per step, nothing is released
    for rep in reps:
        for s in rep.per_step:
            s.end["store"] = s.peak["store"] = s.end["controller"]
    gc_off = model_mod.fit(reps)
    cap, _ = prediction.resolve_store_capacity(None, 40 * pay)
    out = prediction.play_node(gc_off, wl, 512, pay, 4, 120, {"store": pay}, 40 * pay, 0.95, store_capacity=cap)
    assert out["peaks"]["store"] <= 12 * pay  # 0.3 x 40 payloads, the store's baseline within it


def test_a_store_capacity_given_caps_the_store_and_the_json_names_where_the_capacity_came_from(monkeypatch):
    """A cluster started with ``object_store_memory`` has that store, not Ray's default: ``store_capacity``
    (``--store-capacity``) caps the store's high-water mark below where the fitted model takes it, the node's
    total loses what the store could not hold (Ray spills it to disk), and the JSON and the summary say which
    capacity was used and where it came from."""
    reps = fit_set()  # the collector off: the store keeps a payload per training step, nothing is released
    for rep in reps:
        for s in rep.per_step:
            s.end["store"] = s.peak["store"] = s.end["controller"]
            s.end["node"] = s.peak["node"] = s.end["controller"] + s.end["workers"] + s.end["store"]
    m = model_mod.fit(reps)
    monkeypatch.setattr(prediction, "models", lambda codecs, *a, **kw: {c: m for c in codecs})
    kw: dict[str, Any] = {"payload": "1GB", "workers": 4, "steps": 6, "gc": "off", "node_memory": "1507GB"}
    default = prediction.predict(("numpy",), "flowgrpo", **kw)[0]
    given = prediction.predict(("numpy",), "flowgrpo", store_capacity="2GB", **kw)[0]
    pay = default.payload_bytes
    assert default.processes["store"] > 5 * pay  # the fitted high-water mark, far under Ray's default 200 GB
    assert default.store_capacity_bytes == 200 * 10**9 and default.store_full_step is None
    assert given.processes["store"] == 2 * 10**9 < default.processes["store"]
    assert given.store_full_step == 2  # a payload (about 1 GB) per step: the store is full at the second step
    assert default.node_peak_bytes - given.node_peak_bytes == pytest.approx(default.processes["store"] - 2 * 10**9,
                                                                            rel=1e-6)
    doc, ray_doc = given.to_json_dict(), default.to_json_dict()
    assert doc["store_capacity_bytes"] == 2 * 10**9 and doc["store_capacity_source"] == "--store-capacity"
    assert doc["processes"]["store"]["peak_bytes"] == 2 * 10**9 and doc["store_full_step"] == 2
    assert ray_doc["store_capacity_source"] == "ray default: 0.3 x node memory, at most 200 GB"
    assert "(--store-capacity), full from training step 2" in given.summary()
    small = prediction.predict(("numpy",), "flowgrpo", **{**kw, "node_memory": "10GB"})[0]
    assert small.store_capacity_bytes == 3 * 10**9 and small.to_json_dict()["store_capacity_source"] == \
        "ray default: 0.3 x node memory"
    assert "unbounded" in prediction.predict(("numpy",), "flowgrpo", **{**kw, "node_memory": None})[0].summary()
    with pytest.raises(PicklescopeError, match="more than the node's memory"):
        prediction.predict(("numpy",), "flowgrpo", store_capacity="2TB", **kw)


def test_the_node_with_a_full_store_is_given_beside_the_fitted_one():
    """The fits end each step idle, so Ray's frees land before the next step allocates; a training loop whose
    steps follow each other faster puts every step's chunks on fresh store pages (a fixed codec's 40-step
    replays run back to back kept rising: benchmarks/README.md), so beside the fitted node the prediction
    gives the node were the store at
    its capacity from the first step (each step's node plus what the store could still take), the first
    step that node crosses the threshold and the largest payload that survives so; the summary and the
    verdict's line say them, and where the store is full already it adds nothing."""
    wl, per_row, pay = _flowgrpo_batch(512)
    m = model_mod.fit(fit_set(grow=0.0))  # a fixed codec's fit: nothing held, the store never rises
    mem = 40 * pay
    cap, _ = prediction.resolve_store_capacity(None, mem)  # Ray's default: 0.3 x the node, 12 payloads
    out = prediction.play_node(m, wl, 512, pay, 4, 8, {}, mem, 0.95, store_capacity=cap)
    assert out["killed"] is None and out["peaks"]["store"] == 0
    assert out["node_peak_store_full"] == pytest.approx(out["node_peak"] + cap, rel=1e-9)
    assert out["store_full_killed_step"] is None  # about 13.5 payloads, under 0.95 x 40
    small = prediction.play_node(m, wl, 512, pay, 4, 8, {}, 14 * pay, 0.95, store_capacity=13 * pay)
    assert small["killed"] is None and small["store_full_killed_step"] == 1
    p = prediction.CodecPrediction("numpy", "off", pay, 512, 4, 8, 14 * pay, 0.95, {}, small["node_peak"],
                                   small["peaks"], small["steps"], None, None, [], [], [],
                                   store_capacity_bytes=13 * pay, store_capacity_source="--store-capacity",
                                   node_peak_store_full_bytes=small["node_peak_store_full"],
                                   store_full_killed_step=small["store_full_killed_step"])
    text, doc = p.store_text(), p.to_json_dict()
    assert "full, the node would peak at" in text and "over the threshold in training step 1" in text, text
    assert p.verdict_text().endswith("but with its object store full it would cross that in training step 1")
    assert doc["node_peak_store_full_bytes"] == small["node_peak_store_full"] and doc["store_full_killed_step"] == 1
    plain = prediction.largest_surviving(m, wl, 4, 8, {}, 14 * pay, 0.95, store_capacity=13 * pay)
    with_full = prediction.largest_surviving(m, wl, 4, 8, {}, 14 * pay, 0.95, store_capacity=13 * pay, store_full=True)
    assert with_full is not None and plain is not None and with_full < plain  # the store's 13 payloads leave less room
    full = prediction.play_node(m, wl, 512, pay, 4, 8, {"store": 10 * pay}, 40 * pay, 0.95, store_capacity=10 * pay)
    assert full["node_peak_store_full"] == full["node_peak"]  # at its capacity already: nothing to add
