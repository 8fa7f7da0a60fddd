"""The pickle machine that reads a saved batch inertly, bounded by what a batch's structure needs.

The standard library's pure-Python unpickler, with every global resolved to a stand-in of
:mod:`picklescope.workloads.inert_records`, large byte strings and strings skipped by seeking, and what
a stream makes it hold counted as it goes (see :class:`_Unpickler`).
"""

from __future__ import annotations

import pickle
import struct
import zipfile
import zlib
from typing import Any, BinaryIO

from picklescope.errors import PicklescopeError
from picklescope.workloads.inert_records import (
    _ITEMSIZE,
    _KNOWN,
    Refused,
    _Bytes,
    _Opaque,
    _opaque_type,
    _Storage,
    _storage_type,
    _TorchDType,
    _type_name,
)

# what one stream may make the reader hold; with core.safefile.READ_LIMIT on any single read these keep
# describing any file up to 4 GiB within core.safefile.READER_MEMORY_BOUND of the reader's memory before it started
MAX_DICT_KEYS = 65_536  # a batch has at most 4096 leaves; a row's dict a few keys
MAX_LIST_ITEMS = 1_000_000  # rows of one object array
MAX_ITEMS = 1_000_000  # container entries of the whole stream
MAX_STACK = 1_000_000  # values piled on the unpickler's stack
MAX_MEMO = 1_000_000  # values the stream memoizes
MAX_KEPT = 64 << 20  # bytes of strings and byte strings kept; past it only their lengths are
MAX_OPS = 2_500_000  # opcodes of one stream (each makes at most one object): a batch's structure needs far fewer
MAX_ZIP_ENTRIES = 65_536  # members of a torch.save archive (one per storage) or of an .npz (one per key)
_INLINE = 1 << 16  # byte strings up to this size are read (dtype codes, small strings); larger ones are skipped




