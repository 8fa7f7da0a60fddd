"""Which codec wrote a blob, read from its pickle stream without running any of it.

A blob is a pickle, and unpickling runs code, so identification must not unpickle. The stream is read
by the toolkit's one inert pickle machine (:class:`picklescope.core.safeload.InertUnpickler`), where
every global is an opaque record: the classes it names (``verl.protocol.DataProto``,
``picklescope.batch.Batch``), byte strings that are ``torch.save`` zip archives (torch mode), numpy
array reconstructors (numpy mode) and out-of-band buffer markers (pickle protocol 5) are enough to
say who wrote it and which ``VERL_DATAPROTO_SERIALIZATION_METHOD`` the reader needs. A stream the
machine cannot finish is worded from ``pickletools.genops``, which says at which opcode and byte it
stops. Nothing here imports verl or torch.

The blob is streamed, never held, because the caller (``picklescope inspect``, the parent of every
measured run) must stay small whatever it is given: the shared bounded reader
(:class:`picklescope.core.safefile.BoundedFile`) ends where the file ended at open and refuses any one
read over 64 MiB; large byte strings (tensor data, a carried ``torch.save`` archive) are seeked past,
and an archive's directory is read only after its claims are checked (:mod:`picklescope.core.safezip`);
the machine's holdings are counted against :data:`BLOB_BOUNDS`; and the checksum is taken 1 MiB at a time,
only of a stream found whole. A pickle followed by anything else (a polyglot that a zip reader takes
for a ``.pt``) is refused, as ``workload from`` refuses it.
"""

from __future__ import annotations

import hashlib
import io
import pickletools
import re
import struct
import zipfile
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from picklescope.core.safefile import READ_LIMIT, BoundedFile, open_bounded
from picklescope.core.safeload import INLINE, STRUCTURE_BOUNDS, Damaged, InertUnpickler, Skipped, Unreadable
from picklescope.core.safezip import check_directory, check_member
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError, safe_text

ZIP_MAGIC = b"PK\x03\x04"
_NUMPY_GLOBALS = {("numpy._core.multiarray", "_reconstruct"), ("numpy.core.multiarray", "_reconstruct"),
                  ("numpy._core.numeric", "_frombuffer"), ("numpy.core.numeric", "_frombuffer")}
CONTAINERS = {
    ("verl.protocol", "DataProto"): "verl DataProto",
    ("picklescope.batch", "Batch"): "picklescope Batch",
}


@dataclass
class BlobInfo:
    """What the opcodes of one blob say about its writer."""

    path: str
    bytes: int
    sha256: str  # of the bytes seen at open; "" when the file is refused before its checksum matters (a problem)
    kind: str  # pickle | torch-zip | unknown
    pickle_protocol: int | None = None
    container: str | None = None  # "verl DataProto", "picklescope Batch", or a class name
    mode: str | None = None  # torch | numpy | None
    writer: str = ""
    torch_archives: int = 0
    torch_archive_bytes: int = 0
    numpy_arrays: int = 0  # numpy arrays rebuilt, tensor leaves and non_tensor object arrays alike
    out_of_band_buffers: int = 0
    globals: list[str] = field(default_factory=list)
    problem: str | None = None  # empty | not-pickle | truncated | trailing | None (a whole pickle, or a zip)
    problem_at: int | None = None  # byte offset of the opcode where reading stopped
    problem_detail: str = ""
    needs_bytes: int | None = None  # truncated: the stream needs at least this many bytes in all

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# What identifying a blob may make the inert machine hold: the bounds of any file's structure, in a blob's words
BLOB_BOUNDS = replace(
    STRUCTURE_BOUNDS, needs="a batch blob's structure needs",
    way_out="a pickled DataProto or Batch keeps its rows in tensors and numpy arrays, not in millions of Python "
            "objects: the file is not one, or is damaged", damaged="the file is damaged",
    not_it="the file is not a pickled batch")


def _zip_names(f: BoundedFile, where: str) -> list[str] | None:
    """The member names of the zip archive ``f`` (read from its directory, after the directory's claims are
    checked against the archive's real size), or None when it is no readable zip."""
    check_directory(f, f.size, where)  # a million declared members or a directory past the end: one line
    f.seek(0)
    try:
        return zipfile.ZipFile(f).namelist()  # type: ignore[arg-type]
    except (zipfile.BadZipFile, OSError, ValueError, EOFError, struct.error, NotImplementedError):
        return None


