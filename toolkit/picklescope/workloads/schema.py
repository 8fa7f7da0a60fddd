"""Schema inference: what a batch holds, as the workload format describes it (keys, dtypes, shapes, kinds).

The readers of saved files (:mod:`picklescope.workloads.saved_batch`) and of live objects
(:func:`describe_live`, used by the capture probe and a trusted load) hand their leaves here as the
records of :mod:`picklescope.workloads.inert_records`; :func:`_build` infers the batch dimension, turns
each leaf into a workload entry or refuses it with one line naming the leaf, and :func:`to_yaml` writes
the result in the format :mod:`picklescope.workloads.spec` owns. Values are never copied: the workload
regenerates them from its seed.
"""

from __future__ import annotations

import math
import os
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError, safe_text
from picklescope.workloads.inert import _Text
from picklescope.workloads.inert_records import _NUMPY_TO_TORCH, Refused, _NDArray, _Tensor, _type_name
from picklescope.workloads.spec import _ITEMSIZE, check_name, workload_text

__all__ = ["Described", "describe_live", "to_yaml", "workload_name", "write_workload"]


@dataclass
class Described:
    """What a file holds, as a workload would describe it (no values)."""

    path: str
    format: str  # verl DataProto (numpy mode) | ... | torch.save TensorDict | torch.save dict | npz
    batch_size: int
    tensors: dict[str, dict[str, Any]] = field(default_factory=dict)
    non_tensor: dict[str, dict[str, Any]] = field(default_factory=dict)
    meta_info: dict[str, Any] = field(default_factory=dict)
    file_payload_bytes: int = 0  # the file's own tensor bytes
    notes: list[str] = field(default_factory=list)
    loaded: bool = False  # True only when --trust made a child load the file

    def summary(self, payload: int | None = None) -> str:
        p = self.file_payload_bytes if payload is None else payload
        return (f"{len(self.tensors)} tensor keys, {len(self.non_tensor)} non-tensor keys, "
                f"{fmt_bytes(p)} at batch {self.batch_size}")


def _refuse_leaf(key: str, why: str, hint: str = "") -> Refused:
    return Refused(f"leaf {key!r}: {why}", hint or "the workload format cannot describe it; drop or convert that "
                   "key before saving (see docs/workload_from.md)")


def _tensor_spec(key: str, t: _Tensor, n: int) -> dict[str, Any]:
    """One tensor key as a workload entry: shape with ``N``, dtype, kind."""
    if t.dtype not in _ITEMSIZE:
        raise _refuse_leaf(key, f"dtype {t.dtype} has no entry in the workload format",
                           "known dtypes: " + ", ".join(_ITEMSIZE))
    if t.lengths is not None:
        if len(t.lengths) != n:
            raise _refuse_leaf(key, f"a nested tensor of {len(t.lengths)} components in a batch of {n}")
        lo, hi = min(t.lengths, default=1), max(t.lengths, default=1)
        if lo <= 0:
            raise _refuse_leaf(key, "a nested tensor with an empty component (the format draws lengths >= 1)")
        mean = statistics.fmean(t.lengths) if t.lengths else 1
        # lengths are redrawn uniformly in [min_len, max_len]; keep the file's shortest or longest and put the
        # other end where the expected mean equals the file's, inside the file's own range
        if mean - lo <= hi - mean:
            lo2, hi2 = lo, max(lo, min(hi, round(2 * mean - lo)))
        else:
            lo2, hi2 = max(lo, min(hi, round(2 * mean - hi))), hi
        kind = "jagged-nested" if t.layout == "jagged" else "strided-nested"
        return {"shape": ["N", "J", *t.inner], "dtype": t.dtype, "kind": kind, "min_len": lo2, "max_len": hi2}
    shape = t.shape
    if not shape:
        raise _refuse_leaf(key, "a 0-dim tensor has no batch dimension")
    if shape[0] != n:
        raise _refuse_leaf(key, f"its first dimension is {shape[0]}, not the batch dimension {n}",
                           "give --batch-dim with the batch size, or save leaves that share the batch dimension")
    kind = "dense"
    if t.stride is not None and math.prod(shape) > 0:
        dense = _contiguous(shape)
        if tuple(t.stride) != dense:
            swapped = (*shape[:-2], shape[-1], shape[-2]) if len(shape) >= 2 else shape
            base = _contiguous(swapped)
            transposed = (*base[:-2], base[-1], base[-2]) if len(shape) >= 2 else base
            if len(shape) >= 3 and tuple(t.stride) == transposed:
                kind = "non-contiguous"
            elif not _same_layout(shape, tuple(t.stride)):
                raise _refuse_leaf(key, f"a view with strides {tuple(t.stride)} on shape {tuple(shape)}",
                                   "the format's only view is the last two dimensions transposed (3+ dims); "
                                   "save x.contiguous() or that transpose")
    return {"shape": ["N", *shape[1:]], "dtype": t.dtype, **({"kind": kind} if kind != "dense" else {})}


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= max(d, 1)
    return tuple(reversed(out))


