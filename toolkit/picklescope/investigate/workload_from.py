"""A workload file from a user's own saved batch, read without running anything in the file.

``picklescope workload from FILE`` turns a batch someone already has into a workload in the format
of ``data/workloads/*.yaml``: every tensor key with its dtype, its shape (batch dimension ``N``) and
its layout, the non-tensor keys (kind and typical length) and the meta_info keys. Values are never
copied: the workload regenerates them from its seed, so the file is only a description.

FILE may be:

- a ``DataProto`` pickle written by verl's ``save_to_disk``, in either serialization mode (numpy
  mode: a ``(dtype, shape, uint8 array)`` tuple per leaf; torch mode: a ``torch.save`` zip archive of
  the consolidated TensorDict carried as bytes inside the pickle);
- a ``torch.save`` archive of a TensorDict (consolidated or not) or of a dict of tensors;
- a ``.npz`` (numeric arrays are tensor keys, object arrays non-tensor keys).

Why it can read all of that safely: unpickling runs whatever the stream names, so the stream is
interpreted by the standard library's own pickle machine with every global it names replaced by an
inert record (:class:`picklescope.workloads.inert._Unpickler`): a ``_rebuild_tensor_v2`` call becomes a
record of its storage, offset, size and stride; numpy's ``_reconstruct`` a record of dtype and shape;
any name it does not know an opaque record that remembers only its name. Large byte strings (tensor
data) are skipped by seeking, never read, and a ``torch.save`` archive is read from its zip directory
and its ``data.pkl`` (storage sizes come from the zip records). The only data bytes ever read are the
offsets of jagged nested tensors and the sizes of strided ones: their lengths are the shape.

The file is read no further than its size at open, every size it declares is checked against its
real size and a stated limit before anything is allocated, and what a stream makes the reader hold is
counted as it is read (:data:`LIMITS`, from :mod:`picklescope.workloads.inert`), so describing any
file up to 4 GiB stays within :data:`picklescope.core.safefile.READER_MEMORY_BOUND` of the reader's memory.

What the reader cannot describe is refused with one line naming the leaf and the reason. ``--trust``
(``trust=True``) means "this file's own format needs code to load", nothing more: a plain pickle of
tensors, TensorDicts or numpy arrays is then loaded in a child through
:class:`picklescope.codecs.trust.AllowListUnpickler`, and only when every global the stream names is on
its allow-list. A torch archive, an ``.npz``, a verl DataProto, a polyglot and anything naming other
code are never loaded, with or without it (see docs/safe_loading.md).
"""

from __future__ import annotations

import io
import json
import math
import os
import statistics
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from picklescope.codecs.trust import LOADABLE_GLOBALS, load_allowed
from picklescope.core.safefile import BLOB_LIMIT_ENV, BoundedFile, blob_limit, check_file, open_bounded
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError, safe_text
from picklescope.verl.blobinfo import ZIP_MAGIC
from picklescope.workloads.inert import (
    MAX_DICT_KEYS,
    MAX_ITEMS,
    MAX_KEPT,
    MAX_LIST_ITEMS,
    MAX_MEMO,
    MAX_OPS,
    MAX_STACK,
    MAX_ZIP_ENTRIES,
    _Damaged,
    _read,
    _read_stream,
    _Text,
    _Unreadable,
)
from picklescope.workloads.inert_records import (
    _NUMPY_TO_TORCH,
    NeedsCode,
    Refused,
    _Bytes,
    _NDArray,
    _Opaque,
    _Tensor,
    _type_name,
)
from picklescope.workloads.inert_zip import _Archive, _check_member, _open_zip, _Window
from picklescope.workloads.spec import _ITEMSIZE, check_name, parse_workload