def _torch_pickle(f: BoundedFile, where: str) -> str | None:
    """The name of a torch archive's ``data.pkl``, its declared sizes checked against the archive and
    :data:`READ_LIMIT` (no reader of a batch's structure inflates more); None when ``f`` is no torch archive."""
    names = _zip_names(f, where)
    pkl = next((n for n in names or () if n.endswith("/data.pkl") or n == "data.pkl"), None)
    if pkl is not None:
        f.seek(0)
        with zipfile.ZipFile(f) as z:  # type: ignore[arg-type]
            check_member(z.getinfo(pkl), f.size, where, READ_LIMIT)
    return pkl


_RAN_OUT = ("exhausted before seeing STOP", "not enough data", "no newline found")
_NEED = re.compile(r"expected (\d+) bytes in a .*, but only (\d+) remain")
_UNKNOWN = re.compile(r"at position (\d+), opcode (b'.*') unknown")


def _classify(info: BlobInfo, f: BoundedFile, head: bytes, at: int, msg: str) -> None:
    """Word why ``pickletools`` stopped at byte ``at`` (its message ``msg``): the file ends too soon, or it
    is no pickle at all. ``head`` is the file's first bytes."""
    info.problem_at = at
    need = _NEED.search(msg)
    ran_out = bool(need) or any(m in msg for m in _RAN_OUT)
    if not f.size:
        info.problem, info.problem_detail = "empty", "the file is empty (0 bytes)"
    elif ran_out and head[:1] == b"\x80":  # PROTO: it began as a pickle of protocol 2 or later
        info.problem = "truncated"
        if need:
            info.needs_bytes = f.size + int(need.group(1)) - int(need.group(2))
        f.seek(at)
        code = f.read(1)
        op = pickletools.code2op.get(code.decode("latin-1")) if code else None
        info.problem_detail = (f"inside the {op.name} opcode at byte {at}" if op
                               else "right after its last whole opcode")
    else:
        unknown = _UNKNOWN.search(msg)
        if unknown:
            info.problem_at = int(unknown.group(1))
            info.problem_detail = f"opcode {unknown.group(2)} at byte {info.problem_at} is no pickle opcode"
            if head[:1] != b"\x80":
                info.problem_detail += f"; the file starts with {head[:12]!r}"
        elif ran_out:
            info.problem_detail = (f"it does not start with a pickle's PROTO opcode and ends at byte {f.size} "
                                   "without a STOP opcode")
        else:
            f.seek(at)
            info.problem_detail = f"opcode {f.read(1)!r} at byte {at}: {msg}"
        info.problem = "not-pickle"
    info.writer = f"not a pickle stream ({info.problem_detail})" if info.problem != "truncated" else \
        f"a truncated pickle stream ({info.problem_detail})"


def describe_blob(path: str | Path, data: bytes | None = None) -> BlobInfo:
    """Identify the writer of ``path`` from its bytes alone (safe on any file).

    A file that is not a whole pickle stream comes back with ``problem`` set (see
    :func:`require_pickle`); a path that cannot be read, and a stream that would make the reader hold more
    than :data:`BLOB_BOUNDS` allow, raise :class:`PicklescopeError`. The file is streamed, never held:
    read no further than the size it had when it was opened (a file another process keeps appending to
    is judged by what it held then), large byte strings skipped by seeking, at most
    :data:`picklescope.core.safefile.READ_LIMIT` at once, and hashed in chunks, so identifying any file up
    to 4 GiB stays within :data:`picklescope.core.safefile.READER_MEMORY_BOUND` of the caller's memory.
    ``data`` gives the bytes instead, when the caller holds them already.
    """
    p = Path(path)
    shown = safe_text(str(p), 300)
    if data is not None:
        return _describe(p, BoundedFile(io.BytesIO(data), len(data), shown))
    if p.is_dir():
        raise PicklescopeError(f"{p} is a directory, not a blob", "give the path of a file inside it")
    try:
        f = open_bounded(p, shown)
    except FileNotFoundError:
        raise PicklescopeError(f"blob {p} does not exist", "check the path") from None
    except OSError as exc:
        raise PicklescopeError(f"cannot read blob {p}: {exc.strerror}", "check the path and its permissions") from None
    with f:
        return _describe(p, f)


