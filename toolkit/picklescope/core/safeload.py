"""Reading a pickle without running what it names: the inert pickle machine, and torch's ``weights_only`` load.

Unpickling runs whatever the stream names, so the toolkit reads pickles it did not write in one of two
ways, both here:

- **inertly**, with :class:`InertUnpickler`: the standard library's own pickle machine, with every global
  the stream names replaced by a stand-in (by default an :class:`Opaque` record that remembers only its
  name), large byte strings and strings skipped by seeking, and what the stream makes it hold counted
  against :class:`Bounds` as it is read. ``workload from`` gives it stand-ins that record a batch's
  structure (:mod:`picklescope.workloads.inert`); ``inspect`` reads which codec wrote a blob with it
  (:mod:`picklescope.workloads.blobinfo`). Nothing the file names is imported or called.
- **through torch**, with ``torch.load(weights_only=True)``, for the archives the torch codec writes
  (:func:`load_tensordict_archive`), below.

``torch.load(weights_only=False)`` runs whatever the archive's pickle names, so the toolkit never
uses it. The torch codec's receiver reads back the ``torch.save`` archive of a consolidated
TensorDict, whose pickle names tensordict's own rebuild function (and, for a TensorDict without
keys, which is saved unconsolidated, the class and ``_make_td``). Those are allowed for the load
call only, by :func:`allow_tensordict_globals`; every other global (a numpy array held as
non-tensor data inside the TensorDict, a user's class) is still refused.

Why scoped and not ``torch.serialization.add_safe_globals``: the allowlist is process-wide, and
``torch.serialization.safe_globals`` removes on exit every global it was given, even one that
tensordict (0.15 registers these at import) or the user had allowed before; so this context adds
only the globals that are missing and removes only those. tensordict 0.10 registers none of them,
which is why the allowance cannot be left to tensordict.

The list was read off real archives with ``torch.serialization.get_unsafe_globals_in_checkpoint``
(tensordict 0.10.0 and 0.15.3, torch 2.13): the tiny, mixed (fp8 dropped: consolidate refuses it)
and flowgrpo presets, jagged nested tensors, sub-TensorDicts, zero-size and 0-dim leaves, every
dtype, locked, named and device-carrying TensorDicts, and string/dict NonTensorData; the test suite
re-reads it from fresh archives. Memory is unchanged: both unpicklers map the same storages from the
same zip records (the run's receiver peak stays 2.00x payload on flowgrpo).
"""

from __future__ import annotations

import io
import pickle
import struct
import sys
import zipfile
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, BinaryIO

from picklescope.core.safefile import BoundedFile
from picklescope.errors import PicklescopeError

INLINE = 1 << 16  # byte strings and strings up to this size are read (dtype codes, keys); larger ones are skipped

# What one stream may make the reader of a file's structure hold (a saved batch's, a blob's). With
# core.safefile.READ_LIMIT on any single read these keep describing any file up to 4 GiB within
# core.safefile.READER_MEMORY_BOUND of the reader's memory before it started.
MAX_DICT_KEYS = 65_536  # a batch has at most 4096 leaves; a row's dict a few keys
MAX_LIST_ITEMS = 1_000_000  # rows of one object array
MAX_ITEMS = 1_000_000  # container entries of the whole stream
MAX_STACK = 1_000_000  # values piled on the unpickler's stack
MAX_MEMO = 1_000_000  # values the stream memoizes
MAX_KEPT = 64 << 20  # bytes of strings and byte strings kept; past it only their lengths are
MAX_OPS = 2_500_000  # opcodes of one stream (each makes at most one object): a batch's structure needs far fewer


class Refused(PicklescopeError):
    """What the stream holds cannot be read or described (one line: where and why)."""


@dataclass(frozen=True)
class Bounds:
    """What one stream may make the inert reader hold; past any of them it refuses at once, with the count."""

    dict_keys: int = sys.maxsize  # keys of one dict
    list_items: int = sys.maxsize  # items of one list (or other container)
    items: int = sys.maxsize  # container entries of the whole stream
    stack: int = sys.maxsize  # values piled on the unpickler's stack
    memo: int = sys.maxsize  # values the stream memoizes
    kept: int = 64 << 20  # bytes of strings and byte strings kept; past it only their lengths are
    ops: int = sys.maxsize  # opcodes of the stream
    # the words of a refusal: what the bounds stand for, and the ways out
    needs: str = "the reader holds"
    way_out: str = "the file is damaged or not a pickle of plain data"
    damaged: str = "the file is damaged"
    not_it: str = "the file is not a pickle of plain data"


