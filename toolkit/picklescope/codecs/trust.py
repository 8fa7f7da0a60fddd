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

import hashlib
import json
import os
import tempfile
from pathlib import Path

from picklescope.errors import PicklescopeError
from picklescope.workloads.spec import DATA_DIR

LEDGER = "written-by-picklescope.json"


def ledger_path() -> Path:
    """Where picklescope records the files it wrote: ``<cache>/written-by-picklescope.json``."""
    from picklescope.verl.envs import cache_root

    return cache_root() / LEDGER


def file_sha256(path: str | os.PathLike) -> str:
    """The file's sha256, read in 1 MiB chunks (blobs may be large); every file checksum in the toolkit."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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
    from picklescope.core.safefile import blob_limit, check_file

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