def _same_layout(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    """Strides that differ from contiguous only on dimensions of size 1 describe the same bytes."""
    return all(s == c or d == 1 for d, s, c in zip(shape, stride, _contiguous(shape)))


def _non_tensor_spec(key: str, arr: Any, n: int) -> dict[str, Any]:
    if not isinstance(arr, _NDArray):
        raise _refuse_leaf(key, f"non-tensor value of type {_type_name(arr)}, not a numpy object array")
    items = arr.items
    if not arr.shape or arr.shape[0] != n:
        raise _refuse_leaf(key, f"a non-tensor array of shape {arr.shape} in a batch of {n}")
    if len(arr.shape) != 1:
        raise _refuse_leaf(key, f"a non-tensor array of {len(arr.shape)} dimensions (the format has 1)")
    if items is None:
        if arr.dtype == "str":
            return {"kind": "strings", "length": max(1, arr.width)}
        raise _refuse_leaf(key, f"a numeric non-tensor array ({arr.dtype})", "keep numbers in the TensorDict")
    kinds = {_elem_kind(x) for x in items}
    if len(kinds) != 1 or None in kinds:
        seen = ", ".join(sorted({_type_name(x) for x in items}))
        raise _refuse_leaf(key, f"non-tensor elements of type {seen}; the format has strings, dicts or ints")
    kind = kinds.pop()
    out: dict[str, Any] = {"kind": kind}
    if kind == "strings":
        out["length"] = int(statistics.median(len(x) for x in items)) if items else 8
    return out


def _elem_kind(x: Any) -> str | None:
    if isinstance(x, (str, _Text)):
        return "strings"
    if isinstance(x, dict):
        return "dicts"
    if isinstance(x, int) and not isinstance(x, bool):
        return "ints"
    return None


def _meta(meta: Any) -> dict[str, Any]:
    """meta_info keys; plain scalar values kept (settings, not data), anything else named by its type."""
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise Refused(f"meta_info is a {_type_name(meta)}, not a dict", "save a DataProto with a dict meta_info")
    out: dict[str, Any] = {}
    for k, v in meta.items():
        k = safe_text(k, 200)
        if isinstance(v, _Text):
            out[k] = f"<str of {len(v)} characters>"
        elif isinstance(v, (bool, int, float, str)) or v is None:
            out[k] = safe_text(v) if isinstance(v, str) and len(v) <= 200 else \
                v if not isinstance(v, str) else f"<str of {len(v)} characters>"
        elif isinstance(v, (list, tuple)) and len(v) <= 16 and all(isinstance(x, (bool, int, float)) for x in v):
            out[k] = list(v)
        else:
            out[k] = f"<{_type_name(v)}>"
    return out


def _payload(tensors: dict[str, _Tensor]) -> int:
    return sum(t.nbytes for t in tensors.values())


_CLI_HINTS = ("give --batch-dim N (the batch size)", "save a batch with at least one row")


def _build(path: str, fmt: str, n: int | None, tensors: dict[str, _Tensor], non_tensor: dict[str, Any],
           meta: Any, batch_dim: int | None, notes: list[str],
           hints: tuple[str, str] = _CLI_HINTS) -> Described:
    tensors, non_tensor = _safe_keys(tensors, notes), _safe_keys(non_tensor, notes)
    if batch_dim is not None:
        n = batch_dim
    if n is None:
        firsts = {(len(t.lengths) if t.lengths is not None else (t.shape[0] if t.shape else None))
                  for t in tensors.values()}
        firsts |= {a.shape[0] for a in non_tensor.values() if isinstance(a, _NDArray) and a.shape}
        firsts.discard(None)
        if len(firsts) != 1:
            raise Refused(f"{path}: the leaves do not share one first dimension ({sorted(firsts)}) and the file "
                          "does not say its batch size", hints[0])
        n = firsts.pop()
    if not n or n <= 0:
        raise Refused(f"{path}: a batch of size {n} has nothing to describe", hints[1])
    d = Described(path, fmt, int(n), notes=notes)
    for k, t in tensors.items():
        d.tensors[str(k)] = _tensor_spec(str(k), t, n)
    for k, a in non_tensor.items():
        d.non_tensor[str(k)] = _non_tensor_spec(str(k), a, n)
    d.meta_info = _meta(meta)
    d.file_payload_bytes = _payload(tensors)
    return d


_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _safe_keys(d: dict[Any, Any], notes: list[str]) -> dict[str, Any]:
    """Keys as workload names: control characters and lone surrogates escaped (``\\x1b``), with a note."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(k, _Text) or len(str(k)) > 200:
            raise _refuse_leaf(f"<a key of {len(k) if isinstance(k, _Text) else len(str(k)):,} characters>",
                               "a key longer than the 200 characters a workload key may have",
                               "rename the key before saving")
        key = str(k)
        if _UNPRINTABLE.search(key):
            new = safe_text(key)
            notes.append(f"a key holds control characters or lone surrogates: it is written escaped, as {new}")
            key = new
        if key in out:
            raise _refuse_leaf(safe_text(key), "two keys that read the same once escaped", "rename one of them")
        out[key] = v
    return out


def workload_name(stem: str) -> str:
    """A workload name from a file name: unprintable characters become ``_``, at most 200 characters."""
    name = _UNPRINTABLE.sub("_", stem)[:200].strip()
    return name or "my-batch"


class _StrArray(_NDArray):
    """A fixed-width numpy string array of an npz: kind strings, its width as the length (no rows are made)."""

    def __init__(self, shape: tuple[int, ...], width: int) -> None:
        super().__init__("str", shape)
        self.width = width


def describe_live(obj: Any, *, path: str = "<object>", batch_dim: int | None = None,
                  fmt: str | None = None) -> Described:
    """The same description from live objects: a DataProto-like batch, a TensorDict or a dict of tensors.

    Used by the capture probe (the batch is in the trainer's memory already) and by a trusted load.
    ``fmt`` names the object's type when ``obj`` is a stand-in for it (the probe describes a shallow
    copy of the batch's containers taken at call time, off the call itself).
    """
    tensors: dict[str, _Tensor] = {}
    non_tensor: dict[str, Any] = {}
    meta: Any = None
    n: int | None = None
    td = obj
    if hasattr(obj, "non_tensor_batch") and hasattr(obj, "meta_info"):
        td, meta = getattr(obj, "batch", None), obj.meta_info
        non_tensor = {k: _live_array(v) for k, v in (obj.non_tensor_batch or {}).items()}
        fmt = fmt or f"{type(obj).__module__}.{type(obj).__name__}"
    else:
        fmt = fmt or type(obj).__name__
    if td is not None:
        if hasattr(td, "batch_size") and hasattr(td, "items"):
            n = int(td.batch_size[0]) if len(td.batch_size) else None
            items = list(td.items())
        elif isinstance(td, dict):
            items = list(td.items())
        else:
            raise Refused(f"{path}: loaded a {type(td).__name__}, not a DataProto, TensorDict or dict of tensors",
                          "give a DataProto, a TensorDict or a dict of tensors")
        for k, v in items:
            if hasattr(v, "batch_size") and hasattr(v, "items"):
                raise _refuse_leaf(str(k), "a nested sub-TensorDict", "flatten it (td.flatten_keys()) and save again")
            if hasattr(v, "dtype") and hasattr(v, "shape") and hasattr(v, "is_nested"):
                tensors[str(k)] = _live_tensor(str(k), v)
            elif hasattr(v, "dtype") and hasattr(v, "shape"):
                if v.dtype == object:
                    non_tensor[str(k)] = _live_array(v)
                else:
                    tensors[str(k)] = _Tensor(_NUMPY_TO_TORCH.get(v.dtype.name, v.dtype.name), tuple(v.shape),
                                              tuple(s // v.itemsize for s in v.strides))
            else:
                raise _refuse_leaf(str(k), f"a value of type {type(v).__name__}")
    return _build(path, fmt, n, tensors, non_tensor, meta, batch_dim, [], _LIVE_HINTS)


# a trainer cannot pass a command-line flag: the live description advises the Python keyword
_LIVE_HINTS = ("pass batch_dim=N (the batch size) to describe_live",
               "an empty batch (0 rows) has nothing to describe: describe a call whose batch has rows")


def _live_tensor(key: str, v: Any) -> _Tensor:
    dtype = str(v.dtype).removeprefix("torch.")
    if v.is_nested:
        import torch  # deferred: only a live nested tensor needs torch, and the reader runs without it

        parts = list(v.unbind())
        lengths = [int(p.shape[0]) for p in parts]
        inner = tuple(int(d) for d in parts[0].shape[1:]) if parts else ()
        layout = "jagged" if v.layout == torch.jagged else "strided"
        return _Tensor(dtype, (len(parts), -1, *inner), None, layout, lengths, inner)
    return _Tensor(dtype, tuple(int(d) for d in v.shape), tuple(int(s) for s in v.stride()))


def _live_array(v: Any) -> Any:
    if not (hasattr(v, "dtype") and hasattr(v, "shape")):
        return v
    a = _NDArray("object" if v.dtype == object else ("str" if v.dtype.kind in "US" else v.dtype.name),
                 tuple(v.shape))
    if v.dtype == object:
        a.items = list(v.reshape(-1)[:4096])  # kinds and a typical length are judged on the first 4096
    elif v.dtype.kind in "US":
        return _StrArray(tuple(v.shape), v.dtype.itemsize // (4 if v.dtype.kind == "U" else 1))
    return a


# -- the workload file -----------------------------------------------------------------------------------
def to_yaml(d: Described, name: str | None = None, seed: int = 0, validate: bool = True) -> str:
    """The workload file's text, checked by the same parser every workload goes through.

    The capture probe passes ``validate=False``: parsing YAML costs milliseconds, more than the call
    it watches; the text comes from the same writer either way.
    """
    if name is not None:
        check_name(name, "--name", "choose another with --name (1 to 200 printable characters)")
    else:
        name = workload_name(Path(d.path).stem)
    comments = [f"Written by 'picklescope workload from' from {safe_text(Path(d.path).name, 200)} "
                f"({safe_text(d.format, 200)}).",
                "Structure only: every value is regenerated from the seed.",
                f"The file's own tensor payload: {d.file_payload_bytes} bytes ({fmt_bytes(d.file_payload_bytes)}) "
                f"at batch {d.batch_size}.", *d.notes]
    return workload_text(name, d.summary(), d.batch_size, seed, d.tensors, d.non_tensor, d.meta_info, comments,
                         validate=validate)


def write_workload(d: Described, out: str | os.PathLike, name: str | None = None) -> Path:
    """Write the workload file (parents created); returns its path."""
    p = Path(out).expanduser()
    if p.is_dir():
        raise PicklescopeError(f"--out {p} is a directory", "give a file name ending in .yaml")
    if p.suffix not in (".yaml", ".yml"):
        raise PicklescopeError(f"--out {p} does not end in .yaml", "give a file name ending in .yaml, so --workload "
                               "takes it for a path")
    text = to_yaml(d, name)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p
