"""Imported last by the warm forkserver (see :data:`picklescope.measure.launcher.PRELOAD`): it adopts orphans,
and it removes its starter's multiprocessing folder when the starter was killed.

A side's descendant that starts its own session and outlives the side would otherwise be re-parented
to init and escape the run. As a subreaper, the forkserver adopts it instead, so the parent can still
find it among the forkserver's children (:meth:`picklescope.core.leftovers.RunTracker.end`, used where no
tracking cgroup can be made). The forkserver reaps every child it has; for an adopted one it would
warn "unexpected pid", which is expected here and silenced.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import warnings

from picklescope.core.leftovers import become_subreaper
from picklescope.measure.launcher import MP_TEMP_PREFIX


def _in_forkserver() -> bool:
    argv = getattr(sys, "orig_argv", None) or []
    return any("multiprocessing.forkserver" in a for a in argv)


def _gone(pid: int) -> bool:
    """The starter has died or is dying. The kernel closes a dying process's files (the end-of-file
    that ends this forkserver) before it re-parents its children, so ``getppid`` may not have changed
    yet; an empty file table already says the process is on its way out."""
    if os.getppid() != pid:
        return True
    try:
        return not os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return True


def _own_folder() -> tuple[str, int] | None:
    """The ``picklescope-mp-<pid>-*`` folder holding this forkserver's listening socket, and that pid
    (its starter's). Read from the socket itself: the starter may already be gone when this runs."""
    import socket


    for fd in range(3, 64):
        try:
            with socket.fromfd(fd, socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                name = sock.getsockname()
        except OSError:
            continue
        folder = os.path.dirname(name) if isinstance(name, str) else ""
        base = os.path.basename(folder)
        if base.startswith(MP_TEMP_PREFIX):
            pid = base[len(MP_TEMP_PREFIX):].split("-", 1)[0]
            if pid.isdigit():
                return folder, int(pid)
    return None


def _remove_starters_folder(folder: str, starter: int) -> None:
    """At the forkserver's exit: if the process that started it is gone (a SIGKILL gives it no chance to
    clean up), remove its ``picklescope-mp-<pid>-*`` folder now rather than at the next run's sweep."""
    if _gone(starter):
        shutil.rmtree(folder, ignore_errors=True)


if _in_forkserver():
    import gc


    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
    become_subreaper()
    _owned = _own_folder()
    if _owned is not None:
        atexit.register(_remove_starters_folder, *_owned)
    # Every object the preload made (torch, tensordict, numpy: a few hundred thousand) moves to the
    # permanent generation, so a child's gc.collect() (its set-up, its held-memory measurement) scans
    # only what the child itself made: about 0.35 s less per collection on two loaded cores, and the
    # collector no longer writes to the inherited pages (no copy-on-write copies of them in a child).
    gc.freeze()
