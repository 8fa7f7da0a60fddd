"""The ``picklescope`` command's first second: importing torch takes a few seconds, and a Ctrl-C in them
would print a long import traceback. As the command (not as a library in a notebook), SIGINT and
SIGTERM end the process with one line until :func:`picklescope.cli.main` installs its own handling."""

from __future__ import annotations

import os
import signal
import sys


def _is_command() -> bool:
    argv = getattr(sys, "orig_argv", None) or sys.argv
    if not argv:
        return False
    if os.path.basename(sys.argv[0] if sys.argv else "") == "picklescope":  # the console script
        return True
    return "-m" in argv and argv[argv.index("-m") + 1:argv.index("-m") + 2] == ["picklescope"]


def _quit(signum: int, frame: object) -> None:
    word = "interrupted" if signum == signal.SIGINT else "terminated"
    try:
        os.write(2, f"picklescope: {word}\n".encode())
    finally:
        os._exit(130 if signum == signal.SIGINT else 143)


def quiet_interrupts_while_importing() -> None:
    """Install :func:`_quit` for SIGINT/SIGTERM if this process is the ``picklescope`` command."""
    if not _is_command():
        return
    try:
        if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            signal.signal(signal.SIGINT, _quit)
        if signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _quit)
    except ValueError:  # not the main thread
        pass


def restore() -> None:
    """Hand SIGINT/SIGTERM back (the CLI's own handling takes over from here)."""
    try:
        if signal.getsignal(signal.SIGINT) is _quit:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        if signal.getsignal(signal.SIGTERM) is _quit:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
    except ValueError:
        pass
