"""Imported last by the warm forkserver (see :data:`picklescope.launcher.PRELOAD`): it adopts orphans.

A side's descendant that starts its own session and outlives the side would otherwise be re-parented
to init and escape the run. As a subreaper, the forkserver adopts it instead, so the parent can still
find it among the forkserver's children (:meth:`picklescope.leftovers.RunTracker.end`, used where no
tracking cgroup can be made). The forkserver reaps every child it has; for an adopted one it would
warn "unexpected pid", which is expected here and silenced.
"""

from __future__ import annotations

import sys
import warnings


def _in_forkserver() -> bool:
    argv = getattr(sys, "orig_argv", None) or []
    return any("multiprocessing.forkserver" in a for a in argv)


if _in_forkserver():
    from .leftovers import become_subreaper

    warnings.filterwarnings("ignore", message="forkserver: waitpid returned unexpected pid")
    become_subreaper()