# the reader's bounds, importable from here as before the reader had modules of its own
LIMITS = {"MAX_DICT_KEYS": MAX_DICT_KEYS, "MAX_LIST_ITEMS": MAX_LIST_ITEMS, "MAX_ITEMS": MAX_ITEMS,
          "MAX_STACK": MAX_STACK, "MAX_MEMO": MAX_MEMO, "MAX_KEPT": MAX_KEPT, "MAX_OPS": MAX_OPS,
          "MAX_ZIP_ENTRIES": MAX_ZIP_ENTRIES}

__all__ = ["Described", "describe_file", "to_yaml", "write_workload", "describe_live"]

# structure is read by seeking past the data, so a saved batch may be far larger than a blob `inspect`
# loads; the bound only stops a mistaken path (a disk image, a sparse file) from being walked
SAVED_BATCH_LIMIT = 256 << 30
_DESCRIBE_BLOB_LIMIT = 64 << 20  # a file that does not parse is worded by blobinfo from at most this many bytes


# -- the description --------------------------------------------------------------------------------------
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


_UNPRINTABLE = __import__("re").compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


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


def _verl_numpy_batch(state: Any) -> tuple[int | None, dict[str, _Tensor]]:
    """verl's numpy mode: ``(batch_size, device, {key: (dtype, shape, uint8 array) | (layout, [..])})``."""
    batch_size, _device, items = state
    out: dict[str, _Tensor] = {}
    for k, v in (items or {}).items():
        if isinstance(v, tuple) and len(v) == 3:
            dtype, shape, _data = v
            out[k] = _Tensor(str(dtype), tuple(int(d) for d in shape))
        elif isinstance(v, tuple) and len(v) == 2:
            layout, parts = v
            comps = [tuple(int(d) for d in p[1]) for p in parts]
            if not comps:
                raise _refuse_leaf(k, "a nested tensor without components")
            inner = comps[0][1:]
            if any(c[1:] != inner for c in comps):
                raise _refuse_leaf(k, "nested components that differ beyond their first dimension")
            out[k] = _Tensor(str(parts[0][0]), (len(comps), -1, *inner), None,
                             "jagged" if layout == "jagged" else "strided", [c[0] for c in comps], tuple(inner))
        else:
            raise _refuse_leaf(k, f"an entry of verl's numpy mode of an unknown form ({_type_name(v)})")
    n = int(batch_size[0]) if batch_size else None
    return n, out


def _td_leaves(td: dict[str, Any]) -> dict[str, _Tensor]:
    out = {}
    for k, v in td["leaves"].items():
        if isinstance(v, _Tensor):
            out[k] = v
        elif isinstance(v, dict) and v.get("__tensordict__"):
            raise _refuse_leaf(k, "a nested sub-TensorDict", "flatten it (td.flatten_keys()) and save again")
        elif isinstance(v, _Opaque):
            raise NeedsCode(f"leaf {safe_text(repr(k), 80)} is built by {v.name}, which picklescope does not read "
                            "without running it", "pass --trust to load it in a child process, only if you know who "
                            "wrote it (docs/safe_loading.md)", [v.name])
        else:
            raise _refuse_leaf(k, f"a TensorDict entry of type {_type_name(v)}")
    if td.get("non_tensor_in_td"):
        k = td["non_tensor_in_td"][0]
        raise _refuse_leaf(k, "non-tensor data stored inside the TensorDict",
                           "keep non-tensor values in non_tensor_batch (a DataProto) or in a dict beside it")
    return out


