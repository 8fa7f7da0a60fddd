"""What a codec is: the pair ``__getstate__`` / ``__setstate__`` plus the cases it declares it cannot carry.

A codec's steps are marked with :func:`picklescope.core.steps.step` so every run reports them. Its
``unsupported`` declarations are checked against each batch before any work starts, so an
unsupported leaf fails with a message naming the leaf and the reason, never with silent corruption.
The same declarations generate the capability matrix (codec x feature) in the docs and notebooks.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from picklescope.batch import Batch
from picklescope.core.steps import step
from picklescope.errors import PicklescopeError, UnsupportedCase

FP8_DTYPES = tuple(
    getattr(torch, n)
    for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")
    if hasattr(torch, n)
)

# Every feature a leaf can have; the capability matrix has one column per entry.
FEATURES: dict[str, str] = {
    "dense": "an ordinary contiguous tensor",
    "non-contiguous": "a strided view (transpose, slice with step)",
    "tiny-strided-view": "a view of at most one element into a larger tensor, flattened stride not 1 (a "
                         "column of a batch of one, or such a nested component); torch calls it contiguous",
    "conj-view": "a contiguous lazy conjugate view (conj bit set: .conj() of a complex tensor)",
    "neg-view": "a contiguous lazy negative view (neg bit set: .imag of a one-element conjugate view)",
    "zero-size": "a tensor with no elements, or a nested tensor with an empty component",
    "bfloat16": "bfloat16 values",
    "fp8": "float8 values (e4m3, e5m2, their fnuz variants, e8m0)",
    "bool": "bool values",
    "complex": "complex values",
    "jagged-nested": "a nested tensor with torch.jagged layout",
    "ambiguous-jagged": "a jagged nested tensor whose ragged dim is not dim 1 (a transposed view) and whose "
                        "components all have one shape",
    "strided-nested": "a nested tensor with the legacy strided layout",
    "sub-tensordict": "a TensorDict inside the batch",
    "batch-none": "a batch whose tensor part is None",
    "empty-tensordict": "a TensorDict with no keys",
    "object-arrays": "non_tensor_batch numpy object arrays",
}


@dataclass(frozen=True)
class Unsupported:
    """A feature the codec cannot carry, and the error the real implementation would hit."""

    feature: str
    reason: str


def _byte_view_features(t: torch.Tensor) -> set[str]:
    """What makes a dense tensor that nothing copies first refuse a view as bytes."""
    feats: set[str] = set()
    if not t.is_contiguous():
        return feats  # copied before any byte view, which also resolves lazy bits
    if t.numel() <= 1 and t.element_size() > 1 and t.reshape(-1).stride(0) != 1:
        feats.add("tiny-strided-view")
    if t.is_conj():
        feats.add("conj-view")
    elif t.is_neg():
        feats.add("neg-view")
    return feats


def _nested_features(t: torch.Tensor) -> set[str]:
    comps = t.unbind()
    feats = {"jagged-nested" if t.layout == torch.jagged else "strided-nested"}
    for c in comps:  # a codec that moves components one by one meets each as a dense tensor
        feats |= _byte_view_features(c)
        if c.numel() == 0:
            feats.add("zero-size")
    if t.layout == torch.jagged and t.dim() > 2:
        ragged = [i for i, s in enumerate(t.shape) if not isinstance(s, int)]
        if ragged != [1] and len({tuple(c.shape) for c in comps}) == 1:
            # rebuilt from its components, nothing says which dim was ragged: torch picks dim 1
            feats.add("ambiguous-jagged")
    return feats


def _tensor_features(t: torch.Tensor) -> set[str]:
    if t.is_nested:
        feats = _nested_features(t)
    else:
        feats = {"dense"}
        if t.numel() == 0:
            feats.add("zero-size")
        if not t.is_contiguous():
            feats.add("non-contiguous")
        feats |= _byte_view_features(t)
    if t.dtype in FP8_DTYPES:
        feats.add("fp8")
    elif t.dtype == torch.bfloat16:
        feats.add("bfloat16")
    elif t.dtype == torch.bool:
        feats.add("bool")
    elif t.dtype.is_complex:
        feats.add("complex")
    return feats


def iter_leaves(td: Any, prefix: str = "") -> Iterator[tuple[str, Any, set[str]]]:
    """(dotted name, value, features) for every entry of a TensorDict, sub-TensorDicts included."""
    from tensordict import TensorDictBase

    for key, value in td.items():
        name = f"{prefix}{key}"
        if isinstance(value, TensorDictBase):
            yield name, value, {"sub-tensordict"}
            yield from iter_leaves(value, prefix=name + ".")
        else:
            yield name, value, _tensor_features(value)


def batch_features(b: Batch) -> dict[str, set[str]]:
    """Features per leaf name; batch-level features under the name ``<batch>``."""
    out: dict[str, set[str]] = {}
    if b.batch is None:
        out["<batch>"] = {"batch-none"}
    else:
        if len(list(b.batch.keys())) == 0:
            out["<batch>"] = {"empty-tensordict"}
        for name, _, feats in iter_leaves(b.batch):
            out[name] = feats
    for key in b.non_tensor_batch:
        out[f"non_tensor_batch.{key}"] = {"object-arrays"}
    return out


class Codec(ABC):
    """Base class: subclasses implement :meth:`encode` and :meth:`decode` and declare gaps."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
    verl_equivalent: ClassVar[str] = ""
    unsupported: ClassVar[tuple[Unsupported, ...]] = ()

    def check(self, b: Batch) -> None:
        """Raise :class:`UnsupportedCase` for the first leaf with a declared-unsupported feature."""
        gaps = {u.feature: u for u in self.unsupported}
        if not gaps:
            return
        for leaf, feats in batch_features(b).items():
            for feat in sorted(feats):
                if feat in gaps:
                    raise UnsupportedCase(self.name, leaf, feat, gaps[feat].reason)

    def supports(self, feature: str) -> bool:
        return feature not in {u.feature for u in self.unsupported}

    def getstate(self, b: Batch) -> Any:
        with step("__getstate__"):
            self.check(b)
            return self.encode(b)

    def setstate(self, b: Batch, state: Any) -> None:
        with step("__setstate__"):
            self.decode(b, state)

    @abstractmethod
    def encode(self, b: Batch) -> Any:
        """The state ``pickle`` stores for ``b`` (what ``__getstate__`` returns)."""

    @abstractmethod
    def decode(self, b: Batch, state: Any) -> None:
        """Rebuild ``b`` in place from ``state`` (what ``__setstate__`` does)."""


