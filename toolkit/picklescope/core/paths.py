"""Where the files that ship inside the package are: workload presets and reference blobs (``data``), the
notebooks (``notebooks``), the JupyterLab settings (``jupyter``) and the report template (``views/templates``).

They are package data, found with :mod:`importlib.resources`, so the same lookup works for a wheel
installed into a user's own environment, an editable install of a checkout, and a zipped package.
In a checkout the package's ``data``, ``notebooks`` and ``jupyter`` entries are symbolic links to the
folders at the top of the repository, which stay the one source of truth (setuptools copies what they
point to into the wheel). A zipped package has no folders to hand to code that wants paths (YAML
readers, nbconvert's template search, a copy for the user), so its files are extracted once into a
cache folder of the user's own and read from there.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING

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
