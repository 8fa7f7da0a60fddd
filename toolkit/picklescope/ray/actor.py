"""The receiver side over Ray: an actor in a Ray worker process, measured like the in-process receiver.

The actor connects to the parent on creation and announces its pid (the parent samples its RSS from
``/proc`` like any side). Its measured phase has a :class:`~picklescope.core.steps.Meter` installed, so its
steps carry exact kernel peaks (``VmHWM`` with resets) and stream to the parent as they happen:

- put path (``ray``): :meth:`receive` is called with the driver's ``ObjectRef`` wrapped in a list
  (so Ray does not resolve it first) and runs ``ray.get`` inside the meter;
- argument path (``ray-arg``): :meth:`arm` installs the meter and takes the baseline, then the
  driver calls :meth:`receive_arg` with the batch itself, so Ray deserializes it in this worker
  before the method body runs; the ``ray.deserialize`` step (see :mod:`.hooks`) is that work.

After the measured phase the actor records what it still holds, checks the round trip against the
sender's manifest (:func:`picklescope.codecs.verify.compare`), reports where the received tensors live
(:mod:`.received`) and, on the put path, whether an in-place write reaches other readers.
"""

from __future__ import annotations

import gc
import os
from typing import Any

from picklescope.batch import set_active_codec
from picklescope.codecs import get_codec
from picklescope.codecs.verify import compare
from picklescope.core import steps
from picklescope.core.events import Done, Error, Received
from picklescope.core.plugins import load_plugins
from picklescope.measure.child import arm_stack_dump, begin_measure, end_measure, error_event
from picklescope.measure.launcher import PRELOAD
from picklescope.ray import channel, hooks, received
from picklescope.ray import transferqueue as tq
from picklescope.ray.config import RayPairConfig

SIDE = "receiver"


class ReceiverActor:
    """Plain class; the driver wraps it with ``ray.remote`` (so importing this module needs no Ray)."""

    def __init__(self, cfg: RayPairConfig) -> None:
        self.cfg = cfg
        self.conn = channel.connect(cfg)
        self.conn.send(channel.pid_event(SIDE, "receiver"))
        if os.path.isdir(cfg.run_dir):  # the watchdog's SIGUSR1 writes our stack there before a kill
            self._stack_file = arm_stack_dump(cfg, SIDE)
        for key, value in cfg.env.get(SIDE, {}).items():
            os.environ[key] = value
        import importlib


        for module in PRELOAD:  # what the forkserver gives our own children: no first-import cost measured
            importlib.import_module(module)

        load_plugins(cfg.plugins)
        codec = cfg.receiver_codec or cfg.codec
        get_codec(codec)
        set_active_codec(codec)
        hooks.install(deserialize=True)
        self.t0 = channel.local_t0(cfg)
        self.meter: steps.Meter | None = None
        self.manifest: dict[str, Any] | None = None

    def ready(self) -> int:
        return os.getpid()

    def _start(self, manifest: dict[str, Any]) -> None:
        self.manifest = manifest
        gc.collect()
        self.meter = begin_measure(steps.Meter(channel.with_shared(self.conn.send), self.t0, SIDE))

    def arm(self, manifest: dict[str, Any]) -> None:
        """Argument path: measure from now, so the next call's argument deserialization is inside."""
        self._start(manifest)

    def receive(self, refs: list[Any], manifest: dict[str, Any]) -> bool:
        """Put path: ``ray.get`` the driver's object inside the meter."""
        import ray

        self._start(manifest)
        obj, error = None, None
        try:
            with steps.step("ray.get"):
                obj = ray.get(refs[0])
        except BaseException as exc:  # noqa: BLE001 - reported, not raised
            error = error_event(SIDE, exc)
        return self._finish(obj, error, lambda: ray.get(refs[0]))

    def attach_tq(self) -> None:
        """TransferQueue path: connect this process's client to the driver's TransferQueue, unmeasured."""
        tq.activate().init()

    def receive_tq(self, keys: list[str], layout: dict[str, Any], meta_info: dict[str, Any],
                   manifest: dict[str, Any]) -> bool:
        """TransferQueue path: read the rows back and rebuild the batch inside the meter."""
        self._start(manifest)
        obj, error = None, None
        try:
            with steps.step("tq.get"):
                obj = tq.get(keys, layout, meta_info)
        except BaseException as exc:  # noqa: BLE001
            error = error_event(SIDE, exc)
        return self._finish(obj, error, lambda: tq.get(keys, layout, meta_info))

    def receive_arg(self, obj: Any) -> bool:
        """Argument path: Ray already deserialized ``obj`` (measured by the hook); finish the side."""
        return self._finish(obj, None, None)

    def _finish(self, obj: Any, error: Error | None, read_again: Any) -> bool:
        meter = self.meter
        assert meter is not None, "receive before arm"
        m = end_measure(self.conn, meter, error, read_at_end=channel.shared_bytes)
        mismatches = compare(self.manifest or {}, obj) if error is None else []
        report: dict[str, Any] = {}
        if error is None:
            try:
                report = received.inspect(obj)
                if read_again is None:
                    report["hazard"] = {"probed": False, "reason": "the argument path has no ref a second "
                                        "reader could get; see the put path"}
                else:
                    report["hazard"] = received.probe_hazard(obj, report, read_again)
            except Exception as exc:  # noqa: BLE001 - an inspection failure must not hide the run
                report = {"status": None, "error": f"{type(exc).__name__}: {exc}"}
        self.conn.send(Received(type="received", side=SIDE, report=report, shm_end_bytes=m.at_end))
        self.conn.send(Done(type="done", side=SIDE, peak_bytes=m.peak_bytes, held_bytes=m.held_bytes,
                            cycle_held_bytes=m.cycle_held_bytes, baseline_bytes=m.baseline_bytes, t_s=m.end_t,
                            mismatches=mismatches))
        del obj
        return error is None
