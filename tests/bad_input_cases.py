"""The bad-input catalogue: every way a user can get picklescope's input wrong, and what must be said.

Each case is one wrong input (CLI arguments or a Python call), the words its one-line error must
contain to name the cause, and the words that name the way out. ``tests/test_bad_input.py`` runs
every case and checks exit status 2, one line, no traceback, and that nothing in the user's folder
changed; ``python tests/bad_input_cases.py`` runs them and writes ``docs/bad_input.md`` with the
message each one really printed on this machine.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BLOBS = ROOT / "data" / "blobs"


@dataclass(frozen=True)
class Case:
    """One wrong input. ``argv`` for the CLI (``{tmp}`` is the user's folder), or ``call`` for the API."""

    id: str
    what: str  # the wrong input, as the docs table shows it
    cause: tuple[str, ...]  # every fragment must be in the message (case-insensitive)
    way_out: tuple[str, ...]  # and these name the fix
    argv: tuple[str, ...] = ()
    call: Callable[[Path], Any] | None = None
    files: dict[str, str] = field(default_factory=dict)  # the user's folder before the case runs
    subprocess: bool = False  # run as 'python -m picklescope' (the case sets environment variables)
    env: dict[str, str] = field(default_factory=dict)
    hide: tuple[str, ...] = ()  # modules made unimportable for the case ("not installed")
    needs: tuple[str, ...] = ()  # "verl-0.9.0": an installed verl 0.9.0 environment

    @property
    def surface(self) -> str:
        return "API" if self.call is not None else "CLI"


BAD_YAML_FIELD = "name: bad\nbatch_size: 8\ntensors:\n  obs: {shape: [N, 64], dtype: float33}\n"
BAD_YAML_SYNTAX = "name: bad\nbatch_size: 8\ntensors:\n  obs: {shape: [N, 64], dtype: float32\n"
BAD_YAML_BATCH = "name: bad\nbatch_size: -3\ntensors:\n  obs: {shape: [N, 64], dtype: float32}\n"
BAD_YAML_EXTRA = "name: bad\nbatch_size: 8\ntensors:\n  obs: {shape: [N, 5], dtype: float32, colour: red}\n"
BAD_YAML_SHAPE = "name: bad\nbatch_size: 8\ntensors:\n  obs: {shape: [N, -5], dtype: float32}\n"
SYNTAX_ERROR_PY = "def __getstate__(self):\n    return (\n"
NO_FUNCTION_PY = "x = 1\n"
BROKEN_VERL = "import not_a_real_dependency_xyz\n"
USER_NOTE = "my notes from the incident\n"


def _api_run(**kw: Any) -> Callable[[Path], Any]:
    def go(tmp: Path) -> Any:
        from picklescope import run

        kw2 = {k: (v.format(tmp=tmp) if isinstance(v, str) else v) for k, v in kw.items()}
        if "plugins" in kw2:
            kw2["plugins"] = [p.format(tmp=tmp) for p in kw2["plugins"]]
        return run(**{"workload": "tiny", **kw2})

    return go


def _api(fn: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    def go(tmp: Path) -> Any:
        import importlib

        module, _, name = fn.rpartition(".")
        a = [x.format(tmp=tmp) if isinstance(x, str) else x for x in args]
        return getattr(importlib.import_module(module), name)(*a, **kw)

    return go


CASES: list[Case] = [
    # -- names ---------------------------------------------------------------------------------
    Case("unknown-codec", "run --codec nope", ("unknown codec 'nope'",), ("numpy-legacy", "torch"),
         argv=("run", "--codec", "nope")),
    Case("unknown-transport", "run --transport carrier-pigeon", ("unknown transport 'carrier-pigeon'",),
         ("pickle5-oob", "ray"), argv=("run", "--transport", "carrier-pigeon")),
    Case("unknown-tracer", "run --tracer valgrind", ("unknown tracer 'valgrind'",), ("memray", "tracemalloc"),
         argv=("run", "--tracer", "valgrind")),
    Case("unknown-workload", "run --workload nope", ("unknown workload 'nope'",), ("flowgrpo", "tiny", ".yaml"),
         argv=("run", "--workload", "nope")),
    Case("unknown-receiver-codec", "run --receiver-codec nope", ("unknown codec 'nope'",), ("numpy-legacy",),
         argv=("run", "--receiver-codec", "nope")),
    Case("unknown-codec-api", "picklescope.run(codec='nope')", ("unknown codec 'nope'",), ("numpy-legacy",),
         call=_api_run(codec="nope")),
    Case("unknown-verl-mode", "run --codec verl-0.9.0:bogus", ("unknown codec 'verl-0.9.0:bogus'",),
         ("numpy",), argv=("run", "--codec", "verl-0.9.0:bogus")),
    Case("unknown-command", "picklescope frobnicate", ("invalid choice: 'frobnicate'",), ("reproduce", "--help"),
         argv=("frobnicate",)),
    Case("unknown-enforcement", "run --enforcement magic", ("invalid choice: 'magic'",), ("watchdog", "cgroup"),
         argv=("run", "--enforcement", "magic")),
    # -- workload files ------------------------------------------------------------------------
    Case("workload-bad-field", "workload YAML with dtype float33 on line 4",
         ("tensors.obs.dtype", "line 4", "float33"), ("float32", "fix that field"),
         argv=("run", "--workload", "{tmp}/bad.yaml"), files={"bad.yaml": BAD_YAML_FIELD}),
    Case("workload-bad-yaml", "workload YAML with an unclosed brace", ("not valid YAML", "line"),
         ("fix the syntax",), argv=("run", "--workload", "{tmp}/bad.yaml"), files={"bad.yaml": BAD_YAML_SYNTAX}),
    Case("workload-bad-batch", "workload YAML with batch_size -3 (API)", ("batch_size", "line 2", "positive"),
         ("fix that field",), call=_api("picklescope.workloads.load_workload", "{tmp}/bad.yaml"),
         files={"bad.yaml": BAD_YAML_BATCH}),
    Case("workload-unknown-field", "workload YAML with a misspelt field 'colour' on line 4",
         ("tensors.obs.colour", "line 4", "unknown field"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/bad.yaml"), files={"bad.yaml": BAD_YAML_EXTRA}),
    Case("workload-negative-shape", "workload YAML with shape [N, -5]", ("tensors.obs.shape", "-5"),
         ("integers >= 0",), argv=("run", "--workload", "{tmp}/bad.yaml"), files={"bad.yaml": BAD_YAML_SHAPE}),
    Case("workload-missing", "run --workload missing.yaml", ("missing.yaml", "does not exist"),
         ("check the path", "preset"), argv=("run", "--workload", "{tmp}/missing.yaml")),
    # -- scale ---------------------------------------------------------------------------------
    Case("scale-zero", "run --scale 0", ("scale 0.0 must be a positive number",), ("--scale 0.25",),
         argv=("run", "--scale", "0")),
    Case("scale-negative", "run --scale -1", ("scale -1.0 must be a positive number",), ("--scale",),
         argv=("run", "--scale", "-1")),
    Case("scale-nan-api", "picklescope.run(scale=float('nan'))", ("scale nan",), ("positive",),
         call=_api_run(scale=float("nan"))),
    Case("scale-too-big", "run --scale 100000 (45 TiB of batch)", ("needs about", "available"),
         ("smaller --scale",), argv=("run", "--scale", "100000")),
    # -- budgets -------------------------------------------------------------------------------
    Case("budget-unparsable", "run --budget lots", ("--budget 'lots' is not a size",), ("700MiB", "1.5x"),
         argv=("run", "--budget", "lots")),
    Case("budget-zero", "run --budget 0", ("must be above zero",), ("positive size",),
         argv=("run", "--budget", "0")),
    Case("budget-negative", "run --budget -1MiB", ("'-1MiB' is negative",), ("positive size",),
         argv=("run", "--budget", "-1MiB")),
    Case("budget-below-baseline", "run --budget total:64MiB (the child holds torch and the batch)",
         ("below the sender's baseline", "total:64.0 MiB"), ("give a total above",),
         argv=("run", "--workload", "tiny", "--budget", "total:64MiB")),
    Case("budget-above-machine", "run --budget 100TiB", ("more than this machine can give",),
         ("use a budget under",), argv=("run", "--workload", "tiny", "--budget", "100TiB")),
    Case("budget-total-multiple", "run --budget total:0.5x", ("mixes total: with a payload multiple",),
         ("total:2GiB",), argv=("run", "--budget", "total:0.5x")),
    Case("receiver-budget-api", "picklescope.run(receiver_budget='12 parsecs')",
         ("--receiver-budget '12 parsecs' is not a size",), ("700MiB",), call=_api_run(receiver_budget="12 parsecs")),
    Case("budget-without-sampling", "picklescope.run(budget='1x', tracer='none')",
         ("turns off the sampling a budget is enforced with",), ("drop --tracer none",),
         call=_api_run(budget="1x", tracer="none")),
    Case("budget-infinite", "run --budget 1e400MiB", ("too large to be a size",), ("700MiB",),
         argv=("run", "--budget", "1e400MiB")),
    Case("timeout-zero", "run --timeout 0", ("--timeout '0' must be a positive number of seconds",),
         ("--timeout 300",), argv=("run", "--timeout", "0")),
    Case("timeout-api", "picklescope.run(timeout_s=-5)", ("timeout_s -5 must be a positive",), ("timeout_s=300",),
         call=_api_run(timeout_s=-5)),
    # -- tracers -------------------------------------------------------------------------------
    Case("tracer-not-installed", "run --tracer memray where memray is not installed",
         ("tracer 'memray' is not available", "memray is not installed"), ("pip install", "drop it"),
         argv=("run", "--workload", "tiny", "--tracer", "memray"), hide=("memray",)),
    Case("tracers-conflict", "run --tracer memray,memray-native", ("memray and memray-native cannot run",),
         ("choose one",), argv=("run", "--tracer", "memray,memray-native")),
    # -- verl ----------------------------------------------------------------------------------
    Case("verl-not-installable", "verl install 0.0.99", ("verl 0.0.99 is not on the package index",),
         ("0.9.1", "pick one"), argv=("verl", "install", "0.0.99"), subprocess=True,
         env={"PICKLESCOPE_CACHE": "{tmp}/.cache"}),
    Case("verl-bad-version", "verl install latest-please", ("is not a verl version number",), ("0.9.0",),
         argv=("verl", "install", "latest-please")),
    Case("verl-not-importable", "run --codec verl-broken:numpy (its protocol.py imports a missing package)",
         ("verl broken", "cannot be imported", "not_a_real_dependency_xyz"), ("not installed here",),
         argv=("run", "--workload", "tiny", "--codec", "verl-broken:numpy"), subprocess=True,
         env={"PICKLESCOPE_CACHE": "{tmp}/.cache"}, needs=("verl-broken",),
         files={"checkout/verl/__init__.py": "", "checkout/verl/protocol.py": BROKEN_VERL}),
    Case("verl-check-not-importable", "verl check broken", ("cannot be imported", "not_a_real_dependency_xyz"),
         ("pip install",), argv=("verl", "check", "broken"), subprocess=True,
         env={"PICKLESCOPE_CACHE": "{tmp}/.cache"}, needs=("verl-broken",),
         files={"checkout/verl/__init__.py": "", "checkout/verl/protocol.py": BROKEN_VERL}),
    Case("verl-checkout-missing", "verl install --source a-folder-without-verl", ("is not a verl checkout",),
         ("protocol.py",), argv=("verl", "install", "--source", "{tmp}"), files={"readme.txt": "not verl\n"}),
    # -- Ray -----------------------------------------------------------------------------------
    Case("ray-unreachable", "run --transport ray --ray-address 127.0.0.1:1",
         ("127.0.0.1:1",), ("ray start", "--ray-address"),
         argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address", "127.0.0.1:1")),
    Case("ray-bad-address", "run --transport ray --ray-address nothost", ("nothost",), ("host:port",),
         argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address", "nothost")),
    Case("ray-bad-port", "run --transport ray --ray-address 127.0.0.1:99999", ("port '99999'",),
         ("1 to 65535",), argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address", "127.0.0.1:99999")),
    Case("ray-not-installed", "run --transport ray where Ray is not installed", ("ray",), ("pip install",),
         argv=("run", "--transport", "ray", "--workload", "tiny"), hide=("ray",)),
    # -- blobs ---------------------------------------------------------------------------------
    Case("blob-missing", "inspect missing.pkl", ("missing.pkl",), ("check the path",),
         argv=("inspect", "{tmp}/missing.pkl")),
    Case("blob-not-pickle", "inspect notes.txt --trust", ("not a pickle",), ("",),
         argv=("inspect", "{tmp}/notes.txt", "--trust"), files={"notes.txt": USER_NOTE}),
    Case("blob-truncated", "inspect half.pkl --trust (first half of a real blob)", ("truncated",), ("",),
         argv=("inspect", "{tmp}/half.pkl", "--trust"), files={"half.pkl": "@half:verl-0.9.0-numpy.pkl"}),
    Case("blob-untrusted", "inspect --as numpy a pickle outside data/ without --trust", ("--trust",), ("trust",),
         argv=("inspect", "{tmp}/copy.pkl", "--as", "numpy"), files={"copy.pkl": "@copy:verl-0.9.0-numpy.pkl"}),
    Case("blob-other-codec", "inspect a numpy-mode blob --as verl-0.9.0:torch",
         ("written in numpy mode, read in torch mode",), ("VERL_DATAPROTO_SERIALIZATION_METHOD=numpy",),
         argv=("inspect", str(BLOBS / "verl-0.9.0-numpy.pkl"), "--as", "verl-0.9.0:torch"), needs=("verl-0.9.0",)),
    Case("blob-not-verl-codec", "inspect a verl blob --as torch", ("holds a verl DataProto", "'torch' cannot read"),
         ("verl-0.9.1:numpy",), argv=("inspect", str(BLOBS / "verl-0.9.0-numpy.pkl"), "--as", "torch")),
    # -- output folders ------------------------------------------------------------------------
    Case("out-not-empty", "reproduce --out notes/ (holds the user's file)", ("already holds other files", "mine.txt"),
         ("--force",), argv=("reproduce", "--workload", "tiny", "--out", "{tmp}/notes"),
         files={"notes/mine.txt": USER_NOTE}),
    Case("out-is-a-file", "reproduce --out notes.txt (a file)", ("exists and is not a folder",),
         ("folder path",), argv=("reproduce", "--workload", "tiny", "--out", "{tmp}/notes.txt"),
         files={"notes.txt": USER_NOTE}),
    Case("out-unwritable", "reproduce --out /proc/1/picklescope-out (cannot be created)", ("/proc/1/picklescope-out",),
         ("permissions",), argv=("reproduce", "--workload", "tiny", "--out", "/proc/1/picklescope-out")),
    Case("postmortem-out-not-empty", "postmortem --out notes/", ("is not empty", "mine.txt"), ("--force",),
         argv=("postmortem", "--workload", "tiny", "--out", "{tmp}/notes"), files={"notes/mine.txt": USER_NOTE}),
    # -- patches, plugins, functions -----------------------------------------------------------
    Case("candidate-syntax-error", "confirm --candidate broken.py (unclosed parenthesis)",
         ("broken.py", "line"), ("__getstate__",),
         argv=("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", "{tmp}/broken.py"),
         files={"broken.py": SYNTAX_ERROR_PY}),
    Case("candidate-no-function", "confirm --candidate empty.py (no __getstate__)",
         ("defines neither __getstate__ nor __setstate__",), ("def __getstate__(self)",),
         argv=("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", "{tmp}/empty.py"),
         files={"empty.py": NO_FUNCTION_PY}),
    Case("confirm-baseline-not-verl", "confirm --baseline numpy (a built-in codec)",
         ("'numpy' is not a verl codec name",), ("verl-0.9.0:numpy",),
         argv=("confirm", "--baseline", "numpy", "--candidate", "{tmp}/empty.py"), files={"empty.py": NO_FUNCTION_PY}),
    Case("candidate-missing", "confirm --candidate missing.py", ("missing.py does not exist",), (".py patch",),
         argv=("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", "{tmp}/missing.py")),
    Case("plugin-syntax-error", "picklescope.run(plugins=['plug.py']) with a syntax error",
         ("plug.py", "syntax error", "line 2"), ("fix the file",),
         call=_api_run(plugins=["{tmp}/plug.py"]), files={"plug.py": SYNTAX_ERROR_PY}),
    Case("plugin-missing", "stepthrough --codec numpy --plugin nothere.py", ("nothere.py", "does not exist"),
         ("check the path",), argv=("stepthrough", "--codec", "numpy", "--plugin", "{tmp}/nothere.py")),
    Case("function-no-module", "stepthrough --function nope.mod:Thing",
         ("'nope.mod:Thing' does not resolve", "cannot be imported"), ("--path",),
         argv=("stepthrough", "--workload", "tiny", "--function", "nope.mod:Thing")),
    Case("function-no-attribute", "stepthrough --function json:JSONDecoder.nope",
         ("does not resolve", "has no attribute 'nope'"), ("module:Class.method",),
         argv=("stepthrough", "--workload", "tiny", "--function", "json:JSONDecoder.nope")),
    Case("function-no-colon", "stepthrough --function verl.protocol.DataProto", ("is not module:qualname",),
         ("verl.protocol:DataProto.__getstate__",), argv=("stepthrough", "--function", "verl.protocol.DataProto")),
    Case("function-api", "picklescope.stepthrough(function='json:nothing')", ("has no attribute 'nothing'",),
         ("module:Class.method",), call=_api("picklescope.stepthrough.stepthrough", "json:nothing", workload="tiny")),
    Case("stepthrough-unknown-method", "stepthrough --codec numpy --method __reduce__",
         ("unknown method '__reduce__'",), ("__getstate__",), argv=("stepthrough", "--codec", "numpy", "--method",
                                                                    "__reduce__")),
    Case("stepthrough-bad-env", "stepthrough --codec numpy --env NOEQUALS", ("'NOEQUALS' is not KEY=VALUE",),
         ("VERL_DATAPROTO_SERIALIZATION_METHOD=numpy",), argv=("stepthrough", "--codec", "numpy", "--env", "NOEQUALS")),
    Case("capabilities-unknown", "capabilities --codec nope", ("unknown codec 'nope'",), ("numpy",),
         argv=("capabilities", "--codec", "nope")),
]


def materialize(case: Case, tmp: Path) -> None:
    """Write the user's folder of ``case`` (``@half:`` / ``@copy:`` take bytes of a reference blob)."""
    for rel, text in case.files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if text.startswith("@"):
            how, _, name = text[1:].partition(":")
            data = (BLOBS / name).read_bytes()
            p.write_bytes(data[: len(data) // 2] if how == "half" else data)
        else:
            p.write_text(text)


def fill(case: Case, tmp: Path) -> tuple[list[str], dict[str, str]]:
    return [a.format(tmp=tmp) for a in case.argv], {k: v.format(tmp=tmp) for k, v in case.env.items()}


def run_case(case: Case, tmp: Path) -> tuple[int, str]:
    """Run one case; returns (exit status or 2 for an API error, the error text). Raises if the API
    call does not raise a PicklescopeError (the test reports that)."""
    import contextlib
    import io
    import os
    import subprocess

    from picklescope.errors import PicklescopeError

    argv, env = fill(case, tmp)
    hidden = {m: sys.modules.get(m) for m in case.hide}
    for m in case.hide:  # what 'pip uninstall' would leave: the import fails
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        if case.call is not None:
            try:
                case.call(tmp)
            except PicklescopeError as exc:
                return 2, str(exc)
            raise AssertionError(f"{case.id}: the call returned instead of raising PicklescopeError")
        if case.subprocess:
            p = subprocess.run([sys.executable, "-m", "picklescope", *argv], capture_output=True, text=True,
                               env={**os.environ, **env}, cwd=tmp, timeout=600)
            return p.returncode, p.stderr
        from picklescope.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        return code, err.getvalue()
    finally:
        for m, mod in hidden.items():
            if mod is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = mod


def prepare_needs(case: Case, tmp: Path) -> None:
    """Install what a case needs before it runs (a verl environment)."""
    import os
    import subprocess

    _, env = fill(case, tmp)
    full_env = {**os.environ, **env}
    for need in case.needs:
        if need == "verl-broken":
            args = ["verl", "install", "--source", str(tmp / "checkout"), "--name", "broken"]
        else:
            args = ["verl", "install", need.removeprefix("verl-")]
        p = subprocess.run([sys.executable, "-m", "picklescope", *args], capture_output=True, text=True,
                           env=full_env, timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"could not prepare {need}: {p.stderr}")


def error_line(stderr: str) -> str:
    return "\n".join(ln for ln in stderr.splitlines() if ln.startswith("picklescope: error:"))


def markdown(rows: list[tuple[Case, str]]) -> str:
    """The docs page: one row per case with the message it printed."""
    def cell(s: str) -> str:  # a code span: shown as printed, '<' and '*' included
        return "`" + s.replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"

    out = [
        "# Bad input: what picklescope says",
        "",
        "Every wrong input below ends with one line on stderr that names the problem and the way out,",
        "exit status 2 and no traceback (`picklescope --debug ...` shows it). Nothing in the user's",
        "folder is changed. The Python API raises `picklescope.PicklescopeError` (`UnknownNameError`",
        "for names, also a `KeyError`) with the same text. The catalogue lives in",
        "`tests/bad_input_cases.py`; `tests/test_bad_input.py` runs every case and checks each",
        "message for the named cause and fix. This page is written by",
        "`python tests/bad_input_cases.py` with the messages printed on the machine that ran it",
        "(sizes differ by machine).",
        "",
        f"{len(rows)} cases.",
        "",
        "| case | surface | input | message |",
        "|---|---|---|---|",
    ]
    for case, msg in rows:
        out.append(f"| `{case.id}` | {case.surface} | {cell(case.what)} | {cell(msg)} |")
    return "\n".join(out) + "\n"


def main() -> None:  # pragma: no cover - writes the docs page
    import tempfile

    rows = []
    for case in CASES:
        with tempfile.TemporaryDirectory(prefix="picklescope-badinput-") as d:
            tmp = Path(d)
            materialize(case, tmp)
            prepare_needs(case, tmp)
            code, text = run_case(case, tmp)
            msg = text.strip() if case.call is not None else error_line(text)
            msg = msg.replace(str(tmp), "<folder>")
            print(f"{case.id}: exit {code}: {msg}", file=sys.stderr)
            rows.append((case, msg))
    (ROOT / "docs" / "bad_input.md").write_text(markdown(rows))


if __name__ == "__main__":  # pragma: no cover
    main()
