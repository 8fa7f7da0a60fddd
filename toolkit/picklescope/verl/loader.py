"""Inside a child process: put exactly one verl on ``sys.path``, import it, apply a candidate patch.

This module never imports verl at module level and is only called from child processes (a run's
sender and receiver, the matrix and blob-check children): importing ``verl.protocol`` costs about
5 s and 360 MiB (ray, transformers, omegaconf), which must never land in a notebook kernel or in a
measured phase. One process holds one verl: loading a second, different one raises, so two
versions can never mix in a measurement.

verl reads ``VERL_DATAPROTO_SERIALIZATION_METHOD`` with ``os.getenv`` inside ``__getstate__`` and
``__setstate__`` (at call time, not at import), so :func:`set_mode` right before each call is what
selects the mode; the matrix child relies on it to run both modes in one process.

Instrumentation, not behaviour: :func:`mark_step` wraps a function in a recording step marker and
is the one such wrapper of the package; :func:`instrument_consolidate` uses it on tensordict's
``consolidate`` (name ``consolidate``, plus the calling file and line), so a run of the real,
unmodified verl code shows where its copy happened. The wrapper calls the original with the same
arguments and returns its result.
"""

from __future__ import annotations

import ast
import functools
import importlib
import importlib.util
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from picklescope.core.checksum import file_sha256
from picklescope.core.steps import step
from picklescope.errors import PicklescopeError
from picklescope.verl.envs import VerlEnv, get_env, verl_root

MODE_ENV = "VERL_DATAPROTO_SERIALIZATION_METHOD"
MODES = ("torch", "numpy")
PATCHABLE = ("__getstate__", "__setstate__")


@dataclass
class Loaded:
    """The verl this process imported, and what (if anything) was patched into its DataProto."""

    env: VerlEnv
    protocol: ModuleType
    patch: str | None
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def DataProto(self) -> type:  # noqa: N802 - the real class's name
        return self.protocol.DataProto


_loaded: Loaded | None = None


def set_mode(mode: str) -> None:
    """Select verl's serialization mode in this process (verl reads the variable at call time)."""
    if mode not in MODES:
        raise PicklescopeError(f"unknown verl serialization mode {mode!r}", f"use one of {', '.join(MODES)}")
    os.environ[MODE_ENV] = mode


