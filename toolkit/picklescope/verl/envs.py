"""verl environments: one folder per verl version (or checkout), never installed into the venv.

Several verl versions must be measured side by side, and a venv holds one version of a package. So
each version gets a folder of its own under the cache (``PICKLESCOPE_CACHE``, default
``~/.cache/picklescope``), filled by ``pip install --no-deps --target``; a child process puts exactly
one of them on ``sys.path`` (:mod:`picklescope.verl.loader`). verl's runtime dependencies (ray,
omegaconf, transformers) are the project's optional extra ``verl`` and live in the venv.

The verl wheel also ships top-level ``tests`` and ``scripts`` packages. Anything on ``sys.path``
ahead of the project would let ``import tests`` find verl's, so an environment's importable folder
(``site/``) holds only ``verl`` and its ``.dist-info``; everything else the wheel brought is moved to
``stray/`` (kept for reading, never on a path). A checkout is linked the same way: ``site/verl`` is a
symlink to the checkout's ``verl`` package, so edits show up at once and the checkout's own
``tests`` never becomes importable.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from picklescope.core.cache import CACHE_ENV, cache_problem, cache_root  # noqa: F401 - re-exported: the verl cache
from picklescope.errors import PicklescopeError

_VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*((a|b|rc)[0-9]+)?(\.post[0-9]+)?(\.dev[0-9]+)?$")
_LABEL_RE = re.compile(r"^[a-z][a-z0-9_]*$")
INFO_FILE = "install.json"


def verl_root() -> Path:
    return cache_root() / "verl"


@dataclass(frozen=True)
class VerlEnv:
    """One installed verl: its label (a version, or ``local`` for a checkout) and where it lives."""

    label: str
    version: str
    source: str  # "pypi" or the checkout path
    root: str
    installed_at: float = 0.0
    install_s: float | None = None
    stray: tuple[str, ...] = ()

    @property
    def site(self) -> Path:
        """The one folder a child puts on ``sys.path`` (holds only ``verl`` and its dist-info)."""
        return Path(self.root) / "site"

    @property
    def protocol_file(self) -> Path:
        return self.site / "verl" / "protocol.py"

    @property
    def codec_prefix(self) -> str:
        return f"verl-{self.label}"


def _env_dir(label: str) -> Path:
    return verl_root() / f"verl-{label}"


def _read_env(path: Path) -> VerlEnv | None:
    try:
        d = json.loads((path / INFO_FILE).read_text())
        env = VerlEnv(d["label"], d["version"], d["source"], str(path), d.get("installed_at", 0.0),
                      d.get("install_s"), tuple(d.get("stray", ())))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return env if env.protocol_file.is_file() else None


def _write_env(env: VerlEnv) -> None:
    d = asdict(env)
    d.pop("root")
    (Path(env.root) / INFO_FILE).write_text(json.dumps(d, indent=1))


_listing: tuple[tuple[str, float], list[VerlEnv]] | None = None


def installed() -> list[VerlEnv]:
    """Every usable verl environment in the cache (cached until the cache folder changes)."""
    global _listing
    root = verl_root()
    try:
        key = (str(root), root.stat().st_mtime)
    except OSError:
        return []
    if _listing is not None and _listing[0] == key:
        return list(_listing[1])
    envs = [e for p in sorted(root.glob("verl-*")) if (e := _read_env(p)) is not None]
    envs.sort(key=lambda e: _sort_key(e.label))
    _listing = (key, envs)
    return list(envs)


def _sort_key(label: str) -> tuple:
    if _VERSION_RE.match(label):
        return (0, tuple(int(x) if x.isdigit() else 0 for x in re.split(r"[.a-z]+", label) if x), label)
    return (1, (), label)


def get_env(label: str) -> VerlEnv:
    """The environment called ``label`` (``0.9.0``, ``local``); the error says how to install it."""
    for env in installed():
        if env.label == label:
            return env
    known = [e.label for e in installed()]
    hint = (f"install it with 'picklescope verl install {label}'" if _VERSION_RE.match(label)
            else f"register a checkout with 'picklescope verl install --source PATH --name {label}'")
    raise PicklescopeError(f"verl {label!r} is not installed" + (f" (installed: {', '.join(known)})" if known else ""),
                           hint)


def _check_version(version: str) -> None:
    if not _VERSION_RE.match(version):
        raise PicklescopeError(f"{version!r} is not a verl version number", "use e.g. 0.9.0 or 0.9.1")


def _quarantine_strays(staging: Path, env_dir: Path) -> tuple[str, ...]:
    """Move everything but ``verl`` and its dist-info out of the importable folder."""
    site, stray = env_dir / "site", env_dir / "stray"
    site.mkdir(parents=True)
    moved = []
    for entry in sorted(staging.iterdir()):
        keep = entry.name == "verl" or (entry.name.startswith("verl-") and entry.name.endswith(".dist-info"))
        if keep:
            entry.rename(site / entry.name)
        else:
            stray.mkdir(exist_ok=True)
            entry.rename(stray / entry.name)
            moved.append(entry.name)
    return tuple(moved)


def _pip_failure(version: str, output: str) -> PicklescopeError:
    """pip's failure as one line: the versions that exist when the index has none by that number."""
    import re

    errors = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("ERROR:")]
    found = re.search(r"\(from versions: ([^)]*)\)", output)
    if found is not None:
        versions = found.group(1).strip() or "none"
        return PicklescopeError(f"verl {version} is not on the package index (it has: {versions})",
                                "pick one of those versions, e.g. 'picklescope verl install 0.9.0 0.9.1'")
    reason = " | ".join(errors[-2:]) or " | ".join(output.strip().splitlines()[-2:]) or "no output"
    return PicklescopeError(f"pip could not install verl=={version}: {reason}",
                            "check that the package index is reachable (pip config, proxy) and retry")


