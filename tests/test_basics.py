"""Units, registries and workloads: the parts that decide before anything is measured."""

from __future__ import annotations

import pytest

from picklescope import PicklescopeError, UnknownNameError, get_codec, get_transport, load_workload
from picklescope.core.units import GiB, MiB, parse_size
from picklescope.workloads.spec import parse_workload


@pytest.mark.parametrize(("text", "payload", "expected"), [
    ("700MiB", 0, 700 * MiB), ("1.5GiB", 0, int(1.5 * GiB)), ("1.5x", 100 * MiB, 150 * MiB),
    ("123456", 0, 123456), ("2g", 0, 2 * 10**9),
])
def test_parse_size(text, payload, expected):
    assert parse_size(text).resolve(payload) == expected


@pytest.mark.parametrize("bad", ["", "lots", "-1MiB", "0", "0x", "x", "1.5 parsecs"])
def test_parse_size_rejects(bad):
    with pytest.raises(PicklescopeError) as e:
        parse_size(bad, "budget")
    assert "budget" in str(e.value)


def test_unknown_names_list_the_known_ones():
    with pytest.raises(UnknownNameError) as e:
        get_codec("pickle-rick")
    assert "torch" in str(e.value) and "numpy-legacy" in str(e.value) and "numpy" in str(e.value)
    with pytest.raises(UnknownNameError) as e:
        get_transport("carrier-pigeon")
    assert "pickle5-oob" in str(e.value)
    with pytest.raises(UnknownNameError) as e:
        load_workload("nope")
    assert "flowgrpo" in str(e.value) and "tiny" in str(e.value)


@pytest.mark.parametrize("name", ["flowgrpo", "seed-6400x20480", "mixed", "tiny"])
def test_presets_predict_their_payload(name):
    w = load_workload(name)
    scale = 0.02 if w.payload_bytes() > 100 * MiB else 1.0
    b = w.build(scale)
    actual = 0
    for v in b.batch.values():
        actual += v.values().nbytes if v.is_nested else v.numel() * v.element_size()
    assert actual == w.payload_bytes(scale)


def test_preset_sizes_match_the_story():
    assert 440 * MiB < load_workload("flowgrpo").payload_bytes() < 480 * MiB
    assert 100 * MiB < load_workload("flowgrpo").payload_bytes(0.25) < 125 * MiB
    seed = load_workload("seed-6400x20480").build(0.01)
    assert tuple(seed.batch["hidden"].shape) == (64, 20480)
    assert load_workload("tiny").payload_bytes() < 8 * MiB


def test_mixed_has_every_leaf_kind():
    from picklescope.codecs import batch_features

    feats = set().union(*batch_features(load_workload("mixed").build()).values())
    for f in ("bfloat16", "fp8", "bool", "non-contiguous", "jagged-nested", "zero-size", "object-arrays"):
        assert f in feats


def test_workloads_are_deterministic_and_scaled():
    from picklescope.codecs.verify import manifest

    w = load_workload("tiny")
    assert manifest(w.build(0.5)) == manifest(w.build(0.5))
    assert manifest(w.build(0.5)) != manifest(w.build(1.0))
    assert len(w.build(0.5)) == 4


@pytest.mark.parametrize("scale", [0, -1, float("nan")])
def test_bad_scale(scale):
    with pytest.raises(PicklescopeError, match="scale"):
        load_workload("tiny").payload_bytes(scale)


def test_user_workload_file(tmp_path):
    p = tmp_path / "mine.yaml"
    p.write_text("name: mine\nbatch_size: 4\ntensors:\n  x: {shape: [N, 3], dtype: float32}\n")
    w = load_workload(str(p))
    assert w.name == "mine" and w.payload_bytes() == 4 * 3 * 4


@pytest.mark.parametrize(("text", "field", "line"), [
    ("name: a\nbatch_size: 4\ntensors:\n  x: {shape: [N, 3], dtype: floaty}\n", "tensors.x.dtype", 4),
    ("name: a\nbatch_size: -4\n", "batch_size", 2),
    ("name: a\nbatch_size: 4\ntensors:\n  x: {shape: [3, N], dtype: float32}\n", "tensors.x.shape", 4),
    ("name: a\nbatch_size: 4\ntensors:\n  x:\n    shape: [N]\n    dtype: float32\n    colour: red\n",
     "tensors.x.colour", 7),
    ("name: a\nbatch_size: 4\n  bad: [\n", "valid YAML", 3),
])
def test_malformed_workload_names_field_and_line(text, field, line):
    with pytest.raises(PicklescopeError) as e:
        parse_workload(text, "w.yaml")
    assert field in str(e.value) and f"line {line}" in str(e.value)


def test_each_transport_either_hands_off_or_owns_its_receiver():
    """The runner tells them apart with isinstance, and neither kind inherits methods it must refuse."""
    from picklescope.transports import TRANSPORTS, OwnsItsReceiver, PickleTransport

    for name in TRANSPORTS:
        t = get_transport(name)
        assert isinstance(t, OwnsItsReceiver) != isinstance(t, PickleTransport), name
        if isinstance(t, OwnsItsReceiver):
            assert not any(hasattr(t, m) for m in ("send", "prepare", "receive")), name
    assert {"pickle", "pickle5-oob"} <= {n for n in TRANSPORTS if isinstance(get_transport(n), PickleTransport)}