def _from_dataproto(path: str, state: Any, f: BinaryIO, container: str, batch_dim: int | None) -> Described:
    if not (isinstance(state, tuple) and len(state) == 3):
        raise Refused(f"{path}: the {container}'s state is not the (batch, non_tensor_batch, meta_info) verl writes",
                      "save it with DataProto.save_to_disk")
    batch, non_tensor, meta = state
    notes: list[str] = []
    if batch is None:
        fmt, n, tensors = f"{container} (numpy mode, batch=None)", None, {}
    elif isinstance(batch, tuple) and len(batch) == 3:
        fmt = f"{container} (numpy mode)"
        n, tensors = _verl_numpy_batch(batch)
        notes.append("numpy mode writes each leaf flattened and contiguous: a view in the original batch "
                     "reads back as dense")
    elif isinstance(batch, (_Bytes, bytes)):
        fmt = f"{container} (torch mode)"
        b = batch if isinstance(batch, _Bytes) else _Bytes(-1, len(batch), batch[:4], batch)
        if b.head != ZIP_MAGIC:
            raise Refused(f"{path}: the {container}'s batch bytes are not a torch.save archive",
                          "save it with DataProto.save_to_disk")
        if b.data is None and b.offset < 0:
            raise Refused(f"{path}: the {container}'s torch archive sits in a part of the stream past the "
                          f"{fmt_bytes(MAX_KEPT)} of strings the reader keeps", "save it with DataProto.save_to_disk")
        src: BinaryIO = _Window(f, b.offset, b.length) if b.data is None else io.BytesIO(b.data)  # type: ignore
        root, u = _Archive(src, f"{path} (its torch archive)", b.length).root()
        _no_unknown(path, u.unknown, root)
        if root is None:
            n, tensors = None, {}
        elif isinstance(root, dict) and root.get("__tensordict__"):
            tensors = _td_leaves(root)
            n = root["batch_size"][0] if root.get("batch_size") else None
        else:
            raise Refused(f"{path}: the torch archive inside holds a {_type_name(root)}, not a TensorDict",
                          "save it with DataProto.save_to_disk")
        notes.append("torch mode consolidates the batch first: a view in the original batch reads back as dense")
    else:
        raise Refused(f"{path}: the {container}'s batch is a {_type_name(batch)}, neither verl mode",
                      "save it with DataProto.save_to_disk")
    if not isinstance(non_tensor, dict):
        raise Refused(f"{path}: non_tensor_batch is a {_type_name(non_tensor)}, not a dict",
                      "save it with DataProto.save_to_disk")
    if n is None and non_tensor:
        first = next(iter(non_tensor.values()))
        n = first.shape[0] if isinstance(first, _NDArray) and first.shape else None
    return _build(path, fmt, n, tensors, non_tensor, meta, batch_dim, notes)


def _no_unknown(path: str, unknown: list[str], root: Any) -> None:
    """Names the reader does not know are fine where they carry no batch data (e.g. a class named in a
    TensorDict's metadata); a torch archive whose batch itself is built by unknown code is refused, and
    ``--trust`` does not change that: a torch archive is only ever read, never loaded (docs/safe_loading.md)."""
    if isinstance(root, _Opaque):
        raise Refused(f"{path}: its torch archive's batch is built by {root.name}, which picklescope does not run: "
                      "a torch.save archive is only ever read, never loaded, --trust or not",
                      "save tensors, TensorDicts or numpy arrays only (torch.save(td, path))")


