"""``picklescope capabilities``: which codec can carry which kind of leaf, each cell checked.

Prints the codec x feature matrix built by :func:`picklescope.investigate.capabilities.capability_matrix` from the
codecs' own declarations, with every cell verified on a tiny example in this process. ``--markdown``
prints the page kept in ``docs/capabilities.md``. Exit status 1 when a cell does not hold (a "yes"
that is not exact, a "no" that would have worked): that is a codec bug, not a user error.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from picklescope.cli.commands.common import print_json
from picklescope.codecs import get_codec
from picklescope.investigate.capabilities import capability_matrix, inconsistent, render_markdown, render_text

ORDER = 7


def register(sub: Any) -> None:
    p = sub.add_parser("capabilities", help="which codec carries which leaf kind (declared, then checked)")
    p.add_argument("--codec", action="append", default=None, metavar="NAME",
                   help="a codec to include (repeatable); default: the built-in codecs")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--markdown", action="store_true", help="print the Markdown page (docs/capabilities.md)")
    fmt.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("--no-verify", action="store_true", help="only the declarations: skip the round trips")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    for name in args.codec or []:
        get_codec(name)  # an unknown name fails here, listing the known ones
    rows = capability_matrix(args.codec, verify=not args.no_verify)
    if args.json:
        print_json(rows)
    elif args.markdown:
        sys.stdout.write(render_markdown(rows))
    else:
        sys.stdout.write(render_text(rows))
    bad = inconsistent(rows)
    if bad:
        print(f"picklescope: {len(bad)} cell(s) disagree with the codec's declarations (marked (!))", file=sys.stderr)
        return 1
    return 0
