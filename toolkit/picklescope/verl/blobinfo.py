"""Which codec wrote a blob, read from its pickle stream without running any of it.

A blob is a pickle, and unpickling runs code, so identification must not unpickle. The stream is read
by the toolkit's one inert pickle machine (:class:`picklescope.core.safeload.InertUnpickler`), where
every global is an opaque record: the classes it names (``verl.protocol.DataProto``,
``picklescope.batch.Batch``), byte strings that are ``torch.save`` zip archives (torch mode), numpy
array reconstructors (numpy mode) and out-of-band buffer markers (pickle protocol 5) are enough to
say who wrote it and which ``VERL_DATAPROTO_SERIALIZATION_METHOD`` the reader needs. A stream the
machine cannot finish is worded from ``pickletools.genops``, which says at which opcode and byte it
stops. Nothing here imports verl or torch.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickletools
import re
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from picklescope.core.safefile import BoundedFile
from picklescope.core.safeload import Damaged, InertUnpickler, Skipped, Unreadable
from picklescope.errors import PicklescopeError

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
    sha256: str
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
    problem: str | None = None  # empty | not-pickle | truncated | None (a whole pickle, or a zip)
    problem_at: int | None = None  # byte offset of the opcode where reading stopped
    problem_detail: str = ""
    needs_bytes: int | None = None  # truncated: the stream needs at least this many bytes in all

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_torch_archive(data: bytes | BinaryIO) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data) if isinstance(data, bytes) else data) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
    except zipfile.BadZipFile:
        return False


_RAN_OUT = ("exhausted before seeing STOP", "not enough data", "no newline found")
_NEED = re.compile(r"expected (\d+) bytes in a .*, but only (\d+) remain")
_UNKNOWN = re.compile(r"at position (\d+), opcode (b'.*') unknown")


def _classify(info: BlobInfo, data: bytes, at: int, msg: str) -> None:
    """Word why ``pickletools`` stopped at byte ``at`` (its message ``msg``): the file ends too soon, or it
    is no pickle at all."""
    info.problem_at = at
    need = _NEED.search(msg)
    ran_out = bool(need) or any(m in msg for m in _RAN_OUT)
    if not data:
        info.problem, info.problem_detail = "empty", "the file is empty (0 bytes)"
    elif ran_out and data[:1] == b"\x80":  # PROTO: it began as a pickle of protocol 2 or later
        info.problem = "truncated"
        if need:
            info.needs_bytes = len(data) + int(need.group(1)) - int(need.group(2))
        op = pickletools.code2op.get(chr(data[at])) if at < len(data) else None
        info.problem_detail = (f"inside the {op.name} opcode at byte {at}" if op
                               else "right after its last whole opcode")
    else:
        unknown = _UNKNOWN.search(msg)
        if unknown:
            info.problem_at = int(unknown.group(1))
            info.problem_detail = f"opcode {unknown.group(2)} at byte {info.problem_at} is no pickle opcode"
            if data[:1] != b"\x80":
                info.problem_detail += f"; the file starts with {data[:12]!r}"
        elif ran_out:
            info.problem_detail = (f"it does not start with a pickle's PROTO opcode and ends at byte {len(data)} "
                                   "without a STOP opcode")
        else:
            info.problem_detail = f"opcode {data[at:at + 1]!r} at byte {at}: {msg}"
        info.problem = "not-pickle"
    info.writer = f"not a pickle stream ({info.problem_detail})" if info.problem != "truncated" else \
        f"a truncated pickle stream ({info.problem_detail})"


def describe_blob(path: str | Path, data: bytes | None = None) -> BlobInfo:
    """Identify the writer of ``path`` from its bytes alone (safe on any file).

    A file that is not a whole pickle stream comes back with ``problem`` set (see
    :func:`require_pickle`); a path that cannot be read raises :class:`PicklescopeError`. The file is
    read once, up to the size it had when it was opened (a file another process keeps appending to is
    judged by what it held then); ``data`` gives those bytes instead, when the caller read them already.
    """
    p = Path(path)
    if data is not None:
        return _describe_bytes(p, data)
    if p.is_dir():
        raise PicklescopeError(f"{p} is a directory, not a blob", "give the path of a file inside it")
    try:
        with open(p, "rb") as f:
            data = f.read(os.fstat(f.fileno()).st_size)
    except FileNotFoundError:
        raise PicklescopeError(f"blob {p} does not exist", "check the path") from None
    except OSError as exc:
        raise PicklescopeError(f"cannot read blob {p}: {exc.strerror}", "check the path and its permissions") from None
    return _describe_bytes(p, data)


class _Identify(InertUnpickler):
    """The inert machine over a blob held in memory, counting what tells its writer apart."""

    def __init__(self, data: bytes) -> None:
        super().__init__(io.BytesIO(data))
        self.data = data
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
            # a skipped one is read where it lies, through a window on the blob (no copy of its bytes)
            raw: bytes | BinaryIO = b""
            if b.data is not None:
                raw = b.data
            elif b.offset >= 0:
                raw = BoundedFile(io.BytesIO(self.data), b.length, "a byte string", max_read=b.length, start=b.offset)
            if _is_torch_archive(raw):
                self.archives += 1
                self.archive_bytes += b.length
        return b

    def _push_text(self, fmt: str, size: int) -> None:
        super()._push_text(fmt, size)
        if self.stack[-1] == "numpy":
            self.says_numpy = True


def _where_it_stops(data: bytes) -> tuple[int, str] | None:
    """Where ``pickletools`` stops walking ``data`` and its message, or None when the stream is whole."""
    stream = io.BytesIO(data)
    at = 0  # where the opcode being read starts
    try:
        for _op, _arg, _pos in pickletools.genops(stream):
            at = stream.tell()
    except (ValueError, IndexError) as exc:
        return at, str(exc)
    return None


def _counts(info: BlobInfo, u: _Identify, data: bytes) -> None:
    info.pickle_protocol = u.proto if data[:1] == b"\x80" and len(data) > 1 else None  # PROTO is read whole
    info.out_of_band_buffers = u.buffers
    info.torch_archives, info.torch_archive_bytes = u.archives, u.archive_bytes


def _describe_bytes(p: Path, data: bytes) -> BlobInfo:
    info = BlobInfo(str(p), len(data), hashlib.sha256(data).hexdigest(), "unknown")
    if data.startswith(ZIP_MAGIC):
        info.kind = "torch-zip" if _is_torch_archive(data) else "zip"
        info.mode = "torch" if info.kind == "torch-zip" else None
        info.writer = ("a bare torch.save archive (not a pickled DataProto): torch mode's inner payload"
                       if info.mode else "a zip file, not a pickle")
        return info
    u = _Identify(data)
    try:
        u.run()
    except (PicklescopeError, Damaged, Unreadable) as exc:
        _counts(info, u, data)  # what was read before it stopped
        stop = _where_it_stops(data)
        if stop is not None:
            _classify(info, data, *stop)
        else:  # whole by its opcodes, yet not a stream of plain data the machine can build
            info.problem, info.problem_at = "not-pickle", 0
            info.problem_detail = f"its opcodes cannot be followed without running code ({exc})"
            info.writer = f"not a pickle stream ({info.problem_detail})"
        return info
    info.kind = "pickle"
    _counts(info, u, data)
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
    if info.kind == "zip":
        raise PicklescopeError(f"{path} is a zip file, not a pickle stream",
                               "give a blob written by pickle.dump or DataProto.save_to_disk")


def mode_hint(mode: str | None) -> str:
    """What the reading process must set, in verl's words."""
    if mode is None:
        return "no verl mode applies"
    return f"read it with VERL_DATAPROTO_SERIALIZATION_METHOD={mode}"
