"""``torch.load`` with ``weights_only=True`` for the archives the torch codec writes.

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from picklescope.errors import PicklescopeError


def tensordict_archive_globals() -> list[Callable[..., Any]]:
    """Exactly the globals a ``torch.save`` of a (consolidated or key-less) TensorDict names."""
    from tensordict import TensorDict
    from tensordict._reductions import _make_td, _rebuild_tensordict_files_consolidated

    return [_rebuild_tensordict_files_consolidated, _make_td, TensorDict]


@contextmanager
def allow_globals(extra: list[Callable[..., Any]]) -> Iterator[list[Callable[..., Any]]]:
    """Allow ``extra`` for ``weights_only`` loads inside the block; yields the ones it had to add.

    Globals that were already allowed (by torch, tensordict or the user) stay allowed afterwards.
    """
    import torch.serialization as ts

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
    import torch.serialization as ts

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
    import torch

    with allow_tensordict_globals():
        try:
            return torch.load(io.BytesIO(data), weights_only=True)
        except pickle.UnpicklingError as exc:
            refused = refused_globals(bytes(data)) or ["(see torch's message: " + str(exc).splitlines()[0] + ")"]
    raise PicklescopeError(
        f"the torch archive names globals that a weights_only load refuses: {', '.join(refused)}; picklescope "
        "loads torch archives with weights_only=True only, allowing tensordict's own rebuild functions",
        "keep non-tensor values (numpy arrays, objects) in non_tensor_batch instead of inside the TensorDict")
