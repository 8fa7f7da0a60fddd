"""A capture probe for a live job: what the trainer's own batches look like and what serializing them cost.

One line in a trainer::

    import picklescope.capture; picklescope.capture.install("batch-capture/", limit=3)

or ``PICKLESCOPE_CAPTURE=batch-capture/`` in the job's environment plus ``picklescope.capture.auto()``
(e.g. in a ``sitecustomize`` or at the top of the entry point). The probe wraps
``verl.protocol:DataProto.__getstate__`` (or any ``module:Class.method``). For the first ``limit``
calls in each process it records, next to the call:

- the batch's structure, as a workload file in the format of ``data/workloads/`` (no values:
  :func:`picklescope.workload_from.describe_live`), ``call-<pid>-<n>.yaml``; the first one written in
  the folder is also ``workload.yaml``, ready for ``picklescope run --workload batch-capture/workload.yaml``;
- one JSON line in ``calls.jsonl``: the process, verl's serialization mode
  (``VERL_DATAPROTO_SERIALIZATION_METHOD``), the tensor payload, resident memory before and after the
  call, and the call's exact peak: the process's ``VmHWM`` is reset (``/proc/self/clear_refs``) right
  before the call and read right after it, where the kernel allows a process to reset its own peak
  (``peak_exact`` says whether it did).

Then it puts the original method back, so later calls run exactly as if it had never been there.
It never raises into the trainer: the original method runs with the same arguments and its result
or exception passes through untouched; a failure to record is logged once (logger
``picklescope.capture``) and the probe steps aside. Resetting ``VmHWM`` is the one side effect on the
process: a peak read by someone else across a recorded call starts at that call.
"""

from __future__ import annotations

import functools
import gc
import importlib
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ENV = "PICKLESCOPE_CAPTURE"
LIMIT_ENV = "PICKLESCOPE_CAPTURE_LIMIT"
TARGET_ENV = "PICKLESCOPE_CAPTURE_TARGET"
DEFAULT_TARGET = "verl.protocol:DataProto.__getstate__"
MODE_ENV = "VERL_DATAPROTO_SERIALIZATION_METHOD"

log = logging.getLogger("picklescope.capture")


def _status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


