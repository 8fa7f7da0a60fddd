"""The object store's memory on the run's time axis, read by the parent from the kernel.

Ray's plasma store is one shared-memory file (``/dev/shm/plasmaXXXX``, unlinked at once and held by
the raylet). Its allocated blocks (``st_blocks`` from ``fstat``) are the pages the store really
holds in the machine's RAM: they grow when a ``ray.put`` writes and, because plasma's allocator
keeps its arena, they do not shrink when an object is freed (and on a cluster that already held
objects, a new one may reuse pages and not move the line at all). That is the number an out-of-memory
investigation needs (it is RAM nobody's RSS owns alone), and one ``fstat`` costs microseconds, so
the parent samples it at the same 1 ms as the sides' RSS. Ray's own memory API (a GCS round trip,
logical object sizes) would be neither that cheap nor that physical.

For TransferQueue the "store" is the storage-unit actor's process, sampled by its RSS instead.
"""

from __future__ import annotations

import os


class ShmFileReader:
    """Allocated bytes of one (possibly unlinked) file, through a descriptor we keep open.

    Keeping the descriptor open keeps the file's pages alive, so :meth:`close` must run before the
    run ends (the session does it on ``stop``).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_RDONLY)

    def read(self) -> int | None:
        if self._fd < 0:
            return None
        try:
            return os.fstat(self._fd).st_blocks * 512
        except OSError:
            return None

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def store_trace(t_s: list[float], values: list[int], source: str | None, capacity: int | None) -> dict:
    """The JSON-able form kept in ``RunResult.object_store`` (the session's store curve)."""
    return {"t_s": list(t_s), "bytes": list(values), "source": source, "capacity_bytes": capacity}
