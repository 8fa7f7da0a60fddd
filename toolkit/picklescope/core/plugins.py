"""User code that must exist in both the parent and the measured children.

A codec defined in a notebook cell or a patch file lives only in the process that ran it; the
sender and receiver are separate processes forked from a server that never saw it. A plugin is a
Python file path or an importable module name: the parent loads it (so names validate up front) and
each child loads it again before any lookup, so both register the same codecs.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

from picklescope.core.safefile import check_file
from picklescope.errors import PicklescopeError, safe_text

PLUGIN_LIMIT = 16 * 1024**2  # a codec is a page of Python; a larger file is not one

_loaded: dict[str, ModuleType] = {}


def load_plugin(spec: str) -> ModuleType:
    """Import a plugin file (``path/to/codec.py``) or module (``mypkg.codecs``), once per process."""
    if spec in _loaded:
        return _loaded[spec]
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not os.path.lexists(spec):
            raise PicklescopeError(f"plugin file {spec!r} does not exist", "check the path")
        check_file(spec, "plugin file", PLUGIN_LIMIT)
        name = "picklescope_plugin_" + hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]
        mod_spec = importlib.util.spec_from_file_location(name, path)
        assert mod_spec is not None and mod_spec.loader is not None
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        try:
            mod_spec.loader.exec_module(module)
        except SyntaxError as exc:
            sys.modules.pop(name, None)
            raise PicklescopeError(f"plugin file {spec} has a syntax error at line {exc.lineno}: {exc.msg}",
                                   "fix the file and run again") from None
        except Exception as exc:  # noqa: BLE001 - any failure of the user's code at import is bad input
            sys.modules.pop(name, None)
            raise PicklescopeError(f"plugin file {spec} raised {_where(exc, str(path.resolve()))}{type(exc).__name__}: "
                                   f"{_first_line(exc)}", "fix the file and run again (--debug shows the "
                                   "traceback)") from exc
    else:
        try:
            module = importlib.import_module(spec)
        except ImportError as exc:
            raise PicklescopeError(f"plugin module {spec!r} cannot be imported ({exc})",
                                   "give a .py file path or an importable module name") from None
        except Exception as exc:  # noqa: BLE001 - the module's own code failed at import
            raise PicklescopeError(f"plugin module {spec!r} raised {type(exc).__name__} at import: "
                                   f"{_first_line(exc)}", "fix the module and run again (--debug shows the "
                                   "traceback)") from exc
    _loaded[spec] = module
    return module


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return safe_text(text.splitlines()[0] if text else "(no message)", 200)


def _where(exc: BaseException, filename: str) -> str:
    """``at line N `` of the plugin file where ``exc`` was raised (its deepest frame in that file)."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if os.path.realpath(tb.tb_frame.f_code.co_filename) == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return f"at line {line} at import: " if line else "at import: "


def load_plugins(specs: list[str] | tuple[str, ...] | None) -> None:
    for spec in specs or ():
        load_plugin(spec)