# How long a second installer waits for the first (a verl wheel installs in about a minute; a busy
# machine or a slow index can make it several), before it says who holds the lock instead of hanging.
LOCK_WAIT_S = 900.0


@contextlib.contextmanager
def _installing(label: str, wait_s: float | None = None) -> Iterator[None]:
    """Hold the cache's lock on environment ``label`` while it is (re)made.

    Two processes that install the same version at once (two notebooks, two test workers) would
    each replace the folder the other has just filled while the other reads it; the second waits for
    the first and then finds the version installed. The lock is the kernel's (``flock``): it ends with
    its holder, killed or not, so a crashed install never blocks the next. The wait is bounded
    (``LOCK_WAIT_S``): a holder stuck in pip gets one line naming its pid, not a silent hang."""
    verl_root().mkdir(parents=True, exist_ok=True)
    wait_s = LOCK_WAIT_S if wait_s is None else wait_s
    deadline = time.monotonic() + wait_s
    with open(verl_root() / f".install-{label}.lock", "a+") as f:
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    f.seek(0)
                    holder = f.read().strip() or "unknown"
                    raise PicklescopeError(
                        f"verl environment {label!r} has been locked for {wait_s:.0f} s by another install "
                        f"(process {holder})",
                        f"wait for that install to finish, or end process {holder}, then retry") from None
                time.sleep(0.2)
        f.truncate(0)
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            f.truncate(0)
            fcntl.flock(f, fcntl.LOCK_UN)


def install_version(version: str, *, force: bool = False, index_url: str | None = None) -> VerlEnv:
    """``pip install --no-deps --target`` one verl version into its own folder (skipped if present)."""
    _check_version(version)
    env_dir = _env_dir(version)
    with _installing(version):
        existing = _read_env(env_dir) if env_dir.exists() else None
        if existing is not None and existing.version == version and not force:
            return existing
        return _install_version(version, env_dir, index_url)


def _install_version(version: str, env_dir: Path, index_url: str | None) -> VerlEnv:
    staging = verl_root() / f".staging-{version}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--disable-pip-version-check",
           "--no-input", "--target", str(staging), f"verl=={version}"]
    if index_url:
        cmd += ["--index-url", index_url]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.monotonic() - t0
    if proc.returncode != 0:
        shutil.rmtree(staging, ignore_errors=True)
        raise _pip_failure(version, proc.stderr or proc.stdout or "")
    if not (staging / "verl" / "protocol.py").is_file():
        shutil.rmtree(staging, ignore_errors=True)
        raise PicklescopeError(f"verl=={version} installed no verl/protocol.py",
                               "this version has no DataProto; pick another version")
    shutil.rmtree(env_dir, ignore_errors=True)
    stray = _quarantine_strays(staging, env_dir)
    staging.rmdir()
    found = (env_dir / "site" / "verl" / "version" / "version")
    real_version = found.read_text().strip() if found.is_file() else version
    env = VerlEnv(version, real_version, "pypi", str(env_dir), time.time(), round(seconds, 2), stray)
    _write_env(env)
    os.utime(verl_root())  # a new environment: refresh the listing in this and other processes
    return env


def _checkout_package(path: str | os.PathLike) -> Path:
    p = Path(path).expanduser().resolve()
    for candidate in (p / "verl", p):
        if (candidate / "protocol.py").is_file() and candidate.name == "verl":
            return candidate
    raise PicklescopeError(f"{p} is not a verl checkout (no verl/protocol.py in it)",
                           "give the folder that contains the 'verl' package (the repository root)")


def install_source(path: str | os.PathLike, label: str = "local") -> VerlEnv:
    """Register a verl checkout as environment ``label`` (``site/verl`` links to its package)."""
    if not _LABEL_RE.match(label) or _VERSION_RE.match(label):
        raise PicklescopeError(f"{label!r} cannot name a checkout",
                               "use lower-case letters, digits and _ starting with a letter (e.g. local)")
    pkg = _checkout_package(path)
    env_dir = _env_dir(label)
    with _installing(label):  # the same folder swap as an install: the same lock
        shutil.rmtree(env_dir, ignore_errors=True)
        (env_dir / "site").mkdir(parents=True)
        (env_dir / "site" / "verl").symlink_to(pkg, target_is_directory=True)
        vfile = pkg / "version" / "version"
        version = vfile.read_text().strip() if vfile.is_file() else "unknown"
        env = VerlEnv(label, version, str(pkg.parent), str(env_dir), time.time(), None, ())
        _write_env(env)
    os.utime(verl_root())
    return env


def remove(label: str) -> None:
    """Delete an environment folder (a checkout itself is never touched, only its link)."""
    env = get_env(label)
    shutil.rmtree(env.root)
    os.utime(verl_root())
