"""Which files picklescope may unpickle: the project's ``data/``, its own output, or what the user trusts.

A blob is a pickle, and unpickling runs whatever the stream names, so a file is only ever loaded if
one of these holds:

- it lies inside the project's own ``data/`` folder (after resolving symlinks, so a link in
  ``data/`` to a file elsewhere does not count);
- picklescope wrote it itself: every file it writes that is meant to be unpickled later (the
  reference blobs of ``scripts/make_reference_blobs.py`` / :func:`picklescope.verl.blobs.write_reference_blobs`)
  is recorded with its sha256 in a ledger in picklescope's cache, and a file counts only while its
  bytes still have that checksum. A manifest sitting next to a blob does NOT make it trusted: anyone
  who hands over a blob can hand over a manifest with it;
- the caller says so: ``--trust`` on the command line, ``trust=True`` in Python.

Identifying a file (``picklescope inspect`` without ``--as``) never unpickles it and needs no trust.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

from picklescope.core.cache import cache_root
from picklescope.core.checksum import file_sha256  # noqa: F401 - re-exported: blobs and tests read it here
from picklescope.core.paths import DATA_DIR
from picklescope.core.safefile import blob_limit, check_file
from picklescope.errors import PicklescopeError

LEDGER = "written-by-picklescope.json"


def ledger_path() -> Path:
    """Where picklescope records the files it wrote: ``<cache>/written-by-picklescope.json``."""
    return cache_root() / LEDGER


def _read_ledger() -> dict[str, str]:
    try:
        data = json.loads(ledger_path().read_text())
    except (OSError, ValueError):
        return {}
    files = data.get("files") if isinstance(data, dict) else None
    return {str(k): str(v) for k, v in files.items()} if isinstance(files, dict) else {}


def record_written(paths: list[str | Path]) -> Path:
    """Record files picklescope just wrote (resolved path -> sha256), so loading them later needs no ``--trust``."""
    files = {k: v for k, v in _read_ledger().items() if os.path.isfile(k)}  # forget files that are gone
    for p in paths:
        rp = Path(p).resolve()
        files[str(rp)] = file_sha256(rp)
    target = ledger_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".ledger-", dir=target.parent)  # atomic: a reader never sees half a file
    with os.fdopen(fd, "w") as f:
        json.dump({"format": 1, "files": files}, f, indent=1)
    os.replace(tmp, target)
    return target


def why_trusted(path: str | Path) -> str | None:
    """Why ``path`` may be unpickled without ``--trust``, or None if nothing vouches for it."""
    p = Path(path).expanduser().resolve()
    if p.is_relative_to(DATA_DIR.resolve()):
        return "inside the project's data/ folder"
    recorded = _read_ledger().get(str(p))
    if recorded is not None and p.is_file() and file_sha256(p) == recorded:
        return "written by picklescope (recorded in its ledger with this sha256)"
    return None


def check_trusted(path: str | Path, trust: bool = False, what: str = "blob") -> Path:
    """``path`` resolved, if it may be unpickled; otherwise a PicklescopeError naming the file, why, and ``--trust``."""
    p = Path(path).expanduser().resolve()
    if p.is_dir():
        raise PicklescopeError(f"{path} is a directory, not a {what}", "give the path of a file inside it")
    check_file(p, what, blob_limit())  # not a FIFO, a device or a file over the blob limit
    if trust or why_trusted(p):
        return p
    raise PicklescopeError(
        f"refusing to unpickle {p}: a {what} is a pickle and loading it runs any code it names; only files in the "
        f"project's data/ folder ({DATA_DIR}) and files picklescope wrote itself (unchanged since) are loaded "
        "without asking",
        "pass --trust (Python: trust=True) if you know who wrote it; 'picklescope inspect FILE' identifies it "
        "without loading it")


# -- the one unpickler a trusted `workload from` may use ---------------------------------------------------
def _torch_dtypes() -> set[str]:
    names = ("float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
             "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64")
    return {f"torch.{n}" for n in names}


# Every global a trusted load may resolve: what pickling a tensor, a TensorDict, a numpy array or a dict
# of them names (read off real pickles with pickletools; torch 2.13, tensordict 0.10 / 0.15, numpy 2).
# Nothing here runs code chosen by the file: each is a constructor of plain data, and a tensor's storage
# (``torch.storage._load_from_bytes``, a torch.save archive in the pickle) is loaded by torch.load with
# weights_only=True. verl's DataProto is not on the list: its own __setstate__ loads torch mode with
# weights_only=False, and picklescope reads both of its modes without loading them anyway.
LOADABLE_GLOBALS: frozenset[str] = frozenset({
    "builtins.set", "builtins.frozenset", "builtins.slice", "builtins.complex", "collections.OrderedDict",
    "numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct", "numpy.ndarray", "numpy.dtype",
    "numpy._core.multiarray.scalar", "numpy.core.multiarray.scalar", "numpy._core.numeric._frombuffer",
    "numpy.core.numeric._frombuffer",
    "torch._utils._rebuild_tensor_v2", "torch._utils._rebuild_tensor_v3", "torch._utils._rebuild_parameter",
    "torch.Size", "torch.device", "torch.storage._load_from_bytes",
    "tensordict._reductions._make_td", "tensordict._reductions._rebuild_tensordict_files_consolidated",
    "tensordict._td.TensorDict",
} | _torch_dtypes())


def _storage_from_bytes(data: bytes) -> Any:
    """``torch.storage._load_from_bytes`` with ``weights_only=True``: a storage, or a refusal."""
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


class AllowListUnpickler(pickle.Unpickler):
    """An unpickler that resolves only :data:`LOADABLE_GLOBALS` and refuses every other name.

    Persistent ids (a torch.save archive's storages) are refused too: archives are read, never loaded.
    """

    def find_class(self, module: str, name: str) -> Any:
        full = f"{module}.{name}"
        if full not in LOADABLE_GLOBALS:
            raise PicklescopeError(f"the stream names {full}, which is not on the allow-list of a trusted load",
                                   "save the batch with DataProto.save_to_disk, torch.save or numpy.savez "
                                   "(docs/safe_loading.md)")
        if full == "torch.storage._load_from_bytes":
            return _storage_from_bytes
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise PicklescopeError("the stream refers to a persistent object (a torch.save archive's storage)",
                               "give the torch.save file itself: it is read without loading")


def load_allowed(f: Any) -> Any:
    """Unpickle ``f`` through :class:`AllowListUnpickler` (for a trusted load, in a child process)."""
    return AllowListUnpickler(f).load()
