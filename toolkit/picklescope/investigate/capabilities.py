"""The capability matrix: which codec can carry which kind of leaf, and the proof for each cell.

Each cell comes from the codec's own declarations (``Codec.unsupported``, one entry per feature of
``codecs.base.FEATURES``), never from a hand-written table, so the docs, ``picklescope capabilities``
and notebook 03 cannot drift from what the code refuses. Then every cell is checked on a tiny example
that has the feature, in this process, over both pickle transports:

- "yes" must be an exact round trip (bit for bit, and the sender's batch left untouched);
- "no" must be refused by the check with that feature named, and the underlying operation, run with
  the check skipped, must really fail (an exception or a silent mismatch); the failure it shows is
  the cell's evidence.

A cell that does not hold is reported (``consistent`` False), not hidden: a "yes" that corrupts data
or a "no" that would have worked is a bug in the codec's declarations.
"""

from __future__ import annotations

import warnings
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from picklescope.batch import Batch
from picklescope.codecs import CODECS, FEATURES, batch_features, get_codec
from picklescope.errors import UnsupportedCase
from picklescope.measure.inprocess import IN_PROCESS_TRANSPORTS, exact_problems, roundtrip, unchecked_outcome

_EVIDENCE_CHARS = 160


def builtin_codec_names() -> list[str]:
    """Codecs defined inside the ``picklescope.codecs`` package, in registry order.

    Codecs a notebook, a test or a plug-in registers, and real-verl codecs (which run verl in its own
    process), are left out: the docs and the property tests speak for the toolkit's own codecs.
    """
    names = []
    for name in CODECS:
        module = type(CODECS.get(name)).__module__
        if module.startswith("picklescope.codecs.") or module == "picklescope.codecs":
            names.append(name)
    return names


def _td(leaves: dict[str, Any], batch_size: Sequence[int]) -> Any:
    from tensordict import TensorDict

    return TensorDict(leaves, batch_size=list(batch_size))


