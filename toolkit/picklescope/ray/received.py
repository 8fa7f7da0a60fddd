"""Where a received tensor's bytes live: the receiver's own copy, or the object store everyone reads.

``ray.get`` hands numpy arrays back zero-copy: they point into the shared-memory object store and
numpy marks them read-only. The flag is advisory: Ray maps the store read-write in every worker, and
``torch.from_numpy`` or ``torch.frombuffer`` on such an array (with a warning at most) gives a tensor
that torch lets you write in place; the write then changes the stored object for every reader,
including the next ``ray.get`` of the same ref in any process. A codec that copies (verl's numpy
mode into a ``bytearray``, ``torch.load``) is safe and pays memory for it. This module tells the two
apart per leaf from facts, not from the codec's name: the address range each tensor's storage sits
in, looked up in ``/proc/self/maps`` (path and permissions).
"""

from __future__ import annotations

import bisect
from typing import Any

from picklescope.codecs.base import iter_leaves

COPIED = "copied"  # private memory of the receiver
SHARED = "shared"  # inside the object store (or another shared mapping), writable
READ_ONLY = "read-only"  # inside a mapping without write permission (a write would crash)


def _maps() -> list[tuple[int, int, str, str]]:
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi, parts[1], parts[5].strip() if len(parts) > 5 else ""))
    return out


def _storage(t: Any) -> tuple[int, int]:
    """(address, bytes) of the memory holding a tensor's data (a nested tensor: its buffer)."""
    import torch

    if t.is_nested and t.layout == torch.jagged:
        t = t.values()
    try:
        st = t.untyped_storage()
        return st.data_ptr(), st.nbytes()
    except (RuntimeError, NotImplementedError):  # a layout without one storage: its first component
        parts = t.unbind()
        return (_storage(parts[0])[0], sum(p.numel() * p.element_size() for p in parts)) if parts else (0, 0)


def _key(name: str) -> Any:
    return tuple(name.split(".")) if "." in name else name


def classify(ptr: int, maps: list[tuple[int, int, str, str]], store_hint: str = "plasma") -> dict[str, Any]:
    """Status of the memory at ``ptr``: copied, shared (and where) or read-only."""
    starts = [m[0] for m in maps]
    i = bisect.bisect_right(starts, ptr) - 1
    if i < 0 or ptr >= maps[i][1]:
        return {"status": COPIED, "writable": True, "region": "unmapped"}
    lo, hi, perms, path = maps[i]
    writable = "w" in perms
    if perms[3:4] == "s" or store_hint in path:
        region = "object store" if store_hint in path else (path or "shared anonymous")
        return {"status": SHARED if writable else READ_ONLY, "writable": writable, "region": region}
    if not writable:
        return {"status": READ_ONLY, "writable": False, "region": path or "private read-only"}
    return {"status": COPIED, "writable": True, "region": path or "anonymous"}


def inspect(batch: Any) -> dict[str, Any]:
    """Per tensor leaf of a received :class:`~picklescope.batch.Batch`: copied, shared or read-only."""
    out: dict[str, Any] = {"leaves": {}, "status": None, "shared_bytes": 0, "copied_bytes": 0}
    td = getattr(batch, "batch", None)
    if td is None:
        out["status"] = "no tensors"
        return out
    maps = _maps()
    statuses = set()
    counted: set[int] = set()  # leaves of a consolidated TensorDict share one storage: count it once
    for name, value, feats in iter_leaves(td):
        if "sub-tensordict" in feats:
            continue
        ptr, nbytes = _storage(value)
        info = classify(ptr, maps) if ptr else {"status": COPIED, "writable": True, "region": "empty"}
        info["bytes"] = int(nbytes)
        out["leaves"][name] = info
        statuses.add(info["status"])
        if ptr not in counted:
            counted.add(ptr)
            out["copied_bytes" if info["status"] == COPIED else "shared_bytes"] += int(nbytes)
    out["status"] = statuses.pop() if len(statuses) == 1 else ("mixed" if statuses else "no tensors")
    return out


def probe_hazard(batch: Any, report: dict[str, Any], read_again: Any) -> dict[str, Any]:
    """Write one byte in place into the first shared leaf and read the object again, as another reader.

    ``read_again()`` must return a fresh :class:`Batch` deserialized from the same stored object
    (the put path's ``ray.get(ref)``). The byte is restored afterwards. Returns what happened.
    """
    import torch

    name = next((n for n, i in report["leaves"].items() if i["status"] == SHARED), None)
    if name is None:
        why = ("no received tensor points into a writable shared mapping: in-place writes stay private"
               if report.get("status") != READ_ONLY else "shared leaves are read-only: a write would crash")
        return {"probed": False, "reason": why}
    leaf = batch.batch.get(_key(name))
    flat = leaf.reshape(-1).view(torch.uint8)
    before = int(flat[0])
    flat[0] = (before + 1) % 256
    try:
        again = read_again()
        seen = int(again.batch.get(_key(name)).reshape(-1).view(torch.uint8)[0])
    finally:
        flat[0] = before
    return {"probed": True, "leaf": name, "wrote": (before + 1) % 256, "other_reader_saw": seen,
            "visible_to_other_readers": seen == (before + 1) % 256}
