"""Shared fixtures: the payload-relative checks every test of a measured run needs."""

from __future__ import annotations

import os
import subprocess
import sys

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


@pytest.fixture(scope="session")
def verl_envs():
    """verl 0.9.0 and 0.9.1 from PyPI through the CLI (a no-op when already in the cache), {label: env}.

    Every test of real verl asks for this rather than skipping when the cache is empty: on a fresh
    machine the cache is empty until the first of them runs, and a skip would hide the check."""
    p = subprocess.run([sys.executable, "-m", "picklescope", "verl", "install", "0.9.0", "0.9.1"],
                       capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stderr
    from picklescope.verl import envs

    found = {e.label: e for e in envs.installed() if e.label in ("0.9.0", "0.9.1")}
    assert set(found) == {"0.9.0", "0.9.1"}, found
    return found
