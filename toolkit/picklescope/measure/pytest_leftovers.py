"""A pytest plugin: the session fails if any process or temporary file outlived the tests.

Used by picklescope's own suite (``tests/conftest.py`` imports these hooks) and usable by any suite
that runs picklescope: ``pytest -p picklescope.measure.pytest_leftovers``. At the start it marks the session
(:func:`picklescope.core.leftovers.begin`); after the last test it stops the warm forkserver (the one
long-lived child a session is allowed), then looks for every process and temporary of the session
that is still there (:func:`picklescope.core.leftovers.check`). Anything found is printed with its pid and
command line or its path, the session's exit status becomes non-zero, and the leftovers are then
ended so they do not outlive the report (set ``PICKLESCOPE_KEEP_LEFTOVERS=1`` to keep them).

Under pytest-xdist (``-n``) the controller marks the session before it starts its workers, so every
worker and everything a worker starts carries the one marker; each worker stops its own forkserver,
and the controller checks once, after the last worker has ended. A worker checking on its own would
see another worker's run in progress (a hand-off file whose creator has just exited) as a leftover,
and remove it.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from picklescope.core import leftovers
from picklescope.measure import launcher

_KEY = pytest.StashKey[Any]()


def _is_xdist_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")  # what pytest-xdist gives a worker's config, and only a worker's


def pytest_sessionstart(session: pytest.Session) -> None:
    if _is_xdist_worker(session.config):
        return  # the controller's marker is already in this worker's environment
    session.config.stash[_KEY] = leftovers.begin()


def _say(session: pytest.Session, line: str, red: bool = False) -> None:
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(line, red=red, bold=red)
    else:
        print(line, file=sys.stderr)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if _is_xdist_worker(session.config):
        launcher.shutdown()  # the worker's warm forkserver; the controller checks for the rest
        return
    snap = session.config.stash.get(_KEY, None)
    if snap is None:
        return

    launcher.shutdown()
    report = leftovers.check(snap)
    _say(session, "")
    for note in report.notes:
        _say(session, f"leftover check note: {note}")
    if report.ok:
        _say(session, report.summary())
        return
    _say(session, report.summary() + " - the session FAILS:", red=True)
    for x in report.leftovers:
        _say(session, f"  left behind: {x}", red=True)
    if not os.environ.get("PICKLESCOPE_KEEP_LEFTOVERS"):
        failed = leftovers.clean(report)
        _say(session, "  (ended and removed after this report" + (f"; could not: {failed})" if failed else ")"))
    if session.exitstatus == 0:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
