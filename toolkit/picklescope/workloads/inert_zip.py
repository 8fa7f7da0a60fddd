"""Zip archives of saved batches (``torch.save`` files, ``.npz``), opened only after their claims are checked."""

from __future__ import annotations

import struct
import zipfile
import zlib
from typing import Any, BinaryIO

from picklescope.core.safefile import READ_LIMIT, BoundedFile
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError, safe_text
from picklescope.workloads.inert import MAX_ZIP_ENTRIES, _Damaged, _read, _Unpickler, _Unreadable

_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"


def _zip_directory(f: BinaryIO, size: int, where: str) -> None:
    """Check what the end of a zip declares before ``zipfile`` acts on it: the member count and the size of
    the central directory (zip64 included) must fit the file and :data:`MAX_ZIP_ENTRIES`; zipfile would
    otherwise build one record per declared member."""
    tail = min(size, 22 + 65535 + 20)
    f.seek(size - tail)
    data = f.read(tail)
    at = data.rfind(_EOCD)
    if at < 0 or len(data) - at < 22:
        return  # no directory: zipfile words that itself
    entries, cd_size = struct.unpack("<HI", data[at + 10:at + 16])  # total members, directory bytes
    loc = at - 20
    if loc >= 0 and data[loc:loc + 4] == _EOCD64_LOCATOR:
        (offset64,) = struct.unpack("<Q", data[loc + 8:loc + 16])
        if offset64 + 56 > size:
            raise PicklescopeError(f"{where}: its zip64 directory record is declared at byte {offset64:,}, past the "
                                   f"end of the {size:,}-byte archive", "the archive is damaged; copy it again")
        f.seek(offset64)
        rec = f.read(56)
        if rec[:4] == b"PK\x06\x06" and len(rec) == 56:
            entries, cd_size = struct.unpack("<Q", rec[32:40])[0], struct.unpack("<Q", rec[40:48])[0]
    if entries > MAX_ZIP_ENTRIES:
        raise PicklescopeError(f"{where}: its zip directory declares {entries:,} members, over the "
                               f"{MAX_ZIP_ENTRIES:,} a saved batch has (one per storage or key)",
                               "the archive is damaged or not a saved batch")
    if cd_size > size:
        raise PicklescopeError(f"{where}: its zip directory declares {fmt_bytes(cd_size)} of records in an archive "
                               f"of {fmt_bytes(size)}", "the archive is damaged; copy it again")
    f.seek(0)


def _open_zip(f: BinaryIO, where: str, size: int) -> zipfile.ZipFile:
    """``zipfile.ZipFile`` on ``f`` (of ``size`` bytes), after :func:`_zip_directory`; failures are one line."""
    _zip_directory(f, size, where)
    try:
        return zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, NotImplementedError) as exc:
        raise PicklescopeError(f"{where} is not a readable zip archive ({exc})",
                               "copy it again; a torch.save file is a zip archive") from None


def _check_member(info: zipfile.ZipInfo, size: int, where: str, limit: int | None) -> None:
    """A member's declared sizes against the archive's real size and, for what is read, ``limit``."""
    name = safe_text(info.filename, 120)
    if limit is not None and info.file_size > limit:
        raise PicklescopeError(f"{where}: member {name} declares {fmt_bytes(info.file_size)} uncompressed "
                               f"({fmt_bytes(info.compress_size)} in the file), over the {fmt_bytes(limit)} limit for "
                               "the structure of a batch (tensor data lives in other members)",
                               "the archive is damaged or built to exhaust memory; copy the original again")
    if info.compress_size > size or info.header_offset + info.compress_size > size:
        raise PicklescopeError(f"{where}: member {name} declares {fmt_bytes(info.compress_size)} of data at byte "
                               f"{info.header_offset:,}, past the end of the {fmt_bytes(size)} archive",
                               "the archive is truncated or damaged; copy it again")
    if info.compress_type == zipfile.ZIP_STORED and info.file_size != info.compress_size:
        raise PicklescopeError(f"{where}: member {name} is stored uncompressed but declares {info.file_size:,} bytes "
                               f"in {info.compress_size:,}", "the archive is damaged; copy it again")


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


