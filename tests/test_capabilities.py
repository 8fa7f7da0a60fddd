"""The capability matrix: generated from the declarations, every cell checked, the docs page current."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from picklescope import batch as batch_mod
from picklescope.batch import set_active_codec
from picklescope.cli import main as cli
from picklescope.codecs import CODECS, FEATURES, get_codec
from picklescope.codecs.base import Unsupported
from picklescope.investigate.capabilities import (
    builtin_codec_names,
    capability_matrix,
    example_features,
    feature_example,
    inconsistent,
    render_markdown,
    render_text,
)
from picklescope.measure.inprocess import roundtrip

DOCS = Path(__file__).resolve().parents[1] / "docs" / "capabilities.md"


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    return capability_matrix()


def test_builtins_are_the_codecs_package_own() -> None:
    names = builtin_codec_names()
    assert names[:3] == ["torch", "numpy-legacy", "numpy"]
    assert all(type(CODECS.get(n)).__module__.startswith("picklescope.codecs.") for n in names)


def test_one_row_per_codec_and_feature_taken_from_the_declarations(rows) -> None:
    assert len(rows) == len(builtin_codec_names()) * len(FEATURES)
    for r in rows:
        gaps = {u.feature: u.reason for u in get_codec(r["codec"]).unsupported}
        assert r["support"] == (f"no: {gaps[r['feature']]}" if r["feature"] in gaps else "yes")


def test_every_cell_holds_on_its_example(rows) -> None:
    assert inconsistent(rows) == []
    for r in rows:
        if r["support"] == "yes":
            assert r["evidence"].startswith("exact over pickle")
        else:  # the real error (or silent difference) the check prevents
            assert r["evidence"] and not r["evidence"].startswith("declared")


def test_each_example_shows_its_feature_and_nothing_else_unsupported() -> None:
    for feature in FEATURES:
        feats = example_features(feature)
        assert feature in feats, feature
        for name in builtin_codec_names():  # so a failure of the example is the feature's own
            codec = get_codec(name)
            assert all(codec.supports(f) for f in feats - {feature}), (name, feature, feats)


def test_docs_page_is_what_the_generator_prints(rows) -> None:
    assert DOCS.read_text() == render_markdown(rows), (
        "docs/capabilities.md is stale: regenerate it with 'picklescope capabilities --markdown > "
        "docs/capabilities.md'")


def test_cli_table_markdown_and_json(capsys) -> None:
    assert cli(["capabilities", "--markdown"]) == 0
    assert capsys.readouterr().out == DOCS.read_text()
    assert cli(["capabilities", "--no-verify", "--codec", "torch"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["feature", "torch"]
    assert "fp8" in out and "consolidate() has no entry for float8" in out and "Not verified" in out
    assert cli(["capabilities", "--no-verify", "--json", "--codec", "numpy"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert {r["feature"] for r in data} == set(FEATURES)
    assert all(r["consistent"] is None for r in data)


def test_cli_unknown_codec_lists_the_known_ones(capsys) -> None:
    assert cli(["capabilities", "--codec", "no-such-codec"]) == 2
    err = capsys.readouterr().err
    assert "unknown codec 'no-such-codec'" in err and "numpy-legacy" in err


def test_a_wrong_declaration_shows_up_as_an_inconsistent_cell(monkeypatch, capsys) -> None:
    codec = get_codec("numpy")
    wrong = tuple(u for u in codec.unsupported if u.feature != "sub-tensordict") + (
        Unsupported("bool", "invented for the test"),)
    monkeypatch.setattr(codec, "unsupported", wrong)  # instance attribute; restored after the test
    bad = {r["feature"]: r["evidence"] for r in inconsistent(capability_matrix(["numpy"]))}
    assert set(bad) == {"bool", "sub-tensordict"}
    assert "without the check is exact" in bad["bool"]
    assert bad["sub-tensordict"].startswith("declared yes, but") and "is_nested" in bad["sub-tensordict"]
    assert cli(["capabilities", "--codec", "numpy"]) == 1
    captured = capsys.readouterr()
    assert "(!)" in captured.out and "INCONSISTENT" in captured.out and "disagree" in captured.err
    assert "(!)" in render_text(capability_matrix(["numpy"]))


def test_roundtrip_restores_the_process_codec() -> None:
    set_active_codec("numpy")
    try:
        roundtrip(feature_example("dense"), "torch", "pickle")
        assert batch_mod._active == "numpy"
    finally:
        set_active_codec(None)


def test_new_declared_gaps_are_real_failures_of_the_underlying_operation() -> None:
    """The operations verl runs (flatten + contiguous + byte view, consolidate, as_nested_tensor) fail."""
    from tensordict import TensorDict

    def byte_view(t: torch.Tensor) -> torch.Tensor:  # numpy mode's sender, per leaf or component
        return t.flatten().contiguous().view(torch.uint8)

    column = torch.randn(1, 4)[:, 1]  # batch of one, second column: contiguous to torch, stride 4
    assert column.is_contiguous() and column.stride() == (4,)
    with pytest.raises(RuntimeError, match="stride"):
        byte_view(column)
    conj = torch.randn(2, dtype=torch.complex64).conj()
    with pytest.raises(RuntimeError, match="conjugate"):
        byte_view(conj)
    with pytest.raises(RuntimeError, match="conjugate"):
        TensorDict({"c": conj}, batch_size=[2]).contiguous().consolidate()
    neg = torch.randn((), dtype=torch.complex64).conj().imag.unsqueeze(0)
    with pytest.raises(RuntimeError, match="negative"):
        byte_view(neg)
    TensorDict({"n": neg}, batch_size=[1]).contiguous().consolidate()  # torch mode copes: declared yes
    with_empty = torch.nested.nested_tensor([torch.zeros(0, 2), torch.ones(2, 2)], layout=torch.jagged)
    with pytest.raises(ValueError):
        torch.frombuffer(bytearray(byte_view(with_empty.unbind()[0]).numpy()), dtype=torch.uint8)
    transposed = torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(2, 3)], layout=torch.jagged)
    transposed = transposed.transpose(1, 2)
    rebuilt = torch.nested.as_nested_tensor(list(transposed.unbind()), layout=torch.jagged)
    assert [c.shape for c in rebuilt.unbind()] == [c.shape for c in transposed.unbind()]
    assert not isinstance(rebuilt.shape[1], int) and isinstance(transposed.shape[1], int)  # ragged dim moved


REPLICA_OF = {"verl-0.9.1:numpy": "numpy", "verl-0.9.1:torch": "torch",
              "verl-0.9.0:numpy": "numpy-legacy", "verl-0.9.0:torch": "torch"}


@pytest.mark.parametrize("version", ["0.9.1", "0.9.0"])
def test_replica_declarations_match_what_real_verl_fails_on(version, verl_envs) -> None:
    """Real verl declares nothing; its failed cells must be exactly the replica's "no" cells."""
    codecs = [f"verl-{version}:numpy", f"verl-{version}:torch"]
    assert all(c in CODECS for c in codecs), (codecs, CODECS.names())
    args = [a for c in codecs for a in ("--codec", c)]
    # one verl per process: a child, so this process never imports verl
    proc = subprocess.run([sys.executable, "-m", "picklescope", "capabilities", "--json", *args],
                          capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert proc.returncode in (0, 1), proc.stderr
    real = json.loads(proc.stdout)
    for codec in codecs:
        failed = {r["feature"] for r in real if r["codec"] == codec and r["consistent"] is False}
        declared = {u.feature for u in get_codec(REPLICA_OF[codec]).unsupported}
        assert failed == declared, (codec, failed ^ declared)