STRUCTURE_BOUNDS = Bounds(dict_keys=MAX_DICT_KEYS, list_items=MAX_LIST_ITEMS, items=MAX_ITEMS, stack=MAX_STACK,
                          memo=MAX_MEMO, kept=MAX_KEPT, ops=MAX_OPS)


# -- inert records of what a stream holds ----------------------------------------------------------------
@dataclass
class Skipped:
    """A byte string of the stream: where it lies in the file and how long it is; its bytes only when small."""

    offset: int
    length: int
    head: bytes = b""
    data: bytes | None = None  # kept only when small


class Text:
    """A long string of the stream, skipped: only its length is kept."""

    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length


class Opaque:
    """Anything built by a global the reader has no stand-in for; remembers only the name (and what it was fed)."""

    _g = ("?", "?")

    def __new__(cls, *args: Any, **kw: Any) -> Opaque:
        self = object.__new__(cls)
        self.args, self.state, self.items = args, None, []
        return self

    def __init__(self, *args: Any, **kw: Any) -> None:
        pass

    def __call__(self, *args: Any, **kw: Any) -> Opaque:
        return opaque_type(*self._g)(*args)

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def append(self, x: Any) -> None:
        self.items.append(x)

    def extend(self, xs: Any) -> None:
        self.items.extend(xs)

    def __setitem__(self, k: Any, v: Any) -> None:
        self.items.append((k, v))

    @property
    def name(self) -> str:
        return f"{self._g[0]}.{self._g[1]}"


_OPAQUE: dict[tuple[str, str], type] = {}


def opaque_type(module: str, name: str) -> type:
    """The stand-in class for global ``module.name``: one per name, so a record says what built it."""
    key = (module, name)
    if key not in _OPAQUE:
        _OPAQUE[key] = type(f"Opaque_{name}", (Opaque,), {"_g": key})
    return _OPAQUE[key]


class Damaged(Exception):
    """A zip member that fails its own check (CRC, deflate stream) while it is read."""


class Unreadable(Exception):
    """A stream the pickle machine cannot read; ``ran_out`` when it ends too soon."""

    def __init__(self, text: str, ran_out: bool = False) -> None:
        super().__init__(text)
        self.ran_out = ran_out


class _Counting(dict):  # type: ignore[type-arg]
    """The opcode table, counting lookups: every 65,536 opcodes the unpickler checks what it holds."""

    def __init__(self, table: dict[int, Any], unpickler: InertUnpickler) -> None:
        super().__init__(table)
        self.unpickler, self.ops = unpickler, 0

    def __getitem__(self, key: int) -> Any:
        self.ops += 1
        if not self.ops & 0xFFFF:
            self.unpickler._check_held()
        return dict.__getitem__(self, key)


def _pusher(text: bool, fmt: str) -> Callable[[Any], None]:
    """The opcode handler that reads a length packed as ``fmt`` and pushes a string (``text``) or a byte
    string, through the unpickler's own pusher (a subclass's included)."""
    size = struct.calcsize(fmt)

    def load(self: Any) -> None:
        (self._push_text if text else self._push_bytes)(fmt, size)
    return load


