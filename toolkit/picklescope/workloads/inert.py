"""The inert reader of a saved batch: the shared pickle machine with a batch's stand-ins, and its bounds.

:class:`picklescope.core.safeload.InertUnpickler` reads the stream without running it; this module
gives it the stand-ins of :mod:`picklescope.workloads.inert_records` (tensors, storages, numpy arrays,
TensorDicts) and the bounds a batch's structure needs.
"""

from __future__ import annotations

from typing import Any, BinaryIO

from picklescope.core.safeload import Bounds, InertUnpickler
from picklescope.core.safeload import Damaged as _Damaged
from picklescope.core.safeload import Text as _Text
from picklescope.core.safeload import Unreadable as _Unreadable
from picklescope.workloads.inert_records import (
    _ITEMSIZE,
    _KNOWN,
    Refused,
    _opaque_type,
    _Storage,
    _storage_type,
    _StorageType,
    _TorchDType,
    _type_name,
)

__all__ = ["BATCH_BOUNDS", "MAX_ZIP_ENTRIES", "_Damaged", "_read", "_read_stream", "_Text", "_Unpickler",
           "_Unreadable"]

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

BATCH_BOUNDS = Bounds(
    dict_keys=MAX_DICT_KEYS, list_items=MAX_LIST_ITEMS, items=MAX_ITEMS, stack=MAX_STACK, memo=MAX_MEMO,
    kept=MAX_KEPT, ops=MAX_OPS, needs="a batch's structure needs",
    way_out="save the batch as a DataProto, a TensorDict or a dict of tensors; rows of data belong in tensors or "
            "numpy arrays, not in millions of Python objects",
    damaged="the file is damaged or not a saved batch", not_it="the file is not a saved batch")


class _Unpickler(InertUnpickler):
    """The inert machine resolving what a saved batch names to records of its structure.

    ``archive`` is the :class:`picklescope.workloads.inert_zip._Archive` the stream's storages live in
    (a ``torch.save`` file), or None for a plain pickle.
    """

    def __init__(self, f: BinaryIO, archive: Any = None) -> None:
        super().__init__(f, BATCH_BOUNDS)
        self._archive = archive

    def type_name(self, x: Any) -> str:
        return _type_name(x)

    def resolve(self, module: str, name: str) -> Any:
        if (module, name) in _KNOWN:
            return _KNOWN[(module, name)]
        if module in ("torch", "torch.storage") and name.endswith("Storage"):
            return _storage_type(name)
        if module == "torch" and (name in _ITEMSIZE or name.startswith(("uint", "int", "float", "complex"))):
            return _TorchDType(name)
        if (module, name) == ("torch", "Tensor"):
            return _opaque_type(module, name)
        return super().resolve(module, name)

    def persistent_load(self, pid: Any) -> Any:
        if isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage":
            _, stype, key, _loc, numel = pid
            known = isinstance(stype, type) and issubclass(stype, _StorageType)
            dtype = stype.dtype if known else None
            if known and stype.storage_name == "UntypedStorage":
                dtype = "untyped"  # the tensor record names its dtype (_rebuild_tensor_v3)
            if dtype is None:
                raise Refused(f"a storage of type {stype.storage_name if known else stype!r} the workload format "
                              "has no dtype for", "use one of: " + ", ".join(_ITEMSIZE))
            return _Storage(dtype, str(key), int(numel), self._archive)
        raise Refused("the stream refers to a persistent object that is not a torch storage",
                      "save the batch with torch.save or DataProto.save_to_disk")


def _read_stream(f: BinaryIO, archive: Any = None) -> tuple[Any, list[str]]:
    obj, u = _read(f, archive)
    return obj, u.unknown


def _read(f: BinaryIO, archive: Any = None) -> tuple[Any, _Unpickler]:
    u = _Unpickler(f, archive)
    return u.run(), u
