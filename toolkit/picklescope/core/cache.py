"""The user's picklescope cache (installed verl versions, the trust ledger, fitted predictions).

It sits in core because codecs, the trust rules, the verl installer and the predictor all name
folders inside it: one definition below all of them keeps each of them from importing another.
"""

from __future__ import annotations

import os
from pathlib import Path

CACHE_ENV = "PICKLESCOPE_CACHE"


def cache_root() -> Path:
    """The picklescope cache: ``$PICKLESCOPE_CACHE``, else ``$XDG_CACHE_HOME/picklescope`` or ``~/.cache``."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base).resolve() / "picklescope"


def cache_problem() -> str | None:
    """Why the verl cache cannot be used at all (None if it can, or simply holds nothing yet).

    A codec name such as ``verl-0.9.0:numpy`` is only known when its version is installed in the
    cache, so an unusable cache would otherwise surface as "unknown codec": this names the folder.
    """
    root = cache_root()
    where = f"{root} (from ${CACHE_ENV})" if os.environ.get(CACHE_ENV) else str(root)
    for path in (root, root / "verl"):
        if not path.exists():
            return f"the picklescope cache {where} does not exist" if path == root and os.environ.get(CACHE_ENV) \
                else None
        if not path.is_dir():
            return f"the picklescope cache {where}: {path} is not a folder"
        if not os.access(path, os.R_OK | os.X_OK):
            return f"the picklescope cache {where}: {path} cannot be read"
    return None
