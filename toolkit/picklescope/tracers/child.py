"""The tracers' child half in a measured process: start them, feed them step boundaries, stop them.

:class:`ChildTracing` wraps the pipe the :class:`~picklescope.core.steps.Meter` sends on. At each step
boundary it asks every running tracer for its view of that moment and attaches the answer to the
step event itself, so what a tracer saw up to a SIGKILL is already with the parent. When a tracer
attributes memory by stack (memray), the step start also carries the code block of its
``with step(...)`` statement (file, function, line), so the parent can tell which step an
allocation's stack was inside without trusting clocks.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from typing import Any

from picklescope.core import steps
from picklescope.core.childconfig import ChildConfig
from picklescope.core.events import Event
from picklescope.core.events import Tracer as TracerEvent
from picklescope.tracers.base import ChildContext, Tracer
from picklescope.tracers.catalog import TRACERS

Send = Callable[[Event], None]
_SKIP = {steps.__file__, contextlib.__file__, __file__}


def step_block() -> dict[str, Any] | None:
    """Where the ``with step(...)`` statement now being entered is: file, function and line.

    Only the location is taken here (a frame walk); the parent finds the block's extent in the
    source, so no parsing happens inside a measured step.
    """
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename in _SKIP:
        frame = frame.f_back
    if frame is None:
        return None
    return {"file": frame.f_code.co_filename, "function": frame.f_code.co_name, "line": frame.f_lineno}


class ChildTracing:
    """The chosen tracers inside one side; every failure is reported, never raised."""

    def __init__(self, names: list[str], ctx: ChildContext, send: Send) -> None:
        self.ctx = ctx
        self._send = send
        self.tracers: list[Tracer] = []
        for name in names:
            cls = TRACERS.get(name)
            if cls.in_child:
                self.tracers.append(cls())
        self.running: list[Tracer] = []
        self.want_blocks = False

    @classmethod
    def from_cfg(cls, cfg: ChildConfig, side: str, send: Send) -> ChildTracing:
        return cls(list(cfg.tracers), ChildContext(side, cfg.run_dir, cfg.t0), send)

    def _event(self, tracer: Tracer, phase: str, **kw: Any) -> None:
        self._send(TracerEvent(type="tracer", side=self.ctx.side, tracer=tracer.name, phase=phase, **kw))

    def start(self) -> None:
        """Start every tracer (before the baseline, so their fixed cost is not counted as a step's)."""
        for t in self.tracers:
            ok, reason = t.availability()
            if ok:
                try:
                    t.start(self.ctx)
                except Exception as exc:  # noqa: BLE001 - reported as unavailable, never raised
                    ok, reason = False, f"could not start: {type(exc).__name__}: {exc}"
            self._event(t, "start", ok=ok, reason=reason)
            if ok:
                self.running.append(t)
        self.want_blocks = any(t.needs_blocks for t in self.running)

    def sink(self, ev: Event) -> None:
        """The Meter's sink: add each tracer's view of this boundary, then send."""
        if self.running and ev.get("type") in ("step_start", "step_end"):
            if self.want_blocks and ev["type"] == "step_start":
                ev["where"] = step_block()
            points: dict[str, Any] = {}
            for t in self.running:
                try:
                    got = t.at_boundary(ev)
                except Exception:  # noqa: BLE001 - a tracer must never break the measured code
                    got = None
                if got:
                    points[t.name] = got
            if points:
                ev["tracer_points"] = points
        self._send(ev)

    def stop(self) -> None:
        """Stop every running tracer and send what each returned."""
        for t in self.running:
            try:
                data, reason = t.stop(), None
            except Exception as exc:  # noqa: BLE001
                data, reason = None, f"failed while stopping: {type(exc).__name__}: {exc}"
            self._event(t, "stop", data=data, reason=reason)
        self.running = []
