"""The ``picklescope`` command: one subcommand per module in :mod:`picklescope.commands`.

Each command module defines ``register(subparsers)`` and a handler; adding a command means adding a
file. Errors the user can fix end with one line on stderr and exit status 2; ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import traceback
from collections.abc import Sequence

from .errors import PicklescopeError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors also exit 2, in our one-line style
        raise PicklescopeError(message, f"see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="picklescope", description="What serializing a training batch costs in host memory.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    from . import commands

    mods = [importlib.import_module(f"{commands.__name__}.{m.name}") for m in pkgutil.iter_modules(commands.__path__)]
    for mod in sorted(mods, key=lambda m: getattr(m, "ORDER", 100)):
        mod.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            parser.print_help()
            return 2
        return int(args.func(args) or 0)
    except PicklescopeError as exc:
        if debug:
            traceback.print_exc()
        print(f"picklescope: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("picklescope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
