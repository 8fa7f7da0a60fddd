"""What machine and software a result was measured on, so a shared report can be trusted or re-run.

Versions come from package metadata, not imports: asking must not load torch into a parent that has
not loaded it, nor change what is being measured.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from picklescope.core import procmem
from picklescope.core.cgroup import describe

PACKAGES = ("picklescope", "torch", "tensordict", "numpy", "ray", "plotly", "memray")


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def collect() -> dict[str, Any]:
    """Versions of Python and the packages that matter, machine memory and CPUs, and budget support."""
    mem = procmem.machine_memory()
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        "packages": {name: _version(name) for name in PACKAGES},
        "machine_memory_bytes": mem["total"],
        "available_memory_bytes": mem["available"],
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "kernel_peak_reset": procmem.hwm_resettable(),
        "memory_cgroup": describe(),
    }
