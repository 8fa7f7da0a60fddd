"""Random and mutated workload files fed to the parser: only ever a PicklescopeError, never a traceback,
and never more than 200 MiB of growth in the parsing process.

Two kinds of input: workloads built from random structure (valid fields with random values, wrong
types, control characters, huge numbers, nesting) and dumped as YAML; and the real presets in
``data/workloads/`` with their bytes mutated (flips, inserted YAML features such as anchors, aliases and
tags, invalid UTF-8, NUL bytes, truncation, duplicated lines). Each input is written to a file and
loaded through :func:`picklescope.workloads.spec.load_workload` (the same path as ``--workload FILE``),
then its payload is predicted at two scales, since that is where sizes are computed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picklescope.errors import PicklescopeError
from picklescope.workloads.spec import WORKLOAD_DIR, load_workload

PRESETS = sorted(p.read_bytes() for p in WORKLOAD_DIR.glob("*.yaml"))
LIMIT = 200 * 1024**2
HAS_CLEAR_REFS = os.path.exists("/proc/self/clear_refs")

_text = st.text(alphabet=st.characters(codec="utf-8"), max_size=40)
_scalar = st.one_of(st.integers(min_value=-(2**70), max_value=2**70), st.floats(allow_nan=True), st.booleans(),
                    st.none(), _text, st.sampled_from(["N", "J", "float32", "int8", "bool", "jagged-nested",
                                                       "strided-nested", "non-contiguous", "strings", "dicts"]))
_value = st.recursive(_scalar, lambda inner: st.one_of(st.lists(inner, max_size=5),
                                                       st.dictionaries(_text, inner, max_size=5)), max_leaves=20)
_dim = st.one_of(st.just("N"), st.just("J"), st.integers(min_value=-2, max_value=2**45), _value)
_tensor = st.fixed_dictionaries(
    {"shape": st.one_of(st.lists(_dim, min_size=0, max_size=20), st.lists(st.sampled_from(["N", 1, 4, "J"]),
                                                                          max_size=4), _value)},
    optional={"dtype": st.one_of(st.sampled_from(["float32", "bfloat16", "int8", "uint8", "int64", "bool",
                                                  "float8_e4m3fn", "complex64"]), _value),
              "kind": st.one_of(st.sampled_from(["dense", "jagged-nested", "strided-nested", "non-contiguous"]),
                                _value),
              "high": st.one_of(st.integers(min_value=-5, max_value=2**70), _value),
              "min_len": st.one_of(st.integers(min_value=-5, max_value=2**40), _value),
              "max_len": st.one_of(st.integers(min_value=-5, max_value=2**40), _value),
              "colour": _value})
_workload = st.fixed_dictionaries(
    {},
    optional={"name": st.one_of(_text, _value), "description": st.one_of(_text, _value),
              "batch_size": st.one_of(st.integers(min_value=-3, max_value=2**64), _value),
              "seed": st.one_of(st.integers(min_value=-(2**40), max_value=2**70), _value),
              "tensors": st.one_of(st.dictionaries(_text, st.one_of(_tensor, _value), max_size=4), _value),
              "non_tensor": st.one_of(st.dictionaries(_text, st.fixed_dictionaries(
                  {"kind": st.one_of(st.sampled_from(["strings", "dicts", "ints"]), _value)},
                  optional={"length": st.one_of(st.integers(min_value=-3, max_value=2**40), _value)}), max_size=3),
                  _value),
              "meta_info": _value, "extra": _value})

_SNIPPETS = [b"&a ", b"*a", b"!!python/object/apply:os.system ['true'] ", b"!!str ", b"!x ", b"<<: *a\n", b"\x00",
             b"\xe9", b"\xff\xfe", b"\x1b[31m", b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[", b"{", b"}", b"? [a]\n: b\n",
             b"batch_size: 99999999999999999999999999\n", b"1e30", b".inf", b"-", b"\n  ", b"\t", b"'", b'"', b"#",
             b"---\n", b"...\n", b"%YAML 1.1\n", b"\xef\xbb\xbf", b"\\u202e"]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(draw(st.sampled_from(PRESETS)))
    for _ in range(draw(st.integers(min_value=1, max_value=6))):
        how = draw(st.sampled_from(["flip", "insert", "delete", "truncate", "duplicate"]))
        at = draw(st.integers(min_value=0, max_value=max(0, len(data) - 1)))
        if how == "flip" and data:
            data[at] = draw(st.integers(min_value=0, max_value=255))
        elif how == "insert":
            data[at:at] = draw(st.one_of(st.sampled_from(_SNIPPETS), st.binary(max_size=8)))
        elif how == "delete":
            del data[at:at + draw(st.integers(min_value=1, max_value=20))]
        elif how == "truncate":
            del data[at:]
        else:
            end = data.find(b"\n", at)
            start = data.rfind(b"\n", 0, at) + 1
            if end > 0:
                data[end + 1:end + 1] = data[start:end + 1]
    return bytes(data)


def _dumped(w: dict) -> bytes:
    try:
        return yaml.safe_dump(w, allow_unicode=True).encode("utf-8", "surrogatepass")
    except (yaml.YAMLError, UnicodeEncodeError, ValueError):
        return repr(w).encode("utf-8", "surrogatepass")


def _status(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _check(data: bytes, folder: Path) -> None:
    path = folder / "w.yaml"
    path.write_bytes(data)
    if HAS_CLEAR_REFS:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start = _status("VmRSS")
    try:
        w = load_workload(str(path))
        for scale in (1.0, 0.25):
            assert isinstance(w.payload_bytes(scale), int)
    except PicklescopeError as exc:
        assert "\n" not in str(exc) and str(exc)
    if HAS_CLEAR_REFS:
        growth = _status("VmHWM") - start
        assert growth < LIMIT, f"parsing grew the process by {growth / 1024**2:.1f} MiB: {data[:200]!r}"


FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                       HealthCheck.data_too_large])


@FUZZ
@given(w=_workload)
def test_random_structure_never_escapes_as_a_traceback(w, tmp_path):
    _check(_dumped(w), tmp_path)


@FUZZ
@given(data=mutated())
def test_mutated_presets_never_escape_as_a_traceback(data, tmp_path):
    _check(data, tmp_path)


@pytest.mark.parametrize("data", [
    b"a: &a [1]\n" + b"".join(b"b%d: &b%d [*a, *a]\n" % (i, i) for i in range(3)),
    b"name: w\nbatch_size: 8\nmeta_info: " + b"[" * 5000 + b"]" * 5000 + b"\n",
    b"name: w\nbatch_size: 8\nmeta_info: {" + b"a: {" * 3000 + b"}" * 3001 + b"\n",
], ids=["anchors", "deep-lists", "deep-maps"])
def test_known_hard_inputs(data, tmp_path):
    """Inputs a random search rarely builds: anchors, and nesting deep enough to exhaust a recursive parser."""
    _check(data, tmp_path)
