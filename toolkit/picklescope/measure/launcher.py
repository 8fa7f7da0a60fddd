"""Warm, safe child processes.

A cold ``import torch, tensordict`` costs 8-10 s, and ``fork()`` of a process that has already run a
parallel torch op (a Jupyter kernel always has) can deadlock the child in OpenMP. So children come
from a forkserver that has only imported torch and tensordict and never computed: about 0.5 s per
child after a few seconds for the first start, whatever the parent did before.

Unlike plain ``multiprocessing``, the children never re-run the parent's ``__main__`` (a script
without a ``__main__`` guard, or a notebook), because the measured code lives in this package.
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from multiprocessing import context as mp_context
from multiprocessing import forkserver, popen_forkserver, spawn, util
from typing import Any

from picklescope.core.events import Release
from picklescope.core.leftovers import become_subreaper, temp_name
from picklescope.core.paths import torch_cache_env

PRELOAD = ["torch", "tensordict", "numpy", "picklescope.measure.child", "picklescope.measure.forkserver_setup"]
_lock = threading.Lock()
_preload_set = False
_started: dict[int, ChildProcess] = {}  # pid -> every child this process had the forkserver start, while it lives


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
            if self.pid is not None:
                _started[self.pid] = process_obj


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

        become_subreaper()  # a descendant that starts its own session stays in this tree (see RunTracker)
        try:  # the forkserver (and so our starter) may have ended before the request took effect
            os.kill(self._parent_pid, 0)
        except ProcessLookupError:
            os._exit(1)
        super().run()


def started_pids() -> set[int]:
    """The pids of this process's own children that are still running, read under the launch lock.

    A child forked for another thread's run is in this set from the moment its pid is known, so a run's
    clean-up that looks for orphans adopted by the forkserver never mistakes it for one (runs may go on
    side by side, e.g. ``reproduce``'s Ray rows beside its in-process matrix)."""
    with _lock:
        for pid, proc in list(_started.items()):
            if proc.exitcode is not None or proc._popen is None:  # multiprocessing's own check, no reaping
                _started.pop(pid, None)
        return set(_started)


def ensure_preload() -> None:
    """Tell the forkserver what to import before it first starts (once per parent process)."""
    global _preload_set
    if not _preload_set:
        forkserver.set_forkserver_preload(PRELOAD)
        _preload_set = True


def collect_like_a_fresh_process() -> None:
    """Give this child's garbage collector the preloaded heap back (the forkserver froze it).

    A frozen heap makes a child's ``gc.collect()`` cheap, but it also makes full collections frequent:
    CPython runs one only when the objects promoted since the last one exceed a quarter of those it
    found then, and frozen objects are not counted. A long-lived process such as verl's driver, with
    torch and Ray loaded, has a large old generation, so its full collections are rare and a cycle
    that reaches it (the legacy codec's discarded copy) can stay for many training steps. Children
    that run many steps under Python's default collector (the node's driver, a measured cell) call
    this first, so their collector behaves as it would in that process. A one-serialization side
    keeps the frozen heap: a young collection frees what it makes either way.
    """
    gc.unfreeze()


MP_TEMP_PREFIX = "picklescope-mp-"


def _own_mp_tempdir() -> None:
    """Give ``multiprocessing`` a picklescope-named temp folder before it makes its own ``/tmp/pymp-*``.

    The forkserver's socket lives in that folder. ``multiprocessing`` removes it at a normal exit, but
    a parent killed with SIGKILL leaves it, and nothing would ever sweep a ``pymp-*`` name; a
    ``picklescope-mp-<pid>-*`` one is removed by the next run's sweep once that pid is gone
    (:func:`picklescope.core.leftovers.sweep_orphans`). A process that already has a folder keeps it.
    """
    import shutil
    import tempfile
    from multiprocessing import process, util


    config = process.current_process()._config
    if config.get("tempdir"):
        return
    path = tempfile.mkdtemp(prefix=temp_name(MP_TEMP_PREFIX))
    config["tempdir"] = path
    util.Finalize(None, shutil.rmtree, args=(path,), kwargs={"ignore_errors": True}, exitpriority=-100)


def _warm_start() -> dict[str, str]:
    """Start the forkserver (if it is not running) with SIGINT ignored, so a Ctrl-C while it imports
    torch does not print its traceback; its children inherit the same, and the parent ends them. Only
    the new process ignores it (:func:`_spawn_ignoring_sigint`): this one keeps its handler throughout, so
    a Ctrl-C that arrives while the forkserver starts still ends the command.

    The forkserver starts with torch's cache folder inside the ``multiprocessing`` temp folder
    (:func:`picklescope.core.paths.torch_cache_env`): importing tensordict creates it, and every child
    and Ray process inherits the setting, so nothing named ``torchinductor_*`` is left in ``TMPDIR``.
    Only the forkserver's environment gets it; the caller's own stays as it was. Returns that setting,
    which every child the forkserver starts keeps (:func:`start`)."""
    from multiprocessing import process

    _own_mp_tempdir()
    fs = forkserver._forkserver
    extra = torch_cache_env(process.current_process()._config["tempdir"])
    with _environment(extra):
        if fs._forkserver_pid is not None:
            fs.ensure_running()
            return extra
        with _spawn_ignoring_sigint(own_session=_in_kernel()):
            fs.ensure_running()
    return extra


def _in_kernel() -> bool:
    """Whether this process is a running Jupyter kernel (ipykernel's application initialized).

    A kernel's shutdown sends SIGTERM to every child in its process group and waits for each to go, but
    nothing reaps a forkserver or resource tracker that SIGTERM ends: they stay zombies, which it counts as
    alive, so a restart or shutdown takes about 30 s, or Jupyter kills the kernel first and its
    ``picklescope-mp-*`` folder stays until the next run's sweep. Started in a session of their own, they
    are no children of the kernel's group; both end by themselves when the kernel's end of their pipe closes."""
    app = sys.modules.get("ipykernel.kernelapp")
    return bool(app is not None and app.IPKernelApp.initialized())


_SH = "/bin/sh"


@contextlib.contextmanager
def _spawn_ignoring_sigint(own_session: bool = False) -> Iterator[None]:
    """Processes ``multiprocessing`` starts meanwhile (the forkserver, its resource tracker) begin with
    SIGINT ignored, and with ``own_session`` in a session of their own (see :func:`_in_kernel`: their
    ``-c`` code calls ``os.setsid()`` first).

    It starts them with ``util.spawnv_passfds`` (fork, then exec). An exec keeps an ignored signal
    ignored, so each goes through ``sh -c 'trap "" INT; exec ...'`` (the same pid, the same file
    descriptors). Ignoring SIGINT in this process around the start instead would drop a Ctrl-C that
    arrives meanwhile: with other threads running, the kernel hands it to one of them, which ignores it,
    and the command would run on as if never interrupted."""
    original = util.spawnv_passfds
    if not os.path.exists(_SH):
        yield
        return

    def spawn(path: str | bytes, args: list[str], passfds: Any) -> int:
        args = list(args)
        if own_session and "-c" in args[:-1]:
            code = args.index("-c") + 1
            args[code] = "import os; os.setsid(); " + args[code]
        return original(os.fsencode(_SH), [_SH, "-c", 'trap "" INT; exec "$0" "$@"', os.fsdecode(path), *args[1:]],
                        passfds)

    util.spawnv_passfds = spawn
    try:
        yield
    finally:
        util.spawnv_passfds = original


@contextlib.contextmanager
def _environment(extra: dict[str, str]) -> Iterator[None]:
    """``extra`` in ``os.environ`` while the block runs (a process started inside inherits it)."""
    saved = {k: os.environ.get(k) for k in extra}
    os.environ.update(extra)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def warm_up() -> int | None:
    """Start the forkserver now if it is not running (it imports torch and tensordict); returns its pid."""
    ensure_preload()
    _warm_start()
    return forkserver_pid()


def _in_environment(conn: Any, env: dict[str, str], target: Any, *args: Any) -> Any:
    """A child's entry: the environment its parent had when it started the child, then ``target``.

    The forkserver's own environment is the one its parent had when the forkserver started, which may be
    long before (a kernel's first run) and under other settings: a ``PICKLESCOPE_CACHE`` set for one call
    (a test's, a notebook cell's) stayed in every later child, which then looked for verl's installed
    versions in that folder and named them unknown codecs. A child started now gets the environment of
    now, as a child spawned afresh would."""
    os.environ.clear()
    os.environ.update(env)
    return target(conn, *args)


def start(target: Any, args: tuple, name: str) -> tuple[ChildProcess, Any]:
    """Start ``target(child_conn, *args)`` in a warm child; returns (process, parent end of pipe). The child
    runs in the caller's environment of this moment (:func:`_in_environment`), torch's cache folder as the
    forkserver's (:func:`_warm_start`)."""
    ensure_preload()
    env = {**os.environ, **_warm_start()}
    parent_end, child_end = mp_context._default_context.get_context("forkserver").Pipe()
    p = ChildProcess(target=_in_environment, args=(child_end, env, target, *args), name=name, daemon=True)
    # A Ctrl-C or SIGTERM between the forkserver's fork and our learning the pid (the first start waits
    # for the forkserver to import torch) would leave a child nobody knows about, which then prints a
    # traceback when its run folder disappears. Both are held back until p knows its pid, then handed
    # to the handler they were meant for, inside the block that ends p.
    held: list[int] = []
    previous = _hold_signals(held)
    try:
        try:
            p.start()
        finally:
            _release_signals(previous, held)
    except BaseException:  # Ctrl-C between the fork and our return: the caller never sees p, so end it here
        if getattr(p, "_popen", None) is not None:
            p.kill()
            p.join(timeout=5)
        parent_end.close()
        raise
    finally:
        child_end.close()
    return p, parent_end


def _hold_signals(held: list[int]) -> dict[int, Any]:
    """Replace the SIGINT/SIGTERM handlers with ones that only record the signal (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.signal(sig, lambda signum, frame: held.append(signum)) for sig in (signal.SIGINT,
                                                                                            signal.SIGTERM)}


def _release_signals(previous: dict[int, Any], held: list[int]) -> None:
    """Put the handlers back, then act on a signal that arrived meanwhile as its handler would have."""
    for sig, handler in previous.items():
        signal.signal(sig, handler)
    for sig in dict.fromkeys(held):
        handler = previous.get(sig)
        if callable(handler):
            handler(sig, None)  # e.g. KeyboardInterrupt, or the CLI's Terminated
        elif handler == signal.SIG_DFL:
            signal.raise_signal(sig)


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
        end(proc, conn, join_s)
    return msg, proc.exitcode


def end(proc: ChildProcess, conn: Any, wait_s: float = 5.0, *, release: bool = False) -> int | None:
    """End a child of :func:`start`: with ``release``, tell it its run is over (the Release event) first;
    give it ``wait_s`` to end on its own, then kill it; close its pipe. Returns its exit code.

    The one ending of a measured child, whatever ran it (a pair's side, a cell, a Ray driver): a child
    that ignored its release or hung is never left running."""
    if release:
        try:
            conn.send(Release(type="release"))
        except (OSError, BrokenPipeError):
            pass
    proc.join(timeout=wait_s)
    if proc.is_alive():
        proc.kill()
        proc.join(timeout=5)
    conn.close()
    return proc.exitcode


def shutdown(wait_s: float = 10.0) -> list[int]:
    """Stop the warm forkserver and the resource tracker ``multiprocessing`` started with it.

    Both otherwise live exactly as long as this process. Whatever must prove it left no process
    behind (the test session, see :mod:`picklescope.measure.pytest_leftovers`) stops them first. A child still
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
    _drop_mp_tempdir()
    return stuck


def _drop_mp_tempdir() -> None:
    """Remove the folder :func:`_own_mp_tempdir` made (the forkserver is gone); the next start makes a new one."""
    import shutil
    from multiprocessing import process

    config = process.current_process()._config
    path = config.get("tempdir")
    if path and os.path.basename(path).startswith(MP_TEMP_PREFIX):
        shutil.rmtree(path, ignore_errors=True)
        config.pop("tempdir", None)


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
