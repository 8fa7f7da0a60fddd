"""Warm, safe child processes.

A cold ``import torch, tensordict`` costs 8-10 s, and ``fork()`` of a process that has already run a
parallel torch op (a Jupyter kernel always has) can deadlock the child in OpenMP. So children come
from a forkserver that has only imported torch and tensordict and never computed: about 0.5 s per
child after a few seconds for the first start, whatever the parent did before.

Unlike plain ``multiprocessing``, the children never re-run the parent's ``__main__`` (a script
without a ``__main__`` guard, or a notebook), because the measured code lives in this package.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
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


PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when the process that forked it ends (Linux).

    A child's parent is the forkserver, which ends when the process that started it ends, however it
    ended (SIGKILL, a closed terminal, a crashed kernel). Without this, a child busy in a long step
    (or hung) would outlive everyone who could end it. Returns False where it is not available.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _let_go_of_forkserver() -> None:
    """Close this child's copy of the pipe that keeps the forkserver alive.

    ``multiprocessing`` hands every forkserver child the write end of the pipe whose end-of-file tells
    the forkserver that its starter is gone. A child busy in a long step would then keep the forkserver
    alive after our parent died, and the forkserver would keep the child alive (its death signal never
    fires). Our children never ask the forkserver for children of their own, so they let go of it.
    """
    fd = getattr(forkserver._forkserver, "_forkserver_alive_fd", None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
        forkserver._forkserver._forkserver_alive_fd = None


class ChildProcess(mp_context.ForkServerProcess):
    """A process forked from the warm forkserver (torch and tensordict already imported)."""

    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:  # noqa: N802 - multiprocessing's name
        return _Popen(process_obj)

    def run(self) -> None:
        die_with_parent()
        _let_go_of_forkserver()
        try:  # the forkserver (and so our starter) may have ended before the request took effect
            os.kill(self._parent_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        super().run()


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
    try:
        p.start()
    except BaseException:  # Ctrl-C between the fork and our return: the caller never sees p, so end it here
        if getattr(p, "_popen", None) is not None:
            p.kill()
            p.join(timeout=5)
        parent_end.close()
        raise
    finally:
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


def shutdown(wait_s: float = 10.0) -> list[int]:
    """Stop the warm forkserver and the resource tracker ``multiprocessing`` started with it.

    Both otherwise live exactly as long as this process. Whatever must prove it left no process
    behind (the test session, see :mod:`picklescope.pytest_leftovers`) stops them first. A child still
    running dies with the forkserver (:func:`die_with_parent`); the next run starts a fresh forkserver.
    Unlike ``multiprocessing``'s own stop, the wait is bounded: returns the pids that did not end
    within ``wait_s`` (a leftover holding the tracker's pipe keeps the tracker alive), for the caller
    to report.
    """
    from multiprocessing import resource_tracker, util

    stuck = []
    fs = forkserver._forkserver
    with fs._lock:
        if fs._forkserver_pid is not None:
            if not _close_and_reap(fs._forkserver_alive_fd, fs._forkserver_pid, wait_s):
                stuck.append(fs._forkserver_pid)
            address = fs._forkserver_address
            if address and not util.is_abstract_socket_namespace(address):
                try:
                    os.unlink(address)
                except OSError:
                    pass
            fs._forkserver_alive_fd = fs._forkserver_pid = fs._forkserver_address = None
    rt = resource_tracker._resource_tracker
    with rt._lock:
        if rt._pid is not None:
            if not _close_and_reap(rt._fd, rt._pid, wait_s):
                stuck.append(rt._pid)
            rt._fd = rt._pid = None
    return stuck


def forkserver_pid() -> int | None:
    """The running forkserver's pid (None before the first child): who forked the measured children."""
    return forkserver._forkserver._forkserver_pid


def _close_and_reap(alive_fd: int | None, pid: int, wait_s: float) -> bool:
    """Close the pipe whose end-of-file stops a helper process, then reap it; False if it outlived ``wait_s``."""
    if alive_fd is not None:
        try:
            os.close(alive_fd)
        except OSError:
            pass
    deadline = time.monotonic() + wait_s
    while True:
        try:
            done, _ = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            return True
        if done:
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