class _Identify(InertUnpickler):
    """The inert machine over a blob, counting what tells its writer apart."""

    def __init__(self, f: BoundedFile) -> None:
        super().__init__(f, BLOB_BOUNDS)
        self.numpy_arrays = 0
        self.archives = 0
        self.archive_bytes = 0
        self.says_numpy = False  # the string "numpy" appears (verl's numpy mode names itself)

    def resolve(self, module: str, name: str) -> Any:
        made = super().resolve(module, name)
        if (module, name) not in _NUMPY_GLOBALS:
            return made

        def counted(*args: Any) -> Any:  # one call rebuilds one array: a leaf or a non_tensor object array
            self.numpy_arrays += 1
            return made(*args)
        return counted

    def _bytes(self, n: int) -> Skipped:
        b = super()._bytes(n)
        if b.head == ZIP_MAGIC:
            # a skipped one is read where it lies, through a window on the blob (no copy of its bytes);
            # the window moves the shared file, so the stream's place is put back after it
            back = self._f.tell()
            if b.data is not None:
                raw = BoundedFile(io.BytesIO(b.data), len(b.data), "a byte string")
            else:
                raw = BoundedFile(self._f, b.length, f"{self._where()} (the zip archive at byte {b.offset:,})",
                                  start=b.offset)
            try:
                if _torch_pickle(raw, raw.where) is not None:
                    self.archives += 1
                    self.archive_bytes += b.length
            finally:
                self._f.seek(back)
        return b

    def _push_text(self, fmt: str, size: int) -> None:
        super()._push_text(fmt, size)
        if self.stack[-1] == "numpy":
            self.says_numpy = True


class _Sized(bytes):
    """What :class:`_Walk` gives for a long argument it seeks past: empty bytes that say how long they are."""

    def __new__(cls, n: int) -> _Sized:
        made = super().__new__(cls)
        made.n = n
        return made

    def __len__(self) -> int:
        return self.n


class _Walk:
    """The blob as ``pickletools.genops`` reads it: arguments over ``INLINE`` bytes are seeked past, never read,
    so walking a stream costs no memory for its data (genops only checks their lengths)."""

    def __init__(self, f: BoundedFile) -> None:
        self.f = f

    def read(self, n: int = -1) -> bytes:
        if 0 <= n <= INLINE:
            return self.f.read(n)
        at = self.f.tell()
        return _Sized(self.f.seek(at + n) - at) if n > 0 else self.f.read(n)

    def readline(self) -> bytes:
        return self.f.readline()

    def tell(self) -> int:
        return self.f.tell()


def _where_it_stops(f: BoundedFile) -> tuple[int, str] | None:
    """Where ``pickletools`` stops walking ``f`` and its message, or None when the stream is whole."""
    f.seek(0)
    stream = _Walk(f)
    at = 0  # where the opcode being read starts
    try:
        for _op, _arg, _pos in pickletools.genops(stream):
            at = stream.tell()
    except (ValueError, IndexError, PicklescopeError) as exc:
        return at, str(exc)
    return None


def _counts(info: BlobInfo, u: _Identify, head: bytes) -> None:
    info.pickle_protocol = u.proto if head[:1] == b"\x80" and len(head) > 1 else None  # PROTO is read whole
    info.out_of_band_buffers = u.buffers
    info.torch_archives, info.torch_archive_bytes = u.archives, u.archive_bytes


def _trailing(info: BlobInfo, f: BoundedFile, end: int) -> None:
    """Bytes after the pickle's STOP: ``pickle.load`` would never read them, a zip reader (``torch.load``) would
    read only them. A file that is a pickle and something else is refused, --trust or not."""
    f.seek(end)
    zipped = ZIP_MAGIC in f.read(min(f.size - end, 1 << 16))
    if not zipped:
        try:
            zipped = _zip_names(BoundedFile(f, f.size - end, f.where, start=end), f.where) is not None
        except PicklescopeError:  # its directory claims too much: still a zip's directory
            zipped = True
    what = ("a zip archive (the file is both a pickle and a zip: a polyglot, which a zip reader such as torch.load "
            "would take for a .pt archive)" if zipped else "other data")
    info.problem, info.problem_at = "trailing", end
    info.problem_detail = f"{fmt_bytes(f.size - end)} of {what} follow"
    info.writer = f"a pickle stream followed by {what}"


def _sha256(f: BoundedFile) -> str:
    """The sha256 of what ``f`` held at open, read 1 MiB at a time."""
    h = hashlib.sha256()
    f.seek(0)
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
    return h.hexdigest()


