"""Inert stand-ins for what a saved batch's pickle stream names (used by ``workload from``).

Each global a stream may name and the reader understands maps to a function or class here that only
records what a batch's structure needs (dtype, shape, strides, storage, a numpy array's shape, a
TensorDict's leaves); nothing here imports torch, numpy or tensordict, or runs anything the file names.
Anything else becomes an :class:`_Opaque` record that remembers its name only.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

from picklescope.core.safeload import Opaque as _Opaque
from picklescope.core.safeload import Refused
from picklescope.core.safeload import Skipped as _Bytes
from picklescope.core.safeload import opaque_type as _opaque_type
from picklescope.errors import PicklescopeError
from picklescope.workloads.spec import _ITEMSIZE

# the shared records of core.safeload, under the names this reader has always given them
__all__ = ["NeedsCode", "Refused", "_Bytes", "_Opaque", "_opaque_type"]

_NUMPY_TO_TORCH = {
    "float64": "float64", "float32": "float32", "float16": "float16", "int64": "int64", "int32": "int32",
    "int16": "int16", "int8": "int8", "uint8": "uint8", "bool": "bool", "complex64": "complex64",
    "complex128": "complex128",
}
_STORAGE_DTYPE = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool", "ComplexFloatStorage": "complex64",
    "ComplexDoubleStorage": "complex128", "Float8_e4m3fnStorage": "float8_e4m3fn",
    "Float8_e5m2Storage": "float8_e5m2",
}


class NeedsCode(PicklescopeError):
    """The batch is built by code the reader does not know: only a trusted load can describe it."""

    def __init__(self, problem: str, way_out: str, names: list[str]) -> None:
        super().__init__(problem, way_out)
        self.names = names


@dataclass
class _Storage:
    dtype: str
    key: str
    numel: int
    archive: Any = None  # the _Archive it lives in


@dataclass
class _Tensor:
    """A tensor as the stream describes it: never materialised."""

    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...] | None = None
    layout: str = "dense"  # dense | jagged | strided (nested)
    lengths: list[int] | None = None  # nested: each component's ragged length
    inner: tuple[int, ...] = ()  # nested: the dimensions after the ragged one
    storage: _Storage | None = None
    offset: int = 0

    @property
    def nbytes(self) -> int:
        size = _ITEMSIZE.get(self.dtype, 0)
        if self.lengths is not None:
            return sum(self.lengths) * math.prod(self.inner) * size
        return math.prod(self.shape) * size


class _DType:
    def __init__(self, code: Any = "", *args: Any) -> None:
        self.code = code if isinstance(code, str) else "?"
        self.byteorder = "|"

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) > 1 and isinstance(state[1], str):
            self.byteorder = state[1]

    @property
    def width(self) -> int:
        """Characters of a fixed-width string dtype ('<U12' -> 12)."""
        digits = "".join(ch for ch in self.code if ch.isdigit())
        return int(digits) if self.name == "str" and digits else 0

    @property
    def name(self) -> str:
        c = self.code
        if c.lstrip("<>|=").startswith("O"):
            return "object"
        if c and c[0] in "<>|=":
            c = c[1:]
        table = {"f8": "float64", "f4": "float32", "f2": "float16", "i8": "int64", "i4": "int32", "i2": "int16",
                 "i1": "int8", "u1": "uint8", "b1": "bool", "c8": "complex64", "c16": "complex128"}
        if c in table:
            return table[c]
        if c.startswith(("U", "S")):
            return "str"
        return c


class _NDArray:
    """A numpy array as the stream describes it; object arrays keep their (inert) elements."""

    def __init__(self, dtype: Any = None, shape: tuple[int, ...] = (), nbytes: int = 0) -> None:
        self.dtype = dtype.name if isinstance(dtype, _DType) else str(dtype)
        self.width = dtype.width if isinstance(dtype, _DType) else 0
        self.shape = tuple(shape)
        self.nbytes = nbytes
        self.items: list[Any] | None = None

    def __setstate__(self, state: Any) -> None:
        # numpy's array state: (version, shape, dtype, is_fortran, data)
        if not (isinstance(state, tuple) and len(state) == 5):
            raise Refused("a numpy array in the stream has a state of an unknown form",
                          "save the batch with a numpy of version 1.x or 2.x")
        _v, shape, dtype, _fortran, data = state
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype.name if isinstance(dtype, _DType) else str(dtype)
        self.width = dtype.width if isinstance(dtype, _DType) else 0
        if isinstance(data, list):
            self.items = data
        self.nbytes = data.length if isinstance(data, _Bytes) else len(data) if isinstance(data, bytes) else 0


def _reconstruct(subtype: Any, shape: Any, dtype: Any) -> _NDArray:
    return _NDArray(dtype if isinstance(dtype, _DType) else _DType(dtype), tuple(shape) if shape else ())


def _frombuffer(buf: Any, dtype: Any, shape: Any, order: Any = "C") -> _NDArray:
    length = buf.length if isinstance(buf, _Bytes) else len(buf) if isinstance(buf, (bytes, bytearray)) else 0
    return _NDArray(dtype, tuple(shape), length)


class _StorageType:
    """``torch.FloatStorage`` and friends, named in a stream: the class its storage records name."""

    dtype: str | None = None
    storage_name = ""


def _storage_type(name: str) -> type[_StorageType]:
    return type(name, (_StorageType,), {"dtype": _STORAGE_DTYPE.get(name), "storage_name": name})


def _rebuild_tensor_v2(storage: Any, offset: int, size: Any, stride: Any, *rest: Any) -> Any:
    if isinstance(storage, _Opaque):  # a plain pickle's tensor: its storage is a torch.save blob to load
        return _opaque_type("torch._utils", "_rebuild_tensor_v2")()
    if not isinstance(storage, _Storage):
        raise Refused("a tensor in the archive has no storage record", "save it with torch.save")
    return _Tensor(storage.dtype, tuple(size), tuple(stride), storage=storage, offset=int(offset))


def _rebuild_tensor_v3(storage: Any, offset: int, size: Any, stride: Any, requires_grad: Any, hooks: Any,
                       dtype: Any, *rest: Any) -> Any:
    """Newer dtypes (uint16, ...) are saved on an untyped storage with the dtype beside it."""
    if isinstance(storage, _Opaque):
        return _opaque_type("torch._utils", "_rebuild_tensor_v3")()
    if not isinstance(storage, _Storage):
        raise Refused("a tensor in the archive has no storage record", "save it with torch.save")
    name = dtype.name if isinstance(dtype, _TorchDType) else str(dtype)
    return _Tensor(name, tuple(size), tuple(stride), storage=storage, offset=int(offset))


class _TorchDType:
    """``torch.float32`` and friends, named in a stream (e.g. by ``_rebuild_tensor_v3``)."""

    def __init__(self, name: str) -> None:
        self.name = name


def _rebuild_from_type_v2(func: Any, new_type: Any, args: Any, state: Any) -> Any:
    out = func(*args)
    if isinstance(out, _Opaque):
        out.state = state
    return out


def _rebuild_parameter(data: Any, *rest: Any) -> Any:
    return data


def _read_ints(t: _Tensor) -> list[int]:
    """The values of a small int64 tensor (nested offsets or sizes), read from its storage record."""
    if t.storage is None or t.storage.archive is None or t.dtype != "int64":
        raise Refused("a nested tensor's offsets are not an int64 tensor of the archive", "save it with torch.save")
    count = math.prod(t.shape)
    raw = t.storage.archive.read_range(t.storage.key, t.offset * 8, count * 8)
    values = list(struct.unpack(f"<{count}q", raw))
    if t.stride is not None and len(t.shape) == 2 and t.stride != (t.shape[1], 1):
        raise Refused("a nested tensor's size table is not contiguous", "save it with torch.save")
    return values


def _njt(components: Any, *rest: Any) -> _Tensor:
    """``torch.nested._internal.nested_tensor._rebuild_njt(components)``: a jagged tensor's values and offsets."""
    values, offsets = (components.get("values"), components.get("offsets")) if isinstance(components, dict) \
        else (None, None)
    if not (isinstance(values, _Tensor) and isinstance(offsets, _Tensor)):
        raise Refused("a jagged nested tensor without values and offsets tensors", "save it with torch.save")
    off = _read_ints(offsets)
    lengths = [b - a for a, b in zip(off, off[1:])]
    return _Tensor(values.dtype, (len(lengths), -1, *values.shape[1:]), None, "jagged", lengths,
                   tuple(values.shape[1:]))


