"""``picklescope workload from FILE``: a workload file from a user's own saved batch.

The batch is read without running anything in the file (:mod:`picklescope.workloads.saved_batch`), its
leaves become workload entries (:mod:`picklescope.workloads.schema`) and the file is written in the
format :mod:`picklescope.workloads.spec` reads. Values are never copied: the workload regenerates them
from its seed, so the file is only a description.

This module adds the one thing that needs a child process, and so sits with the investigations:
``--trust`` (``trust=True``) means "this file's own format needs code to load", nothing more: a plain
pickle of tensors, TensorDicts or numpy arrays is then loaded in a child through
:class:`picklescope.codecs.trust.AllowListUnpickler`, and only when every global the stream names is on
its allow-list. A torch archive, an ``.npz``, a verl DataProto, a polyglot and anything naming other
code are never loaded, with or without it (see docs/safe_loading.md).
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from picklescope.codecs.trust import LOADABLE_GLOBALS, load_allowed
from picklescope.core.safefile import open_bounded
from picklescope.errors import PicklescopeError, safe_text
from picklescope.verl import childcall
from picklescope.workloads.inert_records import NeedsCode, Refused
from picklescope.workloads.saved_batch import LIMITS, SAVED_BATCH_LIMIT, read_saved_batch
from picklescope.workloads.schema import Described, describe_live, to_yaml, workload_name, write_workload

__all__ = ["LIMITS", "SAVED_BATCH_LIMIT", "Described", "describe_file", "describe_live", "load_in_child", "to_yaml",
           "workload_name", "write_workload"]


def describe_file(path: str | os.PathLike, *, batch_dim: int | None = None, trust: bool = False) -> Described:
    """Describe FILE's batch without running anything in it (see :mod:`picklescope.workloads.saved_batch`).

    ``trust=True`` loads a plain pickle in a child process only when reading cannot describe it because
    its batch is built by code, and only when every global the stream names is on the allow-list of
    :data:`picklescope.codecs.trust.LOADABLE_GLOBALS` (see docs/safe_loading.md); every other file is read
    the same way with or without it, and anything naming other code is refused either way.
    """
    p = Path(path).expanduser()
    try:
        return read_saved_batch(p, batch_dim)[2]
    except NeedsCode as exc:
        shown = safe_text(str(p), 300)
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


# -- --trust: load in a child through the allow-list, describe the live objects ---------------------------
def _trusted_load(p: Path, batch_dim: int | None) -> Described:
    """Only for a plain pickle whose every global is on the allow-list (checked by the caller)."""
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
    return {k: v for k, v in asdict(d).items() if k != "loaded"}
