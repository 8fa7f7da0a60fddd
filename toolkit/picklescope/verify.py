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

from .batch import Batch


def _digest_dense(t: torch.Tensor, h: Any) -> None:
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel():
        h.update(memoryview(flat.view(torch.uint8).numpy()))


def describe_leaf(t: Any) -> dict[str, Any]:
    """Metadata and digest for one leaf (a tensor, nested tensor or sub-TensorDict marker)."""
    from tensordict import TensorDictBase

    if isinstance(t, TensorDictBase):
        return {"kind": "tensordict", "batch_size": list(t.batch_size), "keys": sorted(t.keys())}
    h = hashlib.blake2b(digest_size=16)
    if t.is_nested:
        comps = t.unbind()
        for c in comps:
            _digest_dense(c, h)
        shape: Any = [list(c.shape) for c in comps]
        layout = "jagged" if t.layout == torch.jagged else "strided-nested"
    else:
        _digest_dense(t, h)
        shape = list(t.shape)
        layout = "dense"
    return {"kind": "tensor", "dtype": str(t.dtype), "shape": shape, "layout": layout,
            "device": str(t.device), "digest": h.hexdigest()}


def _obj_digest(obj: Any) -> str:
    return hashlib.blake2b(pickle.dumps(obj, protocol=5), digest_size=16).hexdigest()


def manifest(b: Batch) -> dict[str, Any]:
    """What the receiver must reproduce exactly."""
    from .codecs.base import iter_leaves

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
        for field in ("kind", "dtype", "shape", "layout", "device", "batch_size", "keys", "digest"):
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
