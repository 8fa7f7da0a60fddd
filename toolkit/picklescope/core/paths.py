"""Where the project's ``data/`` and ``notebooks/`` folders are, and where temporaries go.

They belong to the checkout, not to the package: the supported install is editable (``python3 dev.py``),
so the folders are found by walking up from the package to the folder that holds ``pyproject.toml``.
``PICKLESCOPE_PROJECT`` names a checkout explicitly, for a package installed elsewhere (a wheel).

Temporaries (run folders, Ray's temp dirs, torch's caches) all go under :func:`temp_root`.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from picklescope.core.leftovers import temp_name
from picklescope.errors import PicklescopeError

_PACKAGE = Path(__file__).resolve().parents[1]


def project_folder(name: str) -> Path:
    """The project's folder ``name`` (``data`` or ``notebooks``); see the module docstring for the search."""
    env = os.environ.get("PICKLESCOPE_PROJECT")
    if env:
        return Path(env).expanduser().resolve() / name
    for up in _PACKAGE.parents:
        if (up / "pyproject.toml").is_file() and (up / name).is_dir():
            return up / name
    return _PACKAGE.parents[1] / name


# -- temporaries ------------------------------------------------------------------------------------

# Ray puts its sockets under its temp dir: ``<temp dir>/session_<date>_<time>_<usec>_<pid>/sockets/
# plasma_store``, and a Unix socket's path holds at most 107 bytes. The session part is at most this long.
RAY_SOCKET_TAIL = len("/session_2026-12-02_09-52-31_123456_4194304/sockets/plasma_store")
UNIX_SOCKET_MAX = 107
TORCH_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def temp_root() -> str:
    """Where every temporary of the toolkit goes: ``TMPDIR`` (``/tmp`` when it is unset), never a
    hard-coded ``/tmp``, so a user who points ``TMPDIR`` at a scratch disk finds nothing elsewhere."""
    return tempfile.gettempdir()


def make_temp_dir(prefix: str, *, for_ray: bool = False, socket: str = "") -> str:
    """A new folder ``<temp root>/<prefix><pid>-<random>`` (the leftover sweep reads the pid in its name).

    ``for_ray``: the folder will be a Ray temp dir, whose sockets must fit a Unix socket path (107 bytes);
    ``socket``: the name of a socket of ours that will be made in it. A ``TMPDIR`` too long for either
    is refused in one line rather than failing deep inside ``ray.init`` or ``Listener``.
    """
    path = tempfile.mkdtemp(prefix=temp_name(prefix), dir=temp_root())
    tail = max(RAY_SOCKET_TAIL if for_ray else 0, len(socket.encode()) + 1 if socket else 0)
    if len(path.encode()) + tail > UNIX_SOCKET_MAX:
        shutil.rmtree(path, ignore_errors=True)
        room = UNIX_SOCKET_MAX - tail - (len(path.encode()) - len(temp_root().encode()))
        raise PicklescopeError(f"the temp folder {temp_root()!r} (TMPDIR) is too long for Ray's socket paths "
                               f"({len(temp_root().encode())} bytes; a Unix socket path holds {UNIX_SOCKET_MAX})",
                               f"point TMPDIR at a folder whose path has at most {max(room, 1)} bytes, e.g. /tmp")
    return path


def torch_cache_env(folder: str) -> dict[str, str]:
    """Environment that keeps torch's caches inside ``folder``: importing tensordict imports
    ``torch._dynamo``, which creates ``$TMPDIR/torchinductor_<user>`` in every process that imports it
    and never removes it. A value the user set is kept."""
    if os.environ.get(TORCH_CACHE_ENV):
        return {}
    return {TORCH_CACHE_ENV: os.path.join(folder, "torchinductor")}


class OutFolder:
    """An output folder held by one run: locked while the run writes it, removed if the run made it and
    did not finish.

    Two runs writing one folder would mix their files silently, so the folder itself is locked
    (``flock`` on its directory descriptor, which leaves no lock file behind and is released by the
    kernel when the holder dies, even by SIGKILL); a second run gets one line. A run stopped by Ctrl-C,
    SIGTERM or an error removes the folder it created, when it holds nothing but ``own`` files (the
    run's own outputs), so an interrupted run leaves nothing behind; a folder that existed before is
    left as it was. Call :meth:`keep` once the outputs are written.
    """

    def __init__(self, path: str, own: tuple[str, ...] = (), flag: str = "--out") -> None:
        self.path, self.own, self.flag = path, own, flag
        self.created = False
        self.kept = False
        self._fd: int | None = None

    def __enter__(self) -> OutFolder:
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise PicklescopeError(f"{self.flag} {self.path!r} exists and is not a folder", "give a folder path")
        self.created = not os.path.isdir(self.path)
        os.makedirs(self.path, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise PicklescopeError(f"{self.flag} {self.path!r} is being written by another picklescope run right now",
                                   f"wait for that run to end, or give this one another folder with {self.flag}") \
                from None
        self._fd = fd
        return self

    def keep(self) -> None:
        """The run wrote its outputs: the folder stays whatever happens next."""
        self.kept = True

    def __exit__(self, *exc: object) -> None:
        try:
            if (self.created and not self.kept and os.path.isdir(self.path)
                    and set(os.listdir(self.path)) <= set(self.own)):
                shutil.rmtree(self.path, ignore_errors=True)
        finally:
            if self._fd is not None:
                os.close(self._fd)  # closing the descriptor releases the lock
                self._fd = None