def _from_pickle(path: str, f: BoundedFile, batch_dim: int | None) -> Described:
    try:
        root, u = _read(f)
    except _Unreadable as exc:
        if exc.ran_out and f.size > _DESCRIBE_BLOB_LIMIT:
            raise PicklescopeError(f"{path} is truncated: the pickle stream ends at byte {f.size:,} (its size when "
                                   "it was opened) before its STOP opcode (an interrupted copy, or a file still "
                                   "being written?)", "wait until the writer has finished, or copy it again") from None
        from picklescope.verl.blobinfo import describe_blob, require_pickle

        f.seek(0)
        # the same one-line words as 'picklescope inspect', from the bytes seen at open only
        require_pickle(describe_blob(path, data=f.read(min(f.size, _DESCRIBE_BLOB_LIMIT))))
        raise PicklescopeError(f"{path} is not a pickle stream picklescope can read ({exc})",
                               "give a DataProto.save_to_disk pickle, a torch.save file or a .npz") from None
    end = f.tell()
    if end < f.size:
        _refuse_trailing(path, f, end)
    if isinstance(root, _Opaque) and root._g in (("verl.protocol", "DataProto"), ("picklescope.batch", "Batch")):
        container = "verl DataProto" if root._g[0] == "verl.protocol" else "picklescope Batch"
        return _from_dataproto(path, root.state, f, container, batch_dim)
    try:
        if isinstance(root, _Opaque):
            raise NeedsCode(f"{path}: a pickle whose top object is built by {root.name}, which picklescope does not "
                            "read without running it", "pass --trust to load it in a child process, only if you know "
                            "who wrote it (docs/safe_loading.md)", u.named)
        if isinstance(root, dict) and root.get("__tensordict__"):
            n = root["batch_size"][0] if root.get("batch_size") else None
            return _build(path, "pickle of a TensorDict", n, _td_leaves(root), {}, None, batch_dim, [])
        if isinstance(root, dict):
            return _from_mapping(path, "pickle of a dict", root, batch_dim)
    except NeedsCode as exc:
        exc.names = list(u.named)  # the trusted load is judged on every global the stream names
        raise
    raise Refused(f"{path}: a pickle of a {_type_name(root)}, not a DataProto, TensorDict or dict of tensors",
                  "give a DataProto.save_to_disk pickle, a torch.save file or a .npz")


def _refuse_trailing(path: str, f: BoundedFile, end: int) -> None:
    """Bytes after the pickle's STOP: a file that is a pickle and something else is refused, --trust or not."""
    f.seek(end)
    rest = f.read(min(f.size - end, 1 << 16))
    zipped = ZIP_MAGIC in rest
    if not zipped:
        f.seek(end)
        try:
            zipped = zipfile.is_zipfile(_Window(f, end, f.size - end))  # type: ignore[arg-type]
        except Exception:  # noqa: BLE001 - only to word the refusal
            zipped = False
    what = "a zip archive (the file is both a pickle and a zip: a polyglot, which a zip reader such as torch.load " \
        "would take for a .pt archive)" if zipped else "other data"
    raise PicklescopeError(f"{path}: the pickle stream stops at byte {end:,} and {fmt_bytes(f.size - end)} of {what} "
                           "follow; such a file is refused with or without --trust",
                           "save the batch on its own (DataProto.save_to_disk, torch.save or numpy.savez) and give "
                           "that file")


def _from_mapping(path: str, fmt: str, root: dict[Any, Any], batch_dim: int | None) -> Described:
    tensors: dict[str, _Tensor] = {}
    non_tensor: dict[str, Any] = {}
    for k, v in root.items():
        if isinstance(v, _Tensor):
            tensors[str(k)] = v
        elif isinstance(v, _NDArray) and v.dtype in ("object", "str"):
            non_tensor[str(k)] = v
        elif isinstance(v, _NDArray) and v.dtype in _NUMPY_TO_TORCH:
            tensors[str(k)] = _Tensor(_NUMPY_TO_TORCH[v.dtype], v.shape)
        elif isinstance(v, _Opaque):
            raise NeedsCode(f"{path}: key {safe_text(repr(k), 80)} is built by {v.name}, which picklescope does not "
                            "read without running it", "pass --trust to load it in a child process, only if you know "
                            "who wrote it (docs/safe_loading.md)", [v.name])
        else:
            raise _refuse_leaf(str(k), f"a value of type {_type_name(v)}")
    return _build(path, fmt, None, tensors, non_tensor, None, batch_dim, [])


