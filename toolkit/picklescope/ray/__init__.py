"""Transports across real process boundaries: Ray (put/get and call arguments) and TransferQueue.

Unlike ``pickle`` and ``pickle5-oob``, whose two sides are children the runner starts, these own
their receiver (an actor the cluster starts) and their cleanup (every process of the cluster), so the
runner hands them the run (:meth:`ProcessTransport.run_sides`). Importing this package never imports
Ray: only the driver child and the actor do.
"""

from __future__ import annotations

from picklescope.ray.transport import (
    ProcessTransport,
    RayArg,
    RayPut,
    RayTransport,
    TransferQueueTransport,
    TransportUnavailable,
)

_instances: dict[str, ProcessTransport] = {}


def transports() -> dict[str, ProcessTransport]:
    """The registry provider: one instance per name, created once."""
    if not _instances:
        for cls in (RayPut, RayArg, TransferQueueTransport):
            _instances[cls.name] = cls()
    return dict(_instances)


def ray_available() -> bool:
    """Whether the ``ray`` transports can run on this machine."""
    return _instances.get("ray", RayPut()).availability() is None


__all__ = ["ProcessTransport", "RayArg", "RayPut", "RayTransport", "TransferQueueTransport", "TransportUnavailable",
           "ray_available", "transports"]
