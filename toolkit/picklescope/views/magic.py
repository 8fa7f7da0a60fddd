"""IPython magics: measure a cell in an isolated child, step through a ``__getstate__``, try a codec.

``%load_ext picklescope`` registers:

- ``%%picklescope [--budget 300MiB] [--tracer T] [--push a,b] [--timeout S] [--result NAME]``: run the
  cell's code in a child from the warm forkserver (see :mod:`picklescope.measure.cellrun`), after re-running
  the kernel's import statements there, and show its timeline and exact peak. Beyond the budget the
  child is SIGKILLed like the OOM killer would, the magic reports ``oom-killed``, and the kernel keeps
  going. Imports cross over, and the variables named by ``--push`` (pickled, before the baseline);
  the cell builds its own data otherwise, because the point is to measure it.
- ``%picklescope_stepthrough EXPR`` (e.g. ``codec.getstate`` or ``Batch.__getstate__``): the
  per-line table of that function, run in a measured child.
- ``%%picklescope_codec``: the cell defines a :class:`~picklescope.codecs.Codec` subclass (a candidate
  ``__getstate__``); it is registered in the kernel and saved as a plugin file so the sender and
  receiver children of later runs load it too.
"""

from __future__ import annotations

import ast
import hashlib
import html
import os
import re
import tempfile
from types import ModuleType
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from picklescope.codecs import Codec
from picklescope.core.plugins import load_plugin
from picklescope.core.result import RunResult
from picklescope.core.units import fmt_bytes, parse_size
from picklescope.errors import PicklescopeError
from picklescope.measure import verdicts
from picklescope.measure.cellrun import SIDE, run_cell
from picklescope.tracers import report_lines
from picklescope.views.figures import timeline_figure
from picklescope.views.offline_html import use_offline_renderer
from picklescope.views.stepper import stepthrough_target

_SKIP_NAMES = {"In", "Out", "exit", "quit", "get_ipython"}


