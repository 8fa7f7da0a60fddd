"""The ``picklescope`` command: one subcommand per module in :mod:`picklescope.cli.commands`.

Each command module defines ``register(subparsers)`` and a handler; adding a command means adding a
file. Errors the user can fix end with one line on stderr and exit status 2; ``--debug`` shows the
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import re
import signal
import sys
import threading
import traceback
from collections.abc import Sequence

from picklescope.errors import PicklescopeError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors also exit 2, in our one-line style
        raise PicklescopeError(message, f"see '{self.prog} --help'")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="picklescope", description="What serializing a training batch costs in host memory.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    from picklescope.cli import commands

    mods = [importlib.import_module(f"{commands.__name__}.{m.name}") for m in pkgutil.iter_modules(commands.__path__)]
    for mod in sorted(mods, key=lambda m: getattr(m, "ORDER", 100)):
        mod.register(sub)
    return parser


_NEGATIVE = re.compile(r"^-\.?[0-9]")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--budget -1MiB`` -> ``--budget=-1MiB``.

    argparse takes any token that starts with '-' and is not a plain number for an option, so a
    negative size would fail as "expected one argument" instead of reaching the check that says
    what is wrong with it. No option of ours starts with a digit, so the join is unambiguous.
    """
    out: list[str] = []
    for tok in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and _NEGATIVE.match(tok):
            out[-1] = f"{out[-1]}={tok}"
        else:
            out.append(tok)
    return out


class Terminated(BaseException):
    """SIGTERM (a job scheduler, ``timeout``, ``kill``) turned into an exception, so the run in progress
    ends its children and removes its hand-off files the same way Ctrl-C does."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def main(argv: Sequence[str] | None = None) -> int:
    from picklescope.core.quiet_start import restore

    restore()  # from here on, Ctrl-C is a KeyboardInterrupt that ends the run's children first
    owns_process = argv is None  # the command line's own process, not a caller's (a test, a notebook)
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    debug = "--debug" in argv
    installed = threading.current_thread() is threading.main_thread()  # signals only go to the main thread
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if installed else None
    try:
        return _main(argv, debug, owns_process)
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _remove_own_temporaries() -> None:
    """An interrupted command leaves no temporary of its own, whichever thread made it (only when the
    process is the command's own: a caller's process keeps what its other parts made)."""
    from picklescope.core.leftovers import remove_own

    remove_own()


def _main(argv: list[str], debug: bool, owns_process: bool = False) -> int:
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
        if owns_process:
            _remove_own_temporaries()
        print("picklescope: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        if owns_process:
            _remove_own_temporaries()
        print("picklescope: terminated", file=sys.stderr)
        return 143
    except BrokenPipeError:  # output piped into 'head' and closed: not an error of ours or the user's
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except OSError:
            pass
        return 141
    except OSError as exc:  # a path the user gave that cannot be read or written (permissions, a full disk)
        if debug:
            traceback.print_exc()
        where = f" {exc.filename!r}" if exc.filename else ""
        print(f"picklescope: error: cannot use{where}: {exc.strerror or exc}: check the path, its permissions "
              "and free space (--debug shows where it happened)", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
