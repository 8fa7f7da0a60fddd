"""The toolkit's stand-in for verl's ``DataProto``.

It holds the same three things (``batch``: a TensorDict or None, ``non_tensor_batch``: dict of numpy
object arrays, ``meta_info``: dict) and, like verl, lets the active codec decide what ``__getstate__``
returns and what ``__setstate__`` accepts. As in verl, where each process reads
``VERL_DATAPROTO_SERIALIZATION_METHOD`` for itself, the codec is chosen per process
(:func:`set_active_codec` or the ``PICKLESCOPE_CODEC`` variable), so a sender and a receiver can
disagree exactly the way two verl processes can.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

ENV_VAR = "PICKLESCOPE_CODEC"
DEFAULT_CODEC = "torch"
_active: str | None = None
# The codec registry hands its lookup in when it is imported (picklescope.codecs calls use_codec_lookup): the
# codecs build on this class, so the class naming them would close an import cycle.
REGISTRY_MODULE = "picklescope.codecs"
_lookup: Callable[[str], Any] | None = None


def use_codec_lookup(lookup: Callable[[str], Any]) -> None:
    """Set the function that turns a codec name into a codec (``picklescope.codecs.get_codec`` sets itself)."""
    global _lookup
    _lookup = lookup


def _codec() -> Any:
    """The active codec. A process that unpickles a Batch before importing the registry (a plain
    ``pickle.load`` of a saved blob) loads it by name first, so that it registers its lookup."""
    if _lookup is None:
        importlib.import_module(REGISTRY_MODULE)
    assert _lookup is not None, f"{REGISTRY_MODULE} did not hand in its codec lookup"
    return _lookup(active_codec_name())


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
        return _codec().getstate(self)

    def __setstate__(self, state: Any) -> None:
        self.batch = None
        self.non_tensor_batch = {}
        self.meta_info = {}
        _codec().setstate(self, state)

    def __len__(self) -> int:
        if self.batch is not None and self.batch.batch_size:
            return int(self.batch.batch_size[0])
        for v in self.non_tensor_batch.values():
            return len(v)
        return 0
