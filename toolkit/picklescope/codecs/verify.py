"""Leaf-by-leaf round-trip checks: the sender describes what it had, the receiver compares.

The sender computes a manifest (dtype, shape, layout, device, a digest of the raw bytes of every
leaf, and digests of the non-tensor data and meta_info) during setup, outside the measured steps;
the receiver checks what it got against it after its measured steps. Only bit-exact equality counts.
"""

from __future__ import annotations

import hashlib
import pickle
from typing import Any

import torch

from picklescope.batch import Batch
from picklescope.codecs.base import iter_leaves


def _digest_dense(t: torch.Tensor, h: Any) -> None:
    # resolve lazy conj/neg bits: the digest is of the values the tensor shows, and torch refuses a
    # dtype view of a tensor with either bit set
    flat = t.detach().resolve_conj().resolve_neg().reshape(-1)
    if flat.numel() and flat.stride(0) != 1:  # a one-element view keeps its stride; a byte view needs 1
        flat = flat.clone(memory_format=torch.contiguous_format)
    if flat.numel():
        h.update(memoryview(flat.view(torch.uint8).numpy()))


def describe_leaf(t: Any) -> dict[str, Any]:
    """Metadata and digest for one leaf (a tensor, nested tensor or sub-TensorDict marker)."""
    from tensordict import TensorDictBase

    if isinstance(t, TensorDictBase):
        return {"kind": "tensordict", "batch_size": list(t.batch_size), "keys": sorted(t.keys())}
    h = hashlib.blake2b(digest_size=16)
    ragged_dim: list[int] | None = None
    if t.is_nested:
        comps = t.unbind()
        for c in comps:
            _digest_dense(c, h)
        shape: Any = [list(c.shape) for c in comps]
        layout = "jagged" if t.layout == torch.jagged else "strided-nested"
        if t.layout == torch.jagged:  # the components alone do not say which dim is ragged
            ragged_dim = [i for i, s in enumerate(t.shape) if not isinstance(s, int)]
    else:
        _digest_dense(t, h)
        shape = list(t.shape)
        layout = "dense"
    return {"kind": "tensor", "dtype": str(t.dtype), "shape": shape, "layout": layout,
            "device": str(t.device), "digest": h.hexdigest(), "ragged_dim": ragged_dim}


def _obj_digest(obj: Any) -> str:
    # protocol 4: under 5 a numpy array records whether it is writable, and one received out of band
    # is read-only (the hand-off mapping, Ray's object store) though its contents are identical
    return hashlib.blake2b(pickle.dumps(obj, protocol=4), digest_size=16).hexdigest()


def manifest(b: Batch) -> dict[str, Any]:
    """What the receiver must reproduce exactly."""
    out: dict[str, Any] = {"batch_none": b.batch is None}
    if b.batch is not None:
        out["batch_size"] = list(b.batch.batch_size)
        out["device"] = None if b.batch.device is None else str(b.batch.device)
        out["leaves"] = {name: describe_leaf(v) for name, v, _ in iter_leaves(b.batch)}
    out["non_tensor"] = {k: _obj_digest(v) for k, v in b.non_tensor_batch.items()}
    out["non_tensor_types"] = {k: str(getattr(v, "dtype", type(v).__name__)) for k, v in b.non_tensor_batch.items()}
    out["meta_info"] = _obj_digest(b.meta_info)
    return out


def compare(expected: dict[str, Any], got: Any) -> list[str]:
    """Every difference between the sender's manifest and the received batch, as readable lines."""
    if not isinstance(got, Batch):
        return [f"received a {type(got).__name__}, expected a Batch"]
    actual = manifest(got)
    problems: list[str] = []
    if expected["batch_none"] != actual["batch_none"]:
        return [f"batch is None on one side only (sent None={expected['batch_none']})"]
    for key in ("batch_size", "device"):
        if expected.get(key) != actual.get(key):
            problems.append(f"{key}: sent {expected.get(key)!r}, received {actual.get(key)!r}")
    exp_leaves, got_leaves = expected.get("leaves", {}), actual.get("leaves", {})
    for name in sorted(set(exp_leaves) | set(got_leaves)):
        e, g = exp_leaves.get(name), got_leaves.get(name)
        if e is None or g is None:
            problems.append(f"leaf {name!r}: {'missing on the receiver' if g is None else 'not sent'}")
            continue
        for field in ("kind", "dtype", "shape", "layout", "ragged_dim", "device", "batch_size", "keys", "digest"):
            if e.get(field) != g.get(field):
                what = "values differ" if field == "digest" else f"sent {e.get(field)!r}, received {g.get(field)!r}"
                problems.append(f"leaf {name!r} {field}: {what}")
    for key in sorted(set(expected["non_tensor"]) | set(actual["non_tensor"])):
        if expected["non_tensor"].get(key) != actual["non_tensor"].get(key):
            problems.append(f"non_tensor_batch[{key!r}] differs")
        elif expected["non_tensor_types"].get(key) != actual["non_tensor_types"].get(key):
            problems.append(f"non_tensor_batch[{key!r}] type differs")
    if expected["meta_info"] != actual["meta_info"]:
        problems.append("meta_info differs")
    return problems