def _rebuild_nested(buffer: Any, sizes: Any, strides: Any, offsets: Any) -> _Tensor:
    if not (isinstance(buffer, _Tensor) and isinstance(sizes, _Tensor)):
        raise Refused("a strided nested tensor without its buffer and size table", "save it with torch.save")
    rows, dims = (sizes.shape + (0,))[:2] if len(sizes.shape) == 2 else (sizes.shape[0] if sizes.shape else 0, 0)
    flat = _read_ints(sizes) if rows and dims else []
    comps = [tuple(flat[i * dims:(i + 1) * dims]) for i in range(rows)]
    inner = comps[0][1:] if comps else ()
    if any(c[1:] != inner for c in comps):
        raise Refused("a strided nested tensor whose components differ beyond their first dimension",
                      "the workload format has ragged first dimensions only")
    return _Tensor(buffer.dtype, (rows, -1, *inner), None, "strided", [c[0] for c in comps], tuple(inner))


def _tensordict_consolidated(metadata: Any, storage: Any, *rest: Any) -> dict[str, Any]:
    """``tensordict._reductions._rebuild_tensordict_files_consolidated(metadata, storage)``: leaves from metadata."""
    if not isinstance(storage, _Tensor) or storage.storage is None:
        raise Refused("a consolidated TensorDict without its storage", "save it with torch.save")
    return _from_consolidated(metadata, storage, "")


