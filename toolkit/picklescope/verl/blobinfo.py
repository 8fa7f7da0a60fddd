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
import pickletools
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import PicklescopeError

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

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _is_torch_archive(data: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return any(n.endswith("/data.pkl") or n == "data.pkl" for n in z.namelist())
    except zipfile.BadZipFile:
        return False


def describe_blob(path: str | Path) -> BlobInfo:
    """Identify the writer of ``path`` from its bytes alone (safe on any file)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as exc:
        raise PicklescopeError(f"cannot read blob {p}: {exc.strerror}", "check the path") from None
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
    try:
        for op, arg, _pos in pickletools.genops(data):
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
        info.writer = f"not a pickle stream ({exc})"
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


def mode_hint(mode: str | None) -> str:
    """What the reading process must set, in verl's words."""
    if mode is None:
        return "no verl mode applies"
    return f"read it with VERL_DATAPROTO_SERIALIZATION_METHOD={mode}"
