"""Which codec wrote a blob, read from its pickle opcodes without running any of it.

A blob is a pickle, and unpickling runs code, so identification must not unpickle.
``pickletools.genops`` walks the opcode stream: the classes it names (``verl.protocol.DataProto``,
``picklescope.batch.Batch``), byte strings that are ``torch.save`` zip archives (torch mode), numpy
array reconstructors (numpy mode) and out-of-band buffer markers (pickle protocol 5) are enough to
say who wrote it and which ``VERL_DATAPROTO_SERIALIZATION_METHOD`` the reader needs. Nothing here
imports verl or torch.
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
from typing import Any

from picklescope.errors import PicklescopeError

ZIP_MAGIC = b"PK\x03\x04"
_STRING_OPS = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING", "STRING"}
_BYTES_OPS = {"SHORT_BINBYTES", "BINBYTES", "BINBYTES8", "BYTEARRAY8"}
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


def _is_torch_archive(data: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
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


def _describe_bytes(p: Path, data: bytes) -> BlobInfo:
    info = BlobInfo(str(p), len(data), hashlib.sha256(data).hexdigest(), "unknown")
    if data.startswith(ZIP_MAGIC):
        info.kind = "torch-zip" if _is_torch_archive(data) else "zip"
        info.mode = "torch" if info.kind == "torch-zip" else None
        info.writer = ("a bare torch.save archive (not a pickled DataProto): torch mode's inner payload"
                       if info.mode else "a zip file, not a pickle")
        return info
    strings: list[str] = []
    memo: dict[int, Any] = {}
    last: Any = None
    seen: list[tuple[str, str]] = []  # each global once, in order
    uses: list[tuple[str, str]] = []  # every use (memo gets included)
    stream = io.BytesIO(data)
    at = 0  # where the opcode being read starts
    try:
        for op, arg, _pos in pickletools.genops(stream):
            at = stream.tell()
            name = op.name
            if name == "PROTO":
                info.pickle_protocol = arg
            elif name in _STRING_OPS:
                last = arg
                strings.append(arg)
            elif name == "MEMOIZE":
                memo[len(memo)] = last
            elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
                memo[int(arg)] = last
            elif name in ("BINGET", "LONG_BINGET", "GET"):
                last = memo.get(int(arg))
                strings.append(last if isinstance(last, str) else "")
                if isinstance(last, tuple):
                    uses.append(last)
            elif name in ("GLOBAL", "STACK_GLOBAL"):
                if name == "GLOBAL":
                    module, _, qual = str(arg).partition(" ")
                else:
                    module, qual = (strings[-2], strings[-1]) if len(strings) >= 2 else ("?", "?")
                seen.append((module, qual))
                uses.append((module, qual))
                last = (module, qual)
            elif name in _BYTES_OPS:
                last = None
                if bytes(arg[:4]) == ZIP_MAGIC and _is_torch_archive(bytes(arg)):
                    info.torch_archives += 1
                    info.torch_archive_bytes += len(arg)
            elif name == "NEXT_BUFFER":
                info.out_of_band_buffers += 1
            else:
                last = None
    except (ValueError, IndexError) as exc:
        _classify(info, data, at, str(exc))
        return info
    info.kind = "pickle"
    info.globals = list(dict.fromkeys(f"{m}.{q}" for m, q in seen))
    info.numpy_arrays = sum(1 for g in uses if g in _NUMPY_GLOBALS)
    container = next((CONTAINERS[g] for g in seen if g in CONTAINERS), None)
    info.container = container or (f"{seen[0][0]}.{seen[0][1]}" if seen else "plain Python data")
    if info.torch_archives:
        info.mode = "torch"
        info.writer = (f"{info.container} in torch mode: the TensorDict consolidated and torch.save'd into one "
                       f"zip archive ({info.torch_archive_bytes} bytes) carried in-band")
    elif container and (info.numpy_arrays or info.out_of_band_buffers or ("numpy" in strings)):
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
