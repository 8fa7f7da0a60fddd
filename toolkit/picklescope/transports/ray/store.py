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

from picklescope.core.procmem import StatmReader
from picklescope.core.result import Timeline
from picklescope.measure.sampler import Sampler


class ShmFileReader:
    """Allocated bytes of one (possibly unlinked) file, through a descriptor we keep open.

    Keeping the descriptor open keeps the file's pages alive, so :meth:`close` must run before the
    run ends (the sampler does it on ``stop``).
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


class StoreSampler(Sampler):
    """A sampler for readers that are not a process's statm (the plasma file), on the run's clock.

    Kept apart from the sides' sampler so the watchers of that one (budgets, live views) only ever
    see the two sides.
    """

    def add_reader(self, name: str, reader: ShmFileReader | StatmReader) -> None:
        with self._lock:
            self._readers[name] = reader  # type: ignore[assignment]
            self.timelines.setdefault(name, Timeline())


def store_trace(timeline: Timeline, source: str, capacity: int | None) -> dict:
    """The JSON-able form kept in ``RunResult.extra["object_store"]``."""
    return {"t_s": list(timeline.t_s), "bytes": list(timeline.rss_bytes), "source": source,
            "capacity_bytes": capacity}
