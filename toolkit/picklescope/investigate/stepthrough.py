"""Step through any ``__getstate__`` / ``__setstate__`` line by line, with exact memory per line.

The question this answers: *which line* of a serialization method costs the memory? A run's steps
say "consolidate added 1.0x payload"; the step-through says it was line 129,
``b.batch.contiguous().consolidate()``, and that no other line added anything. It works on any
function, not only the toolkit's codecs: a real verl ``DataProto.__getstate__``, a class of your own,
or a candidate patch in a file.

Python API::

    from picklescope.investigate.stepthrough import stepthrough

    st = stepthrough(codec="numpy-legacy")                      # the codec's __getstate__
    st = stepthrough(codec="numpy", method="__setstate__")      # ... or its __setstate__
    st = stepthrough(function="verl.protocol:DataProto.__getstate__", sys_path=[verl_dir])
    st = stepthrough(function="my_patch.py:getstate")          # a plain function taking the batch
    st.rows          # list[LineRow] in execution order: depth, function, filename, lineno, source,
                     #   hits, time_s, added_bytes / retained_bytes / peak_bytes (inclusive: callees
                     #   included), self_added_bytes / self_retained_bytes (the line's own code), caller
    st.ranked()      # (costly, quiet): lines whose own code costs >= 1% of the payload, costliest
                     #   first (ties: slower first), then the quiet ones in execution order
    st.culprit()     # the line whose own code costs the most: the innermost line that allocates,
                     #   never a wrapper that only calls it
    st.to_dict()     # plain data, rows ranked as above; StepThrough.from_dict() reads it back

How the target is called, in a fresh child process (from the warm forkserver), on the workload's
batch (``workload``/``scale``, default flowgrpo x0.25):

- ``codec=NAME``: ``codec.getstate(batch)``; for ``__setstate__``, ``codec.setstate(Batch(), state)``
  with the state its ``getstate`` produced, sent through ``transport`` first (default
  ``pickle5-oob``, as Ray does), all before tracing starts.
- ``function="module:Class.method"`` (or ``"path/file.py:Class.method"``): an instance of ``Class``
  is built over the batch's three parts (``Class(batch=..., non_tensor_batch=..., meta_info=...)``,
  else an empty instance given those attributes); ``__getstate__`` is called on it; for
  ``__setstate__`` the state comes from the same class's ``__getstate__``.
- ``function="module:func"``: a plain function; for ``__getstate__`` it gets the toolkit's
  :class:`~picklescope.batch.Batch` (it has ``batch``, ``non_tensor_batch`` and ``meta_info`` like
  ``DataProto``); for ``__setstate__`` it gets an empty ``Batch`` and the state ``codec`` (default
  ``numpy``) produced.

Traced lines: the target's, and those of every function it reaches from the same top-level package
(plus ``expand``; see :mod:`picklescope.measure.linetrace`). Memory figures come from the kernel
(``VmHWM``, reset at every line boundary); times include the tracer's own cost, which grows with
the number of lines run, so compare times only between lines of the same step-through.
"""

from __future__ import annotations

import gc
import importlib
import inspect
import json
import os
import pickle
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from picklescope.batch import Batch
from picklescope.codecs import get_codec
from picklescope.codecs.base import PreparesInChild
from picklescope.core import procmem
from picklescope.core.plugins import load_plugin, load_plugins
from picklescope.core.units import fmt_bytes as _fmt
from picklescope.errors import PicklescopeError
from picklescope.measure import launcher, verdicts
from picklescope.measure.linetrace import LineRow, LineTracer
from picklescope.transports import get_transport
from picklescope.workloads.spec import check_scale, load_workload

METHODS = {"__getstate__": "__getstate__", "getstate": "__getstate__",
           "__setstate__": "__setstate__", "setstate": "__setstate__"}
DEFAULT_TIMEOUT_S = 900.0
QUIET_SHARE = 0.01  # a line whose own code costs less than this share of the payload is quiet


