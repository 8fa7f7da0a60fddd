"""Zip archives of saved batches (``torch.save`` files, ``.npz``), opened only after their claims are checked
(:mod:`picklescope.core.safezip`)."""

from __future__ import annotations

import zipfile
import zlib
from typing import Any, BinaryIO

from picklescope.core.safefile import READ_LIMIT, BoundedFile
from picklescope.core.safezip import check_member as _check_member
from picklescope.core.safezip import open_zip
from picklescope.errors import PicklescopeError, safe_text
from picklescope.workloads.inert import MAX_ZIP_ENTRIES, _Damaged, _read, _Unpickler, _Unreadable


def _open_zip(f: BinaryIO, where: str, size: int) -> zipfile.ZipFile:
    """``zipfile.ZipFile`` on ``f`` after its end record is checked against :data:`MAX_ZIP_ENTRIES`."""
    return open_zip(f, where, size, MAX_ZIP_ENTRIES)


class _Archive:
    """A ``torch.save`` zip: its ``data.pkl`` and the sizes of its storage records, nothing else read.

    Every declared size is checked against the archive's real size before it is acted on; ``data.pkl``
    is read as a stream (never whole) up to its declared size, and at most :data:`READ_LIMIT` of it.
    """

    def __init__(self, f: BinaryIO, where: str, size: int) -> None:
        self.zip = _open_zip(f, where, size)
        self.size = size
        names = self.zip.namelist()
        pkl = next((n for n in names if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if pkl is None:
            raise PicklescopeError(f"{where} is a zip archive without a data.pkl (not written by torch.save)",
                                   "give a torch.save file, a .npz, or a DataProto.save_to_disk pickle")
        self.pkl = pkl
        self.prefix = pkl[: -len("data.pkl")]
        self.where = where
        _check_member(self.zip.getinfo(pkl), size, where, READ_LIMIT)

    def read_range(self, key: str, start: int, n: int) -> bytes:
        try:
            info = self.zip.getinfo(f"{self.prefix}data/{key}")
        except KeyError:
            raise PicklescopeError(f"{self.where}: storage record {key!r} is missing",
                                   "copy the file again; the archive is incomplete") from None
        _check_member(info, self.size, self.where, None)
        if n < 0 or start < 0 or start + n > info.file_size or n > READ_LIMIT:
            raise PicklescopeError(f"{self.where}: storage record {key!r} is shorter than its tensor "
                                   f"({n:,} bytes at {start:,} asked of {info.file_size:,})",
                                   "copy the file again; the archive is truncated")
        try:
            with self.zip.open(info) as m:
                m.seek(start)
                data = m.read(n)
        except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as exc:
            raise PicklescopeError(f"{self.where}: storage record {key!r} is damaged ({exc})",
                                   "copy the file again") from None
        if len(data) != n:
            raise PicklescopeError(f"{self.where}: storage record {key!r} is shorter than its tensor",
                                   "copy the file again; the archive is truncated")
        return data

    def root(self) -> tuple[Any, _Unpickler]:
        info = self.zip.getinfo(self.pkl)
        try:
            with self.zip.open(info) as m:
                return _read(BoundedFile(m, info.file_size, f"{self.where}: data.pkl"), self)
        except _Unreadable as exc:
            raise PicklescopeError(f"{self.where}: its data.pkl is not a readable pickle ({exc})",
                                   "copy the file again") from None
        except (_Damaged, zipfile.BadZipFile, zlib.error, EOFError) as exc:
            raise PicklescopeError(f"{self.where}: its data.pkl is damaged ({safe_text(exc, 200)})",
                                   "copy the file again; the archive fails its own checksum") from None


