"""Execute one of the project's notebooks headless, with papermill parameters.

The notebooks are jupytext percent files (``notebooks/*.py``); papermill wants ``.ipynb``, so the
file is converted first. The kernel always runs on this very interpreter: a kernelspec found by name
could be a user-wide ``python3`` pointing at another Python that has no picklescope (or no torch).
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from picklescope.core.leftovers import sweep_orphans, temp_name
from picklescope.core.paths import package_folder
from picklescope.errors import PicklescopeError

NOTEBOOK_DIR = package_folder("notebooks")  # package data (in a checkout: notebooks/)
KERNEL_NAME = "python3"
KERNEL_SHUTDOWN_S = 30.0


def _kernel_manager_class(ipc_dir: str) -> type:
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager

    class ThisPythonKernelManager(AsyncKernelManager):
        """An ipykernel on ``sys.executable``, whatever kernelspecs the machine has.

        It gets 30 s to shut down instead of jupyter_client's 5: after half of that the whole process
        group gets SIGTERM, and a kernel that is still ending its forkserver and Ray session on a busy
        machine would die without removing its temporaries. It talks to its kernel over local (IPC)
        sockets in ``ipc_dir`` (the caller's temporary folder, which the caller removes however the kernel
        ended), not TCP: nothing else on the machine can connect, and the kernel has no reason to warn
        that its traffic is unencrypted."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            kwargs.setdefault("shutdown_wait_time", KERNEL_SHUTDOWN_S)
            kwargs.setdefault("transport", "ipc")
            if kwargs["transport"] == "ipc":
                kwargs.setdefault("ip", os.path.join(ipc_dir, "k"))
            super().__init__(*args, **kwargs)

        @property
        def kernel_spec(self) -> KernelSpec:
            if self._kernel_spec is None:
                self._kernel_spec = KernelSpec(
                    argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    display_name=f"Python {sys.version_info[0]}.{sys.version_info[1]} (picklescope)",
                    language="python", resource_dir="", name=KERNEL_NAME)
            return self._kernel_spec

    return ThisPythonKernelManager


def notebook_path(name: str) -> Path:
    """A notebook of ``notebooks/`` by stem (``05_postmortem_template``) or a path to a file."""
    p = Path(name)
    if p.is_file():
        return p
    for candidate in (NOTEBOOK_DIR / name, NOTEBOOK_DIR / f"{name}.py"):
        if candidate.is_file():
            return candidate
    known = ", ".join(sorted(x.stem for x in NOTEBOOK_DIR.glob("*.py")))
    raise PicklescopeError(f"no notebook {name!r}", f"known notebooks: {known}")


def to_ipynb(source: str | Path, out_path: str | Path) -> Path:
    """Convert a jupytext ``.py`` notebook to ``.ipynb`` (parameters tag and kernelspec kept)."""
    import jupytext

    nb = jupytext.read(str(source))
    nb.metadata.setdefault("kernelspec", {"name": KERNEL_NAME, "display_name": "Python 3", "language": "python"})
    out = Path(out_path)
    jupytext.write(nb, str(out), fmt="ipynb")
    return out


def execute(source: str | Path, out_ipynb: str | Path, parameters: dict[str, Any] | None = None, *,
            cwd: str | Path | None = None, timeout_s: float = 900.0) -> Any:
    """Run the notebook top to bottom with ``parameters`` injected after its ``parameters`` cell.

    Returns the executed NotebookNode (also written to ``out_ipynb``); a failing cell raises
    papermill's ``PapermillExecutionError`` naming the cell and the exception.
    """
    import papermill

    out = Path(out_ipynb)
    with tempfile.TemporaryDirectory(prefix=temp_name("picklescope-nb-")) as tmp:
        src = Path(source)
        if src.suffix != ".ipynb":
            src = to_ipynb(src, Path(tmp) / (src.stem + ".ipynb"))
        try:
            return papermill.execute_notebook(
                str(src), str(out), parameters=parameters or {}, kernel_name=KERNEL_NAME, language="python",
                cwd=str(cwd or out.parent), progress_bar=False, execution_timeout=timeout_s,
                kernel_manager_class=_kernel_manager_class(tmp),
            )
        finally:  # a kernel killed at shutdown (or by a failing cell) could not remove its own temporaries
            sweep_orphans()
