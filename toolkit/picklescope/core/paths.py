"""Where the files that ship inside the package are, and where temporaries go.

Package data: workload presets and reference blobs (``data``), the notebooks (``notebooks``), the
JupyterLab settings (``jupyter``), the docs (``docs``, whose glossary the postmortem inlines) and the
report template (``views/templates``).

They are package data, found with :mod:`importlib.resources`, so the same lookup works for a wheel
installed into a user's own environment, an editable install of a checkout, and a zipped package.
In a checkout the package's ``data``, ``notebooks``, ``jupyter`` and ``docs`` entries are symbolic links to the
folders at the top of the repository, which stay the one source of truth (setuptools copies what they
point to into the wheel). A zipped package has no folders to hand to code that wants paths (YAML
readers, nbconvert's template search, a copy for the user), so its files are extracted once into a
cache folder of the user's own and read from there.

Temporaries (run folders, Ray's temp dirs, torch's caches) all go under :func:`temp_root`.
"""

from __future__ import annotations

import atexit
import fcntl
import hashlib
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

from picklescope.core.leftovers import temp_name
from picklescope.errors import PicklescopeError

if TYPE_CHECKING:  # importlib.resources.abc only from Python 3.11; the name is only a type hint here
    from importlib.abc import Traversable

PACKAGE = "picklescope"


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "picklescope"


def _extract(src: Traversable, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    for item in src.iterdir():
        if item.is_dir():
            _extract(item, dest / item.name)
        elif item.name != "__pycache__":
            (dest / item.name).write_bytes(item.read_bytes())


def _digest(src: Traversable) -> str:
    """A short hash of a packaged folder's names and contents: a changed package gets a fresh extraction."""
    h = hashlib.sha256()
    stack = [(src, "")]
    while stack:
        node, rel = stack.pop()
        for item in sorted(node.iterdir(), key=lambda x: x.name):
            if item.is_dir():
                stack.append((item, f"{rel}{item.name}/"))
            else:
                h.update(f"{rel}{item.name}\0".encode())
                h.update(item.read_bytes())
    return h.hexdigest()[:16]


def package_folder(*parts: str) -> Path:
    """The package's data folder ``parts`` (``"data"``, ``"notebooks"``, ``"views", "templates"``) as a path.

    On a file system (wheel, editable install, checkout) that is the folder itself; inside a zip it is
    a copy extracted into ``~/.cache/picklescope`` (``XDG_CACHE_HOME`` honoured), made once per content.
    """
    node = resources.files(PACKAGE).joinpath(*parts)
    if isinstance(node, Path):
        return node
    if not node.is_dir():
        return _cache_root() / "missing" / "/".join(parts)  # a lookup in it then says what is missing
    target = _cache_root() / f"{'-'.join(parts)}-{_digest(node)}"
    if not target.is_dir():
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".extract-", dir=target.parent))
        try:
            _extract(node, tmp)
            try:
                tmp.rename(target)
            except OSError:  # another process extracted the same content first
                if not target.is_dir():
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def __getattr__(name: str) -> Path:
    """``DATA_DIR``, the package's ``data`` folder (workload presets, reference blobs), found on first use.

    It is looked up lazily (PEP 562) because in a zipped package finding it extracts the folder, which
    importing this module (done by light entry points) must not pay.
    """
    if name == "DATA_DIR":
        value = package_folder("data")
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def copy_notebooks(dest: str | os.PathLike[str], force: bool = False, keep: bool = False) -> list[Path]:
    """Copy the packaged notebooks (jupytext ``.py`` files and their ``jupytext.toml``) into ``dest``.

    A user works on copies in a folder of their own, never in the installed package. A file already
    in ``dest`` with other content is a user's work: nothing is copied unless ``force`` says to replace
    it; ``keep`` copies only the missing ones and leaves every file there as it is (``picklescope lab``).
    Identical files are left as they are. Returns the files written.
    """
    src = package_folder("notebooks")
    files = sorted(p for p in src.iterdir() if p.is_file() and (p.suffix == ".py" or p.name == "jupytext.toml"))
    if not files:
        raise PicklescopeError(f"this picklescope has no notebooks in {src}",
                               "reinstall it: pip install --force-reinstall picklescope")
    out = Path(dest).expanduser()
    if out.exists() and not out.is_dir():
        raise PicklescopeError(f"{out} is a file, not a folder", "give a folder for the notebooks")
    if keep:
        files = [p for p in files if not (out / p.name).exists()]
    differ = [out / p.name for p in files if (out / p.name).exists() and (out / p.name).read_bytes() != p.read_bytes()]
    if differ and not force:
        names = ", ".join(d.name for d in differ)
        raise PicklescopeError(f"{out} already holds other versions of {names}",
                               "choose another folder, or add --force to replace them (your edits would be lost)")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for p in files:
        target = out / p.name
        if not target.exists() or target.read_bytes() != p.read_bytes():
            target.write_bytes(p.read_bytes())
            written.append(target)
    return written


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


_own_torch_cache: str | None = None  # the value keep_torch_cache_private set (not the user's)


def torch_cache_env(folder: str) -> dict[str, str]:
    """Environment that keeps torch's caches inside ``folder``: importing tensordict imports
    ``torch._dynamo``, which creates ``$TMPDIR/torchinductor_<user>`` in every process that imports it
    and never removes it. A value the user set is kept."""
    current = os.environ.get(TORCH_CACHE_ENV)
    if current and current != _own_torch_cache:
        return {}
    return {TORCH_CACHE_ENV: os.path.join(folder, "torchinductor")}