class InertUnpickler(pickle._Unpickler):  # type: ignore[name-defined]
    """The standard library's pickle machine with every global replaced by an inert stand-in.

    :meth:`resolve` gives the stand-in for a global (an :class:`Opaque` record unless a subclass knows
    better); every global the stream names is listed in ``named``, the unresolved ones in ``unknown``.
    Byte strings longer than ``INLINE`` are skipped by seeking (when outside a frame, which is where
    pickle writes large ones), so reading a 500 MiB blob costs no memory for its data; long strings
    likewise keep only their length. What the stream makes the reader hold is bounded by ``bounds``:
    a container, the stack or the memo past its bound is refused at once, with the count reached,
    before the rest of the stream is read.
    """

    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def __init__(self, f: BinaryIO, bounds: Bounds | None = None) -> None:
        super().__init__(f)
        self._f = f
        self.bounds = bounds or Bounds()
        self.unknown: list[str] = []
        self.named: list[str] = []  # every global the stream names, known or not, each once in order
        self.buffers = 0  # out-of-band buffers the stream asks for (pickle protocol 5)
        self.items = 0
        self.kept = 0  # bytes of strings and byte strings held
        self.proto = 0
        self.dispatch = _Counting(type(self).dispatch, self)  # type: ignore[misc]

    # -- what a subclass may specialise
    def resolve(self, module: str, name: str) -> Any:
        """The stand-in for global ``module.name``; unknown to this reader, so an opaque record."""
        full = f"{module}.{name}"
        if full not in self.unknown:
            self.unknown.append(full)
        return opaque_type(module, name)

    def type_name(self, x: Any) -> str:
        return x.name if isinstance(x, Opaque) else type(x).__name__

    def persistent_load(self, pid: Any) -> Any:
        return opaque_type("<persistent id>", type(pid).__name__)()

    # -- bounds
    def _where(self) -> str:
        return self._f.where if isinstance(self._f, BoundedFile) else "the stream"

    def _too_many(self, what: str, count: int, limit: int) -> Refused:
        return Refused(f"{self._where()}: {what} holds {count:,} entries by byte {self._f.tell():,}, over the "
                       f"{limit:,} {self.bounds.needs}; refused before reading the rest", self.bounds.way_out)

    def _check_held(self) -> None:
        b = self.bounds
        ops = self.dispatch.ops  # type: ignore[attr-defined]
        if ops > b.ops:
            raise self._too_many("the stream's opcodes", ops, b.ops)
        stacked = len(self.stack) + sum(len(s) for s in self.metastack)
        if stacked > b.stack:
            raise self._too_many("the unpickler's stack", stacked, b.stack)
        if len(self.memo) > b.memo:
            raise self._too_many("the unpickler's memo", len(self.memo), b.memo)

    def _grew(self, target: Any, added: int) -> None:
        b = self.bounds
        self.items += added
        size = len(target.items) if isinstance(target, Opaque) else len(target) if hasattr(target, "__len__") else 0
        if isinstance(target, dict) and size > b.dict_keys:
            raise self._too_many("a dict", size, b.dict_keys)
        if size > b.list_items:
            raise self._too_many(f"a {self.type_name(target)}", size, b.list_items)
        if self.items > b.items:
            raise self._too_many("the stream's containers together", self.items, b.items)

    # -- containers, counted
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
            raise Refused(f"{self._where()}: ADDITEMS on a {self.type_name(target)}", self.bounds.not_it)
        target.update(items)
        self._grew(target, len(items))

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full not in self.named:
            self.named.append(full)
        return self.resolve(module, name)

    # -- byte strings and strings: large ones skipped
    def _skip(self, n: int) -> Skipped | None:
        """Seek past ``n`` bytes outside a frame (None: read them, they are small or framed)."""
        frame = getattr(self._unframer, "current_frame", None)
        if n <= INLINE or frame is not None:
            return None
        at = self._f.tell()
        head = self._f.read(4)
        self._f.seek(at + n)
        if self._f.tell() != at + n or len(head) < min(4, n):
            raise pickle.UnpicklingError("data ran out")
        return Skipped(at, n, head)

    def _bytes(self, n: int) -> Skipped:
        skipped = self._skip(n)
        if skipped is not None:
            return skipped
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("data ran out")
        self.kept += n
        return Skipped(-1, n, data[:4], data if self.kept <= self.bounds.kept else None)

    def _push_bytes(self, fmt: str, size: int) -> None:
        (n,) = struct.unpack(fmt, self.read(size))
        b = self._bytes(n)
        self.append(b.data if b.data is not None else b)

    def _push_text(self, fmt: str, size: int) -> None:
        (n,) = struct.unpack(fmt, self.read(size))
        if self._skip(n) is not None:
            self.append(Text(n))
            return
        data = self.read(n)
        if len(data) != n:
            raise pickle.UnpicklingError("data ran out")
        self.kept += n
        self.append(str(data, "utf-8", "surrogatepass") if self.kept <= self.bounds.kept else Text(n))

    def load_next_buffer(self) -> None:
        self.buffers += 1
        self.append(Skipped(-1, 0))

    def load_long4(self) -> None:
        (n,) = struct.unpack("<i", self.read(4))
        if n > INLINE:
            raise Refused(f"{self._where()}: an integer of {n:,} bytes at byte {self._f.tell():,}",
                          self.bounds.damaged)
        self.append(pickle.decode_long(self.read(n)))

    # each opcode that pushes a byte string or a string: (opcode, how its length is packed, a string?)
    for _op, _fmt, _text in ((pickle.BINBYTES, "<I", False), (pickle.SHORT_BINBYTES, "<B", False),
                             (pickle.BINBYTES8, "<Q", False), (pickle.BYTEARRAY8, "<Q", False),
                             (pickle.BINUNICODE, "<I", True), (pickle.SHORT_BINUNICODE, "<B", True),
                             (pickle.BINUNICODE8, "<Q", True)):
        dispatch[_op[0]] = _pusher(_text, _fmt)
    dispatch.update({pickle.NEXT_BUFFER[0]: load_next_buffer, pickle.LONG4[0]: load_long4,
                     pickle.SETITEMS[0]: load_setitems, pickle.SETITEM[0]: load_setitem,
                     pickle.APPENDS[0]: load_appends, pickle.APPEND[0]: load_append,
                     pickle.ADDITEMS[0]: load_additems})
    del _op, _fmt, _text

    def run(self) -> Any:
        """The stream's top object, built of stand-ins. A refusal is a :class:`PicklescopeError`; a zip member
        failing its own check is :class:`Damaged`; anything else the machine cannot read is :class:`Unreadable`."""
        try:
            return self.load()
        except PicklescopeError:
            raise
        except RecursionError:
            raise Refused("the stream nests too deeply to read", "save a flatter batch") from None
        except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise Damaged(f"{type(exc).__name__}: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - a stream the machine cannot read: the caller words it
            raise Unreadable(f"{type(exc).__name__}: {exc}", _ran_out(exc)) from None


def _ran_out(exc: Exception) -> bool:
    text = str(exc)
    return isinstance(exc, EOFError) or any(w in text for w in ("data ran out", "truncated", "ran out of input",
                                                                 "pickle exhausted", "not enough data"))


# -- torch.load(weights_only=True) of the torch codec's archives -------------------------------------------


def tensordict_archive_globals() -> list[Callable[..., Any]]:
    """Exactly the globals a ``torch.save`` of a (consolidated or key-less) TensorDict names."""
    # deferred, as every torch import here: the inert reader above must not wait for torch
    from tensordict import TensorDict
    from tensordict._reductions import _make_td, _rebuild_tensordict_files_consolidated

    return [_rebuild_tensordict_files_consolidated, _make_td, TensorDict]


@contextmanager
def allow_globals(extra: list[Callable[..., Any]]) -> Iterator[list[Callable[..., Any]]]:
    """Allow ``extra`` for ``weights_only`` loads inside the block; yields the ones it had to add.

    Globals that were already allowed (by torch, tensordict or the user) stay allowed afterwards.
    """
    import torch.serialization as ts  # deferred: torch only for a torch load

    before = set(ts.get_safe_globals())
    added = [g for g in extra if g not in before]
    if not added:
        yield added
        return
    with ts.safe_globals(added):
        yield added


@contextmanager
def allow_tensordict_globals() -> Iterator[list[Callable[..., Any]]]:
    """:func:`allow_globals` of :func:`tensordict_archive_globals`."""
    with allow_globals(tensordict_archive_globals()) as added:
        yield added


def refused_globals(data: bytes) -> list[str]:
    """The globals of a ``torch.save`` archive that a ``weights_only`` load with the TensorDict allowance refuses."""
    import torch.serialization as ts  # deferred: torch only for a torch load

    with allow_tensordict_globals():
        try:
            return sorted(ts.get_unsafe_globals_in_checkpoint(io.BytesIO(data)))
        except Exception:  # noqa: BLE001 - only used to word an error; the load's own error is kept
            return []


def load_tensordict_archive(data: bytes | bytearray | memoryview) -> Any:
    """``torch.load(weights_only=True)`` of a TensorDict archive, allowing only tensordict's globals.

    An archive that names anything else (e.g. a numpy array stored as NonTensorData inside the
    TensorDict) is refused with a :class:`PicklescopeError` listing the refused globals: the toolkit
    never falls back to ``weights_only=False``.
    """
    import torch  # deferred: torch only for a torch load

    with allow_tensordict_globals():
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except pickle.UnpicklingError as exc:
            refused = refused_globals(bytes(data)) or ["(see torch's message: " + str(exc).splitlines()[0] + ")"]
    raise PicklescopeError(
        f"the torch archive names globals that a weights_only load refuses: {', '.join(refused)}; picklescope "
        "loads torch archives with weights_only=True only, allowing tensordict's own rebuild functions",
        "keep non-tensor values (numpy arrays, objects) in non_tensor_batch instead of inside the TensorDict")