def _imports_in(source: str) -> list[str]:
    """Top-level ``import`` statements of one cell (absolute only; ``__future__`` is per compile)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    out = []
    for node in tree.body:
        if isinstance(node, ast.Import) or (
            isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__"
        ):
            out.append(ast.unparse(node))
    return out


def kernel_imports(shell: Any) -> list[str]:
    """The kernel's import statements, in the order they ran, for the child to run again.

    Taken from the cells the user ran (so aliases and ``from x import y`` survive), then any module
    bound in the namespace that those did not cover (imported by ``%run`` or ``exec``).
    """
    stmts: list[str] = []
    history = getattr(shell.history_manager, "input_hist_raw", None) or shell.user_ns.get("In", [])
    for raw in history[1:]:
        try:
            source = shell.transform_cell(raw)
        except Exception:  # noqa: BLE001 - a cell IPython cannot transform has no imports for us
            continue
        stmts.extend(_imports_in(source))
    bound: set[str] = set()
    for stmt in stmts:
        node = ast.parse(stmt).body[0]
        for alias in node.names:  # type: ignore[attr-defined]
            bound.add(alias.asname or alias.name.split(".")[0])
    for name, value in list(shell.user_ns.items()):
        if isinstance(value, ModuleType) and not name.startswith("_") and name not in _SKIP_NAMES | bound:
            mod = value.__name__
            stmts.append(f"import {mod}" if mod == name else f"import {mod} as {name}")
            bound.add(name)
    return list(dict.fromkeys(s for s in stmts if "picklescope.views.magic" not in s))


CELL_FILE_RE = re.compile(r'File "[^"]*picklescope_cell\.py", line (\d+)')


def cell_line(n: int | None, offset: int = 1) -> int | None:
    """A line of the code the child ran, numbered as in the cell the user sees: the ``%%picklescope``
    line is line 1 of that cell, so the child's line 1 is the cell's line 2 (``offset``)."""
    return None if n is None else n + offset


def renumber(text: str, offset: int = 1) -> str:
    """A traceback or stack from the child with its cell frames named and numbered as the user sees them."""
    return CELL_FILE_RE.sub(lambda m: f'File "this cell", line {int(m.group(1)) + offset}', text or "")


def _source_line(cell: str | None, n: int | None) -> str:
    """The text of line ``n`` (as the user sees the cell, magic line included) of ``cell``."""
    if not cell or n is None:
        return ""
    lines = cell.splitlines()
    return lines[n - 1].strip() if 0 < n <= len(lines) else ""


def summary_html(r: RunResult, cell: str | None = None, offset: int = 1) -> str:
    """One block: how the cell ended, at which line of the cell, its exact peak, what it still held
    (and why), what it printed, and the stack or traceback folded; the kernel is said to be alive.

    ``cell`` is the cell as the user sees it (with the ``%%picklescope`` line), for quoting a line.
    """
    side = r.processes[SIDE]
    peak = fmt_bytes(side.peak_bytes)
    budget = f" (budget {fmt_bytes(side.budget_bytes)})" if side.budget_bytes else ""
    e = html.escape
    if r.outcome == "oom-killed":
        n = cell_line(r.killed_at_line, offset)
        src = _source_line(cell, n)
        where = (f" while running line {n} of this cell" + (f": <code>{e(src)}</code>" if src else "")) if n else ""
        text = (f"<b>killed: out of memory</b>{budget}. The cell's process reached "
                f"{fmt_bytes(r.memory_at_death_bytes)} above its start and was killed{where}. "
                f"This kernel (pid {os.getpid()}) is still running; nothing it holds was touched.")
    elif r.outcome == "ok":
        held, cyc = side.held_bytes, side.cycle_held_bytes
        text = (f"<b>finished</b>{budget} in {r.wall_s or 0:.2f} s. Its memory peaked at {peak} above its start "
                f"(exact, from the kernel).")
        if held is not None:
            rest = held - (cyc or 0)
            text += (f" At its end it still held {fmt_bytes(held)}: {fmt_bytes(cyc)} of that was freed only by "
                     f"<code>gc.collect()</code> (objects kept alive by reference cycles, such as the buffers of "
                     f"<code>consolidate()</code>), and the other {fmt_bytes(rest)} was still in use after the "
                     f"collection (the cell's own variables, modules it imported, and memory the C allocator "
                     f"keeps for reuse).")
    else:
        what = verdicts.verdict(r).ended
        tb = renumber(r.traceback or "", offset)
        lines = [int(m) for m in re.findall(r'File "this cell", line (\d+)', tb)]
        where = f" at line {lines[-1]} of this cell" if lines else ""
        text = f"<b>{e(what)}</b>{budget}{where}: {e(r.error or '')}. Its memory peaked at {peak} above its start."
    parts = [f"<p>{text}</p>"]
    notes = report_lines(r) if r.tracer != "sampler" else []
    if notes:
        parts.append("<p>" + "<br>".join(e(n) for n in notes) + "</p>")
    errors = r.import_errors or []
    if errors:
        parts.append("<p>Kernel imports that failed in the cell's process: " + e("; ".join(errors)) + "</p>")
    printed = "".join(text for _stream, text in r.output)
    if printed:
        parts.append(f"<details open><summary>what the cell printed</summary><pre>{e(printed)}</pre></details>")
    if r.stack_at_death:
        parts.append("<details><summary>Python stack when it was killed (click to open)</summary>"
                     f"<pre>{e(renumber(r.stack_at_death, offset))}</pre></details>")
    if r.traceback and r.outcome in ("error", "memory-error"):
        parts.append("<details><summary>traceback (click to open)</summary>"
                     f"<pre>{e(renumber(r.traceback, offset))}</pre></details>")
    return f"<div class='picklescope-cell'>{''.join(parts)}</div>"


def show_result(r: RunResult, cell: str | None = None) -> None:
    """The verdict as one rich block (the child's output, stack and traceback folded inside it, so
    nothing lands on stderr as if the kernel had crashed), then the timeline."""
    text = summary_html(r, cell)
    plain = re.sub(r"<[^>]+>", "", text.replace("<br>", "\n").replace("</p>", "\n").replace("</summary>", "\n"))
    display({"text/html": text, "text/plain": html.unescape(plain).strip()}, raw=True)
    display(timeline_figure(r))


_REGISTER_FOOTER = """

# added by %%picklescope_codec: register every codec class this cell defines, in whichever process
# loads this file (the kernel, and each sender and receiver child)
def _picklescope_register_cell_codecs():
    from picklescope.codecs import Codec, register_codec

    for value in list(globals().values()):
        if isinstance(value, type) and issubclass(value, Codec) and value.__module__ == __name__ and value.name:
            register_codec(value(), replace=True)


_picklescope_register_cell_codecs()
"""


def write_codec_plugin(source: str) -> str:
    """Save a cell's codec source as a plugin file every child can load (named by its content)."""
    text = source + _REGISTER_FOOTER
    folder = os.path.join(tempfile.gettempdir(), f"picklescope-codecs-{os.getuid()}")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"cell_{hashlib.sha1(text.encode()).hexdigest()[:16]}.py")
    if not os.path.exists(path):
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return path


