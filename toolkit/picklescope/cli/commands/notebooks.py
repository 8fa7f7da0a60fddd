"""``picklescope notebooks DIR``: copy the notebooks into a folder of the user's own (no clone needed)."""

from __future__ import annotations

import argparse
from typing import Any

from picklescope.core.paths import copy_notebooks

ORDER = 70


def register(sub: Any) -> None:
    p = sub.add_parser("notebooks", help="copy the notebooks (jupytext .py files) into a folder of yours")
    p.add_argument("dir", help="folder to copy them into (made if missing)")
    p.add_argument("--force", action="store_true", help="replace notebooks of the same name that differ")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    written = copy_notebooks(args.dir, force=args.force)
    print(f"{len(written)} file(s) copied into {args.dir}" if written else f"{args.dir} already holds these notebooks")
    print(f"open them with: picklescope lab {args.dir}")
    return 0