def _from_torch_zip(path: str, f: BoundedFile, batch_dim: int | None) -> Described:
    root, u = _Archive(f, path, f.size).root()
    _no_unknown(path, u.unknown, root)
    try:
        if isinstance(root, dict) and root.get("__tensordict__"):
            tensors = _td_leaves(root)
            n = root["batch_size"][0] if root.get("batch_size") else None
            return _build(path, "torch.save TensorDict", n, tensors, {}, None, batch_dim, [])
        if isinstance(root, dict):
            return _from_mapping(path, "torch.save dict", root, batch_dim)
    except NeedsCode as exc:  # a torch archive is never unpickled by anything but this reader
        raise Refused(f"{exc.problem.split(', which ')[0]}, which picklescope does not run: a torch.save archive is "
                      "only ever read, never loaded, --trust or not (docs/safe_loading.md)",
                      "save tensors, TensorDicts or numpy arrays only (keep other objects out of the file)") from None
    if isinstance(root, _Tensor):
        raise Refused(f"{path}: a torch.save of one tensor, not of a batch",
                      "save a dict of tensors or a TensorDict, e.g. torch.save({'x': x}, path)")
    raise Refused(f"{path}: a torch.save of a {_type_name(root)}, not a TensorDict or a dict of tensors",
                  "save a dict of tensors or a TensorDict")


