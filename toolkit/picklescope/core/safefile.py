"""Reading a file the user named, without letting the file decide how much is read or how long it takes.

``Path.read_bytes()`` on ``/dev/zero`` never returns, on a FIFO it waits for a writer that may never
come, and on a 3 GB sparse file it allocates 3 GB in the process that was meant to watch memory.
Every file picklescope reads on a user's behalf goes through :func:`check_file` first: it is opened
without blocking, must be a regular file (not a folder, FIFO, socket or device, whatever its name
says and wherever a symlink points), and must be no larger than a limit stated in the error. Then
:func:`read_bytes` reads at most that limit, so a file that grows while it is read cannot get past it.

Limits: a workload file :data:`WORKLOAD_LIMIT` (real ones are under 2 KiB); a blob
:data:`DEFAULT_BLOB_LIMIT` unless ``PICKLESCOPE_MAX_BLOB_BYTES`` (bytes, or a size such as ``16GiB``)
says otherwise.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from picklescope.errors import PicklescopeError, safe_text

WORKLOAD_LIMIT = 4 * 1024**2
DEFAULT_BLOB_LIMIT = 1024**3  # inspect reads a blob whole: a bound on what the parent may hold
BLOB_LIMIT_ENV = "PICKLESCOPE_MAX_BLOB_BYTES"

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def blob_limit() -> int:
    """The largest blob picklescope reads: ``PICKLESCOPE_MAX_BLOB_BYTES`` or :data:`DEFAULT_BLOB_LIMIT`."""
    raw = os.environ.get(BLOB_LIMIT_ENV)
    if not raw:
        return DEFAULT_BLOB_LIMIT
    from picklescope.core.units import parse_size

    size = parse_size(raw, BLOB_LIMIT_ENV)
    if size.bytes is None:
        raise PicklescopeError(f"{BLOB_LIMIT_ENV}={safe_text(raw)!r} is a multiple, not a size",
                               "give bytes, e.g. 16GiB")
    return size.bytes


def _kind(mode: int) -> str:
    for test, name in _KINDS:
        if test(mode):
            return name
    return "not a regular file"


def _describe(path: str) -> str:
    return safe_text(path, 300)


def check_file(path: str | os.PathLike, what: str, limit: int, way_out: str = "check the path") -> int:
    """The size of ``path`` if it is a regular file of at most ``limit`` bytes; otherwise one-line errors.

    Never blocks: the file is opened with ``O_NONBLOCK`` (a FIFO opens at once) and only inspected.
    """
    from picklescope.core.units import fmt_bytes

    text = os.fspath(path)
    shown = _describe(text)
    try:
        fd = os.open(text, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        if os.path.islink(text):
            raise PicklescopeError(f"{what} {shown} is a symlink to a path that does not exist", way_out) from None
        raise PicklescopeError(f"{what} {shown} does not exist", way_out) from None
    except IsADirectoryError:
        raise PicklescopeError(f"{what} {shown} is a folder, not a file", "give the path of a file") from None
    except PermissionError:
        raise PicklescopeError(f"{what} {shown} cannot be read (permission denied)",
                               "check its permissions") from None
    except OSError as exc:
        raise PicklescopeError(f"{what} {shown} cannot be opened ({exc.strerror or exc})", way_out) from None
    try:
        st = os.fstat(fd)
    finally:
        os.close(fd)
    if not stat.S_ISREG(st.st_mode):
        link = f" (a symlink to {_describe(os.path.realpath(text))})" if os.path.islink(text) else ""
        raise PicklescopeError(f"{what} {shown} is {_kind(st.st_mode)}{link}, not a regular file",
                               "give the path of a regular file")
    if st.st_size > limit:
        raise PicklescopeError(f"{what} {shown} is {fmt_bytes(st.st_size)}, over the {fmt_bytes(limit)} limit for a "
                               f"{what}", _limit_hint(what))
    return st.st_size


def _limit_hint(what: str) -> str:
    if "blob" in what:
        return f"set {BLOB_LIMIT_ENV} (e.g. 16GiB) if this really is a blob you want read"
    return "a workload file describes the batch (shapes, dtypes) and is a few lines long; check that this is one"


def read_bytes(path: str | os.PathLike, what: str, limit: int, way_out: str = "check the path") -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes (checked first by :func:`check_file`)."""
    check_file(path, what, limit, way_out)
    from picklescope.core.units import fmt_bytes

    with open(os.fspath(path), "rb", buffering=0) as f:
        data = f.read(limit + 1)
    if len(data) > limit:  # the file grew after the check
        raise PicklescopeError(f"{what} {_describe(os.fspath(path))} grew past the {fmt_bytes(limit)} limit while it "
                               "was read", "give a file that is not being written to")
    return data


def read_text(path: str | os.PathLike, what: str, limit: int, way_out: str = "check the path") -> str:
    """UTF-8 text of a bounded regular file; other encodings are refused with the offending byte's position."""
    data = read_bytes(path, what, limit, way_out)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PicklescopeError(
            f"{what} {_describe(os.fspath(path))} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start} (line {line})", "save it as UTF-8 (e.g. iconv -f latin1 -t utf-8)") from None


def resolved(path: str | os.PathLike) -> Path:
    """``path`` with ``~`` expanded (for messages and checks that need an absolute path)."""
    return Path(os.fspath(path)).expanduser()
