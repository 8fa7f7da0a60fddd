"""How the pickled batch crosses from the sender process to the receiver process.

``pickle`` is protocol 4 with everything in-band (what ``pickle.dumps`` and ``save_to_disk`` do);
``pickle5-oob`` is protocol 5 with out-of-band buffers (what Ray does for numpy arrays). The sender
writes the stream and the buffers to one file in ``/dev/shm`` with plain ``write`` calls, so the
hand-off adds nothing to its own memory and shows up as its own step. The receiver maps that file
read-only and pre-faults it during setup (it is counted in the receiver's baseline, as Ray's object
store would be), then unpickles from the mapping.
"""

from __future__ import annotations

import mmap
import os
import pickle
from dataclasses import dataclass
from typing import Any, ClassVar

from .registry import Registry
from .steps import step

ALIGN = 64


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
    """Serialize in the sender (returning a JSON-able hand-off), deserialize in the receiver."""

    name: ClassVar[str] = ""
    description: ClassVar[str] = ""
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


class PickleInBand(Transport):
    name = "pickle"
    description = "pickle protocol 4, every byte in-band (pickle.dumps, save_to_disk)"


class Pickle5OutOfBand(Transport):
    name = "pickle5-oob"
    description = "pickle protocol 5 with out-of-band buffers (what Ray does inside a process)"
    protocol = 5
    out_of_band = True


TRANSPORTS: Registry[Transport] = Registry("transport")
for _cls in (PickleInBand, Pickle5OutOfBand):
    TRANSPORTS.register(_cls.name, _cls())


def _cluster_transports() -> dict[str, Transport]:
    """Ray and TransferQueue (:mod:`picklescope.transports_ray`): they own their receiver process."""
    from .transports_ray import transports

    return dict(transports())


TRANSPORTS.add_provider(_cluster_transports)


def get_transport(name: str) -> Transport:
    """The transport called ``name``; an unknown name lists the known ones."""
    return TRANSPORTS.get(name)
