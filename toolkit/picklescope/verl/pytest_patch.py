"""A pytest plugin that puts a candidate patch on verl's ``DataProto`` before tests run.

Used by :func:`picklescope.investigate.emit.run_emitted` to run an emitted regression test "on the
candidate" when the candidate is a patch file rather than a checkout: ``-p
picklescope.verl.pytest_patch`` with ``PICKLESCOPE_VERL_PATCH`` naming the file. The verl on the
path (``PYTHONPATH``) is imported here, then the patch's ``__getstate__`` / ``__setstate__`` replace
the class's, exactly as in a candidate run.
"""

from __future__ import annotations

import os
from typing import Any

from picklescope.verl.loader import apply_patch


def pytest_configure(config: Any) -> None:
    path = os.environ.get("PICKLESCOPE_VERL_PATCH")
    if not path:
        return
    import verl.protocol


    apply_patch(verl.protocol.DataProto, path)


def pytest_report_header(config: Any) -> str | None:
    path = os.environ.get("PICKLESCOPE_VERL_PATCH")
    return f"picklescope: DataProto patched by {path}" if path else None