def keep_torch_cache_private() -> str | None:
    """In the command line's own process, point torch's cache at a folder of this process's own under
    ``TMPDIR`` (made only if something imports tensordict, removed at exit, or by the next run's sweep
    after a SIGKILL, since its name carries the pid); returns that folder, or None when the user set
    ``TORCHINDUCTOR_CACHE_DIR`` (kept) or it was done already.

    A command that imports tensordict in its own process (``capabilities`` checks every cell there)
    would otherwise leave an empty ``$TMPDIR/torchinductor_<user>``. The children it starts get folders
    inside their own temporaries (:func:`torch_cache_env` does not take this value for the user's).
    """
    global _own_torch_cache
    if os.environ.get(TORCH_CACHE_ENV):
        return None
    folder = os.path.join(temp_root(), temp_name("picklescope-torch-") + secrets.token_hex(4))
    _own_torch_cache = os.path.join(folder, "torchinductor")
    os.environ[TORCH_CACHE_ENV] = _own_torch_cache
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


class OutFolder:
    """An output folder held by one run: locked while the run writes it, removed if the run made it and
    did not finish.

    Two runs writing one folder would mix their files silently, so the folder itself is locked
    (``flock`` on its directory descriptor, which leaves no lock file behind and is released by the
    kernel when the holder dies, even by SIGKILL); a second run gets one line. A run stopped by Ctrl-C,
    SIGTERM or an error removes the folder it created, when it holds nothing but ``own`` files (the
    run's own outputs), so an interrupted run leaves nothing behind; a folder that existed before is
    left as it was. Call :meth:`keep` once the outputs are written.

    A run killed with SIGKILL cannot remove anything itself. So a folder the run created is watched by a
    small process of its own (:data:`_UNDERTAKER`, plain Python, no import of the toolkit): it waits on a
    pipe from the run, and when the pipe ends without the word "keep" (the run died, whatever killed
    it) it removes the folder under the same rule.
    """

    def __init__(self, path: str, own: tuple[str, ...] = (), flag: str = "--out") -> None:
        self.path, self.own, self.flag = path, own, flag
        self._undertaker: subprocess.Popen[bytes] | None = None
        self.created = False
        self.kept = False
        self._fd: int | None = None

    def __enter__(self) -> OutFolder:
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise PicklescopeError(f"{self.flag} {self.path!r} exists and is not a folder", "give a folder path")
        self.created = not os.path.isdir(self.path)
        if self.created:  # watched before it exists: a run killed the moment after making it leaves nothing
            self._undertaker = _watch_for_death(self.path, self.own)
        try:
            os.makedirs(self.path, exist_ok=True)
            fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            self._tell_undertaker(b"keep")  # nothing was made here: nothing to remove
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            self._tell_undertaker(b"keep")  # another run's folder, not ours to remove
            raise PicklescopeError(f"{self.flag} {self.path!r} is being written by another picklescope run right now",
                                   f"wait for that run to end, or give this one another folder with {self.flag}") \
                from None
        self._fd = fd
        return self

    def keep(self) -> None:
        """The run wrote its outputs: the folder stays whatever happens next."""
        self.kept = True
        self._tell_undertaker(b"keep")

    def _tell_undertaker(self, word: bytes) -> None:
        u, self._undertaker = self._undertaker, None
        if u is None:
            return
        try:
            u.stdin.write(word)
            u.stdin.close()
        except OSError:
            pass
        try:
            u.wait(timeout=10)
        except subprocess.TimeoutExpired:
            u.kill()
            u.wait()

    def __exit__(self, *exc: object) -> None:
        try:
            if (self.created and not self.kept and os.path.isdir(self.path)
                    and set(os.listdir(self.path)) <= set(self.own)):
                shutil.rmtree(self.path, ignore_errors=True)
            self._tell_undertaker(b"done")
        finally:
            if self._fd is not None:
                os.close(self._fd)  # closing the descriptor releases the lock
                self._fd = None


# The watcher of a run's new output folder (see OutFolder). Its own session and SIGINT ignored, so a
# Ctrl-C to the terminal's group does not end it before the run does; it reads the run's pipe (and
# checks once a second that its parent is the run still) and, if the run ended without saying "keep",
# removes the folder when the folder holds only the run's own files.
_UNDERTAKER = """
import os, select, shutil, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)
path, own, parent = sys.argv[1], set(sys.argv[2:]), os.getppid()
said = b""
while True:
    ready, _, _ = select.select([0], [], [], 1.0)
    if ready:
        chunk = os.read(0, 64)
        if not chunk:
            break
        said += chunk
    elif os.getppid() != parent:
        break
if said not in (b"keep", b"done") and os.path.isdir(path) and set(os.listdir(path)) <= own:
    shutil.rmtree(path, ignore_errors=True)
"""


def _watch_for_death(path: str, own: tuple[str, ...]) -> subprocess.Popen[bytes] | None:
    """Start the undertaker of ``path`` (None if it cannot start: the folder is then removed only on the
    paths this process survives)."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", "-c", _UNDERTAKER, os.path.abspath(path), *own],
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True, close_fds=True)
    except OSError:
        return None
