"""Every path of an isolated run ends with a verdict and leaves nothing behind."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

import picklescope as ps

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from own_processes import measured_processes  # noqa: E402

PLUGIN = textwrap.dedent('''
    import os, time
    from picklescope.codecs import Codec, register_codec, get_codec, CODECS

    class Sleepy(Codec):
        name = "test-sleepy"
        def encode(self, b):
            time.sleep(120)
        def decode(self, b, state):
            pass

    class Crashy(Codec):
        name = "test-crashy"
        def encode(self, b):
            os._exit(3)
        def decode(self, b, state):
            pass

    class Plain(Codec):
        name = "test-plain"
        def encode(self, b):
            return get_codec("numpy").encode(b)
        def decode(self, b, state):
            get_codec("numpy").decode(b, state)

    for cls in (Sleepy, Crashy, Plain):
        if cls.name not in CODECS:
            register_codec(cls())
''')


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    path = tmp_path_factory.mktemp("plugin") / "test_codecs_plugin.py"
    path.write_text(PLUGIN)
    return str(path)


def assert_nothing_left(*results):
    assert measured_processes() == []
    for r in results:
        assert not os.path.exists(r.run_dir)


def test_plugin_codec_runs_in_both_children(plugin):
    r = ps.run("test-plain", "pickle5-oob", "tiny", 1.0, plugins=[plugin])
    assert r.outcome == "ok" and r.roundtrip["ok"]
    assert_nothing_left(r)


def test_hung_child_ends_with_timeout_verdict(plugin):
    r = ps.run("test-sleepy", "pickle", "tiny", 1.0, plugins=[plugin], timeout_s=5)
    assert r.outcome == "timeout"
    assert "wall-clock limit" in r.error
    assert r.sender.baseline_bytes is not None  # the timeline up to the limit is kept
    assert r.sender.timeline.t_s
    assert_nothing_left(r)


def test_child_that_dies_is_reported_with_its_exit_code(plugin):
    r = ps.run("test-crashy", "pickle", "tiny", 1.0, plugins=[plugin])
    assert r.outcome == "error"
    assert "exit code 3" in r.error
    assert_nothing_left(r)


def test_plugin_syntax_error_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("x = 1\ndef broken(:\n")
    with pytest.raises(ps.PicklescopeError) as e:
        ps.run("numpy", "pickle", "tiny", plugins=[str(bad)])
    assert "bad.py" in str(e.value) and "line 2" in str(e.value)


def test_ok_and_error_paths_leave_nothing():
    results = [ps.run("numpy", "pickle5-oob", "tiny", 1.0), ps.run("torch", "pickle5-oob", "mixed", 1.0)]
    assert_nothing_left(*results)
