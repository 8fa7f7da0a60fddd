"""How the driver and the receiver actor report to the parent, and on which clock.

The driver is our own child and reports over its multiprocessing pipe. The receiver is a Ray actor
in a worker process the raylet started, so it connects back to a listener the parent opened (a Unix
socket in the run directory, or TCP with an auth key when the cluster may put the actor on another
node) and streams the same events the in-process receiver sends. Every event is written as it
happens, so a SIGKILL of the actor, of the driver or of the whole cluster loses nothing already sent.

Step events also carry the process's ``RssShmem``: a ``ray.put`` writes the payload into shared
pages that the writer's RSS counts, and a ``ray.get`` reader's RSS counts the store pages it
touches; those pages belong to the object store, not to the process, and the parent uses the field
to report each side's private cost apart from the store pages it mapped.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable
from multiprocessing.connection import Client
from typing import Any

from picklescope.core.events import Event, Hello
from picklescope.ray.config import RayConfig

_STEP_EVENTS = ("baseline", "step_start", "step_end")


def shared_bytes() -> int:
    """This process's resident shared-memory pages (``RssShmem``) in bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("RssShmem:"):
                return int(line.split()[1]) * 1024
    return 0


def with_shared(send: Callable[[Event], None]) -> Callable[[Event], None]:
    """A meter sink that stamps step boundaries with ``shm_bytes`` before sending them on."""

    def sink(ev: Event) -> None:
        if ev.get("type") in _STEP_EVENTS:
            ev["shm_bytes"] = shared_bytes()
        send(ev)

    return sink


def machine_id() -> str:
    """Host name plus boot id: equal only for two processes on the same running kernel."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}:{boot}"


def local_t0(cfg: RayConfig) -> float:
    """The parent's ``t0`` on this process's monotonic clock.

    Same machine: the monotonic clock is shared, use it as is. Another node: translate through the
    wall clock (as good as the nodes' clock sync, which the result then says).
    """
    if cfg.machine == machine_id():
        return cfg.t0
    return time.monotonic() - (time.time() - cfg.t0_wall)


def connect(cfg: RayConfig) -> Any:
    """Open the event connection to the parent's listener."""
    address = cfg.events_address
    if isinstance(address, list):  # JSON/Ray turned the (host, port) tuple into a list
        address = tuple(address)
    family = "AF_UNIX" if isinstance(address, str) else "AF_INET"
    return Client(address, family=family, authkey=bytes.fromhex(cfg.events_key))


def pid_event(side: str, role: str) -> Hello:
    """The :class:`~picklescope.core.events.Hello` an actor sends first: the parent samples ``pid`` from here."""
    return Hello(type="hello", side=side, role=role, pid=os.getpid(), machine=machine_id())
