"""Zip archives a user named (``torch.save`` files, ``.npz``), opened only after their claims are checked.

``zipfile`` believes what an archive's end record says: a directory declaring a million members makes
it build a million records, and a member declaring 3 GiB uncompressed is inflated as far as it goes.
Both ``workload from`` (:mod:`picklescope.workloads.inert_zip`) and ``inspect``
(:mod:`picklescope.workloads.blobinfo`) open archives here, so each claim is checked against the archive's
real size and a stated limit before ``zipfile`` acts on it, and every failure is one line.
"""

from __future__ import annotations

import struct
import zipfile
from typing import BinaryIO

from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError, safe_text

MAX_ZIP_ENTRIES = 65_536  # members of a torch.save archive (one per storage) or of an .npz (one per key)

_EOCD = b"PK\x05\x06"
_EOCD64_LOCATOR = b"PK\x06\x07"


def check_directory(f: BinaryIO, size: int, where: str, max_entries: int = MAX_ZIP_ENTRIES) -> None:
    """Check what the end of a zip declares before ``zipfile`` acts on it: the member count and the size of
    the central directory (zip64 included) must fit the file and ``max_entries``; zipfile would
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
    if entries > max_entries:
        raise PicklescopeError(f"{where}: its zip directory declares {entries:,} members, over the "
                               f"{max_entries:,} a saved batch has (one per storage or key)",
                               "the archive is damaged or not a saved batch")
    if cd_size > size:
        raise PicklescopeError(f"{where}: its zip directory declares {fmt_bytes(cd_size)} of records in an archive "
                               f"of {fmt_bytes(size)}", "the archive is damaged; copy it again")
    f.seek(0)


def open_zip(f: BinaryIO, where: str, size: int, max_entries: int = MAX_ZIP_ENTRIES) -> zipfile.ZipFile:
    """``zipfile.ZipFile`` on ``f`` (of ``size`` bytes), after :func:`check_directory`; failures are one line."""
    check_directory(f, size, where, max_entries)
    try:
        return zipfile.ZipFile(f)
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, NotImplementedError) as exc:
        raise PicklescopeError(f"{where} is not a readable zip archive ({exc})",
                               "copy it again; a torch.save file is a zip archive") from None


def check_member(info: zipfile.ZipInfo, size: int, where: str, limit: int | None) -> None:
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