def _from_consolidated(meta: Any, storage: _Tensor, prefix: str) -> dict[str, Any]:
    if not isinstance(meta, dict):
        raise Refused("a consolidated TensorDict with metadata of an unknown form", "save it with torch.save")
    leaves = meta.get("leaves") or {}
    out: dict[str, Any] = {"__tensordict__": True, "batch_size": list((meta.get("cls_metadata") or {})
                                                                      .get("batch_size") or []), "leaves": {}}
    njt: dict[str, dict[str, Any]] = {}
    for key, rec in leaves.items():
        for tag in ("<NJT_VALUES>", "<NJT_OFFSETS>", "<NJT_LENGTHS>"):
            if key.startswith(tag):
                njt.setdefault(key[len(tag):], {})[tag] = rec
                break
        else:
            dtype, shape, start, stop, *_ = rec
            out["leaves"][prefix + key] = _Tensor(str(dtype).removeprefix("torch."), tuple(shape), None,
                                                  storage=storage.storage, offset=int(start))
    for key, parts in njt.items():
        vals, offs = parts.get("<NJT_VALUES>"), parts.get("<NJT_OFFSETS>")
        if vals is None or offs is None:
            raise Refused(f"leaf {prefix + key!r}: a jagged nested tensor without offsets", "save it unconsolidated")
        count = math.prod(offs[1])
        raw = storage.storage.archive.read_range(storage.storage.key, int(offs[2]), count * 8)
        o = list(struct.unpack(f"<{count}q", raw))
        lengths = [b - a for a, b in zip(o, o[1:])]
        dtype, shape = str(vals[0]).removeprefix("torch."), tuple(vals[1])
        out["leaves"][prefix + key] = _Tensor(dtype, (len(lengths), -1, *shape[1:]), None, "jagged", lengths,
                                              tuple(shape[1:]))
    for key, sub in (meta.items() if isinstance(meta, dict) else []):
        if key not in ("cls", "non_tensors", "leaves", "cls_metadata") and isinstance(sub, dict) and "leaves" in sub:
            raise Refused(f"leaf {prefix + key!r}: a nested sub-TensorDict",
                          "the format has flat TensorDicts only; flatten it (td.flatten_keys()) and save again")
    return out


def _make_td(cls: Any, state: Any, *rest: Any) -> dict[str, Any]:
    """``tensordict._reductions._make_td(cls, state)``: an unconsolidated TensorDict's leaves."""
    if not isinstance(state, dict):
        raise Refused("a TensorDict with a state of an unknown form", "save it with torch.save")
    leaves = state.get("_tensordict") or {}
    meta = state.get("_batch_size")
    for key, v in leaves.items():
        if isinstance(v, dict) and v.get("__tensordict__"):
            raise Refused(f"leaf {key!r}: a nested sub-TensorDict",
                          "the format has flat TensorDicts only; flatten it (td.flatten_keys()) and save again")
    non_tensor = state.get("_non_tensordict") or {}
    return {"__tensordict__": True, "batch_size": list(meta) if isinstance(meta, (list, tuple)) else None,
            "leaves": dict(leaves), "non_tensor_in_td": list(non_tensor)}


def _size(*args: Any) -> tuple[int, ...]:
    return tuple(args[0]) if args else ()


def _ordered_dict(*args: Any) -> dict[Any, Any]:
    return dict(*args)


_KNOWN: dict[tuple[str, str], Any] = {
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.numeric", "_frombuffer"): _frombuffer,
    ("numpy.core.numeric", "_frombuffer"): _frombuffer,
    ("numpy", "ndarray"): _NDArray,
    ("numpy", "dtype"): _DType,
    ("torch", "Size"): _size,
    ("collections", "OrderedDict"): _ordered_dict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor_v2,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_tensor_v3"): _rebuild_tensor_v3,
    ("torch._utils", "_rebuild_nested_tensor"): _rebuild_nested,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch.nested._internal.nested_tensor", "_rebuild_njt"): _njt,
    ("tensordict._reductions", "_rebuild_tensordict_files_consolidated"): _tensordict_consolidated,
    ("tensordict._reductions", "_make_td"): _make_td,
    ("builtins", "set"): set, ("__builtin__", "set"): set,
}


def _type_name(x: Any) -> str:
    if isinstance(x, _Opaque):
        return x.name
    if isinstance(x, _NDArray):
        return f"numpy {x.dtype} array"
    if isinstance(x, _Tensor):
        return "tensor"
    return type(x).__name__