def _objects(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = values
    return arr


def _nested(parts: list[torch.Tensor], layout: torch.layout) -> torch.Tensor:
    with warnings.catch_warnings():  # torch calls the strided layout a prototype; it is one of the cases
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor(parts, layout=layout)


def _example_tensors(feature: str, g: torch.Generator) -> Any:
    """The batch (TensorDict or None) of the smallest example with ``feature``."""
    r = lambda *shape: torch.randn(*shape, generator=g)  # noqa: E731
    dense: dict[str, Callable[[], torch.Tensor]] = {
        "dense": lambda: r(3, 2),
        "non-contiguous": lambda: r(2, 3).t(),
        "zero-size": lambda: torch.zeros(3, 0),
        "bfloat16": lambda: r(3, 2).to(torch.bfloat16),
        "fp8": lambda: r(3, 2).to(torch.float8_e4m3fn),
        "bool": lambda: r(3, 2) > 0,
        "complex": lambda: torch.complex(r(3, 2), r(3, 2)),
        "conj-view": lambda: torch.complex(r(3, 2), r(3, 2)).conj(),
        "jagged-nested": lambda: _nested([r(1, 2), r(3, 2), r(2, 2)], torch.jagged),
        "ambiguous-jagged": lambda: _nested([r(2, 2), r(2, 2), r(2, 2)], torch.jagged).transpose(1, 2),
        "strided-nested": lambda: _nested([r(1), r(3), r(2)], torch.strided),
    }
    if feature in dense:
        return _td({"x": dense[feature]()}, [3])
    if feature == "neg-view":  # .imag of a 0-dim conjugate view, unsqueezed: contiguous, stride 1, neg bit
        return _td({"x": torch.complex(r(()), r(())).conj().imag.unsqueeze(0)}, [1])
    if feature == "tiny-strided-view":  # the second column of a batch of one
        return _td({"x": r(1, 4)[:, 1]}, [1])
    if feature == "sub-tensordict":
        return _td({"sub": _td({"x": r(3, 2)}, [3])}, [3])
    if feature == "empty-tensordict":
        return _td({}, [3])
    if feature == "object-arrays":
        return _td({"x": r(3)}, [3])
    if feature == "batch-none":
        return None
    raise KeyError(feature)


def feature_example(feature: str) -> Batch:
    """A tiny deterministic batch whose leaves have ``feature`` (and otherwise only plain features)."""
    g = torch.Generator().manual_seed(zlib.crc32(feature.encode()))  # stable when features are added
    non_tensor: dict[str, np.ndarray] = {}
    if feature in ("object-arrays", "batch-none"):
        non_tensor = {"prompt": _objects(["a", "bb", "ccc"]),
                      "extra": _objects([{"k": [1, 2]}, None, ("t", 3.5)])}
    return Batch(_example_tensors(feature, g), non_tensor, {"step": 1, "nested": {"eos": [2, 3]}})


def has_example(feature: str) -> bool:
    try:
        feature_example(feature)
    except KeyError:
        return False
    return True


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _EVIDENCE_CHARS else text[: _EVIDENCE_CHARS - 3] + "..."


def _check_yes(example: Batch, codec: str) -> tuple[bool, str]:
    for transport in IN_PROCESS_TRANSPORTS:
        try:
            problems = exact_problems(example, codec, transport)
        except Exception as exc:  # noqa: BLE001 - a failing "yes" is the finding
            return False, _short(f"declared yes, but over {transport}: {type(exc).__name__}: {exc}")
        if problems:
            return False, _short(f"declared yes, but over {transport}: {problems[0]}")
    return True, "exact over " + ", ".join(IN_PROCESS_TRANSPORTS)


def _check_no(example: Batch, codec: str, feature: str) -> tuple[bool, str]:
    outcomes = []
    for transport in IN_PROCESS_TRANSPORTS:
        try:
            roundtrip(example, codec, transport)
        except UnsupportedCase as exc:
            if exc.feature != feature:
                return False, _short(f"refused for {exc.feature!r} instead (the example has another gap)")
        except Exception as exc:  # noqa: BLE001
            return False, _short(f"the check did not refuse it: {type(exc).__name__}: {exc}")
        else:
            return False, f"the check let it through over {transport}"
        outcomes.append(unchecked_outcome(example, codec, transport))
    if any(o is None for o in outcomes):
        return False, "declared no, but the round trip without the check is exact"
    return True, _short(outcomes[0] or "")


def capability_matrix(codecs: Sequence[str] | None = None, *, verify: bool = True) -> list[dict[str, Any]]:
    """One plain row per codec x feature: ``support`` is "yes" or "no: <reason>".

    ``codecs`` defaults to :func:`builtin_codec_names`. With ``verify`` each row also carries
    ``evidence`` (what the round trip on a tiny example of the feature showed) and ``consistent``
    (whether that agrees with the declaration); without it both are None. Runs in this process on
    tensors of a few bytes.
    """
    names = list(codecs) if codecs is not None else builtin_codec_names()
    rows: list[dict[str, Any]] = []
    for name in names:
        codec = get_codec(name)
        gaps = {u.feature: u.reason for u in codec.unsupported}
        for feature in FEATURES:
            row: dict[str, Any] = {
                "codec": name, "feature": feature,
                "support": f"no: {gaps[feature]}" if feature in gaps else "yes",
                "evidence": None, "consistent": None,
            }
            if verify:
                if not has_example(feature):
                    row["consistent"], row["evidence"] = False, "no example of this feature to check it on"
                else:
                    example = feature_example(feature)
                    check = _check_no(example, name, feature) if feature in gaps else _check_yes(example, name)
                    row["consistent"], row["evidence"] = check
            rows.append(row)
        unknown = sorted(set(gaps) - set(FEATURES))
        for feature in unknown:
            rows.append({"codec": name, "feature": feature, "support": f"no: {gaps[feature]}",
                         "evidence": "not a feature of codecs.base.FEATURES: no leaf is ever checked for it",
                         "consistent": False if verify else None})
    return rows


def example_features(feature: str) -> set[str]:
    """All features the example for ``feature`` has (it must have ``feature`` itself)."""
    feats: set[str] = set()
    for f in batch_features(feature_example(feature)).values():
        feats |= f
    return feats


def _grid(rows: list[dict[str, Any]]) -> tuple[list[str], list[str], dict[tuple[str, str], dict[str, Any]], list[str]]:
    codecs = list(dict.fromkeys(r["codec"] for r in rows))
    features = list(dict.fromkeys(r["feature"] for r in rows))
    cells = {(r["feature"], r["codec"]): r for r in rows}
    reasons = list(dict.fromkeys(r["support"][4:] for r in rows if r["support"].startswith("no")))
    return codecs, features, cells, reasons


def _cell(row: dict[str, Any] | None, reasons: list[str]) -> str:
    if row is None:
        return "-"
    text = "yes" if row["support"] == "yes" else f"no [{reasons.index(row['support'][4:]) + 1}]"
    return text + (" (!)" if row["consistent"] is False else "")


def render_text(rows: list[dict[str, Any]]) -> str:
    """The matrix as a fixed-width table with numbered reasons, for a terminal."""
    codecs, features, cells, reasons = _grid(rows)
    table = [["feature", *codecs]] + [[f, *(_cell(cells.get((f, c)), reasons) for c in codecs)] for f in features]
    widths = [max(len(line[i]) for line in table) for i in range(len(table[0]))]
    out = ["  ".join(v.ljust(w) for v, w in zip(line, widths)).rstrip() for line in table]
    out.append("")
    out += [f"[{i}] {reason}" for i, reason in enumerate(reasons, 1)]
    out.append("")
    out.append(_evidence_summary(rows))
    out += [f"  {codec} / {feature}: {text}" for codec, feature, text in _evidence(rows, consistent=True)]
    bad = _evidence(rows, consistent=False)
    if bad:
        out.append("INCONSISTENT cells, marked (!):")
        out += [f"  {codec} / {feature}: {text}" for codec, feature, text in bad]
    return "\n".join(out) + "\n"


def _evidence_summary(rows: list[dict[str, Any]]) -> str:
    if all(r["consistent"] is None for r in rows):
        return "Not verified (--no-verify): these are the declarations only."
    yes = sum(1 for r in rows if r["support"] == "yes" and r["consistent"])
    return (f"Checked in this process on a tiny example of each feature: {yes} 'yes' cells round-trip exactly over "
            f"{' and '.join(IN_PROCESS_TRANSPORTS)}; each 'no' cell is refused by the codec's check, and with the "
            "check skipped the operation really fails:")


def _evidence(rows: list[dict[str, Any]], *, consistent: bool) -> list[tuple[str, str, str]]:
    """(codec, feature, evidence) of the checked "no" cells (consistent) or of every failed cell."""
    if consistent:
        return [(r["codec"], r["feature"], r["evidence"]) for r in rows
                if r["consistent"] and r["support"] != "yes"]
    return [(r["codec"], r["feature"], r["evidence"]) for r in rows if r["consistent"] is False]


def _md(text: str) -> str:
    """A table cell: error messages may hold ``|``, which would split the cell."""
    return text.replace("|", "\\|")


def render_markdown(rows: list[dict[str, Any]]) -> str:
    """The matrix as the Markdown page ``docs/capabilities.md`` (a test keeps the file equal to this)."""
    codecs, features, cells, reasons = _grid(rows)
    out = [
        "# Capability matrix: which codec carries which leaf",
        "",
        "Generated by `picklescope capabilities --markdown > docs/capabilities.md` from the codecs' own",
        "declarations (`Codec.unsupported`) and checked cell by cell on a tiny example; do not edit by hand",
        "(`tests/test_capabilities.py` fails when this file and the generator disagree). A codec refuses a",
        "batch with a \"no\" leaf before any work starts, naming the leaf, the feature and the reason.",
        "",
        "| feature | what it is | " + " | ".join(f"`{c}`" for c in codecs) + " |",
        "|---|---|" + "---|" * len(codecs),
    ]
    for f in features:
        what = _md(FEATURES.get(f, "(not a declared feature)"))
        out.append(f"| {f} | {what} | " + " | ".join(_cell(cells.get((f, c)), reasons) for c in codecs) + " |")
    out += ["", "## Why not", ""]
    out += [f"{i}. {reason}" for i, reason in enumerate(reasons, 1)]
    out += ["", "## Evidence", "", _evidence_summary(rows)]
    for title, consistent in (("", True), ("Inconsistent cells, marked (!):", False)):
        found = _evidence(rows, consistent=consistent)
        if not found:
            continue
        if title:
            out += ["", title]
        out += ["", "| codec | feature | what happens without the check |", "|---|---|---|"]
        out += [f"| `{codec}` | {feature} | {_md(text)} |" for codec, feature, text in found]
    return "\n".join(out) + "\n"


def inconsistent(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose check disagreed with the declaration."""
    return [r for r in rows if r["consistent"] is False]