def _from_npz(path: str, f: BoundedFile, batch_dim: int | None) -> Described:
    from numpy.lib import format as npformat

    z = _open_zip(f, path, f.size)
    tensors: dict[str, _Tensor] = {}
    non_tensor: dict[str, Any] = {}
    for info in z.infolist():
        if not info.filename.endswith(".npy"):
            continue
        key = info.filename[:-4]
        _check_member(info, f.size, path, None)
        with z.open(info) as raw:
            m = BoundedFile(raw, info.file_size, f"{path}: {safe_text(info.filename, 120)}")
            try:
                version = npformat.read_magic(m)
                reader = npformat.read_array_header_1_0 if version == (1, 0) else npformat.read_array_header_2_0
                shape, fortran, dtype = reader(m)  # a literal parsed safely by numpy, no code run
            except ValueError as exc:
                raise _refuse_leaf(key, f"its .npy header cannot be read ({exc})") from None
            if not dtype.hasobject:  # a header is a claim: the member must hold what it declares
                declared, held = math.prod(int(d) for d in shape) * dtype.itemsize, info.file_size - m.tell()
                if declared > held:
                    raise _refuse_leaf(key, f"its .npy header declares shape {tuple(shape)} of {dtype} "
                                       f"({fmt_bytes(declared)}) but the member holds {fmt_bytes(max(held, 0))}",
                                       "the file is truncated or damaged: save it again")
            if dtype.hasobject:
                arr, unknown = _read_stream(m)  # np.save pickles object arrays: read that stream inertly
                if isinstance(arr, _Opaque):
                    raise _refuse_leaf(key, f"an object array built by {arr.name}, which picklescope does not run "
                                       "(an .npz is never loaded with allow_pickle, --trust or not)",
                                       "keep strings, dicts or ints in object arrays")
                non_tensor[key] = arr
            elif dtype.kind in "US":
                non_tensor[key] = _StrArray(tuple(shape), dtype.itemsize // (4 if dtype.kind == "U" else 1))
            elif dtype.name in _NUMPY_TO_TORCH:
                t = _Tensor(_NUMPY_TO_TORCH[dtype.name], tuple(shape))
                if fortran and len(shape) >= 2:
                    t.stride = tuple(reversed(_contiguous(tuple(reversed(shape)))))
                tensors[key] = t
            else:
                raise _refuse_leaf(key, f"numpy dtype {dtype} has no entry in the workload format")
    if not tensors and not non_tensor:
        raise Refused(f"{path}: a zip archive with no .npy members", "give an .npz written by numpy.savez")
    return _build(path, "npz", None, tensors, non_tensor, None, batch_dim, [])


class _StrArray(_NDArray):
    """A fixed-width numpy string array of an npz: kind strings, its width as the length (no rows are made)."""

    def __init__(self, shape: tuple[int, ...], width: int) -> None:
        super().__init__("str", shape)
        self.width = width


def describe_file(path: str | os.PathLike, *, batch_dim: int | None = None, trust: bool = False) -> Described:
    """Describe FILE's batch without running anything in it (see the module docstring).

    ``trust=True`` loads a plain pickle in a child process only when reading cannot describe it because
    its batch is built by code, and only when every global the stream names is on the allow-list of
    :data:`picklescope.codecs.trust.LOADABLE_GLOBALS` (see docs/safe_loading.md); every other file is read
    the same way with or without it, and anything naming other code is refused either way.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        raise PicklescopeError(f"{p} is a directory, not a saved batch", "give the path of a file inside it")
    size = check_file(p, "saved batch", 1 << 62)  # a FIFO, a device or a link to one is named, never opened
    limit = max(blob_limit(), SAVED_BATCH_LIMIT)
    if size > limit:
        raise PicklescopeError(f"{p} is {fmt_bytes(size)}, over the {fmt_bytes(limit)} limit for a saved batch",
                               f"set {BLOB_LIMIT_ENV} (e.g. 512GiB) if this really is one")
    if batch_dim is not None and (isinstance(batch_dim, bool) or not isinstance(batch_dim, int) or batch_dim <= 0):
        raise PicklescopeError(f"--batch-dim {batch_dim!r} must be a positive integer (the batch size)",
                               "use e.g. --batch-dim 128")
    shown = safe_text(str(p), 300)
    try:
        with open_bounded(p, shown) as f:  # reads stop at the size the file has now, whoever appends to it
            return _describe_open(shown, f, batch_dim)
    except NeedsCode as exc:
        outside = [n for n in exc.names if n not in LOADABLE_GLOBALS]
        if outside:  # code no load may run: the same refusal with or without --trust
            shown_names = ", ".join(outside[:6]) + (f" and {len(outside) - 6} more" if len(outside) > 6 else "")
            raise Refused(f"{shown}: {exc.problem.split(': ', 1)[-1].split(', which ')[0]}; the file names "
                          f"{shown_names}, outside the globals any load may resolve (tensors, TensorDicts, numpy "
                          "arrays): refused with or without --trust, and nothing in it is run",
                          "save the batch with DataProto.save_to_disk, torch.save or numpy.savez "
                          "(docs/safe_loading.md)") from None
        if not trust:
            raise
        return _trusted_load(p, batch_dim)
    except (_Damaged, zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise PicklescopeError(f"{shown} is damaged: {safe_text(exc, 200)}",
                               "copy it again; a zip member fails its own checksum or ends too soon") from None
    except _Unreadable as exc:
        raise PicklescopeError(f"{shown}: a stream inside it cannot be read ({safe_text(exc, 200)})",
                               "copy it again, or save the batch again") from None


def _describe_open(path: str, f: BoundedFile, batch_dim: int | None) -> Described:
    head = f.read(4)
    f.seek(0)
    if not head:
        raise PicklescopeError(f"{path} is empty (0 bytes)", "copy or download it again")
    if head == ZIP_MAGIC:
        names = _open_zip(f, path, f.size).namelist()
        f.seek(0)
        if any(n.endswith(".npy") for n in names) and not any(n.endswith("data.pkl") for n in names):
            return _from_npz(path, f, batch_dim)
        return _from_torch_zip(path, f, batch_dim)
    return _from_pickle(path, f, batch_dim)


# -- --trust: load in a child through the allow-list, describe the live objects ---------------------------
def _trusted_load(p: Path, batch_dim: int | None) -> Described:
    """Only for a plain pickle whose every global is on the allow-list (checked by the caller)."""
    from picklescope.verl import childcall

    try:
        d = childcall.call("picklescope.investigate.workload_from.load_in_child",
                           path=str(p.resolve()), batch_dim=batch_dim, size=p.stat().st_size,
                           timeout_s=600.0)
    except childcall.ChildError as exc:
        first = str(exc).split("\n", 1)[0].split(" raised ", 1)[-1]
        raise PicklescopeError(f"loading {safe_text(str(p), 300)} with --trust failed in the child process: "
                               f"{safe_text(first, 300)}", "--debug shows the child's traceback") from exc
    out = Described(**{k: v for k, v in d.items() if k != "summary"})
    out.loaded = True
    return out


def load_in_child(path: str, batch_dim: int | None, size: int | None = None) -> dict[str, Any]:
    """Child side of a trusted load (a plain pickle only): unpickle through the allow-list, describe the batch.

    Reads at most ``size`` bytes (the size the parent saw), and only through
    :class:`picklescope.codecs.trust.AllowListUnpickler`, never a bare ``pickle.load``.
    """
    with open_bounded(path) as f:
        if size is not None and size < f.size:
            f.size = size
        f.max_read = f.size  # a trusted load reads tensor data too; still no further than the size seen
        obj = load_allowed(f)
    d = describe_live(obj, path=path, batch_dim=batch_dim)
    return {k: getattr(d, k) for k in ("path", "format", "batch_size", "tensors", "non_tensor", "meta_info",
                                       "file_payload_bytes", "notes")}


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
        import torch

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
_PLAIN = __import__("re").compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_YAML_WORDS = {"yes", "no", "on", "off", "true", "false", "null", "none", "~"}


def _scalar(v: Any) -> str:
    """One value in YAML flow style, written directly (no YAML library on the probe's path)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)
        return text if ("." in text or "n" in text) else text.replace("e", ".0e", 1)  # 1e-05 -> 1.0e-05
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(str(k))}: {_scalar(x)}" for k, x in v.items()) + "}"
    return _key(str(v))


