#!/usr/bin/env python3
"""Set-up and entry point for a fresh machine that has only Python 3.11.

    python3 dev.py reproduce [ARGS]   run the main job (picklescope reproduce) on the default workload
    python3 dev.py test [PYTEST ARGS] run the whole test suite (ruff, lint-imports, then pytest)
        --quick                       only the quick tier (docs/testing.md): the core checks, no Ray, browser,
                                      real verl, fault or slow tests
        --coverage                    also measure line coverage of toolkit/picklescope, children included
        (on two pytest-xdist workers where there are two cores; PICKLESCOPE_TEST_WORKERS=N chooses,
        0 runs one process; docs/testing.md, "Workers")
    python3 dev.py lab                open JupyterLab on notebooks/ (the .py files open as notebooks)
    python3 dev.py picklescope ARGS   any picklescope command

Each creates ``.venv`` and installs the project into it first if needed (again only when
pyproject.toml or constraints.txt changes). pyproject.toml gives ranges (picklescope installs into a
user's own environment); the exact versions of this repository's runs are in constraints.txt, and
torch is installed first from it, so nothing pulls a CUDA build.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = Path(os.environ.get("PICKLESCOPE_VENV", ROOT / ".venv"))
TORCH = "torch==2.13.0"  # also in constraints.txt; tests/test_setup.py checks the two agree
CONSTRAINTS = ROOT / "constraints.txt"
LAB_SETTINGS = ROOT / "jupyter" / "overrides.d" / "picklescope.json"
EXTRAS = "all,test"
TRANSFERQUEUE = ("transferqueue==0.1.11", "msgspec==0.23.0")
# The quick tier (docs/testing.md): what no tier marker of tests/conftest.py marks.
QUICK = "quick and not (ray or browser or verl or fault or slow)"
COVERAGE_DIR = ROOT / "out" / "coverage"
# pytest-xdist workers of `dev.py test`: two where the machine has two cores or more (the suite in one
# process keeps about one core busy: its tests mostly wait on the children, clusters and kernels they
# start), none on one core; PICKLESCOPE_TEST_WORKERS=N chooses, 0 runs in one process. docs/testing.md
# ("Workers") says what was measured.
WORKERS = os.environ.get("PICKLESCOPE_TEST_WORKERS", "2" if (os.cpu_count() or 1) >= 2 else "0")


def _python311() -> str:
    if sys.version_info[:2] == (3, 11):
        return sys.executable
    found = shutil.which("python3.11")
    if found:
        return found
    sys.exit("dev.py: Python 3.11 is required (torch 2.13.0's CPU wheel here is for 3.11); install python3.11")


def _stamp() -> str:
    h = hashlib.sha256()
    for name in ("pyproject.toml", "dev.py", "constraints.txt"):
        h.update((ROOT / name).read_bytes())
    return h.hexdigest()


def _sh(*cmd: str, **kw) -> None:
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, check=True, **kw)


def ensure_venv() -> Path:
    """Create and fill the virtual environment unless it is already up to date."""
    py = VENV / "bin" / "python"
    stamp_file = VENV / ".picklescope-stamp"
    if py.exists() and stamp_file.exists() and stamp_file.read_text() == _stamp():
        return py
    if not py.exists():
        _sh(_python311(), "-m", "venv", str(VENV))
    pip = [str(py), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _sh(*pip, "--upgrade", "pip")
    _sh(*pip, "-c", str(CONSTRAINTS), TORCH)
    _sh(*pip, "-c", str(CONSTRAINTS), "-e", f"{ROOT}[{EXTRAS}]")
    # TransferQueue declares ray[default] and hydra-core, which would replace the pinned Ray and
    # downgrade omegaconf, and it installs top-level tests/scripts packages: keep it in a folder of
    # its own that only the transferqueue transport puts on its path.
    _sh(*pip, "--no-deps", "--upgrade", "--target", str(VENV / "picklescope-tq"), *TRANSFERQUEUE)
    stamp_file.write_text(_stamp())
    return py


def install_lab_settings() -> None:
    """Make JupyterLab in the venv open the notebooks' .py files as notebooks (jupytext's viewer).

    JupyterLab reads per-package setting defaults from <prefix>/share/jupyter/lab/settings/overrides.d;
    pip's editable install does not copy data files there, so this does (only when they differ).
    """
    target = VENV / "share" / "jupyter" / "lab" / "settings" / "overrides.d" / LAB_SETTINGS.name
    if LAB_SETTINGS.is_file() and (not target.is_file() or target.read_bytes() != LAB_SETTINGS.read_bytes()):
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(LAB_SETTINGS, target)


def compile_sources(py: Path, env: dict[str, str]) -> None:
    """Write the bytecode of the project's own sources once, before anything imports them.

    A machine may set ``PYTHONDONTWRITEBYTECODE`` (the project's CI machine does), and an editable install has no
    bytecode that pip wrote, so every fresh process would compile each picklescope module it imports:
    every measured-run child compiles what the forkserver did not preload, every Ray worker and CLI run
    what it needs. Python reads bytecode whatever that setting says and checks it against each source's
    time and size, so an edited file is compiled again. ``__pycache__`` is in .gitignore. Measured: a
    tiny measured run's processes took 0.30 s of CPU without it, 0.25-0.26 s with it (docs/testing.md)."""
    folders = [str(ROOT / p) for p in ("toolkit", "tests", "benchmarks") if (ROOT / p).is_dir()]
    subprocess.run([str(py), "-m", "compileall", "-q", "-j", "0", *folders], env=env, cwd=ROOT,
                   stdout=subprocess.DEVNULL, check=False)


def _caller_workers(args: list[str]) -> str | None:
    """The worker count the caller gave pytest-xdist (``-n 2``, ``-n2``, ``--numprocesses=2``), or None."""
    for i, a in enumerate(args):
        if a in ("-n", "--numprocesses"):
            return args[i + 1] if i + 1 < len(args) else None
        if a.startswith("--numprocesses="):
            return a.split("=", 1)[1]
        if a.startswith("-n") and len(a) > 2:
            return a[2:]
    return None


def _workers(args: list[str]) -> tuple[list[str], Path | None]:
    """``-n WORKERS --dist loadgroup`` unless the caller chose (``-n``, ``-p no:xdist``) or there are no
    workers (``WORKERS`` is 0); with workers, a short ``--basetemp`` of its own: xdist puts every test's folder one
    level deeper (``popen-gw0/``), and a Ray session's socket paths under it must stay within the 107
    characters of an AF_UNIX path. Also returns that folder (None if the caller gave one or there are no
    workers), to remove after a passing run: pytest prunes its own numbered folders, not one named for
    it, and a failed run's stays to be read."""
    given, out, own = _caller_workers(args), [], None
    if given is None and "no:xdist" not in args and WORKERS not in ("", "0"):
        given, out = WORKERS, ["-n", WORKERS, "--dist", "loadgroup"]
    if given not in (None, "0") and not any(a.startswith("--basetemp") for a in args):
        own = Path(tempfile.mkdtemp(prefix="pst-"))
        out.append(f"--basetemp={own}")
    return out, own


def _pytest(py: Path, args: list[str], env: dict[str, str]) -> int:
    """pytest with the tier and coverage options of ``dev.py test`` turned into its own arguments.

    ``--quick`` selects the quick tier with ``-m``; a ``-m`` of the caller's comes later and wins.
    ``--coverage`` runs pytest under coverage.py (its ``patch`` setting in pyproject.toml makes every
    Python child count), then combines the children's files and prints the report."""
    quick, cover = "--quick" in args, "--coverage" in args
    rest = [a for a in args if a not in ("--quick", "--coverage")]
    workers, own = _workers(rest)
    pytest_args = (["-m", QUICK] if quick else []) + workers + rest
    if not cover:
        rc = subprocess.call([str(py), "-m", "pytest", *pytest_args], env=env, cwd=ROOT)
        if rc == 0 and own is not None:
            shutil.rmtree(own, ignore_errors=True)
        return rc
    if COVERAGE_DIR.exists():
        shutil.rmtree(COVERAGE_DIR)
    COVERAGE_DIR.mkdir(parents=True)
    # children run from other folders: the data file's path is absolute, the settings come from here
    env = dict(env, COVERAGE_FILE=str(COVERAGE_DIR / ".coverage"), COVERAGE_RCFILE=str(ROOT / "pyproject.toml"))
    rc = subprocess.call([str(py), "-m", "coverage", "run", "-m", "pytest", *pytest_args], env=env, cwd=ROOT)
    if rc == 0 and own is not None:
        shutil.rmtree(own, ignore_errors=True)
    subprocess.call([str(py), "-m", "coverage", "combine", "-q"], env=env, cwd=ROOT)
    total = subprocess.run([str(py), "-m", "coverage", "report", "--format=total"], env=env, cwd=ROOT,
                           capture_output=True, text=True).stdout.strip()
    report = subprocess.run([str(py), "-m", "coverage", "report"], env=env, cwd=ROOT, capture_output=True,
                            text=True).stdout
    (COVERAGE_DIR / "report.txt").write_text(report)
    print(f"dev.py: line coverage of toolkit/picklescope, children included: {total or 'not measured'}% "
          f"(per file: {COVERAGE_DIR / 'report.txt'})")
    return rc


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    py = ensure_venv()
    install_lab_settings()
    bindir = py.parent
    env = dict(os.environ, PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", VIRTUAL_ENV=str(VENV))
    compile_sources(py, env)
    if cmd == "reproduce":
        return subprocess.call([str(bindir / "picklescope"), "reproduce", *rest], env=env, cwd=ROOT)
    if cmd == "picklescope":
        return subprocess.call([str(bindir / "picklescope"), *rest], env=env, cwd=ROOT)
    if cmd == "test":
        lint = [p for p in ("toolkit", "tests", "benchmarks", "notebooks", "scripts", "dev.py") if (ROOT / p).exists()]
        rc = subprocess.call([str(bindir / "ruff"), "check", *lint], env=env, cwd=ROOT)
        if rc:
            print("dev.py: ruff found problems (see above)", file=sys.stderr)
            return rc
        # the layers and no-cycles contracts of [tool.importlinter] in pyproject.toml (docs/architecture.md)
        rc = subprocess.call([str(bindir / "lint-imports"), "--no-cache", str(ROOT / "pyproject.toml")], env=env,
                             cwd=ROOT)
        if rc:
            print("dev.py: lint-imports found imports that break the architecture (see above)", file=sys.stderr)
            return rc
        return _pytest(py, rest, env)
    if cmd == "lab":
        extra = []
        if hasattr(os, "getuid") and os.getuid() == 0 and "--allow-root" not in rest:
            # a container's default user is root; Jupyter refuses to start as root without this flag
            print("dev.py: running as root (user id 0), so JupyterLab gets --allow-root", file=sys.stderr)
            extra.append("--allow-root")
        with tempfile.TemporaryDirectory(prefix="picklescope-lab-sockets-") as sockets:
            if not any(a.startswith("--KernelManager.transport") for a in rest):
                # kernels talk to Lab over local sockets in a private folder: no "running over TCP without
                # encryption" warning, and nothing else on the machine can connect
                extra += ["--KernelManager.transport=ipc", f"--KernelManager.ip={os.path.join(sockets, 'k')}"]
            return subprocess.call([str(bindir / "jupyter"), "lab", "--notebook-dir", str(ROOT / "notebooks"),
                                    *extra, *rest], env=env, cwd=ROOT)
    print(f"dev.py: unknown command {cmd!r}: use reproduce, test, lab or picklescope", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
