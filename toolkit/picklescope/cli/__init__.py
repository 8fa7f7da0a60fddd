"""The ``picklescope`` command: one subcommand per module in :mod:`picklescope.cli.commands`.

Each command module defines ``register(subparsers)`` and a handler, and imports what its handler needs at
its top. The command table (:data:`COMMANDS`) names each command's module, papermill-style (a registry of
names resolved with :func:`importlib.import_module`): only the module of the command being run is imported,
so ``picklescope --help`` and a light command never load what another command needs (torch, plotly,
Jupyter), and no import waits inside a function. Adding a command means adding a file and a table row.
Errors the user can fix end with one line on stderr and exit status 2; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Sequence
from types import ModuleType

from picklescope.core.leftovers import remove_own
from picklescope.core.paths import keep_torch_cache_private
from picklescope.core.quiet_start import restore
from picklescope.errors import PicklescopeError

COMMANDS_PACKAGE = "picklescope.cli.commands"
# command -> its one-line help, in the order ``picklescope --help`` lists them. The module of a command is
# ``picklescope.cli.commands.<command>``; its ``register`` gives the same help (tests/test_cli.py checks).
COMMANDS: dict[str, str] = {
    "reproduce": "the main job: every codec x transport, headroom, an OOM under a budget, a report",
    "list": "list codecs, transports and workloads",
    "capabilities": "which codec carries which leaf kind (declared, then checked)",
    "run": "measure one codec over one transport in isolated processes",
    "headroom": "find the smallest sender budget a codec survives (to 2%% of payload)",
    "node": "replay a verl node: a driver and N worker actors over K training steps",
    "predict": "predict a node you cannot run here: peaks per step, Ray's kill, the largest batch that survives",
    "postmortem": "execute the postmortem notebook and export it as offline HTML",
    "verl": "install and inspect real verl versions (one folder each)",
    "confirm": "run a real verl baseline and a candidate fix side by side and judge it",
    "workload": "make a workload file from your own saved batch (workload from FILE)",
    "inspect": "tell which codec wrote a blob; --as CODEC also loads it in a child",
    "notebooks": "copy the notebooks (jupytext .py files) into a folder of yours",
    "lab": "open JupyterLab on a folder of the notebooks (copied there if missing)",
    "stepthrough": "run a __getstate__/__setstate__ line by line with exact per-line memory",
}


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors also exit 2, in our one-line style
        raise PicklescopeError(message, f"see '{self.prog} --help'")


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The command's parser. Given the arguments, only the command they name is imported and registered in
    full; the others are listed by name and help. Without arguments every command is registered."""
    parser = _Parser(prog="picklescope", description="What serializing a training batch costs in host memory.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    chosen = None if argv is None else next((a for a in argv if not a.startswith("-")), "")
    for name, help_text in COMMANDS.items():
        if chosen is None or name == chosen:
            command_module(name).register(sub)
        else:
            sub.add_parser(name, help=help_text)
    return parser


def command_module(name: str) -> ModuleType:
    """The module that implements command ``name``, imported by name from the command table."""
    return importlib.import_module(f"{COMMANDS_PACKAGE}.{name}")


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
    restore()  # from here on, Ctrl-C is a KeyboardInterrupt that ends the run's children first
    owns_process = argv is None  # the command line's own process, not a caller's (a test, a notebook)
    argv = _join_negative_values(list(sys.argv[1:] if argv is None else argv))
    debug = "--debug" in argv
    installed = threading.current_thread() is threading.main_thread()  # signals only go to the main thread
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if installed else None
    if owns_process:  # a command that imports tensordict here leaves torch's cache folder in its own temporary
        keep_torch_cache_private()
    try:
        return _main(argv, debug, owns_process)
    finally:
        if installed:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _remove_own_temporaries() -> None:
    """An interrupted command leaves no temporary of its own, whichever thread made it (only when the
    process is the command's own: a caller's process keeps what its other parts made)."""
    remove_own()


def _main(argv: list[str], debug: bool, owns_process: bool = False) -> int:
    try:
        parser = build_parser(argv)
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
