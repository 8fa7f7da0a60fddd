"""Reading a file the user named, without letting the file decide how much is read or how long it takes.

``Path.read_bytes()`` on ``/dev/zero`` never returns, on a FIFO it waits for a writer that may never
come, and on a 3 GB sparse file it allocates 3 GB in the process that was meant to watch memory.
Every file picklescope reads on a user's behalf goes through :func:`check_file` first: it is opened
without blocking, must be a regular file (not a folder, FIFO, socket or device, whatever its name
says and wherever a symlink points), and must be no larger than a limit stated in the error. Then
:func:`read_bytes` reads at most that limit, so a file that grows while it is read cannot get past it.

Limits: a workload file :data:`WORKLOAD_LIMIT` (real ones are under 2 KiB); a blob loaded in a child
:data:`DEFAULT_BLOB_LIMIT`, a blob only identified :data:`DEFAULT_DESCRIBE_LIMIT`, unless
``PICKLESCOPE_MAX_BLOB_BYTES`` (bytes, or a size such as ``16GiB``) says otherwise.

A saved batch may be far larger than any of these, and is read piecewise instead: :func:`open_bounded`
gives a :class:`BoundedFile` that ends where the file ended when it was opened and refuses any single
read over :data:`READ_LIMIT` (or line over :data:`LINE_LIMIT`), so a file's claims cannot make the
reader allocate, and a file still being written cannot keep it reading.
"""

from __future__ import annotations

import io
import os
import stat
from pathlib import Path
from typing import Any, BinaryIO

from picklescope.core.units import fmt_bytes, parse_size
from picklescope.errors import PicklescopeError, safe_text

WORKLOAD_LIMIT = 4 * 1024**2
DEFAULT_BLOB_LIMIT = 1024**3  # a blob loaded whole in a child (inspect --as, a trusted load)
DEFAULT_DESCRIBE_LIMIT = 4 * 1024**3  # a blob only streamed to identify its writer (inspect): a bound on time
BLOB_LIMIT_ENV = "PICKLESCOPE_MAX_BLOB_BYTES"

_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def blob_limit() -> int:
    """The largest blob picklescope reads: ``PICKLESCOPE_MAX_BLOB_BYTES`` or :data:`DEFAULT_BLOB_LIMIT`."""
    raw = os.environ.get(BLOB_LIMIT_ENV)
    if not raw:
        return DEFAULT_BLOB_LIMIT
    size = parse_size(raw, BLOB_LIMIT_ENV)
    if size.bytes is None:
        raise PicklescopeError(f"{BLOB_LIMIT_ENV}={safe_text(raw)!r} is a multiple, not a size",
                               "give bytes, e.g. 16GiB")
    return size.bytes


def describe_limit() -> int:
    """The largest blob ``inspect`` identifies: ``PICKLESCOPE_MAX_BLOB_BYTES`` or :data:`DEFAULT_DESCRIBE_LIMIT`.

    Identification streams the file within :data:`READER_MEMORY_BOUND` whatever its size, so the limit
    only keeps a mistaken path (a disk image, a sparse giant) from being hashed for minutes.
    """
    return blob_limit() if os.environ.get(BLOB_LIMIT_ENV) else DEFAULT_DESCRIBE_LIMIT


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


# -- reading a saved batch: bounded by what the file is, not by what it claims --------------------------
READER_MEMORY_BOUND = 256 * 1024**2  # what describing any file up to 4 GiB may add to the reader's memory
READ_LIMIT = 64 * 1024**2  # one read of a stream (a pickle frame, an opcode's argument, a zip's data.pkl)
LINE_LIMIT = 1024**2  # one line of a protocol-0 pickle opcode


class BoundedFile(io.RawIOBase):
    """A read-only view of a binary file that ends where the file ended when it was opened.

    A file that another process keeps appending to reads as the file it was when it was opened, so
    nothing can make the reader go on without end. Single reads are capped at ``max_read`` bytes and
    lines at :data:`LINE_LIMIT`: an opcode or a header that asks for more is refused with one line
    naming the size, instead of allocating it. ``seek`` past the end stops at the end, so a length
    that points past the data is noticed (``tell`` differs) rather than silently accepted.

    ``start`` makes it a window on part of ``f`` (a zip archive carried inside a pickle, the bytes after
    a pickle's STOP): positions count from ``start``, and every read seeks ``f`` first, because ``f`` is
    shared with the reader of the whole file.
    """

    def __init__(self, f: BinaryIO, size: int, where: str, max_read: int = READ_LIMIT, owned: bool = False,
                 start: int | None = None) -> None:
        super().__init__()
        self._f, self.size, self.where, self.max_read, self._owned = f, size, where, max_read, owned
        self._start = start
        self._pos = f.tell() if start is None else 0

    def _sync(self) -> None:
        if self._start is not None:
            self._f.seek(self._start + self._pos)

    def close(self) -> None:
        if self._owned and not self.closed:
            self._f.close()
        super().close()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        target = {0: pos, 1: self._pos + pos, 2: self.size + pos}[whence]
        self._pos = min(max(0, target), self.size)
        self._f.seek(self._pos + (self._start or 0))
        return self._pos

    def _room(self, n: int | None) -> int:
        left = self.size - self._pos
        if n is None or n < 0:
            n = left
        if min(n, left) > self.max_read:
            raise PicklescopeError(f"{self.where}: one read at byte {self._pos} asks for {fmt_bytes(min(n, left))}, "
                                   f"over the {fmt_bytes(self.max_read)} a reader of batch structure takes at once",
                                   "the file is damaged or not a saved batch; copy it again")
        return max(0, min(n, left))

    def read(self, n: int | None = -1) -> bytes:
        n = self._room(n)
        self._sync()
        data = self._f.read(n)
        self._pos += len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[:len(data)] = data
        return len(data)

    def readline(self, size: int | None = -1) -> bytes:
        cap = min(self.size - self._pos, LINE_LIMIT + 1 if size is None or size < 0 else size)
        self._sync()
        line = self._f.readline(cap)
        self._pos += len(line)
        if len(line) > LINE_LIMIT and not line.endswith(b"\n"):
            raise PicklescopeError(f"{self.where}: a line at byte {self._pos - len(line)} runs over "
                                   f"{LINE_LIMIT} bytes without ending", "the file is damaged or not a saved batch")
        return line


def open_bounded(path: str | os.PathLike, where: str | None = None) -> BoundedFile:
    """``path`` opened for reading as a :class:`BoundedFile` of the size it has now (one ``fstat``)."""
    f = open(os.fspath(path), "rb")  # noqa: SIM115 - closed with the BoundedFile
    size = os.fstat(f.fileno()).st_size
    return BoundedFile(f, size, where or _describe(os.fspath(path)), owned=True)
