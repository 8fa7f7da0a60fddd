"""``--controller actor``: the node's training loop runs inside a Ray actor, as verl's ``TaskRunner`` does.

verl's ``main_ppo`` script starts Ray and runs ``TaskRunner.run`` as a Ray actor (one CPU); the
single controller's loop (build the batch, split it, call the workers, join the results) runs in
that actor's process. To Ray's memory monitor that process is a worker like any other, so its
choice of victim and its message ("ray::TaskRunner.run" among the top memory users) are the ones
verl's users see. With ``--controller process`` (the default) the loop runs in the driver process
that called ``ray.init``, where Ray's monitor never looks.

The driver process (the *script*) starts Ray as before, creates the actor and then only relays:
what the actor says goes to the parent on the driver's pipe, what the parent says goes back to the
actor, over a connection in the run's folder (:class:`Relay`). The actor introduces itself with a
``controller`` event (its pid, its Ray node), so the parent measures it as ``driver`` and the script
as ``script`` (:func:`picklescope.measure.session.Session.hand_over`).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Listener, wait
from typing import Any

from picklescope.core.events import Controller
from picklescope.errors import PicklescopeError

CONTROLLERS = ("process", "actor")
CONTROLLER_NAME = "TaskRunner"  # the actor's class name, so Ray names it as verl's users read it
SOCKET = "controller.sock"  # in the run's folder
POLL_S = 0.2
START_S = 300.0  # at most, for the actor's start (its process imports torch and Ray), as the workers'
END_S = 30.0  # at most, for the actor's end once its connection closed


def check_controller(controller: str, engine: str) -> None:
    """A known controller; bad input raises one line."""
    if controller not in CONTROLLERS:
        raise PicklescopeError(f"--controller {controller!r} is not one of {', '.join(CONTROLLERS)}",
                               "use --controller process (the driver runs the loop) or actor (a Ray actor "
                               "runs it, as verl's TaskRunner)")


def hello(conn: Any) -> None:
    """The actor's first word to the script (relayed to the parent): who measures as ``driver`` now."""
    import ray  # deferred: Ray is imported only in the node's own processes, never by the parent

    conn.send(Controller(type="controller", pid=os.getpid(), node_id=ray.get_runtime_context().get_node_id()))


def connect(address: str, key: bytes) -> Any:
    """The actor's connection to the script that created it."""
    return Client(address, family="AF_UNIX", authkey=key)


class Relay:
    """In the script: a listener the actor connects to, and the relay between it and the parent's pipe."""

    def __init__(self, run_dir: str) -> None:
        self.key = os.urandom(16)
        self.address = os.path.join(run_dir, SOCKET)
        self.listener = Listener(self.address, family="AF_UNIX", authkey=self.key)
        self._accepted: list[Any] = []
        threading.Thread(target=self._accept, name="picklescope-controller-accept", daemon=True).start()

    def _accept(self) -> None:
        try:
            self._accepted.append(self.listener.accept())
        except (OSError, EOFError, ValueError):  # closed, or a bad key
            pass

    def run(self, ray: Any, ref: Any, parent: Any, wait_s: Callable[[float], float],
            on_message: Callable[[Any], None] | None = None) -> None:
        """Relay until the actor's ``run`` returns (its error, such as Ray killing it, is raised here).

        ``wait_s(cap)`` is how long a wait may take (``cap`` or what is left of the run's limit): the wait for
        the actor's connection (it needs a free CPU of the cluster), and for its end once its connection
        closed. ``on_message(msg)`` sees every message of the actor before it is passed on."""
        start_s = wait_s(START_S)
        until = time.monotonic() + start_s
        while not self._accepted:
            done, _ = ray.wait([ref], timeout=POLL_S)
            if done:
                ray.get(ref)  # it ended before it connected: its error, if any
                raise RuntimeError("the controller actor ended before it connected to the driver")
            if time.monotonic() > until:
                raise RuntimeError(f"the controller actor did not start within {start_s:.0f} s (it needs one free "
                                   "CPU of the cluster, as verl's TaskRunner; or the run's --timeout was near)")
        actor = self._accepted[0]
        try:
            while True:
                ready = wait([actor, parent], timeout=POLL_S)
                if actor in ready:
                    try:
                        msg = actor.recv()
                    except (EOFError, OSError):
                        break
                    if on_message is not None:
                        on_message(msg)
                    parent.send(msg)
                if parent in ready:
                    try:
                        actor.send(parent.recv())
                    except (EOFError, OSError):
                        break
                if not ready and ray.wait([ref], timeout=0)[0]:
                    break
        finally:
            actor.close()  # an actor still waiting for the parent's word ends now
        try:
            ray.get(ref, timeout=wait_s(END_S))  # raises what ended the actor, if not itself
        except ray.exceptions.GetTimeoutError:
            raise RuntimeError("the controller actor did not end after its connection closed") from None

    def close(self) -> None:
        """Stop listening; the socket's file goes with the run's folder."""
        self.listener.close()