@magics_class
class PicklescopeMagics(Magics):
    """The magics registered by ``%load_ext picklescope``."""

    @magic_arguments()
    @argument("--budget", default=None, help="kill the cell's process above this much memory (e.g. 300MiB)")
    @argument("--tracer", default="sampler", help="tracer (default: the always-on sampler)")
    @argument("--timeout", type=float, default=600.0, help="wall-clock limit in seconds")
    @argument("--result", default="picklescope_result", help="variable that receives the RunResult")
    @argument("--push", default="", help="comma-separated kernel variables to copy into the child (pickled)")
    @cell_magic
    def picklescope(self, line: str, cell: str) -> None:
        """Run this cell in an isolated, measured child process (the kernel's imports come along)."""
        args = parse_argstring(self.picklescope, line)
        budget = None
        if args.budget:
            try:
                size = parse_size(args.budget, "budget")
            except PicklescopeError as exc:
                raise UsageError(str(exc)) from None
            if size.multiple is not None:
                raise UsageError("a cell has no payload: give the budget in bytes, e.g. --budget 300MiB")
            budget = size.bytes
        code = self.shell.transform_cell(cell)
        if "get_ipython()" in code:
            raise UsageError("IPython magics and shell commands cannot run inside a %%picklescope cell: "
                             "the child is a plain Python process")
        pushed = {}
        for name in filter(None, (n.strip() for n in args.push.split(","))):
            if name not in self.shell.user_ns:
                raise UsageError(f"--push {name}: no such variable in the kernel")
            pushed[name] = self.shell.user_ns[name]
        try:
            result = run_cell(code, imports=kernel_imports(self.shell), variables=pushed, budget_bytes=budget,
                              tracer=args.tracer, timeout_s=args.timeout)
        except PicklescopeError as exc:
            raise UsageError(str(exc)) from None
        self.shell.user_ns[args.result] = result
        show_result(result, f"%%picklescope {line}".rstrip() + "\n" + cell)

    @magic_arguments()
    @argument("--workload", default="flowgrpo", help="the batch to build in the child (default flowgrpo)")
    @argument("--scale", type=float, default=0.1, help="fraction of the batch dimension (default 0.1)")
    @argument("--transport", default="pickle5-oob", help="how the state reaches a __setstate__")
    @argument("--result", default="picklescope_stepthrough_result", help="variable that receives the rows")
    @argument("target", nargs="+", help="expression naming the function, e.g. codec.getstate or Batch.__getstate__")
    @line_magic
    def picklescope_stepthrough(self, line: str) -> None:
        """Per-line table of a ``__getstate__``/``__setstate__`` (an expression naming the function)."""
        args = parse_argstring(self.picklescope_stepthrough, line)
        expr = " ".join(args.target)
        try:
            target = eval(expr, self.shell.user_ns)  # noqa: S307 - the user's own expression, in their kernel
        except Exception as exc:  # noqa: BLE001
            raise UsageError(f"cannot evaluate {expr!r}: {type(exc).__name__}: {exc}") from None

        plugins = self.shell.user_ns.get("picklescope_plugins") or None
        try:
            st = stepthrough_target(target, workload=args.workload, scale=args.scale, transport=args.transport,
                                    plugins=plugins)
        except PicklescopeError as exc:
            raise UsageError(str(exc)) from None
        self.shell.user_ns[args.result] = st

    @cell_magic
    def picklescope_codec(self, line: str, cell: str) -> None:
        """Define a candidate codec in this cell; it is registered here and in every later run's children."""
        path = write_codec_plugin(self.shell.transform_cell(cell))
        try:
            module = load_plugin(path)
        except PicklescopeError as exc:
            raise UsageError(str(exc)) from None
        defined = [v for v in vars(module).values()
                   if isinstance(v, type) and issubclass(v, Codec) and v.__module__ == module.__name__ and v.name]
        if not defined:
            raise UsageError("the cell defines no Codec subclass with a name (class C(Codec): name = '...')")
        for cls in defined:
            self.shell.user_ns[cls.__name__] = cls
        plugins = self.shell.user_ns.setdefault("picklescope_plugins", [])
        if path not in plugins:
            plugins.append(path)
        names = ", ".join(cls.name for cls in defined)
        text = (f"registered codec {names}: runs load it in their sender and receiver when given "
                "plugins=picklescope_plugins")
        display({"text/html": f"<p>{html.escape(text)}</p>", "text/plain": text}, raw=True)


def load_ipython_extension(ipython: Any) -> None:
    """Called by ``%load_ext picklescope``: the magics, and figures that survive HTML export."""
    ipython.register_magics(PicklescopeMagics)
    use_offline_renderer()
