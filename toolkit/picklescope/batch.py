"""The toolkit's stand-in for verl's ``DataProto``.

It holds the same three things (``batch``: a TensorDict or None, ``non_tensor_batch``: dict of numpy
object arrays, ``meta_info``: dict) and, like verl, lets the active codec decide what ``__getstate__``
returns and what ``__setstate__`` accepts. As in verl, where each process reads
``VERL_DATAPROTO_SERIALIZATION_METHOD`` for itself, the codec is chosen per process
(:func:`set_active_codec` or the ``PICKLESCOPE_CODEC`` variable), so a sender and a receiver can
disagree exactly the way two verl processes can.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ENV_VAR = "PICKLESCOPE_CODEC"
DEFAULT_CODEC = "torch"
_active: str | None = None


def set_active_codec(name: str | None) -> None:
    """Choose the codec this process uses for Batch pickling (None: fall back to the env var)."""
    global _active
    _active = name


def active_codec_name() -> str:
    return _active or os.environ.get(ENV_VAR) or DEFAULT_CODEC


@dataclass
class Batch:
    """One training batch: tensors, non-tensor object arrays, and metadata."""

    batch: Any = None  # tensordict.TensorDict | None
    non_tensor_batch: dict[str, np.ndarray] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)

    def __getstate__(self) -> Any:
        from picklescope.codecs import get_codec

        return get_codec(active_codec_name()).getstate(self)

    def __setstate__(self, state: Any) -> None:
        from picklescope.codecs import get_codec

        self.batch = None
        self.non_tensor_batch = {}
        self.meta_info = {}
        get_codec(active_codec_name()).setstate(self, state)

    def __len__(self) -> int:
        if self.batch is not None and self.batch.batch_size:
            return int(self.batch.batch_size[0])
        for v in self.non_tensor_batch.values():
            return len(v)
        return 0