def _describe(p: Path, f: BoundedFile) -> BlobInfo:
    """Identify ``f`` from its first bytes, its size and its opcodes; hash it once it is known to be whole."""
    head = f.read(min(f.size, 16))
    f.seek(0)
    info = BlobInfo(str(p), f.size, "", "unknown")
    if head.startswith(ZIP_MAGIC):
        info.kind = "torch-zip" if _torch_pickle(f, f.where) is not None else "zip"
        info.mode = "torch" if info.kind == "torch-zip" else None
        info.writer = ("a bare torch.save archive (not a pickled DataProto): torch mode's inner payload"
                       if info.mode else "a zip file, not a pickle")
        info.sha256 = _sha256(f)
        return info
    u = _Identify(f)
    try:
        u.run()
    except PicklescopeError as exc:  # a bound reached, a read over the limit: refused, with the file's name
        if f.where in exc.problem:
            raise
        raise PicklescopeError(f"{f.where}: {exc.problem}", exc.hint) from None
    except (Damaged, Unreadable) as exc:
        _counts(info, u, head)  # what was read before it stopped
        stop = _where_it_stops(f)
        if stop is not None:
            _classify(info, f, head, *stop)
        else:  # whole by its opcodes, yet not a stream of plain data the machine can build
            info.problem, info.problem_at = "not-pickle", 0
            info.problem_detail = f"its opcodes cannot be followed without running code ({exc})"
            info.writer = f"not a pickle stream ({info.problem_detail})"
        return info
    info.kind = "pickle"
    _counts(info, u, head)
    end = f.tell()
    if end < f.size:
        _trailing(info, f, end)
        return info
    info.sha256 = _sha256(f)
    info.globals = list(u.named)
    info.numpy_arrays = u.numpy_arrays
    by_name = {f"{m}.{q}": word for (m, q), word in CONTAINERS.items()}
    container = next((by_name[g] for g in u.named if g in by_name), None)
    info.container = container or (u.named[0] if u.named else "plain Python data")
    if info.torch_archives:
        info.mode = "torch"
        info.writer = (f"{info.container} in torch mode: the TensorDict consolidated and torch.save'd into one "
                       f"zip archive ({info.torch_archive_bytes} bytes) carried in-band")
    elif container and (info.numpy_arrays or info.out_of_band_buffers or u.says_numpy):
        info.mode = "numpy"
        where = f"{info.out_of_band_buffers} out-of-band buffers" if info.out_of_band_buffers else "in-band"
        info.writer = (f"{info.container} in numpy mode: a tuple of (dtype, shape, uint8 numpy array) per leaf, "
                       f"{info.numpy_arrays} numpy arrays (leaves and object arrays) {where}")
    elif container == "verl DataProto":
        info.mode = "numpy"
        info.writer = "verl DataProto in numpy mode with batch=None (torch mode always writes an archive)"
    else:
        info.writer = f"a pickle of {info.container}; no verl serialization mode recognised"
    return info


def require_pickle(info: BlobInfo) -> None:
    """Raise a one-line :class:`PicklescopeError` unless ``info`` describes a whole pickle stream."""
    path = info.path
    if info.problem == "truncated":
        end = (f"byte {info.bytes} of at least {info.needs_bytes}" if info.needs_bytes
               else f"byte {info.bytes} (the end of the file)")
        raise PicklescopeError(
            f"{path} is truncated: the pickle stream ends at {end}, {info.problem_detail}, before its STOP opcode "
            "(an interrupted copy or download?)",
            "copy or download it again and compare its size and sha256 with the original's")
    if info.problem == "empty":
        raise PicklescopeError(f"{path} is empty (0 bytes), not a pickle stream (an interrupted copy or download?)",
                               "copy or download it again")
    if info.problem == "not-pickle":
        raise PicklescopeError(f"{path} is not a pickle stream ({info.problem_detail})",
                               "give a blob written by pickle.dump or DataProto.save_to_disk "
                               f"('file {path}' may tell what it is)")
    if info.problem == "trailing":
        raise PicklescopeError(f"{path}: the pickle stream stops at byte {info.problem_at:,} and "
                               f"{info.problem_detail}; such a file is refused with or without --trust",
                               "save the batch on its own (DataProto.save_to_disk, torch.save or numpy.savez) and "
                               "give that file")
    if info.kind == "zip":
        raise PicklescopeError(f"{path} is a zip file, not a pickle stream",
                               "give a blob written by pickle.dump or DataProto.save_to_disk")


def mode_hint(mode: str | None) -> str:
    """What the reading process must set, in verl's words."""
    if mode is None:
        return "no verl mode applies"
    return f"read it with VERL_DATAPROTO_SERIALIZATION_METHOD={mode}"
