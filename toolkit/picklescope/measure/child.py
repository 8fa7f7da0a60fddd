"""The code that runs inside the sender and receiver processes.

Both sides follow the same shape: setup (imports are already warm; build or map the data), take the
baseline, run the measured steps with a :class:`~picklescope.core.steps.Meter` installed, then measure
what is still held and what only ``gc.collect()`` frees. Every event goes to the parent as it
happens, so a SIGKILL loses nothing already sent.
"""

from __future__ import annotations

import faulthandler
import gc
import os
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from picklescope.batch import set_active_codec
from picklescope.codecs import get_codec
from picklescope.codecs.base import PreparesInChild
from picklescope.codecs.verify import compare, manifest
from picklescope.core import procmem, steps
from picklescope.core.childconfig import ChildConfig, PairConfig
from picklescope.core.events import CodecInfo, Done, Error, Ready, Waiting
from picklescope.core.plugins import load_plugins
from picklescope.errors import PicklescopeError
from picklescope.measure.budget import apply_in_child, lift_in_child
from picklescope.tracers.child import ChildTracing
from picklescope.transports import pickle_transport
from picklescope.workloads.spec import load_workload


def arm_stack_dump(cfg: ChildConfig, side: str) -> Any:
    """SIGUSR1 writes every thread's Python stack to a file: the watchdog sends it before SIGKILL."""
    path = os.path.join(cfg.run_dir, f"{side}.stack")
    f = open(path, "w")  # noqa: SIM115 - must stay open for the signal handler
    faulthandler.register(signal.SIGUSR1, file=f, all_threads=True)
    return f


def error_event(side: str, exc: BaseException) -> Error:
    """The :class:`~picklescope.core.events.Error` event for ``exc``, raised in ``side``."""
    ev = Error(type="error", side=side, exc_type=type(exc).__name__, message=str(exc),
               traceback=traceback.format_exc(limit=30))
    if isinstance(exc, PicklescopeError):  # the user's input, found where it is used: the parent raises it
        ev["bad_input"] = [exc.problem, exc.hint]
    return ev


def held_memory(meter: steps.Meter, trim: bool = False) -> tuple[int, int]:
    """(held, freed by gc.collect) in bytes, after the measured phase.

    ``trim`` reads both after ``malloc_trim(0)``, for a phase whose baseline was also taken after one (every
    node replay's process, see docs/node.md): there glibc has already served the same large buffers once,
    keeps them in its heap when they are freed, and without the trim a cycle's memory that ``gc.collect()``
    frees would not show as freed."""
    if trim:
        procmem.trim_heap()
    before = procmem.rss()
    gc.collect()
    if trim:
        procmem.trim_heap()
    after = procmem.rss()
    return before - meter.baseline, before - after


@dataclass
class Measured:
    """What the end of a measured phase found: the exact peak, when it ended, what stayed held."""

    peak_bytes: int | None
    end_t: float
    held_bytes: int
    cycle_held_bytes: int
    baseline_bytes: int
    at_end: Any = None  # what ``read_at_end`` returned, read between the end and the collection


def begin_measure(meter: steps.Meter, tracing: ChildTracing | None = None) -> steps.Meter:
    """The one start of a measured phase in any measured process (a side, the Ray driver or actor).

    The meter is installed first, so every step reports to it; the tracers start before the
    baseline, so a tracer's fixed cost is not a step's; then the meter takes the baseline.
    """
    steps.install(meter)
    if tracing is not None:
        tracing.start()
    meter.start()
    return meter


def end_measure(conn: Any, meter: steps.Meter, error: Error | None, *, tracing: ChildTracing | None = None,
                cfg: ChildConfig | None = None, read_at_end: Callable[[], Any] | None = None,
                trim: bool = False) -> Measured:
    """The one end of a measured phase: the exact peak, then what is still held and what only
    ``gc.collect()`` frees, in that order, and the phase's error (if any) sent to the parent.

    ``cfg`` lifts the budgets set at the baseline (a cgroup or address-space limit must not kill
    the held-memory measurement); ``read_at_end`` reads anything else at the phase's end, before
    the collection changes it (the Ray sides read their shared-memory pages there); ``trim`` see
    :func:`held_memory`.
    """
    peak = meter.finish()
    if tracing is not None:
        tracing.stop()
    if cfg is not None:
        lift_in_child(cfg)
    steps.install(None)
    end_t = meter.now()
    at_end = read_at_end() if read_at_end is not None else None
    held, cycle = held_memory(meter, trim)
    if error:
        conn.send({**error, "phase": "measure"})
    return Measured(peak, end_t, held, cycle, meter.baseline, at_end)


