"""Call one function in a fresh warm child process and get its (JSON-able) answer back.

Work on real verl that is not a two-sided measured run (the capability matrix, loading reference
blobs, diagnosing a blob) still has to happen in a child: verl must never be imported by the
caller, and one process holds one verl. The function is named by dotted path so the child imports
it itself; the child runs in the parent's environment of the moment it starts
(:func:`picklescope.measure.launcher.start`), so both sides see the same cache folder and verl
environments. A :class:`~picklescope.errors.PicklescopeError` raised in the child comes back as
the same one-line problem and hint.
"""

from __future__ import annotations

import importlib
import os
import traceback
from typing import Any

from picklescope.codecs.base import ModeMismatch
from picklescope.core.events import Error, Result
from picklescope.errors import PicklescopeError, UnsupportedCase
from picklescope.measure import launcher


def _entry(conn: Any, dotted: str, kwargs: dict[str, Any], env: dict[str, str]) -> None:
    os.environ.update(env)
    try:
        module, _, name = dotted.rpartition(".")
        result = getattr(importlib.import_module(module), name)(**kwargs)
        conn.send(Result(type="result", result=result))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
        ours = exc if isinstance(exc, PicklescopeError) else None
        mismatch = exc if isinstance(exc, ModeMismatch) else None
        conn.send(Error(type="error", exc_type=type(exc).__name__, message=str(exc),
                        problem=ours.problem if ours else None, hint=ours.hint if ours else None,
                        picklescope=ours is not None,
                        written_by=mismatch.written_by if mismatch else None,
                        read_by=mismatch.read_by if mismatch else None,
                        traceback=traceback.format_exc(limit=30)))


def call(dotted: str, timeout_s: float = 600.0, env: dict[str, str] | None = None, **kwargs: Any) -> Any:
    """Run ``dotted(**kwargs)`` in a warm child; return its result or raise its error here."""
    msg, exitcode = launcher.call_once(_entry, (dotted, kwargs, dict(env or {})),
                                       f"picklescope-{dotted.rsplit('.', 1)[-1]}", timeout_s, join_s=10)
    if msg is None:
        raise PicklescopeError(f"the child running {dotted} ended without an answer (exit code {exitcode})",
                               "run again with less data; the machine may be short of memory")
    if msg["type"] == "error":
        if msg["picklescope"]:
            raise _rebuild(msg)
        raise ChildError(dotted, msg["exc_type"], msg["message"], msg["traceback"])
    return msg["result"]


def _rebuild(msg: Error) -> PicklescopeError:
    """The child's PicklescopeError as the same class here (ModeMismatch keeps both modes)."""
    if msg["exc_type"] == "ModeMismatch":
        err: PicklescopeError = ModeMismatch.__new__(ModeMismatch)
        PicklescopeError.__init__(err, msg["problem"], msg["hint"] or "")
        err.written_by, err.read_by = msg["written_by"], msg["read_by"]  # type: ignore[attr-defined]
        return err
    if msg["exc_type"] == "UnsupportedCase":
        err = UnsupportedCase.__new__(UnsupportedCase)
        PicklescopeError.__init__(err, msg["problem"], msg["hint"] or "")
        return err
    return PicklescopeError(msg["problem"] or msg["message"], msg["hint"] or "")


class ChildError(RuntimeError):
    """An unexpected exception in the child, with the child's traceback."""

    def __init__(self, dotted: str, exc_type: str, message: str, tb: str) -> None:
        self.exc_type = exc_type
        self.child_traceback = tb
        super().__init__(f"{dotted} raised {exc_type}: {message}\n--- child traceback ---\n{tb}")
