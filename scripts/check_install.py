#!/usr/bin/env python3
"""Install picklescope the way a user does, into an environment that already holds torch, and use it.

    python3 scripts/check_install.py                          # this Python, torch 2.13.0 (the local CPU wheel)
    python3 scripts/check_install.py --python 3.12 --torch 2.14.1
    python3 scripts/check_install.py --python 3.10            # torch as pip resolves it

Steps: build the wheel from this checkout; make a new virtual environment with the chosen Python; install
torch and numpy into it first (the user's environment); install the wheel with the ``notebooks`` extra;
check that torch's and numpy's versions did not change; then, from a folder outside the checkout, run
``picklescope list``, ``picklescope run`` on a preset, ``picklescope workload from`` on a batch saved with
``torch.save`` (and a run on the workload it wrote), the capture probe in a small script (and that
``import picklescope.capture`` imported no torch, numpy, plotly or Ray), ``picklescope notebooks DIR`` and
notebook 01 executed headless, ``picklescope reproduce --out DIR`` (the report must fetch nothing from the
network), and the package imported from the wheel file itself (zipped). Prints one line per step and a
JSON summary; exit status 0 only if every step passed. Everything is made in a temporary folder that is
removed at the end (``--keep`` keeps it). Other Pythons' torch comes from PyPI (a multi-GB CUDA build), so
this runs outside the test command; ``tests/test_install.py`` runs it for this Python and torch 2.13.0.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYENV = Path(os.environ.get("PYENV_ROOT", "/root/.pyenv")) / "versions"
STEP_TIMEOUT_S = 1800.0  # generous: a loaded machine, or a torch download of a few GB


@dataclass
class Step:
    name: str
    ok: bool
    seconds: float
    detail: str = ""


@dataclass
class Summary:
    python: str
    torch_requested: str
    torch_before: str = ""
    torch_after: str = ""
    numpy_before: str = ""
    numpy_after: str = ""
    steps: list[Step] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return bool(self.steps) and all(s.ok for s in self.steps)


class StepFailed(Exception):
    pass


def find_python(version: str | None) -> str:
    """``3.12`` -> a Python 3.12 interpreter (pyenv's, else one on PATH that is not a pyenv shim); None -> this one."""
    if not version:
        return sys.executable
    for d in sorted(PYENV.glob(f"{version}.*"), reverse=True):
        exe = d / "bin" / f"python{version}"
        if exe.is_file():
            return str(exe)
    found = shutil.which(f"python{version}")
    if found and "/shims/" not in found:
        return found
    raise SystemExit(f"check_install: no Python {version} found ({PYENV} or PATH): install it, e.g. pyenv install "
                     f"{version}")


def _run(cmd: list[str], cwd: Path, env: dict[str, str], timeout: float = STEP_TIMEOUT_S) -> str:
    p = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        raise StepFailed(f"{' '.join(cmd[:4])}... exited {p.returncode}: {p.stdout[-3000:]}")
    return p.stdout


def build_wheel(out: Path) -> Path:
    """``pip wheel`` of the checkout (no dependencies); built in this Python if it has setuptools."""
    try:
        import setuptools  # noqa: F401

        isolation = ["--no-build-isolation"]
    except ImportError:
        isolation = []
    leftover = not (ROOT / "build").exists()  # setuptools builds in the checkout's build/: removed if it made it
    try:
        _run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(out), str(ROOT)], ROOT,
             dict(os.environ))
    finally:
        if leftover:
            shutil.rmtree(ROOT / "build", ignore_errors=True)
    (wheel,) = out.glob("picklescope-*.whl")
    return wheel


TRAINER_MODULE = textwrap.dedent('''
    """A trainer's batch class: the shape of verl's DataProto (a TensorDict, non-tensor data, meta_info)."""
    import torch
    from tensordict import TensorDict


    class Batch:
        def __init__(self, n):
            self.batch = TensorDict({"obs": torch.zeros(n, 16), "ids": torch.arange(n)}, batch_size=[n])
            self.non_tensor_batch = {}
            self.meta_info = {"step": 1}

        def __getstate__(self):
            return {"batch": self.batch.to_dict(), "non_tensor_batch": {}, "meta_info": self.meta_info}

        def __setstate__(self, state):
            self.__dict__.update(state)
''')
PROBE_SCRIPT = textwrap.dedent('''
    import json, pickle, sys
    import picklescope.capture as capture
    heavy = sorted(m for m in ("torch", "numpy", "plotly", "ray", "jupyter_client") if m in sys.modules)
    assert not heavy, f"import picklescope.capture imported {heavy}"
    probe = capture.install("capture-out", limit=2, target="trainer_mod:Batch.__getstate__")
    import trainer_mod
    for _ in range(3):
        pickle.loads(pickle.dumps(trainer_mod.Batch(8)))
    assert probe.flush(), "the probe's thread did not finish writing"
    print(json.dumps({"error": probe.error, "active": probe.active, "calls": probe.calls}))
''')


