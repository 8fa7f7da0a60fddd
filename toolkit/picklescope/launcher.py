"""Warm, safe child processes.

A cold ``import torch, tensordict`` costs 8-10 s, and ``fork()`` of a process that has already run a
parallel torch op (a Jupyter kernel always has) can deadlock the child in OpenMP. So children come
from a forkserver that has only imported torch and tensordict and never computed: about 0.5 s per
child after a few seconds for the first start, whatever the parent did before.

Unlike plain ``multiprocessing``, the children never re-run the parent's ``__main__`` (a script
without a ``__main__`` guard, or a notebook), because the measured code lives in this package.
"""

from __future__ import annotations

import threading
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, spawn
from typing import Any

PRELOAD = ["torch", "tensordict", "numpy", "picklescope.child"]
_lock = threading.Lock()
_preload_set = False


class _Popen(popen_forkserver.Popen):
    """Forkserver launch without the parent's ``__main__`` in the child's preparation data."""

    def _launch(self, process_obj: Any) -> None:
        original = spawn.get_preparation_data

        def without_main(name: str) -> dict[str, Any]:
            data = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        with _lock:
            spawn.get_preparation_data = without_main
            try:
                super()._launch(process_obj)
            finally:
                spawn.get_preparation_data = original


class ChildProcess(mp_context.ForkServerProcess):
    """A process forked from the warm forkserver (torch and tensordict already imported)."""

    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:  # noqa: N802 - multiprocessing's name
        return _Popen(process_obj)


def ensure_preload() -> None:
    """Tell the forkserver what to import before it first starts (once per parent process)."""
    global _preload_set
    if not _preload_set:
        forkserver.set_forkserver_preload(PRELOAD)
        _preload_set = True


def start(target: Any, args: tuple, name: str) -> tuple[ChildProcess, Any]:
    """Start ``target(child_conn, *args)`` in a warm child; returns (process, parent end of pipe)."""
    ensure_preload()
    parent_end, child_end = mp_context._default_context.get_context("forkserver").Pipe()
    p = ChildProcess(target=target, args=(child_end, *args), name=name, daemon=True)
    p.start()
    child_end.close()
    return p, parent_end


def call_once(target: Any, args: tuple, name: str, timeout_s: float, join_s: float = 5.0) -> tuple[Any, int | None]:
    """Run ``target(child_conn, *args)`` in a warm child and wait for its one answer.

    Returns (the message, or None if the child died or ``timeout_s`` passed; the child's exit code).
    The child is always gone when this returns: joined, or killed if it outlived ``join_s``.
    """
    proc, conn = start(target, args, name)
    msg = None
    try:
        if conn.poll(timeout_s):
            msg = conn.recv()
    except (EOFError, OSError):
        msg = None
    finally:
        proc.join(timeout=join_s)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)
        conn.close()
    return msg, proc.exitcode
