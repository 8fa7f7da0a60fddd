"""picklescope: what serializing a training batch costs in host memory, measured in real processes.

The core operation is :func:`run`: serialize a workload's batch with a codec (what ``__getstate__``
returns) over a transport (how the bytes cross to another process) in an isolated sender and
receiver, and return a :class:`RunResult` with exact kernel peaks per step and per side.
"""

from __future__ import annotations

from picklescope.core.quiet_start import quiet_interrupts_while_importing

quiet_interrupts_while_importing()  # only as the 'picklescope' command: a Ctrl-C during imports is one line

from picklescope.core import aliases as _aliases  # noqa: E402

_aliases.install()  # the module names from before the subpackages (picklescope.runner, ...) for one release

from picklescope.batch import Batch  # noqa: E402
from picklescope.codecs import CODECS, get_codec, register_codec  # noqa: E402
from picklescope.core.result import RunResult, Side, Step, Timeline  # noqa: E402
from picklescope.errors import PicklescopeError, UnknownNameError, UnsupportedCase  # noqa: E402
from picklescope.measure.runner import run  # noqa: E402
from picklescope.transports import TRANSPORTS, get_transport  # noqa: E402
from picklescope.workloads.spec import available_workloads, load_workload  # noqa: E402

__version__ = "0.1.0"


def load_ipython_extension(ipython: object) -> None:
    """``%load_ext picklescope``: the ``%%picklescope`` cell magic and friends (see :mod:`picklescope.views.magic`)."""
    from picklescope.views.magic import load_ipython_extension as load

    load(ipython)


__all__ = [
    "CODECS", "TRANSPORTS", "Batch", "PicklescopeError", "RunResult", "Side", "Step", "Timeline",
    "UnknownNameError", "UnsupportedCase", "available_workloads", "get_codec", "get_transport",
    "load_workload", "register_codec", "run",
]

from picklescope.investigate.node import NodeResult, node  # noqa: E402 - picklescope.node(...): a verl node replayed, see docs/node.md

__all__ += ["NodeResult", "node"]

import sys as _sys  # noqa: E402

# 'import picklescope.node' (the old module name) must not replace the function picklescope.node
_sys.modules.setdefault("picklescope.node", _sys.modules["picklescope.investigate.node"])
