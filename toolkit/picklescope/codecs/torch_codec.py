"""verl's default codec: one consolidated buffer, ``torch.save`` into memory, bytes in-band.

Costs on the sender, each about one payload (P): ``consolidate`` builds a single buffer holding every
leaf (+P, and tensordict leaves it in a reference cycle, so it outlives the call until
``gc.collect()``), ``torch.save`` writes a zip archive into a ``BytesIO`` (+P), ``getvalue`` copies
it out (+P while both live). The bytes then travel in-band in the pickle stream.
"""

from __future__ import annotations

import io
from typing import Any

import torch

from picklescope.batch import Batch
from picklescope.codecs.base import Codec, ModeMismatch, Unsupported, describe_state
from picklescope.core.safeload import load_tensordict_archive
from picklescope.core.steps import step


class TorchCodec(Codec):
    name = "torch"
    description = "verl default: contiguous + consolidate, torch.save into BytesIO, getvalue, bytes in-band"
    verl_equivalent = "VERL_DATAPROTO_SERIALIZATION_METHOD=torch (all versions)"
    unsupported = (
        Unsupported("fp8", "tensordict consolidate() has no entry for float8 dtypes (KeyError)"),
        Unsupported("strided-nested", "consolidate() rejects strided nested tensors (NotImplementedError)"),
        Unsupported("conj-view", "consolidate() views each leaf as bytes, which torch refuses for a conjugate "
                                 "view (RuntimeError: torch.Tensor.view is not supported for conjugate view "
                                 "tensors when converting to a different dtype)"),
    )

    def encode(self, b: Batch) -> Any:
        data = None
        if b.batch is not None and len(b.batch.keys()) == 0:
            data = self.save(b.batch)  # verl skips consolidate for a TensorDict without keys
        elif b.batch is not None:
            with step("contiguous"):
                td = b.batch.contiguous()
            with step("consolidate"):
                td = td.consolidate()
            data = self.save(td)
            del td
        return (data, b.non_tensor_batch, b.meta_info)

    def save(self, td: Any) -> bytes:
        buffer = io.BytesIO()
        with step("torch.save"):
            torch.save(td, buffer)
        with step("getvalue"):
            return buffer.getvalue()

    def decode(self, b: Batch, state: Any) -> None:
        kind = describe_state(state)
        if kind != "torch":
            raise ModeMismatch(kind, self.name)
        data, non_tensor, meta = state
        if data is not None:
            with step("torch.load"):
                # weights_only=True, allowing tensordict's rebuild functions for this call only
                # (verl itself passes weights_only=False; the bytes and the memory are the same)
                b.batch = load_tensordict_archive(data)
        b.non_tensor_batch = non_tensor
        b.meta_info = meta
