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
import sys
from pathlib import Path
from types import ModuleType

from .errors import PicklescopeError

_loaded: dict[str, ModuleType] = {}


def load_plugin(spec: str) -> ModuleType:
    """Import a plugin file (``path/to/codec.py``) or module (``mypkg.codecs``), once per process."""
    if spec in _loaded:
        return _loaded[spec]
    path = Path(spec)
    if spec.endswith(".py") or path.is_file():
        if not path.is_file():
            raise PicklescopeError(f"plugin file {spec!r} does not exist", "check the path")
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
    else:
        try:
            module = importlib.import_module(spec)
        except ImportError as exc:
            raise PicklescopeError(f"plugin module {spec!r} cannot be imported ({exc})",
                                   "give a .py file path or an importable module name") from None
    _loaded[spec] = module
    return module


def load_plugins(specs: list[str] | tuple[str, ...] | None) -> None:
    for spec in specs or ():
        load_plugin(spec)
