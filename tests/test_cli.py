"""The command line: JSON results, listings, one-line errors with exit status 2.

These call the CLI's ``main()`` in the test process (its runs start from the session's warm
forkserver); ``python -m picklescope`` as a process of its own is exercised by the tests that need a
shell around it (tests/test_bad_input.py pipes its output into ``head``)."""

from __future__ import annotations

import json
import subprocess

import pytest

from picklescope.cli import main


@pytest.fixture
def cli(capsys):
    """``picklescope ARGS`` in-process: a CompletedProcess with the exit status and what it printed."""
    def call(*args: str) -> subprocess.CompletedProcess:
        capsys.readouterr()
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse ends on a usage error the way the command does
            code = exc.code if isinstance(exc.code, int) else 2
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(["picklescope", *args], code, out, err)

    return call


def test_run_json_has_the_documented_fields(cli):
    p = cli("run", "--codec", "numpy-legacy", "--transport", "pickle5-oob", "--workload", "tiny", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for key in ("codec", "transport", "workload", "payload_bytes", "outcome", "error", "blob_bytes",
                "serialize_s", "deserialize_s", "roundtrip", "sides"):
        assert key in d
    assert d["roundtrip"] == {"ok": True, "mismatches": []}
    for side in ("sender", "receiver"):
        s = d["sides"][side]
        for key in ("peak_bytes", "held_bytes", "cycle_held_bytes", "steps", "timeline"):
            assert key in s
        for st in s["steps"]:
            assert {"name", "start_s", "end_s", "peak_bytes", "added_bytes"} <= set(st)
        assert set(s["timeline"]) == {"t_s", "bytes"} and s["timeline"]["t_s"]
    assert "consolidate" in [st["name"] for st in d["sides"]["sender"]["steps"]]


def test_list_shows_everything(cli):
    out = cli("list").stdout
    for name in ("torch", "numpy-legacy", "numpy", "pickle5-oob", "flowgrpo", "seed-6400x20480", "mixed", "tiny"):
        assert name in out


@pytest.mark.parametrize(("args", "needle"), [
    (("run", "--codec", "zstd"), "unknown codec 'zstd': known codecs: torch, numpy-legacy, numpy"),
    (("run", "--transport", "fax"), "unknown transport 'fax'"),
    (("run", "--workload", "huge"), "unknown workload 'huge'"),
    (("run", "--scale", "0"), "scale 0.0 must be a positive number"),
    (("frobnicate",), "invalid choice"),
])
def test_errors_are_one_line_with_exit_2(cli, args, needle):
    p = cli(*args)
    assert p.returncode == 2
    assert needle in p.stderr
    assert "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1


def test_debug_shows_traceback(cli):
    p = cli("--debug", "run", "--codec", "zstd")
    assert p.returncode == 2 and "Traceback" in p.stderr


def test_the_command_table_names_every_command_module_with_its_own_help():
    """``picklescope --help`` lists commands from the table in :mod:`picklescope.cli` without importing them: the
    table names every module of cli/commands (``common`` holds shared helpers) and repeats each one's own help."""
    import argparse
    import pkgutil

    from picklescope import cli
    from picklescope.cli import commands

    modules = {m.name for m in pkgutil.iter_modules(commands.__path__)} - {"common"}
    assert set(cli.COMMANDS) == modules
    for name, help_text in cli.COMMANDS.items():
        parser = cli._Parser(prog="picklescope")
        sub = parser.add_subparsers(dest="command", parser_class=cli._Parser)
        cli.command_module(name).register(sub)
        (action,) = [a for a in sub._choices_actions if a.dest == name]
        assert action.help == help_text, name
    full = cli.build_parser()
    (choices,) = [a.choices for a in full._actions if isinstance(a, argparse._SubParsersAction)]
    assert list(choices) == list(cli.COMMANDS)


def test_help_imports_no_command_module_and_a_command_imports_only_its_own():
    code = ("import sys, contextlib, io; from picklescope.cli import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n"
            "        code = main(sys.argv[1:])\n"
            "    except SystemExit as exc:\n"
            "        code = exc.code\n"
            "print(code, sorted(m.rsplit('.', 1)[1] for m in sys.modules\n"
            "                   if m.startswith('picklescope.cli.commands.')))")
    import sys

    out = subprocess.run([sys.executable, "-c", code, "--help"], capture_output=True, text=True, timeout=600)
    assert out.stdout.strip() == "0 []", out.stdout[-2000:] + out.stderr[-2000:]
    out = subprocess.run([sys.executable, "-c", code, "notebooks", "--help"], capture_output=True, text=True,
                         timeout=600)
    assert out.stdout.strip() == "0 ['notebooks']", out.stdout[-2000:] + out.stderr[-2000:]
