"""Reading a saved batch without running it: which format the file is, and each format's description.

``picklescope workload from FILE`` (:mod:`picklescope.investigate.workload_from`) reads FILE here:

- a ``DataProto`` pickle written by verl's ``save_to_disk``, in either serialization mode (numpy
  mode: a ``(dtype, shape, uint8 array)`` tuple per leaf; torch mode: a ``torch.save`` zip archive of
  the consolidated TensorDict carried as bytes inside the pickle);
- a ``torch.save`` archive of a TensorDict (consolidated or not) or of a dict of tensors;
- a ``.npz`` (numeric arrays are tensor keys, object arrays non-tensor keys).

Why it can read all of that safely: unpickling runs whatever the stream names, so the stream is
interpreted by the standard library's own pickle machine with every global it names replaced by an
inert record (:class:`picklescope.workloads.inert._Unpickler`, on the shared machine of
:mod:`picklescope.core.safeload`): a ``_rebuild_tensor_v2`` call becomes a record of its storage, offset,
size and stride; numpy's ``_reconstruct`` a record of dtype and shape; any name it does not know an
opaque record that remembers only its name. Large byte strings (tensor data) are skipped by seeking,
never read, and a ``torch.save`` archive is read from its zip directory and its ``data.pkl`` (storage
sizes come from the zip records). The only data bytes ever read are the offsets of jagged nested
tensors and the sizes of strided ones: their lengths are the shape.

The file is read no further than its size at open, every size it declares is checked against its
real size and a stated limit before anything is allocated, and what a stream makes the reader hold is
counted as it is read (:data:`LIMITS`, from :mod:`picklescope.workloads.inert`), so describing any
file up to 4 GiB stays within :data:`picklescope.core.safefile.READER_MEMORY_BOUND` of the reader's memory.

What the reader cannot describe is refused with one line naming the leaf and the reason; a batch built
by code it does not know raises :class:`~picklescope.workloads.inert_records.NeedsCode`, which only the
trusted load of :mod:`picklescope.investigate.workload_from` may act on.
"""

from __future__ import annotations

import io
import math
import os
import zipfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from picklescope.core.safefile import BLOB_LIMIT_ENV, BoundedFile, blob_limit, check_file, open_bounded
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError, safe_text
from picklescope.workloads.blobinfo import ZIP_MAGIC, describe_blob, require_pickle
from picklescope.workloads.inert import LIMITS, MAX_KEPT, _Damaged, _read, _read_stream, _Unreadable
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
from picklescope.workloads.inert_zip import _Archive, _check_member, _open_zip
from picklescope.workloads.schema import Described, _build, _contiguous, _refuse_leaf, _StrArray

__all__ = ["LIMITS", "SAVED_BATCH_LIMIT", "read_saved_batch"]


# structure is read by seeking past the data, so a saved batch may be far larger than a blob `inspect`
# loads; the bound only stops a mistaken path (a disk image, a sparse file) from being walked
SAVED_BATCH_LIMIT = 256 << 30
_DESCRIBE_BLOB_LIMIT = 64 << 20  # a file that does not parse is worded by blobinfo from at most this many bytes


def read_saved_batch(path: str | os.PathLike, batch_dim: int | None = None) -> tuple[Path, str, Described]:
    """FILE's batch, read without running anything in it: ``(path, its name as shown, the description)``.

    Raises :class:`NeedsCode` when the batch is built by code the reader does not know (the caller decides
    whether a trusted load may describe it); every other problem is one line.
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
            return p, shown, _describe_open(shown, f, batch_dim)
    except (_Damaged, zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise PicklescopeError(f"{shown} is damaged: {safe_text(exc, 200)}",
                               "copy it again; a zip member fails its own checksum or ends too soon") from None
    except _Unreadable as exc:
        raise PicklescopeError(f"{shown}: a stream inside it cannot be read ({safe_text(exc, 200)})",
                               "copy it again, or save the batch again") from None


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
        src: BinaryIO = (BoundedFile(f, b.length, f"{path} (its torch archive)", start=b.offset)  # type: ignore
                         if b.data is None else io.BytesIO(b.data))
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
            zipped = zipfile.is_zipfile(BoundedFile(f, f.size - end, path, start=end))  # type: ignore[arg-type]
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
    from numpy.lib import format as npformat  # deferred: numpy only for an .npz, never for a pickle or an archive

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