def _key(k: str) -> str:
    if _PLAIN.match(k) and k.lower() not in _YAML_WORDS:
        return k
    return json.dumps(k)  # a JSON string is a YAML double-quoted scalar


def _flow(d: dict[str, Any]) -> str:
    return _scalar(d)


def to_yaml(d: Described, name: str | None = None, seed: int = 0, validate: bool = True) -> str:
    """The workload file's text, checked by the same parser every workload goes through.

    The capture probe passes ``validate=False``: parsing YAML costs milliseconds, more than the call
    it watches; the text comes from the same writer either way.
    """
    if name is not None:
        check_name(name, "--name", "choose another with --name (1 to 200 printable characters)")
    else:
        name = workload_name(Path(d.path).stem)
    lines = [f"# Written by 'picklescope workload from' from {safe_text(Path(d.path).name, 200)} "
             f"({safe_text(d.format, 200)}).",
             "# Structure only: every value is regenerated from the seed.",
             f"# The file's own tensor payload: {d.file_payload_bytes} bytes ({fmt_bytes(d.file_payload_bytes)}) "
             f"at batch {d.batch_size}."]
    lines += [f"# {note}" for note in d.notes]
    lines += [f"name: {_key(name)}", f"description: {_key(d.summary())}", f"batch_size: {d.batch_size}",
              f"seed: {seed}"]
    width = max((len(_key(k)) for k in [*d.tensors, *d.non_tensor]), default=0) + 1
    lines.append("tensors:" + ("" if d.tensors else " {}"))
    lines += [f"  {(_key(k) + ':').ljust(width + 1)} {_flow(v)}" for k, v in d.tensors.items()]
    lines.append("non_tensor:" + ("" if d.non_tensor else " {}"))
    lines += [f"  {(_key(k) + ':').ljust(width + 1)} {_flow(v)}" for k, v in d.non_tensor.items()]
    lines.append("meta_info:" + ("" if d.meta_info else " {}"))
    lines += [f"  {_key(str(k))}: {_scalar(v)}" for k, v in d.meta_info.items()]
    text = "\n".join(lines) + "\n"
    if validate:
        parse_workload(text, "<derived workload>")  # what we write must load
    return text


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
