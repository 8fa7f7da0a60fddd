"""Shared fixtures: the payload-relative checks every test of a measured run needs."""

from __future__ import annotations

import os

import pytest

# After the last test: no process and no temporary of the session may be left (fails the session).
from picklescope.measure.pytest_leftovers import pytest_sessionfinish, pytest_sessionstart  # noqa: F401

os.environ.setdefault("RAY_AUTH_MODE", "disabled")


@pytest.fixture(scope="session")
def flowgrpo_quarter():
    """Every built-in codec over both in-process transports on flowgrpo x0.25, measured once."""
    from picklescope.investigate.reproduce import matrix

    inv = matrix("flowgrpo", 0.25)
    return {(r.codec, r.transport): r for r in inv.results}