def _apply_env(cfg: ChildConfig, side: str) -> None:
    for key, value in cfg.env.get(side, {}).items():
        os.environ[key] = value


def _prepare_codec(conn: Any, side: str, name: str) -> None:
    """Let a codec load what it needs (real verl: ~5 s of imports) during setup, before the baseline.

    What it returns (e.g. the verl version and the file it was loaded from) is recorded in the run.
    """
    codec = get_codec(name)
    info = codec.prepare() if isinstance(codec, PreparesInChild) else None
    if info:
        conn.send(CodecInfo(type="codec_info", side=side, info=info))


def _set_up(conn: Any, cfg: PairConfig, side: str, codec: str) -> Any:
    """What both sides do before their own set-up: plugins, the codec (prepared before the baseline), and the
    pickle transport they hand off through."""
    load_plugins(cfg.plugins)
    set_active_codec(codec)
    _prepare_codec(conn, side, codec)
    return pickle_transport(cfg.transport)


def _measured(conn: Any, cfg: ChildConfig, side: str, work: Callable[[], Any]) -> tuple[Any, Any, Any, Error | None]:
    """Run ``work`` as the side's measured phase (tracers on every step boundary, the budgets applied at the
    baseline): returns the meter, its measurement, what ``work`` returned and the error it raised, if any."""
    tracing = ChildTracing.from_cfg(cfg, side, conn.send)
    meter = begin_measure(steps.make_meter(tracing.sink, cfg, side), tracing)
    out = None
    error: Error | None = None
    try:
        apply_in_child(cfg, side)  # cgroup / address-space budgets start at the baseline
        out = work()
    except BaseException as exc:  # noqa: BLE001 - a failure of the measured work is the side's result
        error = error_event(side, exc)
    return meter, end_measure(conn, meter, error, tracing=tracing, cfg=cfg), out, error


def sender_main(conn: Any, cfg: PairConfig) -> None:
    """Build the workload, serialize it with the codec over the transport, hand it off."""
    side = "sender"
    arm_stack_dump(cfg, side)
    _apply_env(cfg, side)
    try:
        transport = _set_up(conn, cfg, side, cfg.codec)
        batch = load_workload(cfg.workload).build(cfg.scale)
        expected = manifest(batch)
        gc.collect()
        procmem.populate_file_mappings()  # library pages into the baseline, not into the steps
        conn.send(Ready(type="ready", side=side, pid=os.getpid(), manifest=expected))
    except BaseException as exc:  # noqa: BLE001 - any setup failure is reported, not raised
        conn.send({**error_event(side, exc), "phase": "setup"})
        return
    meter, m, info, _ = _measured(conn, cfg, side, lambda: transport.send(batch, cfg.run_dir))
    conn.send(Done(type="done", side=side, peak_bytes=m.peak_bytes, held_bytes=m.held_bytes,
                   cycle_held_bytes=m.cycle_held_bytes, handoff=info, baseline_bytes=m.baseline_bytes,
                   t_s=meter.now()))
    conn.recv()  # stay alive (and sampled) until the parent lets go


def receiver_main(conn: Any, cfg: PairConfig) -> None:
    """Wait for the hand-off, map it, deserialize, then verify against the sender's manifest."""
    side = "receiver"
    arm_stack_dump(cfg, side)
    _apply_env(cfg, side)
    try:
        transport = _set_up(conn, cfg, side, cfg.receiver_codec or cfg.codec)
        procmem.populate_file_mappings()  # while the sender works: library pages into the baseline
        conn.send(Waiting(type="waiting", side=side, pid=os.getpid()))
        msg = conn.recv()
        if msg.get("type") != "go":
            return
        prepared = transport.prepare(msg["handoff"])
        gc.collect()
    except EOFError:
        return
    except BaseException as exc:  # noqa: BLE001
        conn.send({**error_event(side, exc), "phase": "setup"})
        return
    _, m, obj, error = _measured(conn, cfg, side, lambda: transport.receive(prepared))
    mismatches = compare(msg["manifest"], obj) if error is None else []
    conn.send(Done(type="done", side=side, peak_bytes=m.peak_bytes, held_bytes=m.held_bytes,
                   cycle_held_bytes=m.cycle_held_bytes, baseline_bytes=m.baseline_bytes, t_s=m.end_t,
                   mismatches=mismatches))
    del obj
    prepared.close()
    time.sleep(0)  # let the last message flush before the parent reaps us
    try:
        conn.recv()
    except EOFError:
        pass