class Probe:
    """One installed probe: where it writes, how many calls it has left, and whether it failed."""

    def __init__(self, folder: str | os.PathLike, limit: int, target: str) -> None:
        self.folder = Path(folder).expanduser()
        self.limit = limit
        self.target = target
        self.calls = 0
        self.records: list[dict[str, Any]] = []
        self.error: str | None = None
        self.active = False
        self._owner: Any = None
        self._attr = ""
        self._original: Any = None
        self._lock = threading.Lock()
        self._warned = False

    # -- life cycle --------------------------------------------------------------------------------------
    def _resolve(self) -> tuple[Any, str, Any]:
        module_name, sep, qual = self.target.partition(":")
        if not sep or not module_name or not qual:
            raise ValueError(f"target {self.target!r} is not of the form module:Class.method")
        owner: Any = importlib.import_module(module_name)
        *path, attr = qual.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = owner.__dict__[attr] if isinstance(owner, type) and attr in owner.__dict__ else getattr(owner, attr)
        if not callable(original):
            raise TypeError(f"{self.target} is not callable")
        return owner, attr, original

    def _wrap(self) -> None:
        from . import workload_from  # noqa: F401 - imported now, so the first recorded call does not pay for it

        owner, attr, original = self._resolve()
        probe = self

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return probe._call(original, args, kwargs)

        wrapper.__picklescope_probe__ = probe  # type: ignore[attr-defined]
        self._owner, self._attr, self._original = owner, attr, original
        setattr(owner, attr, wrapper)
        self.active = True

    def remove(self) -> None:
        """Put the original method back (done by itself after ``limit`` calls)."""
        with self._lock:
            if self.active and self._owner is not None:
                try:
                    setattr(self._owner, self._attr, self._original)
                except Exception as exc:  # noqa: BLE001 - never raise into the trainer
                    self._fail(f"could not restore {self.target}: {exc}")
            self.active = False

    def _fail(self, why: str) -> None:
        self.error = why
        if not self._warned:
            self._warned = True
            log.warning("picklescope capture: %s; the probe steps aside and %s runs unchanged", why, self.target)

    # -- one call ----------------------------------------------------------------------------------------
    def _call(self, original: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        with self._lock:
            take = self.active and self.error is None and self.calls < self.limit
            if take:
                self.calls += 1
                n = self.calls
        if not take:
            return original(*args, **kwargs)
        before = exact = None
        try:
            before = _status("VmRSS:")
            try:
                with open("/proc/self/clear_refs", "w") as f:
                    f.write("5")
                exact = True
            except OSError:
                exact = False
        except Exception as exc:  # noqa: BLE001
            self._fail(f"reading memory before the call failed: {exc}")
        c0, t0 = time.thread_time(), time.perf_counter()
        result = original(*args, **kwargs)  # the trainer's own call: its exceptions are its own
        wall, cpu = time.perf_counter() - t0, time.thread_time() - c0
        collecting = gc.isenabled()
        gc.disable()  # the probe's few allocations must not start a collection of the trainer's garbage here
        try:
            hwm, after = _status("VmHWM:"), _status("VmRSS:")
            self._record(n, args[0] if args else None, before, after, hwm if exact else None, wall, cpu)
        except Exception as exc:  # noqa: BLE001 - never raise into the trainer
            self._fail(f"recording call {n} failed: {type(exc).__name__}: {exc}")
        finally:
            if collecting:
                gc.enable()
        if n >= self.limit:
            self.remove()
        return result

    def _record(self, n: int, obj: Any, before: int | None, after: int | None, hwm: int | None,
                wall: float, cpu: float) -> None:
        from .workload_from import describe_live, to_yaml

        self.folder.mkdir(parents=True, exist_ok=True)
        pid = os.getpid()
        rec: dict[str, Any] = {
            "call": n, "pid": pid, "process": " ".join(sys.argv[:3])[:200], "target": self.target,
            "mode": os.environ.get(MODE_ENV) or "torch (default)", "time": time.time(), "wall_s": wall, "cpu_s": cpu,
            "rss_before_bytes": before, "rss_after_bytes": after,
            "held_bytes": (after - before) if before is not None and after is not None else None,
            "peak_bytes": (hwm - before) if hwm is not None and before is not None else None,
            "peak_exact": hwm is not None,
            "verl_version": getattr(sys.modules.get("verl"), "__version__", None),
        }
        try:
            d = describe_live(obj, path=f"{self.target} call {n} in pid {pid}")
            name = f"call-{pid}-{n}"
            text = to_yaml(d, name=f"captured-{pid}-{n}", validate=False)
            (self.folder / f"{name}.yaml").write_text(text)
            rec["workload"] = f"{name}.yaml"
            rec["payload_bytes"] = d.file_payload_bytes
            rec["summary"] = d.summary()
            try:  # the first workload of the folder, whoever wrote it
                fd = os.open(self.folder / "workload.yaml", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
                with os.fdopen(fd, "w") as f:
                    f.write(text)
                rec["also"] = "workload.yaml"
            except FileExistsError:
                pass
        except Exception as exc:  # noqa: BLE001 - the cost is still worth a line without the structure
            rec["workload_error"] = f"{type(exc).__name__}: {exc}"
        p = rec.get("payload_bytes")
        for k in ("peak", "held"):
            v = rec[f"{k}_bytes"]
            rec[f"{k}_x_payload"] = (v / p) if p and v is not None else None
        with open(self.folder / "calls.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        self.records.append(rec)


def install(folder: str | os.PathLike = "batch-capture/", limit: int = 3,
            target: str = DEFAULT_TARGET) -> Probe:
    """Wrap ``target`` so its first ``limit`` calls are recorded into ``folder``; returns the probe.

    Never raises: a target that does not resolve (verl not importable in this process, a typo) is
    logged once and the returned probe has ``error`` set and ``active`` False.
    """
    probe = Probe(folder, limit if isinstance(limit, int) and not isinstance(limit, bool) else 0, str(target))
    if probe.limit <= 0:
        probe._fail(f"limit {limit!r} must be a positive integer")
        return probe
    try:
        probe._wrap()
    except Exception as exc:  # noqa: BLE001 - never raise into the trainer
        probe._fail(f"cannot install on {target}: {type(exc).__name__}: {exc}")
    return probe


def auto() -> Probe | None:
    """Install from the environment: ``PICKLESCOPE_CAPTURE=folder`` (``_LIMIT``, ``_TARGET`` optional)."""
    folder = os.environ.get(ENV)
    if not folder:
        return None
    try:
        limit = int(os.environ.get(LIMIT_ENV) or 3)
    except ValueError:
        limit = 3
        log.warning("picklescope capture: %s=%r is not a whole number; using 3", LIMIT_ENV, os.environ.get(LIMIT_ENV))
    return install(folder, limit, os.environ.get(TARGET_ENV) or DEFAULT_TARGET)
