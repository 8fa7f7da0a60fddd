"""Codecs in one process: exact round trips, declared gaps that are real, clear mode mismatches."""

from __future__ import annotations

import pickle

import pytest
import torch

from picklescope import Batch, UnsupportedCase, get_codec, load_workload
from picklescope.batch import set_active_codec
from picklescope.codecs import CODECS, ModeMismatch, batch_features
from picklescope.codecs.verify import compare, manifest

BUILTIN = ["torch", "numpy-legacy", "numpy"]


def roundtrip(b: Batch, codec: str, protocol: int, receiver: str | None = None):
    set_active_codec(codec)
    try:
        if protocol == 5:
            bufs: list = []
            data = pickle.dumps(b, protocol=5, buffer_callback=bufs.append)
            set_active_codec(receiver or codec)
            return pickle.loads(data, buffers=bufs)
        data = pickle.dumps(b, protocol=protocol)
        set_active_codec(receiver or codec)
        return pickle.loads(data)
    finally:
        set_active_codec(None)


@pytest.mark.parametrize("codec", BUILTIN)
@pytest.mark.parametrize("protocol", [4, 5])
def test_tiny_roundtrip_exact(codec, protocol):
    b = load_workload("tiny").build()
    assert compare(manifest(b), roundtrip(b, codec, protocol)) == []


@pytest.mark.parametrize("codec", BUILTIN)
def test_mixed_is_exact_without_the_declared_gaps(codec):
    c = get_codec(codec)
    b = load_workload("mixed").build()
    feats = batch_features(b)
    bad = [leaf for leaf, f in feats.items() if not all(c.supports(x) for x in f)]
    assert bad, "mixed should hit at least one gap of every built-in codec"
    with pytest.raises(UnsupportedCase) as e:
        roundtrip(b, codec, 5)
    assert e.value.leaf in bad and e.value.reason in str(e.value)
    for leaf in bad:
        del b.batch[leaf]
    assert compare(manifest(b), roundtrip(b, codec, 5)) == []


@pytest.mark.parametrize("codec", BUILTIN)
def test_none_and_empty_batches(codec):
    from tensordict import TensorDict

    for b in (Batch(None, {}, {"a": 1}), Batch(TensorDict({}, batch_size=[3]), {}, {})):
        assert compare(manifest(b), roundtrip(b, codec, 5)) == []


def test_declared_gaps_are_real_failures_of_the_underlying_operation():
    """Each declaration names an error the real operation raises, so none is invented."""
    from tensordict import TensorDict

    with pytest.raises(KeyError):
        TensorDict({"f": torch.zeros(2, 3, dtype=torch.float8_e4m3fn)}, batch_size=[2]).consolidate()
    nt = torch.nested.nested_tensor([torch.zeros(3), torch.zeros(5)], layout=torch.strided)
    with pytest.raises(NotImplementedError):
        TensorDict({"n": nt}, batch_size=[2]).contiguous().consolidate()
    with pytest.raises(ValueError):
        torch.frombuffer(bytearray(), dtype=torch.uint8)
    for name in BUILTIN:
        for gap in get_codec(name).unsupported:
            assert gap.reason


def test_numpy_legacy_inherits_consolidate_gaps():
    legacy, fixed, torch_c = (get_codec(n) for n in ("numpy-legacy", "numpy", "torch"))
    assert not legacy.supports("fp8") and fixed.supports("fp8") and not torch_c.supports("fp8")


@pytest.mark.parametrize(("writer", "reader"), [("numpy", "torch"), ("torch", "numpy")])
def test_mode_mismatch_is_explained(writer, reader):
    b = load_workload("tiny").build()
    with pytest.raises(ModeMismatch) as e:
        roundtrip(b, writer, 5, receiver=reader)
    msg = str(e.value)
    assert f"written in {writer} mode, read in {reader} mode" in msg
    assert "VERL_DATAPROTO_SERIALIZATION_METHOD" in msg


def test_verify_catches_a_flipped_bit():
    b = load_workload("tiny").build()
    expected = manifest(b)
    b.batch["obs"][0, 0, 0] += 1
    assert any("obs" in p and "values differ" in p for p in compare(expected, b))


def test_registry_lists_builtins_in_order():
    assert list(CODECS)[:3] == BUILTIN
