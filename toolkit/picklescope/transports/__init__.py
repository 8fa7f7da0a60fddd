"""How the pickled batch crosses from the sender process to the receiver process.

``pickle`` is protocol 4 with everything in-band (what ``pickle.dumps`` and ``save_to_disk`` do);
``pickle5-oob`` is protocol 5 with out-of-band buffers (what Ray does for numpy arrays). The sender
writes the stream and the buffers to one file in ``/dev/shm`` with plain ``write`` calls, so the
hand-off adds nothing to its own memory and shows up as its own step. The receiver maps that file
read-only and pre-faults it during setup (it is counted in the receiver's baseline, as Ray's object
store would be), then unpickles from the mapping.

Every transport is a :class:`Transport` (a name and a description). The two above are
instances of :class:`PickleTransport`: the runner's sender and receiver children call their ``send``,
``prepare`` and ``receive``. The transports of :mod:`picklescope.ray` have none of those:
they run both sides themselves, which :class:`OwnsItsReceiver` declares and the runner checks with
``isinstance``.
"""

from __future__ import annotations

import mmap
import os
import pickle
import tempfile
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from picklescope.core.registry import Registry
from picklescope.core.steps import step
from picklescope.core.units import fmt_bytes, parse_size
from picklescope.errors import PicklescopeError, safe_text

if TYPE_CHECKING:
    from picklescope.core.childconfig import PairConfig
    from picklescope.core.result import RunResult
    from picklescope.measure.fold import RunFold

ALIGN = 64
SHM = "/dev/shm"
# For tests and for reasoning about a smaller machine: the free bytes the hand-off check believes /dev/shm
# has, instead of what statvfs reports (e.g. 64MiB to act like Docker's default). A --handoff-dir is
# always measured.
FREE_BYTES_ENV = "PICKLESCOPE_SHM_FREE_BYTES"
HANDOFF_SLACK = 1024**2  # the pickle stream's own bytes and the non-tensor data, beyond the payload


def handoff_root(handoff_dir: str | os.PathLike | None = None) -> str | None:
    """Where a run's hand-off goes: ``handoff_dir`` if given (it must be an existing, writable folder),
    else ``/dev/shm`` (memory, like Ray's object store), else the temp directory (None)."""
    if handoff_dir is None:
        return SHM if os.path.isdir(SHM) else None
    path = os.path.abspath(os.path.expanduser(os.fspath(handoff_dir)))
    shown = safe_text(os.fspath(handoff_dir), 300)
    if not os.path.isdir(path):
        what = "does not exist" if not os.path.lexists(path) else "is not a folder"
        raise PicklescopeError(f"--handoff-dir {shown} {what}", "give an existing folder on a disk with room for "
                               "the hand-off (about the payload's size)")
    if not os.access(path, os.W_OK | os.X_OK):
        raise PicklescopeError(f"--handoff-dir {shown} is not writable by this user",
                               "give a folder you can write to")
    return path


def free_bytes(directory: str) -> int:
    """Bytes an unprivileged writer can still put in ``directory``'s filesystem (``statvfs``'s f_bavail).

    For ``/dev/shm`` only, ``PICKLESCOPE_SHM_FREE_BYTES`` (bytes or a size like ``64MiB``) replaces the
    reading, so a test can act out Docker's small ``/dev/shm`` without mounting one.
    """
    raw = os.environ.get(FREE_BYTES_ENV) if os.path.abspath(directory) == SHM else None
    if raw:
        size = parse_size(raw, FREE_BYTES_ENV)
        if size.bytes is None:
            raise PicklescopeError(f"{FREE_BYTES_ENV}={safe_text(raw)!r} is a multiple, not a size", "give e.g. 64MiB")
        return size.bytes
    st = os.statvfs(directory)
    return st.f_bavail * st.f_frsize


def check_handoff_space(directory: str | None, payload: int, chosen: bool = False) -> None:
    """Refuse a run whose hand-off cannot fit ``directory`` (one line: sizes, where, the ways out).

    A full ``/dev/shm`` (Docker gives a container 64 MiB unless ``--shm-size`` says otherwise) would
    otherwise end the sender with ``OSError: [Errno 28] No space left on device`` halfway through the
    hand-off, with no word about which filesystem or what to do.
    """
    where = directory or tempfile.gettempdir()
    need = payload + HANDOFF_SLACK
    free = free_bytes(where)
    if need <= free:
        return
    if chosen:
        raise PicklescopeError(
            f"the hand-off needs about {fmt_bytes(need)} but --handoff-dir {safe_text(where, 300)} has only "
            f"{fmt_bytes(free)} free", "give a --handoff-dir on a disk with more free space, or a smaller --scale")
    ways = ("pass --handoff-dir DIR to write it to a folder on disk instead (Python: handoff_dir=...), give the "
            "machine more shared memory (Docker: --shm-size=2g; elsewhere remount /dev/shm larger), or use a "
            "smaller --scale")
    raise PicklescopeError(f"the hand-off needs about {fmt_bytes(need)} but {safe_text(where)} (shared memory) has "
                           f"only {fmt_bytes(free)} free", ways)