def _check_probe_output(work: Path) -> str:
    calls = work / "capture-out" / "calls.jsonl"
    if not calls.is_file():
        raise StepFailed("the capture probe wrote no capture-out/calls.jsonl")
    lines = [json.loads(x) for x in calls.read_text().splitlines() if x.strip()]
    if len(lines) != 2:
        raise StepFailed(f"the probe recorded {len(lines)} calls, not the 2 of limit=2: {lines}")
    if not (work / "capture-out" / "workload.yaml").is_file():
        raise StepFailed("the probe wrote no capture-out/workload.yaml")
    return f"{len(lines)} calls recorded, workload.yaml written"


def check(python: str, torch_spec: str | None, work: Path, wheel: Path | None = None,
          log=print) -> Summary:  # noqa: ANN001 - a print-like callable
    """Every step above, in ``work``; returns the summary (never raises for a failed step)."""
    version = _run([python, "-c", "import platform; print(platform.python_version())"], work,
                   dict(os.environ)).strip()
    summary = Summary(python=version, torch_requested=torch_spec or "(as pip resolves it)")
    venv = work / "venv"
    bindir = venv / "bin"
    home = work / "home"  # caches of the zipped package and Jupyter's runtime files stay in here
    home.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PICKLESCOPE"))}
    env.update(PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(venv),
               XDG_CACHE_HOME=str(home / "cache"), JUPYTER_RUNTIME_DIR=str(home / "jupyter-runtime"),
               MPLCONFIGDIR=str(home / "mpl"))
    cwd = work / "user"  # a folder outside the checkout: nothing there to find by walking up
    cwd.mkdir(exist_ok=True)
    py = str(bindir / "python")
    # --no-compile: byte-compiling torch's thousands of files is most of an install's time; Python does it on import
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    versions = [py, "-c", "import torch, numpy; print(torch.__version__, numpy.__version__)"]

    def step(name: str, fn) -> bool:  # noqa: ANN001
        t0 = time.monotonic()
        try:
            detail = fn() or ""
            ok = True
        except (StepFailed, subprocess.TimeoutExpired, OSError, AssertionError) as exc:
            detail, ok = str(exc), False
        summary.steps.append(Step(name, ok, round(time.monotonic() - t0, 1), detail))
        log(f"{'ok  ' if ok else 'FAIL'} {name} ({summary.steps[-1].seconds:.0f} s){': ' + detail if detail else ''}")
        return ok

    def make_env() -> str:
        _run([python, "-m", "venv", str(venv)], work, env)
        _run([*pip, torch_spec and f"torch=={torch_spec}" or "torch", "numpy"], cwd, env)
        summary.torch_before, summary.numpy_before = _run(versions, cwd, env).split()
        return f"torch {summary.torch_before}, numpy {summary.numpy_before}"

    def install() -> str:
        nonlocal wheel
        if wheel is None:
            wheel = build_wheel(work / "dist")
        _run([*pip, f"{wheel}[notebooks]"], cwd, env)
        summary.torch_after, summary.numpy_after = _run(versions, cwd, env).split()
        if (summary.torch_after, summary.numpy_after) != (summary.torch_before, summary.numpy_before):
            raise StepFailed(f"the install changed torch {summary.torch_before} -> {summary.torch_after} or "
                             f"numpy {summary.numpy_before} -> {summary.numpy_after}")
        return f"{wheel.name}; torch and numpy unchanged"

    def cli(*args: str, expect: str = "") -> str:
        out = _run([str(bindir / "picklescope"), *args], cwd, env)
        if expect and expect not in out:
            raise StepFailed(f"'picklescope {' '.join(args)}' printed no {expect!r}: {out[-2000:]}")
        return out

    def workload_from() -> str:
        _run([py, "-c", "import torch; torch.save({'obs': torch.zeros(8, 4, 3), 'ids': torch.arange(8)}, "
                        "'batch.pt')"], cwd, env)
        cli("workload", "from", "batch.pt", "--out", "mine.yaml", expect="wrote mine.yaml")
        cli("run", "--codec", "numpy", "--workload", "mine.yaml", expect="ok")
        return "batch.pt -> mine.yaml, run ok"

    def probe() -> str:
        (cwd / "trainer_mod.py").write_text(TRAINER_MODULE)
        (cwd / "probe.py").write_text(PROBE_SCRIPT)
        state = json.loads(_run([py, "probe.py"], cwd, env).strip().splitlines()[-1])
        if state != {"error": None, "active": False, "calls": 2}:
            raise StepFailed(f"the probe's state after 3 calls with limit 2: {state}")
        return _check_probe_output(cwd)

    def notebooks() -> str:
        cli("notebooks", "nb", expect="copied into nb")
        found = sorted(p.name for p in (cwd / "nb").glob("*.py"))
        if len(found) != 6:
            raise StepFailed(f"picklescope notebooks copied {found}, not six notebooks")
        (cwd / "nb-out").mkdir(exist_ok=True)
        out = _run([py, "-c", textwrap.dedent("""
            from picklescope.views import nbrun
            nb = nbrun.execute("nb/01_reproduce_the_oom.py", "nb-out/01.ipynb", {"workload": "tiny", "scale": 1.0})
            print("".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", [])
                          if o.get("name") == "stdout"))
        """)], cwd, env)
        if "verdicts: {'numpy-legacy': 'oom-killed', 'numpy': 'ok'}" not in out:
            raise StepFailed(f"notebook 01 did not print its verdicts: {out[-2000:]}")
        return "6 notebooks copied; 01 executed headless: numpy-legacy oom-killed, numpy ok"

    def reproduce() -> str:
        cli("reproduce", "--workload", "tiny", "--scale", "1", "--out", "rep", "--repeat", "1", "--no-headroom",
            "--no-trace", "--no-ray", "--no-node")
        page = cwd / "rep" / "report.html"
        if not page.is_file():
            raise StepFailed("picklescope reproduce wrote no rep/report.html")
        fetched = _run([py, "-c", "import sys; from picklescope.views.offline_html import external_references; "
                                  "print(len(external_references(open(sys.argv[1]).read())))", str(page)], cwd, env)
        if fetched.strip() != "0":
            raise StepFailed(f"rep/report.html fetches {fetched.strip()} resources from the network")
        return f"rep/report.html ({page.stat().st_size // 1024} KiB), nothing fetched from the network"

    def zipped() -> str:
        out = _run([py, "-c", textwrap.dedent("""
            import picklescope, picklescope.workloads.spec as spec
            from picklescope.views import nbrun, offline_html
            assert ".whl" in picklescope.__file__, picklescope.__file__
            assert spec.available_workloads(), spec.WORKLOAD_DIR
            assert spec.load_workload("tiny").payload_bytes() > 0
            assert len(list(nbrun.NOTEBOOK_DIR.glob("*.py"))) == 6, nbrun.NOTEBOOK_DIR
            assert (offline_html.TEMPLATE_DIR / "picklescope_offline" / "index.html.j2").is_file()
            print(len(spec.available_workloads()), "presets from", spec.WORKLOAD_DIR)
        """)], cwd, dict(env, PYTHONPATH=str(wheel)))
        return out.strip()

    if step("venv with torch and numpy first", make_env) and step("pip install the wheel[notebooks]", install):
        step("picklescope list", lambda: cli("list", expect="flowgrpo") and "presets listed")
        step("picklescope run on a preset",
             lambda: cli("run", "--codec", "numpy-legacy", "--transport", "pickle5-oob", "--workload", "tiny",
                         expect="ok") and "tiny: ok")
        step("picklescope workload from a saved batch", workload_from)
        step("capture probe in a script", probe)
        step("picklescope notebooks DIR + notebook 01 headless", notebooks)
        step("picklescope reproduce --out DIR", reproduce)
        step("imported from the zipped wheel", zipped)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--python", help="a Python version (3.10, 3.12, ...); default: this interpreter")
    ap.add_argument("--torch", help="torch version to install first; default 2.13.0 for this Python, else "
                                    "what pip resolves")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder (its path is printed)")
    ap.add_argument("--json", metavar="FILE", help="also write the summary as JSON to FILE")
    args = ap.parse_args(argv)
    python = find_python(args.python)
    torch_spec = args.torch or (None if args.python else "2.13.0")
    work = Path(tempfile.mkdtemp(prefix="pscheck-install-"))  # not a picklescope- name: no run's sweep touches it
    print(f"check_install: Python {args.python or platform.python_version()} ({python}), torch "
          f"{torch_spec or 'as pip resolves it'}, in {work}", flush=True)
    try:
        summary = check(python, torch_spec, work, log=lambda s: print(s, flush=True))
    except (StepFailed, subprocess.TimeoutExpired) as exc:
        print(f"check_install: {python} cannot be used: {exc}", file=sys.stderr)
        return 2
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    data = {**asdict(summary), "ok": summary.ok, "date": time.strftime("%Y-%m-%d"), "platform": platform.platform()}
    print(json.dumps(data, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    return 0 if summary.ok else 1


if __name__ == "__main__":
    sys.exit(main())