class _Text:
    """A long string of the stream, skipped: only its length is kept (a non-tensor column's typical length)."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


class _Counting(dict):  # type: ignore[type-arg]
    """The opcode table, counting lookups: every 65,536 opcodes the unpickler checks what it holds."""

    def __init__(self, table: dict[int, Any], unpickler: _Unpickler) -> None:
        super().__init__(table)
        self.unpickler, self.ops = unpickler, 0

    def __getitem__(self, key: int) -> Any:
        self.ops += 1
        if not self.ops & 0xFFFF:
            self.unpickler._check_held()
        return dict.__getitem__(self, key)


class _Unpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """The standard library's pickle machine with every global replaced by an inert stand-in.

    Byte strings longer than ``_INLINE`` are skipped by seeking (when outside a frame, which is where
    pickle writes large ones), so reading a 500 MiB blob costs no memory for its data; long strings
    likewise keep only their length. What the stream makes the reader hold is bounded: a dict of more
    than :data:`MAX_DICT_KEYS` keys, a list of more than :data:`MAX_LIST_ITEMS` items, more than
    :data:`MAX_ITEMS` container entries in all, or a stack or memo past its bound is refused at once,
    with the count reached, before the rest of the stream is read.
    """

    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, f: BinaryIO, archive: Any = None) -> None:
        super().__init__(f)
        self._f = f
        self._archive = archive
        self.unknown: list[str] = []
        self.named: list[str] = []  # every global the stream names, known or not
        self.items = 0
        self.kept = 0  # bytes of strings and byte strings held
        self.dispatch = _Counting(type(self).dispatch, self)  # type: ignore[misc]

    def _where(self) -> str:
        return getattr(self._f, "where", "the stream")

    def _too_many(self, what: str, count: int, limit: int) -> Refused:
        return Refused(f"{self._where()}: {what} holds {count:,} entries by byte {self._f.tell():,}, over the "
                       f"{limit:,} a batch's structure needs; refused before reading the rest",
                       "save the batch as a DataProto, a TensorDict or a dict of tensors; rows of data belong in "
                       "tensors or numpy arrays, not in millions of Python objects")

    def _check_held(self) -> None:
        ops = self.dispatch.ops  # type: ignore[attr-defined]
        if ops > MAX_OPS:
            raise self._too_many("the stream's opcodes", ops, MAX_OPS)
        stacked = len(self.stack) + sum(len(s) for s in self.metastack)
        if stacked > MAX_STACK:
            raise self._too_many("the unpickler's stack", stacked, MAX_STACK)
        if len(self.memo) > MAX_MEMO:
            raise self._too_many("the unpickler's memo", len(self.memo), MAX_MEMO)

    def _grew(self, target: Any, added: int) -> None:
        self.items += added
        size = len(target.items) if isinstance(target, _Opaque) else len(target) if hasattr(target, "__len__") else 0
        if isinstance(target, dict) and size > MAX_DICT_KEYS:
            raise self._too_many("a dict", size, MAX_DICT_KEYS)
        if size > MAX_LIST_ITEMS:
            raise self._too_many(f"a {_type_name(target)}", size, MAX_LIST_ITEMS)
        if self.items > MAX_ITEMS:
            raise self._too_many("the stream's containers together", self.items, MAX_ITEMS)

    def load_setitems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        for i in range(0, len(items) - 1, 2):
            target[items[i]] = items[i + 1]
        self._grew(target, len(items) // 2)

    def load_setitem(self) -> None:
        super().load_setitem()
        self._grew(self.stack[-1], 1)

    def load_appends(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if hasattr(target, "extend"):
            target.extend(items)
        else:
            for x in items:
                target.append(x)
        self._grew(target, len(items))

    def load_append(self) -> None:
        super().load_append()
        self._grew(self.stack[-1], 1)

    def load_additems(self) -> None:
        items = self.pop_mark()
        target = self.stack[-1]
        if not isinstance(target, set):
            raise Refused(f"{self._where()}: ADDITEMS on a {_type_name(target)}", "the file is not a saved batch")
        target.update(items)
        self._grew(target, len(items))

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full not in self.named:
            self.named.append(full)
        if (module, name) in _KNOWN:
            return _KNOWN[(module, name)]
        if module in ("torch", "torch.storage") and name.endswith("Storage"):
            return _storage_type(name)
        if module == "torch" and (name in _ITEMSIZE or name.startswith(("uint", "int", "float", "complex"))):
            return _TorchDType(name)
        if (module, name) == ("torch", "Tensor"):
            return _opaque_type(module, name)
        if full not in self.unknown:
            self.unknown.append(full)
        return _opaque_type(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage":
            _, stype, key, _loc, numel = pid
            dtype = getattr(stype, "dtype", None)
            if getattr(stype, "storage_name", "") == "UntypedStorage":
                dtype = "untyped"  # the tensor record names its dtype (_rebuild_tensor_v3)
            if dtype is None:
                raise Refused(f"a storage of type {getattr(stype, 'storage_name', stype)!r} the workload format has "
                              "no dtype for", "use one of: " + ", ".join(_ITEMSIZE))
            return _Storage(dtype, str(key), int(numel), self._archive)
        raise Refused("the stream refers to a persistent object that is not a torch storage",
                      "save the batch with torch.save or DataProto.save_to_disk")

    def _skip(self, n: int) -> _Bytes | None:
        """Seek past ``n`` bytes outside a frame (None: read them, they are small or framed)."""
        frame = getattr(self._unframer, "current_frame", None)
        if n <= _INLINE or frame is not None:
            return None
        at = self._f.tell()
        head = self._f.read(4)
        self._f.seek(at + n)
        if self._f.tell() != at + n or len(head) < min(4, n):
            raise pickle.UnpicklingError("data ran out")
        return _Bytes(at, n, head)

    def _bytes(self, n: int) -> _Bytes:
        skipped = self._skip(n)
        if skipped is not None:
            return skipped
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("data ran out")
        self.kept += n
        return _Bytes(-1, n, data[:4], data if self.kept <= MAX_KEPT else None)

    def _push_bytes(self, fmt: str, size: int) -> None:
        (n,) = struct.unpack(fmt, self.read(size))
        b = self._bytes(n)
        self.append(b.data if b.data is not None else b)

    def _push_text(self, fmt: str, size: int) -> None:
        (n,) = struct.unpack(fmt, self.read(size))
        if self._skip(n) is not None:
            self.append(_Text(n))
            return
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("data ran out")
        self.kept += n
        self.append(str(data, "utf-8", "surrogatepass") if self.kept <= MAX_KEPT else _Text(n))

    def load_short_binunicode(self) -> None:
        self._push_text("<B", 1)

    def load_binbytes(self) -> None:
        self._push_bytes("<I", 4)

    def load_short_binbytes(self) -> None:
        self._push_bytes("<B", 1)

    def load_binbytes8(self) -> None:
        self._push_bytes("<Q", 8)

    def load_bytearray8(self) -> None:
        self._push_bytes("<Q", 8)

    def load_binunicode(self) -> None:
        self._push_text("<I", 4)

    def load_binunicode8(self) -> None:
        self._push_text("<Q", 8)

    def load_next_buffer(self) -> None:
        self.append(_Bytes(-1, 0))

    def load_long4(self) -> None:
        (n,) = struct.unpack("<i", self.read(4))
        if n > _INLINE:
            raise Refused(f"{self._where()}: an integer of {n:,} bytes at byte {self._f.tell():,}",
                          "the file is damaged or not a saved batch")
        self.append(pickle.decode_long(self.read(n)))

    dispatch[pickle.BINBYTES[0]] = load_binbytes
    dispatch[pickle.SHORT_BINBYTES[0]] = load_short_binbytes
    dispatch[pickle.BINBYTES8[0]] = load_binbytes8
    dispatch[pickle.BYTEARRAY8[0]] = load_bytearray8
    dispatch[pickle.BINUNICODE[0]] = load_binunicode
    dispatch[pickle.SHORT_BINUNICODE[0]] = load_short_binunicode
    dispatch[pickle.BINUNICODE8[0]] = load_binunicode8
    dispatch[pickle.NEXT_BUFFER[0]] = load_next_buffer
    dispatch[pickle.LONG4[0]] = load_long4
    dispatch[pickle.SETITEMS[0]] = load_setitems
    dispatch[pickle.SETITEM[0]] = load_setitem
    dispatch[pickle.APPENDS[0]] = load_appends
    dispatch[pickle.APPEND[0]] = load_append
    dispatch[pickle.ADDITEMS[0]] = load_additems


def _read_stream(f: BinaryIO, archive: Any = None) -> tuple[Any, list[str]]:
    obj, u = _read(f, archive)
    return obj, u.unknown


def _read(f: BinaryIO, archive: Any = None) -> tuple[Any, _Unpickler]:
    u = _Unpickler(f, archive)
    try:
        obj = u.load()
    except PicklescopeError:
        raise
    except RecursionError:
        raise Refused("the stream nests too deeply to read", "save a flatter batch") from None
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise _Damaged(f"{type(exc).__name__}: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - a stream the machine cannot read: the caller words it
        raise _Unreadable(f"{type(exc).__name__}: {exc}", _ran_out(exc)) from None
    return obj, u


def _ran_out(exc: Exception) -> bool:
    text = str(exc)
    return isinstance(exc, EOFError) or any(w in text for w in ("data ran out", "truncated", "ran out of input",
                                                                 "pickle exhausted", "not enough data"))


class _Damaged(Exception):
    """A zip member that fails its own check (CRC, deflate stream) while it is read."""


class _Unreadable(Exception):
    def __init__(self, text: str, ran_out: bool = False) -> None:
        super().__init__(text)
        self.ran_out = ran_out


