"""RSS of the child processes sampled from the parent at about 1 ms.

The sampler is a thread of the parent, which only waits on pipes, so unlike a thread inside the
measured process it is never starved by a long ``pickle.dumps`` holding that process's GIL. Watchers
(the budget watchdog) see every sample as it is taken.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from .procmem import StatmReader
from .result import Timeline

Watcher = Callable[[str, float, int], None]


class Sampler:
    """Samples every registered process until stopped; one :class:`Timeline` per name."""

    def __init__(self, t0: float, interval_s: float = 0.001) -> None:
        self.t0 = t0
        self.interval_s = interval_s
        self.timelines: dict[str, Timeline] = {}
        self.watchers: list[Watcher] = []
        self._readers: dict[str, StatmReader] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="picklescope-sampler", daemon=True)

    def start(self) -> Sampler:
        self._thread.start()
        return self

    def add(self, name: str, pid: int) -> None:
        try:
            reader = StatmReader(pid)
        except OSError:
            return
        with self._lock:
            self._readers[name] = reader
            self.timelines.setdefault(name, Timeline())

    def remove(self, name: str) -> None:
        with self._lock:
            reader = self._readers.pop(name, None)
        if reader:
            reader.close()

    def _loop(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                readers = list(self._readers.items())
            for name, reader in readers:
                value = reader.read()
                t = time.monotonic() - self.t0
                if value is None:
                    self.remove(name)
                    continue
                tl = self.timelines[name]
                tl.t_s.append(round(t, 6))
                tl.rss_bytes.append(value)
                for w in self.watchers:
                    w(name, t, value)
            time.sleep(self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for name in list(self._readers):
            self.remove(name)
