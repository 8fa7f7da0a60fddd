"""Allocating a workload's batch: deterministic values per leaf, seeded by workload and leaf name.

Kept apart from the spec parser so that parsing (and payload prediction) never imports torch.
"""

from __future__ import annotations

import zlib
from typing import TYPE_CHECKING

import numpy as np
import torch

from picklescope.batch import Batch

if TYPE_CHECKING:  # annotations only: the spec module imports this one to build a batch
    from picklescope.workloads.spec import TensorSpec, Workload


def _generator(w: Workload, leaf: str) -> torch.Generator:
    return torch.Generator().manual_seed(w.seed * 1_000_003 + zlib.crc32(leaf.encode()))


def _values(shape: list[int], spec: TensorSpec, g: torch.Generator) -> torch.Tensor:
    dtype = getattr(torch, spec.dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.uint8).bool()
    if not (dtype.is_floating_point or dtype.is_complex):
        return torch.randint(0, spec.high, shape, generator=g, dtype=dtype)
    if dtype.itemsize == 1:  # fp8: draw in fp32, keep the range small, then narrow
        return torch.randn(shape, generator=g).clamp_(-8, 8).to(dtype)
    if dtype == torch.float32 or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(-1)
    chunk = 1 << 22  # draw in fp32 chunks so a bf16 leaf never needs a full fp32 twin
    for i in range(0, flat.numel(), chunk):
        part = flat[i:i + chunk]
        part.copy_(torch.randn(part.numel(), generator=g))
    return out


def _leaf(w: Workload, spec: TensorSpec, n: int) -> torch.Tensor:
    g = _generator(w, spec.name)
    inner = [int(d) for d in spec.shape[1:] if d not in ("N", "J")]
    if spec.kind in ("jagged-nested", "strided-nested"):
        lengths = w.jagged_lengths(spec, n)
        values = _values([sum(lengths), *inner], spec, g)
        if spec.kind == "jagged-nested":
            offsets = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int64)
            return torch.nested.nested_tensor_from_jagged(values, offsets)
        return torch.nested.nested_tensor(list(values.split(lengths)), layout=torch.strided)
    shape = [n, *inner]
    if spec.kind == "non-contiguous":
        swapped = shape[:-2] + [shape[-1], shape[-2]]
        return _values(swapped, spec, g).transpose(-1, -2)
    return _values(shape, spec, g)


def _non_tensor(w: Workload, name: str, kind: str, length: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(w.seed * 7919 + zlib.crc32(name.encode()))
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz "))
    if kind == "strings":
        items = ["".join(rng.choice(letters, size=length)) for _ in range(n)]
    elif kind == "dicts":
        items = [{"score": float(rng.normal()), "index": i, "tags": ["a", "b"][: i % 3]} for i in range(n)]
    else:
        items = [int(x) for x in rng.integers(0, 1 << 30, size=n)]
    out = np.empty(n, dtype=object)
    out[:] = items
    return out


def build_batch(w: Workload, scale: float = 1.0) -> Batch:
    """The workload's batch at ``scale``: same seed and scale give the same bytes."""
    from tensordict import TensorDict

    n = w.rows(scale)
    tensors = {spec.name: _leaf(w, spec, n) for spec in w.tensors}
    td = TensorDict(tensors, batch_size=[n])
    non_tensor = {s.name: _non_tensor(w, s.name, s.kind, s.length, n) for s in w.non_tensor}
    return Batch(batch=td, non_tensor_batch=non_tensor, meta_info=dict(w.meta_info))