@runtime_checkable
class PreparesInChild(Protocol):
    """A codec with set-up work to do in the measured child before the baseline (real verl: importing
    one environment's verl). What :meth:`prepare` returns is recorded in the run (``codec_info``)."""

    def prepare(self) -> dict[str, Any] | None:
        """Load what the codec needs; return what to record, or None."""


@runtime_checkable
class MeasuresItsGaps(Protocol):
    """A codec whose gaps are measured, not declared in ``unsupported`` (real verl); the note says where."""

    capabilities_note: str


class ModeMismatch(PicklescopeError):
    """A blob written by one codec was read by another (verl: the two processes' env vars differ)."""

    def __init__(self, written_by: str, read_by: str, original: str = "") -> None:
        self.written_by = written_by
        self.read_by = read_by
        msg = f"blob written in {written_by} mode, read in {read_by} mode"
        if original:
            msg += f" (the codec itself would have raised: {original})"
        super().__init__(
            msg,
            f"use the same codec on both sides (for verl: set VERL_DATAPROTO_SERIALIZATION_METHOD="
            f"{written_by.split('-')[0]} on the receiver)",
        )


def describe_state(state: Any) -> str:
    """Which codec family produced a ``__getstate__`` value, from its shape alone."""
    if isinstance(state, tuple) and state and state[0] == "numpy":
        return "numpy"
    if isinstance(state, tuple) and len(state) == 3 and isinstance(state[0], (bytes, bytearray, memoryview)):
        return "torch"
    if isinstance(state, tuple) and len(state) == 3 and state[0] is None:
        return "torch"
    return "unknown"
