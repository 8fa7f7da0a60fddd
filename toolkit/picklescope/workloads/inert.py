"""The inert reader of a saved batch: the shared pickle machine with a batch's stand-ins, and its bounds.

:class:`picklescope.core.safeload.InertUnpickler` reads the stream without running it; this module
gives it the stand-ins of :mod:`picklescope.workloads.inert_records` (tensors, storages, numpy arrays,
TensorDicts) and the bounds a batch's structure needs.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, BinaryIO

from picklescope.core.safeload import (
    MAX_DICT_KEYS,
    MAX_ITEMS,
    MAX_KEPT,
    MAX_LIST_ITEMS,
    MAX_MEMO,
    MAX_OPS,
    MAX_STACK,
    STRUCTURE_BOUNDS,
    InertUnpickler,
)
from picklescope.core.safeload import Damaged as _Damaged
from picklescope.core.safeload import Text as _Text
from picklescope.core.safeload import Unreadable as _Unreadable
from picklescope.core.safezip import MAX_ZIP_ENTRIES
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

__all__ = ["BATCH_BOUNDS", "LIMITS", "MAX_DICT_KEYS", "MAX_ITEMS", "MAX_KEPT", "MAX_LIST_ITEMS", "MAX_MEMO",
           "MAX_OPS", "MAX_STACK", "MAX_ZIP_ENTRIES", "_Damaged", "_read", "_read_stream", "_Text", "_Unpickler",
           "_Unreadable"]

# the reader's bounds, by name (what a refusal or the docs cite)
LIMITS = {"MAX_DICT_KEYS": MAX_DICT_KEYS, "MAX_LIST_ITEMS": MAX_LIST_ITEMS, "MAX_ITEMS": MAX_ITEMS,
          "MAX_STACK": MAX_STACK, "MAX_MEMO": MAX_MEMO, "MAX_KEPT": MAX_KEPT, "MAX_OPS": MAX_OPS,
          "MAX_ZIP_ENTRIES": MAX_ZIP_ENTRIES}

# what one stream may make the reader hold: the shared bounds of a file's structure, in a batch's words
BATCH_BOUNDS = replace(
    STRUCTURE_BOUNDS, needs="a batch's structure needs",
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
