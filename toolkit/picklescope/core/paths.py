"""Where the project's ``data/`` and ``notebooks/`` folders are, wherever the package is imported from.

They belong to the checkout, not to the package: the supported install is editable (``python3 dev.py``),
so the folders are found by walking up from the package to the folder that holds ``pyproject.toml``.
``PICKLESCOPE_PROJECT`` names a checkout explicitly, for a package installed elsewhere (a wheel).
"""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parents[1]


def project_folder(name: str) -> Path:
    """The project's folder ``name`` (``data`` or ``notebooks``); see the module docstring for the search."""
    env = os.environ.get("PICKLESCOPE_PROJECT")
    if env:
        return Path(env).expanduser().resolve() / name
    for up in _PACKAGE.parents:
        if (up / "pyproject.toml").is_file() and (up / name).is_dir():
            return up / name
    return _PACKAGE.parents[1] / name