@dataclass
class StepThrough:
    """Every executed line of one ``__getstate__`` / ``__setstate__``, with its cost."""

    target: str
    method: str
    workload: str
    scale: float
    payload_bytes: int
    rows: list[LineRow] = field(default_factory=list)
    baseline_bytes: int | None = None
    peak_bytes: int | None = None  # exact peak over the whole call, above the baseline
    outcome: str = "ok"  # ok | error | timeout
    error: str | None = None
    traceback: str | None = None
    wall_s: float | None = None

    def culprit(self) -> LineRow | None:
        """The line whose own code costs the most (:attr:`LineRow.self_bytes`; ties: the slower).

        Ranking by self cost, not inclusive cost, is what keeps a wrapper (``return
        self.encode(b)``, which includes everything ``encode`` does) from being named instead of
        the line inside that really allocates."""
        if not self.rows:
            return None
        top = max(self.rows, key=lambda r: (r.self_bytes, r.time_s))
        return top if top.self_bytes > 0 else None

    def ranked(self, share: float = QUIET_SHARE) -> tuple[list[LineRow], list[LineRow]]:
        """(costly, quiet): lines whose own code costs at least ``share`` of the payload, sorted by
        self cost then time, and the rest in execution order (what a view folds below)."""
        limit = share * (self.payload_bytes or 0)
        costly = [r for r in self.rows if r.self_bytes > 0 and r.self_bytes >= limit]
        costly.sort(key=lambda r: (-r.self_bytes, -r.time_s, r.order))
        quiet = sorted((r for r in self.rows if r not in costly), key=lambda r: r.order)
        return costly, quiet

    def call_path(self, row: LineRow) -> list[LineRow]:
        """The lines that led to ``row``'s function, outermost first (empty for the target's own lines)."""
        by_order = {r.order: r for r in self.rows}
        path: list[LineRow] = []
        caller = row.caller
        while caller >= 0 and caller in by_order and len(path) < 64:
            path.append(by_order[caller])
            caller = by_order[caller].caller
        return list(reversed(path))

    def to_dict(self) -> dict[str, Any]:
        """Plain data; ``rows`` come ranked (costly lines first, quiet ones after, in execution
        order), each with its ``self_bytes``, so a reader of the JSON sees the culprit first too."""
        d = asdict(self)
        costly, quiet = self.ranked()
        d["rows"] = [dict(asdict(r), self_bytes=r.self_bytes, quiet=r in quiet) for r in costly + quiet]
        c = self.culprit()
        d["culprit"] = dict(asdict(c), self_bytes=c.self_bytes) if c is not None else None
        return d

    def to_json(self, **kw: Any) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepThrough:
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        row_fields = {f.name for f in fields(LineRow)}
        rows = [LineRow(**{k: v for k, v in r.items() if k in row_fields}) for r in d.get("rows", [])]
        kw["rows"] = sorted(rows, key=lambda r: r.order)
        return cls(**kw)


def where(row: LineRow) -> str:
    """``file.py:LINE`` for a row."""
    return f"{os.path.basename(row.filename)}:{row.lineno}"


def _short(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 1] + "~"


def line_row(st: StepThrough, r: LineRow) -> dict[str, Any]:
    """One table row for a line: where, its code indented by call depth, the chain that called it."""
    p = st.payload_bytes or 1
    via = " > ".join(where(c) for c in st.call_path(r)) or "(the target)"
    return {"line": where(r), "code": _short("  " * r.depth + r.source, 60), "called from": _short(via, 48),
            "hits": r.hits, "seconds": f"{r.time_s:.4f}", "self": _fmt(r.self_bytes, signed=True),
            "self x payload": f"{r.self_bytes / p:.3f}x", "inclusive": _fmt(r.added_bytes, signed=True),
            "kept": _fmt(r.retained_bytes, signed=True), "peak": _fmt(r.peak_bytes)}


def _method(method: str) -> str:
    if method not in METHODS:
        raise PicklescopeError(f"unknown method {method!r}", "use __getstate__ or __setstate__")
    return METHODS[method]


