"""Transports that cross a real process boundary through a cluster and own their receiver process.

``ray`` is a verl driver's ``ray.put(batch)`` followed by a worker's ``ray.get``; ``ray-arg`` is the
other way verl ships a batch, as the argument of a remote call (Ray serializes it in ``.remote()`` and
deserializes it in the worker before the method runs); ``transferqueue`` puts the batch's fields into
TransferQueue and the actor reads them back (see :mod:`.tq`). All three run through
:func:`~picklescope.ray.orchestrate.run_sides`, because the receiver is an actor that the
cluster starts, not a child of ours. A transport that cannot run here says exactly why
(:meth:`availability`) and is refused before anything starts: no numbers are ever made up.
"""

from __future__ import annotations

import importlib.util
import os
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from picklescope.core.childconfig import PairConfig
from picklescope.core.result import RunResult
from picklescope.errors import PicklescopeError
from picklescope.ray.address import check as check_address
from picklescope.ray.orchestrate import run_sides
from picklescope.ray.transferqueue import INSTALL_HINT, TQ_VERSION, missing
from picklescope.transports import Transport

RAY_MISSING = "the ray package is not installed"
RAY_INSTALL = ("install it with pip install 'picklescope[ray]' (Ray 2.41 or later; the figures in the docs were "
               "measured with 2.60.0)")


class TransportUnavailable(PicklescopeError):
    """The transport's software or platform is missing on this machine; the message says which."""

    def __init__(self, name: str, reason: str, hint: str) -> None:
        self.transport = name
        self.reason = reason
        super().__init__(f"transport {name!r} is unavailable here: {reason}", hint)


class ProcessTransport(Transport, ABC):
    """Base for transports whose receiver is not a child of ours (a Ray actor): each is an
    :class:`~picklescope.transports.OwnsItsReceiver`, with nothing to send or receive in our children."""

    owns_processes: ClassVar[bool] = True
    install_hint: ClassVar[str] = ""

    def availability(self) -> str | None:
        """None if the transport can run here, else the reason it cannot."""
        if not os.path.isdir("/proc/self"):
            return "needs Linux /proc to sample the sides and find the cluster's processes"
        return None

    def hint_for(self, reason: str) -> str:
        """The way out of ``reason`` (what to install, and how)."""
        return self.install_hint

    def check(self) -> None:
        reason = self.availability()
        if reason:
            raise TransportUnavailable(self.name, reason, self.hint_for(reason))

    def check_options(self, options: dict[str, Any]) -> None:
        """Refuse what cannot run, before the runner creates anything (the default: availability)."""
        self.check()

    @property
    def summary(self) -> str:
        reason = self.availability()
        return self.description + (f"  [unavailable: {reason}]" if reason else "")

    @abstractmethod
    def run_sides(self, state: Any, cfg: PairConfig, **kw: Any) -> RunResult:
        """Start, sample, fold and clean up both sides (see :mod:`.orchestrate`)."""


class RayTransport(ProcessTransport):
    """A local Ray cluster of the run's own (or the one at ``ray_address``), driver to actor."""

    ray_path: ClassVar[str] = "put"
    install_hint = RAY_INSTALL

    def availability(self) -> str | None:
        try:
            found = importlib.util.find_spec("ray") is not None
        except (ImportError, ValueError):  # a broken or half-removed install
            found = False
        if not found:
            return RAY_MISSING
        return super().availability()

    def hint_for(self, reason: str) -> str:
        return RAY_INSTALL if reason == RAY_MISSING else self.install_hint

    def check_options(self, options: dict[str, Any]) -> None:
        """Ray's presence and ``ray_address``, checked by the runner before anything of the run exists:
        ``ray.init`` given an address where no cluster answers would retry for minutes."""
        self.check()
        address = options.get("ray_address")
        if address:
            check_address(str(address))

    def run_sides(self, state: Any, cfg: PairConfig, **kw: Any) -> RunResult:
        """Run the driver and the actor (see :mod:`.orchestrate`); ``options`` may hold ``ray_address``."""
        return run_sides(state, cfg, ray_path=self.ray_path, **kw)


class RayPut(RayTransport):
    name = "ray"
    description = "Ray: driver ray.put -> actor ray.get in a worker process (object store, numpy out of band)"


class RayArg(RayTransport):
    name = "ray-arg"
    description = "Ray: the batch as a remote call's argument (serialized in .remote(), deserialized by the worker)"
    ray_path = "arg"


class TransferQueueTransport(RayTransport):
    name = "transferqueue"
    description = f"TransferQueue {TQ_VERSION}: TensorDict fields over ZeroMQ to a storage-unit actor (no pickling)"
    ray_path = "tq"
    install_hint = INSTALL_HINT

    def availability(self) -> str | None:
        return super().availability() or missing()
