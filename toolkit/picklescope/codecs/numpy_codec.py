"""verl's numpy mode: each leaf as a uint8 numpy view, so pickle protocol 5 can ship it out of band.

``numpy`` is the fixed behaviour (verl >= 0.9.1): the sender makes views only (+0), and over protocol
5 with out-of-band buffers the arrays leave without a copy; over protocol 4 pickle copies them
in-band. The receiver copies each buffer into a ``bytearray`` (+P) and wraps it with
``torch.frombuffer``. ``numpy-legacy`` is verl <= 0.9.0: it first runs ``contiguous().consolidate()``
and throws the result away, paying a full copy (+P) that a reference cycle then keeps alive.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from picklescope.batch import Batch
from picklescope.codecs.base import Codec, ModeMismatch, Unsupported, describe_state
from picklescope.codecs.torch_codec import TorchCodec
from picklescope.core.steps import step

_DTYPE_PREFIX = "torch."


def dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name.removeprefix(_DTYPE_PREFIX), None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a numpy-mode blob")
    return dtype


def _dense_to_numpy(t: torch.Tensor) -> tuple[str, tuple[int, ...], np.ndarray]:
    flat = t.contiguous().reshape(-1)  # a view unless the leaf was non-contiguous
    return (str(t.dtype), tuple(t.shape), flat.view(torch.uint8).numpy())


def _dense_from_numpy(spec: tuple[str, tuple[int, ...], np.ndarray]) -> torch.Tensor:
    dtype_name, shape, array = spec
    owned = bytearray(memoryview(array).cast("B"))  # the receiver's one copy of the payload
    return torch.frombuffer(owned, dtype=torch.uint8).view(dtype_from_name(dtype_name)).reshape(shape)


def _leaf_to_numpy(t: torch.Tensor) -> tuple:
    if t.is_nested:
        layout = "jagged" if t.layout == torch.jagged else "strided"
        return ("nested", layout, [_dense_to_numpy(c) for c in t.unbind()])
    return ("dense", *_dense_to_numpy(t))


def _leaf_from_numpy(spec: tuple) -> torch.Tensor:
    if spec[0] == "nested":
        _, layout, comps = spec
        parts = [_dense_from_numpy(c) for c in comps]
        return torch.nested.nested_tensor(parts, layout=torch.jagged if layout == "jagged" else torch.strided)
    return _dense_from_numpy(spec[1:])


# Gaps of the numpy-mode sender and of its rebuild of nested tensors, shared by every codec that
# uses this sender (the receiver's own gaps are declared by each codec).
SENDER_GAPS = (
    Unsupported("sub-tensordict", "leaves are converted one level deep; a TensorDict leaf has no tensor "
                                  "data of its own (AttributeError: is_nested)"),
    Unsupported("conj-view", "each leaf is viewed as uint8, which torch refuses for a conjugate view (RuntimeError: "
                             "torch.Tensor.view is not supported for conjugate view tensors when converting to a "
                             "different dtype)"),
    Unsupported("neg-view", "each leaf is viewed as uint8, which torch refuses for a negative view (RuntimeError: "
                            "torch.Tensor.view is not supported for tensors with negative bit set when converting "
                            "to a different dtype)"),
    Unsupported("tiny-strided-view", "each leaf is flattened and viewed as uint8; flattening at most one element "
                                     "keeps its stride, and torch refuses the byte view (RuntimeError: "
                                     "self.stride(-1) must be 1 to view Float as Byte)"),
    Unsupported("ambiguous-jagged", "the receiver rebuilds a nested tensor from its components, which do not say "
                                    "which dim was ragged: torch puts it at dim 1, so the shape changes silently"),
)


class NumpyCodec(Codec):
    name = "numpy"
    description = "verl >= 0.9.1 numpy mode: uint8 numpy views, no consolidate; receiver copies into bytearray"
    verl_equivalent = "VERL_DATAPROTO_SERIALIZATION_METHOD=numpy, verl >= 0.9.1"
    unsupported = (
        Unsupported("zero-size", "torch.frombuffer cannot wrap an empty buffer, nor an empty component of a "
                                 "nested tensor (ValueError on the receiver)"),
        *SENDER_GAPS,
    )

    def encode(self, b: Batch) -> Any:
        leaves: dict[str, tuple] = {}
        batch_size: list[int] | None = None
        device: str | None = None
        if b.batch is not None:
            self.before_views(b)
            with step("to_numpy"):
                for key, value in b.batch.items():
                    leaves[key] = _leaf_to_numpy(value)
            batch_size = list(b.batch.batch_size)
            device = None if b.batch.device is None else str(b.batch.device)
        return ("numpy", leaves if b.batch is not None else None, batch_size, device,
                b.non_tensor_batch, b.meta_info)

    def before_views(self, b: Batch) -> None:
        """Hook for the legacy codec's discarded copy; the fixed codec does nothing here."""

    receive_step = "frombuffer"

    def leaf_from_numpy(self, spec: tuple) -> torch.Tensor:
        """Rebuild one received leaf (the receiver's copy happens here; a subclass may skip it)."""
        return _leaf_from_numpy(spec)

    def decode(self, b: Batch, state: Any) -> None:
        kind = describe_state(state)
        if kind != "numpy":
            raise ModeMismatch(kind, self.name)
        _, leaves, batch_size, device, non_tensor, meta = state
        if leaves is not None:
            from tensordict import TensorDict

            with step(self.receive_step):
                tensors = {key: self.leaf_from_numpy(spec) for key, spec in leaves.items()}
            b.batch = TensorDict(tensors, batch_size=batch_size, device=device)
        b.non_tensor_batch = non_tensor
        b.meta_info = meta


class NumpyLegacyCodec(NumpyCodec):
    name = "numpy-legacy"
    description = ("verl <= 0.9.0 numpy mode: contiguous().consolidate() computed and discarded, "
                   "then the same numpy views")
    verl_equivalent = "VERL_DATAPROTO_SERIALIZATION_METHOD=numpy, verl <= 0.9.0 (the OOM bug)"
    # consolidate() fails first, so its gaps come with its reasons; then the numpy mode's own gaps
    unsupported = TorchCodec.unsupported + tuple(
        u for u in NumpyCodec.unsupported if u.feature not in {t.feature for t in TorchCodec.unsupported})

    def before_views(self, b: Batch) -> None:
        if len(b.batch.keys()) == 0:
            return  # verl skips consolidate for a TensorDict without keys
        with step("consolidate"):
            b.batch.contiguous().consolidate()  # the bug: a full copy nobody uses
