"""picklescope: what serializing a training batch costs in host memory, measured in real processes.

The core operation is :func:`run`: serialize a workload's batch with a codec (what ``__getstate__``
returns) over a transport (how the bytes cross to another process) in an isolated sender and
receiver, and return a :class:`RunResult` with exact kernel peaks per step and per side.

Importing the package is light: the public names below are imported on first use (PEP 562), so the
capture probe (``import picklescope.capture``) can sit in a training job's start-up without pulling
in torch, numpy, plotly or Ray (docs/workload_from.md states its import time).
"""

from __future__ import annotations

import importlib

from picklescope.core.quiet_start import quiet_interrupts_while_importing

quiet_interrupts_while_importing()  # only as the 'picklescope' command: a Ctrl-C during imports is one line

__version__ = "0.1.0"
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (a few ms the capture probe does not pay)

# public name -> the module that defines it, imported when the name is first used
_PUBLIC: dict[str, str] = {
    "Batch": "picklescope.batch",
    "CODECS": "picklescope.codecs", "get_codec": "picklescope.codecs", "register_codec": "picklescope.codecs",
    "RunResult": "picklescope.core.result", "Process": "picklescope.core.result", "Step": "picklescope.core.result",
    "Series": "picklescope.core.result", "Measured": "picklescope.core.result", "Kill": "picklescope.core.kill",
    "PicklescopeError": "picklescope.errors", "UnknownNameError": "picklescope.errors",
    "UnsupportedCase": "picklescope.errors",
    "run": "picklescope.measure.runner",
    "TRANSPORTS": "picklescope.transports", "get_transport": "picklescope.transports",
    "available_workloads": "picklescope.workloads.spec", "load_workload": "picklescope.workloads.spec",
    "NodeResult": "picklescope.investigate.node", "node": "picklescope.investigate.node",
}

if TYPE_CHECKING:  # for type checkers and editors: the same names, imported eagerly
    from picklescope.batch import Batch
    from picklescope.codecs import CODECS, get_codec, register_codec
    from picklescope.core.kill import Kill
    from picklescope.core.result import Measured, Process, RunResult, Series, Step
    from picklescope.errors import PicklescopeError, UnknownNameError, UnsupportedCase
    from picklescope.investigate.node import NodeResult, node
    from picklescope.measure.runner import run
    from picklescope.transports import TRANSPORTS, get_transport
    from picklescope.workloads.spec import available_workloads, load_workload


def __getattr__(name: str) -> object:
    """A public name (or a subpackage) on first use.

    The names are a registry of module names (``_PUBLIC``) resolved with :func:`importlib.import_module` (PEP 562)
    rather than imports in this function: the package stays light to import, and no import statement hides a
    dependency of the package on its own modules from the import graph the layers contract checks."""
    module = _PUBLIC.get(name)
    if module is not None:
        value = getattr(importlib.import_module(module), name)
        globals()[name] = value
        return value
    if name.startswith("__"):
        raise AttributeError(name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{name}":
            raise
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext picklescope``: the ``%%picklescope`` cell magic and friends (see :mod:`picklescope.views.magic`).

    The magics module is found by name, like the public names above: it imports IPython and plotly, which a
    plain ``import picklescope`` must not.
    """
    importlib.import_module("picklescope.views.magic").load_ipython_extension(ipython)


__all__ = [
    "CODECS", "TRANSPORTS", "Batch", "Kill", "Measured", "NodeResult", "PicklescopeError", "Process", "RunResult",
    "Series", "Step",
    "UnknownNameError", "UnsupportedCase", "available_workloads", "get_codec", "get_transport",
    "load_workload", "node", "register_codec", "run",
]