def _under(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([os.path.abspath(path or "."), os.path.abspath(root)]) == os.path.abspath(root)
    except ValueError:
        return False


def patch_functions(path: str | os.PathLike) -> list[str]:
    """Which of ``__getstate__`` / ``__setstate__`` a patch file defines (parsed, never run here)."""
    p = Path(path)
    try:
        tree = ast.parse(p.read_text(), filename=str(p))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise PicklescopeError(f"cannot read candidate patch {p}: {exc}",
                               "give a Python file defining __getstate__(self) and/or __setstate__(self, data)"
                               ) from None
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    found = [n for n in PATCHABLE if n in names]
    if not found:
        raise PicklescopeError(f"candidate patch {p} defines neither __getstate__ nor __setstate__ at top level",
                               "define def __getstate__(self): ... and/or def __setstate__(self, data): ...")
    return found


def apply_patch(data_proto: type, path: str) -> list[str]:
    spec = importlib.util.spec_from_file_location("picklescope_verl_candidate", path)
    if spec is None or spec.loader is None:
        raise PicklescopeError(f"cannot import candidate patch {path}", "give a .py file")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    replaced = []
    for name in PATCHABLE:
        fn = vars(mod).get(name)  # not getattr: every object (modules too) has an inherited __getstate__
        if fn is not None:
            setattr(data_proto, name, fn)
            replaced.append(name)
    if not replaced:
        raise PicklescopeError(f"candidate patch {path} defines neither __getstate__ nor __setstate__",
                               "define them at the top level of the file")
    return replaced


def mark_step(owner: type, name: str, label: str | None = None, *, where: str = "") -> bool:
    """Wrap ``owner.name`` (a function or a staticmethod of the class itself) in a recording step marker.

    The one wrapper every instrumentation of real verl uses (tensordict's ``consolidate``,
    ``DataProto.__getstate__``/``__setstate__``, ``DataProto.chunk``/``concat``): the step is named
    ``label`` (default ``name``) and the original is called with the same arguments, its result
    returned unchanged. ``where`` adds the code's place to the step: ``"caller"`` the calling file,
    function and line (where a copy was asked for), ``"definition"`` the wrapped function's own file
    and first line (whose function ran). Idempotent: False when ``owner.name`` is missing or already
    wrapped, True when this call wrapped it.
    """
    raw = vars(owner).get(name)
    is_static = isinstance(raw, staticmethod)
    fn = raw.__func__ if is_static else raw
    if fn is None or getattr(fn, "_picklescope_original", None) is not None:
        return False
    label = label or name
    code = getattr(fn, "__code__", None)
    defined = {"file": code.co_filename, "line": code.co_firstlineno} if code is not None else {}

    @functools.wraps(fn)
    def marked(*args: Any, **kwargs: Any) -> Any:
        if where == "caller":
            caller = sys._getframe(1)
            info: dict[str, Any] = {"line": caller.f_lineno, "file": caller.f_code.co_filename,
                                    "function": caller.f_code.co_name}
        else:
            info = defined if where == "definition" else {}
        with step(label, **info):
            return fn(*args, **kwargs)

    marked._picklescope_original = fn  # type: ignore[attr-defined]
    setattr(owner, name, staticmethod(marked) if is_static else marked)
    return True


def instrument_consolidate() -> str:
    """Wrap tensordict's ``consolidate`` with a recording ``consolidate`` step (idempotent)."""
    from tensordict import TensorDict  # deferred: tensordict imports torch, only a verl child needs it

    owner = next(k for k in TensorDict.__mro__ if "consolidate" in vars(k))
    mark_step(owner, "consolidate", where="caller")
    return f"{owner.__module__}.{owner.__qualname__}.consolidate"


def _not_importable(env: VerlEnv, exc: Exception) -> PicklescopeError:
    """Why ``verl.protocol`` of ``env`` did not import, and what to do about it.

    picklescope installs verl with ``--no-deps`` (its dependencies would replace torch and Ray), so
    an older or newer verl may need a package this environment lacks: name it.
    """
    missing = getattr(exc, "name", None) if isinstance(exc, ModuleNotFoundError) else None
    problem = f"verl {env.label} ({env.site}) cannot be imported: {type(exc).__name__}: {exc}"
    if missing and not str(missing).startswith("verl"):
        return PicklescopeError(problem, f"it needs {missing!r}, which is not installed here: pip install it "
                                "into this environment, or use another verl version (picklescope verl list)")
    return PicklescopeError(problem, f"see 'picklescope verl check {env.label}'; reinstall with "
                            f"'picklescope verl install --force {env.version}' or use another version")


def load(env: VerlEnv, patch: str | None = None) -> Loaded:
    """Import ``verl.protocol`` from ``env`` (and apply ``patch``); one verl per process."""
    global _loaded
    if _loaded is not None:
        if _loaded.env.root == env.root and _loaded.patch == patch:
            return _loaded
        raise PicklescopeError(
            f"this process already loaded verl from {_loaded.env.site} (patch {_loaded.patch}); "
            f"it cannot also load {env.site} (patch {patch})",
            "run each verl version in its own child process")
    if "verl" in sys.modules:
        raise PicklescopeError(f"verl is already imported here from {sys.modules['verl'].__file__}",
                               "picklescope loads verl only in fresh child processes")
    root = str(verl_root())
    sys.path[:] = [p for p in sys.path if not _under(p, root)]  # no other verl environment on the path
    sys.path.insert(0, str(env.site))
    importlib.invalidate_caches()
    t0 = time.monotonic()
    try:
        protocol = importlib.import_module("verl.protocol")
    except Exception as exc:  # noqa: BLE001 - any import failure of the user's verl is reported as such
        raise _not_importable(env, exc) from exc
    import_s = time.monotonic() - t0
    verl = sys.modules["verl"]
    if not _under(protocol.__file__, str(env.site)):
        raise PicklescopeError(f"verl.protocol came from {protocol.__file__}, not from {env.site}",
                               "another verl shadows the environment; check PYTHONPATH")
    tests_spec = importlib.util.find_spec("tests")
    tests_places = [] if tests_spec is None else list(tests_spec.submodule_search_locations or [tests_spec.origin])
    if any(p and _under(p, str(env.site)) for p in tests_places):
        raise PicklescopeError(f"verl's stray 'tests' package is importable from {env.site}",
                               f"reinstall with 'picklescope verl install --force {env.label}'")
    replaced = apply_patch(protocol.DataProto, patch) if patch else []
    instrumented = instrument_consolidate()
    info = {
        "verl_label": env.label, "verl_version": getattr(verl, "__version__", env.version),
        "verl_source": env.source, "verl_file": protocol.__file__,
        "verl_file_real": os.path.realpath(protocol.__file__),
        "verl_protocol_sha256": file_sha256(protocol.__file__), "verl_import_s": round(import_s, 2),
        "mode_env": MODE_ENV,
        "patch": patch, "patch_sha256": file_sha256(patch) if patch else None, "patched": replaced,
        "instrumentation": f"{instrumented} wrapped by a recording 'consolidate' step marker",
    }
    _loaded = Loaded(env, protocol, patch, info)
    return _loaded


def loaded() -> Loaded | None:
    return _loaded


def import_report(label: str) -> dict[str, Any]:
    """Child side of ``picklescope verl check``: import one environment, say what is on the path."""
    env = get_env(label)
    info = load(env).info
    root = str(verl_root())
    tests_spec = importlib.util.find_spec("tests")
    tests_places = [] if tests_spec is None else list(tests_spec.submodule_search_locations or [tests_spec.origin])
    return {
        "label": label, "verl_version": info["verl_version"], "verl_file": info["verl_file"],
        "import_s": info["verl_import_s"],
        "verl_dirs_on_path": [p for p in sys.path if _under(p, root)],
        "tests_importable_from": [str(p) for p in tests_places],
        "stray_tests_shadowing": any(p and _under(p, root) for p in tests_places),
    }
