"""This test process's descendants, without the processes the suite shares between tests.

A test that checks that it left nothing running counts this process's descendants. The session's shared
Ray cluster (``ray_cluster`` in tests/conftest.py) is a descendant too, once any test of the same worker
asked for it: a ``ray start --block`` child and everything under it (gcs_server, raylet, agents, workers).
Those belong to the session, not to the test that looks, and the fixture checks itself that stopping them
leaves nothing. The fixture registers its ``ray start`` pid here, and the counts below leave that tree out.
"""

from __future__ import annotations

import psutil

_SHARED: set[int] = set()  # roots of process trees that session fixtures own


def share(pid: int) -> None:
    """Mark ``pid`` and everything under it as the session's, not a test's."""
    _SHARED.add(pid)


def unshare(pid: int) -> None:
    _SHARED.discard(pid)


def descendants() -> list[psutil.Process]:
    """This process's live descendants outside the session's shared trees."""
    me = psutil.Process()
    out = []
    for c in me.children(recursive=True):
        try:
            line = {c.pid, *(p.pid for p in c.parents())}
        except psutil.Error:  # ended while we looked: not left behind
            continue
        if not line & _SHARED:
            out.append(c)
    return out


def measured_processes() -> list[psutil.Process]:
    """Children of this process's children (the forkserver's forks, a run's sender and receiver): the
    measured processes, of which none may outlive its run."""
    me = psutil.Process().pid
    out = []
    for c in descendants():
        try:
            if c.ppid() != me:
                out.append(c)
        except psutil.Error:  # ended while we looked
            pass
    return out