@dataclass(kw_only=True)
class StepThroughConfig:
    """What the step-through child is told: the target (a function, or a codec's method), the batch, and
    the environment to load it in. Not a measured child (no run folder or clock): it traces lines."""

    function: str | None  # "module:qualname", or None for the codec's own method
    codec: str | None
    method: str  # "__getstate__" or "__setstate__"
    workload: str
    scale: float
    transport: str
    sys_path: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    plugins: list[str] = field(default_factory=list)
    expand: list[str] = field(default_factory=list)  # functions whose lines are traced too


def stepthrough(
    function: str | None = None,
    *,
    codec: str | None = None,
    method: str = "__getstate__",
    workload: str = "flowgrpo",
    scale: float = 0.25,
    transport: str = "pickle5-oob",
    sys_path: list[str] | tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    plugins: list[str] | None = None,
    expand: list[str] | tuple[str, ...] = (),
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> StepThrough:
    """Run ``function`` (``"module:qualname"``) or ``codec``'s method line by line in a child process.

    Returns a :class:`StepThrough` in every case; bad input (unknown codec, workload, method, a
    missing target) raises :class:`~picklescope.errors.PicklescopeError`.
    """
    if function is None and codec is None:
        raise PicklescopeError("nothing to step through",
                               "give a codec (--codec) or a function (--function module:qualname)")
    method = _method(method)
    if function is not None and function.rsplit(".", 1)[-1] in ("__getstate__", "__setstate__"):
        method = function.rsplit(".", 1)[-1]
    plugins = [str(p) for p in plugins or []]
    load_plugins(plugins)
    if codec is not None:
        get_codec(codec)
    if function is not None and ":" not in function:
        raise PicklescopeError(f"function {function!r} is not module:qualname",
                               "e.g. verl.protocol:DataProto.__getstate__")
    get_transport(transport)
    check_scale(scale)
    spec = load_workload(workload)
    result = StepThrough(target=function or f"{codec} codec", method=method, workload=spec.name, scale=scale,
                         payload_bytes=spec.payload_bytes(scale))
    cfg = StepThroughConfig(function=function, codec=codec, method=method, workload=spec.source or spec.name,
                            scale=scale, transport=transport, sys_path=list(sys_path), env=dict(env or {}),
                            plugins=plugins, expand=list(expand))
    t0 = time.monotonic()
    msg, exitcode = launcher.call_once(_child_main, (cfg,), "picklescope-stepthrough", timeout_s)
    result.wall_s = time.monotonic() - t0
    if msg is None:
        if exitcode is None or result.wall_s >= timeout_s:
            verdicts.conclude(result, "timeout", f"no answer within {timeout_s:g} s")
        else:
            verdicts.conclude(result, "error",
                              f"the step-through process ended without a result (exit code {exitcode})")
        return result
    if msg.get("bad_input"):
        raise PicklescopeError(*msg["bad_input"])
    result.rows = [LineRow(**r) for r in msg.get("rows", [])]
    result.baseline_bytes, result.peak_bytes = msg.get("baseline_bytes"), msg.get("peak_bytes")
    result.target = msg.get("target") or result.target
    if msg.get("error"):
        verdicts.conclude(result, "error", msg["error"])
        result.traceback = msg.get("traceback")
    return result


# -- inside the child -------------------------------------------------------------------------------
def _transported(state: Any, transport: str) -> Any:
    """The state as a receiver gets it: through pickle, out-of-band buffers kept out of band."""
    if transport == "pickle5-oob":
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(state, protocol=5, buffer_callback=buffers.append)
        return pickle.loads(data, buffers=buffers)
    return pickle.loads(pickle.dumps(state, protocol=4))


def _resolve(function: str) -> tuple[Any, Any]:
    """(owner, attribute) for ``module:qualname``; the module part may be a ``.py`` file."""
    module_name, _, qualname = function.partition(":")
    if module_name.endswith(".py") or os.path.isfile(module_name):
        owner: Any = load_plugin(module_name)
    else:
        try:
            owner = importlib.import_module(module_name)
        except ImportError as exc:
            raise PicklescopeError(
                f"function {function!r} does not resolve: module {module_name!r} cannot be imported ({exc})",
                "check the spelling, add its folder with --path, or install the package in this environment",
            ) from None
    parts = qualname.split(".")
    for i, part in enumerate(parts):
        if not hasattr(owner, part):
            where = f"{module_name}:{'.'.join(parts[:i])}" if i else module_name
            raise PicklescopeError(f"function {function!r} does not resolve: {where} has no attribute {part!r}",
                                   "give module:Class.method as it is spelled in the source")
        owner, last = getattr(owner, part), owner
    return last, owner


def _instance(cls: type, b: Any) -> Any:
    """An instance of ``cls`` over the batch's parts (no tensor copied)."""
    if isinstance(cls, type) and issubclass(cls, Batch):
        return b
    parts = {"batch": b.batch, "non_tensor_batch": b.non_tensor_batch, "meta_info": b.meta_info}
    try:
        return cls(**parts)
    except TypeError:
        obj = cls.__new__(cls)
        obj.__dict__.update(parts)
        return obj


def _code_of(fn: Any) -> Any:
    fn = inspect.unwrap(getattr(fn, "__func__", fn))
    code = getattr(fn, "__code__", None)
    if code is None:
        raise PicklescopeError(f"{fn!r} is not a Python function", "step through a function written in Python")
    return code


def _prepare(cfg: StepThroughConfig, b: Any) -> tuple[Callable[[], Any], Any, str, set[str]]:
    """(zero-argument call, code object to trace, label, packages to expand) for the configured target."""
    setstate = cfg.method == "__setstate__"
    if cfg.function is None:
        c = get_codec(cfg.codec)
        if isinstance(c, PreparesInChild):
            c.prepare()
        fn = c.setstate if setstate else c.getstate
        label = f"{cfg.codec} codec: {type(c).__module__}:{type(c).__qualname__}.{fn.__name__}"
        if setstate:
            state = _transported(c.getstate(b), cfg.transport)
            fresh = Batch()
            return (lambda: fn(fresh, state)), _code_of(fn), label, {"picklescope"}
        return (lambda: fn(b)), _code_of(fn), label, {"picklescope"}
    owner, fn = _resolve(cfg.function)
    package = str(getattr(inspect.unwrap(getattr(fn, "__func__", fn)), "__module__", "") or "").split(".")[0]
    label = cfg.function
    if isinstance(owner, type):
        obj = _instance(owner, b)
        if setstate:
            state = _transported(obj.__getstate__(), cfg.transport)
            fresh = owner.__new__(owner)
            return (lambda: fn(fresh, state)), _code_of(fn), label, {package}
        return (lambda: fn(obj)), _code_of(fn), label, {package}
    if setstate:
        state = _transported(get_codec(cfg.codec or "numpy").getstate(b), cfg.transport)
        fresh = Batch()
        return (lambda: fn(fresh, state)), _code_of(fn), label, {package}
    return (lambda: fn(b)), _code_of(fn), label, {package}


def _child_main(conn: Any, cfg: StepThroughConfig) -> None:
    """Build the batch and the target, trace one call, send the rows."""
    target = None
    try:
        for p in reversed(cfg.sys_path):
            sys.path.insert(0, p)
        os.environ.update(cfg.env)
        load_plugins(cfg.plugins)
        b = load_workload(cfg.workload).build(cfg.scale)
        call, code, target, expand = _prepare(cfg, b)
        del b
        gc.collect()
        procmem.trim_heap()
    except PicklescopeError as exc:  # the user's input (a function that does not resolve): the parent raises it
        conn.send({"target": target, "bad_input": [exc.problem, exc.hint]})
        return
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, never raised
        conn.send({"target": target, "error": f"setup failed: {type(exc).__name__}: {exc}",
                   "traceback": traceback.format_exc(limit=20)})
        return
    tracer = LineTracer(expand | set(cfg.expand))
    error = tb = None
    try:
        tracer.run(call, code)
    except BaseException as exc:  # noqa: BLE001
        error, tb = f"{type(exc).__name__}: {exc}", traceback.format_exc(limit=20)
    rows = [asdict(r) for r in tracer.result_rows()]
    conn.send({"target": target, "rows": rows, "baseline_bytes": tracer.baseline,
               "peak_bytes": tracer.peak - tracer.baseline, "error": error, "traceback": tb})