def _check_room(fd: int, path: str, nbytes: int) -> None:
    """Exact check in the sender, once the stream's size is known (the parent's check used the payload)."""
    st = os.fstatvfs(fd)
    free = st.f_bavail * st.f_frsize
    raw = os.environ.get(FREE_BYTES_ENV) if path.startswith(SHM + os.sep) else None
    if raw and raw.isdigit():
        free = min(free, int(raw))
    if nbytes > free:
        raise OSError(28, f"the hand-off needs {fmt_bytes(nbytes)} but its folder has only {fmt_bytes(free)} free "
                      "(pass --handoff-dir DIR on a disk, or give the machine more shared memory, e.g. Docker "
                      "--shm-size)")


def _write_all(fd: int, data: memoryview) -> None:
    view = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    while view:
        n = os.write(fd, view)
        view = view[n:]


@dataclass
class Prepared:
    """What the receiver mapped during setup: the in-band stream and the out-of-band buffers."""

    mapping: mmap.mmap | None
    inband: memoryview
    buffers: list[memoryview]

    def close(self) -> None:
        self.buffers = []
        self.inband.release()
        if self.mapping is not None:
            try:
                self.mapping.close()
            except BufferError:  # a received array still points into the mapping (zero-copy codec)
                pass


class Transport:
    """What every transport has: the name a run is given, and a line for ``picklescope list``."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""

    @property
    def summary(self) -> str:
        """The description, plus why the transport cannot run here when it cannot."""
        return self.description


@runtime_checkable
class OwnsItsReceiver(Protocol):
    """A transport that runs both sides itself (Ray, TransferQueue: the receiver is an actor the cluster
    starts, not a child of ours). The runner hands it the run instead of starting two children."""

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse ``transport_options`` (or a missing install) before anything of the run exists."""

    def run_sides(self, state: RunFold, cfg: PairConfig, **kw: Any) -> RunResult:
        """Start, sample, fold and clean up both sides; return the run's result."""


class PickleTransport(Transport):
    """Serialize in the sender (returning a JSON-able hand-off), deserialize in the receiver."""

    protocol: ClassVar[int] = 4
    out_of_band: ClassVar[bool] = False

    def send(self, obj: Any, handoff_dir: str) -> dict[str, Any]:
        buffers: list[pickle.PickleBuffer] = []
        with step("pickle.dumps"):
            if self.out_of_band:
                data = pickle.dumps(obj, protocol=self.protocol, buffer_callback=buffers.append)
            else:
                data = pickle.dumps(obj, protocol=self.protocol)
        path = os.path.join(handoff_dir, "handoff.bin")
        sizes = []
        with step("handoff"):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                _check_room(fd, path, len(data) + sum(b.raw().nbytes + ALIGN for b in buffers))
                _write_all(fd, memoryview(data))
                offset = len(data)
                for buf in buffers:
                    raw = buf.raw()
                    pad = (-offset) % ALIGN
                    if pad:
                        os.write(fd, b"\0" * pad)
                        offset += pad
                    _write_all(fd, raw)
                    sizes.append((offset, raw.nbytes))
                    offset += raw.nbytes
            finally:
                os.close(fd)
        oob = sum(n for _, n in sizes)
        info = {"path": path, "inband_bytes": len(data), "buffers": sizes, "oob_bytes": oob,
                "blob_bytes": len(data) + oob}
        del data, buffers
        return info

    def prepare(self, info: dict[str, Any]) -> Prepared:
        """Map the hand-off read-only and fault it in, outside the measured phase."""
        fd = os.open(info["path"], os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            mapping = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0),
                                prot=mmap.PROT_READ)
        finally:
            os.close(fd)
        view = memoryview(mapping)
        inband = view[: info["inband_bytes"]]
        buffers = [view[off:off + n] for off, n in info["buffers"]]
        view.release()
        return Prepared(mapping, inband, buffers)

    def receive(self, prepared: Prepared) -> Any:
        with step("pickle.loads"):
            if self.out_of_band:
                return pickle.loads(prepared.inband, buffers=prepared.buffers)
            return pickle.loads(prepared.inband)


class PickleInBand(PickleTransport):
    name = "pickle"
    description = "pickle protocol 4, every byte in-band (pickle.dumps, save_to_disk)"


class Pickle5OutOfBand(PickleTransport):
    name = "pickle5-oob"
    description = "pickle protocol 5 with out-of-band buffers (what Ray does inside a process)"
    protocol = 5
    out_of_band = True


TRANSPORTS: Registry[Transport] = Registry("transport")
for _cls in (PickleInBand, Pickle5OutOfBand):
    TRANSPORTS.register(_cls.name, _cls())


# Ray and TransferQueue (:mod:`picklescope.ray`) own their receiver process and build on this module's
# base classes: they are named as a provider, imported on the first lookup, so that this module imports none of them.
TRANSPORTS.add_provider("picklescope.ray:transports")


def get_transport(name: str) -> Transport:
    """The transport called ``name``; an unknown name lists the known ones."""
    return TRANSPORTS.get(name)


def pickle_transport(name: str) -> PickleTransport:
    """The transport called ``name``, for a sender or receiver child: it must hand off through a file."""
    transport = get_transport(name)
    if not isinstance(transport, PickleTransport):
        raise PicklescopeError(f"transport {name!r} runs both sides itself, not in a sender and a receiver child",
                               "run it through picklescope.run, which hands it the run")
    return transport
