"""Property-based round trips: every generated batch is exact, or is one of the codec's declared gaps.

Hypothesis builds random small batches (every dtype of ``CORE_DTYPES`` below, fp8 included; 0-dim, 0-size and
one-element shapes; transposed, stepped, offset, expanded, column and lazy conj/neg views; jagged
nested tensors built four ways and strided ones; sub-TensorDicts; None and empty batches; object
arrays and nested meta_info) and sends each through every built-in codec and both in-process pickle
transports. Three outcomes only:

- no declared gap in the batch: the round trip is bit-exact and the sender's batch is unchanged;
- a declared gap: the codec refuses with ``UnsupportedCase`` naming a leaf that has it, the feature
  and the declared reason, and the operation run with the check skipped really fails (so the
  declaration is not invented); the rest of the batch, without the entries holding gaps, is exact;
- anything else (an exception, a silent difference) fails the test: a codec bug.

Seeded (``derandomize``) and deterministic; the number of examples, the features and dtypes they
covered and the features shown exact are asserted, so a weakened strategy cannot pass quietly.
"""

from __future__ import annotations

import random
import warnings
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picklescope.batch import Batch
from picklescope.codecs import FEATURES, batch_features, get_codec
from picklescope.codecs.base import FP8_DTYPES, iter_leaves
from picklescope.errors import UnsupportedCase
from picklescope.investigate.capabilities import builtin_codec_names
from picklescope.measure.inprocess import IN_PROCESS_TRANSPORTS, exact_problems, roundtrip, unchecked_outcome

EXAMPLES_PER_CODEC = 200  # at least; the strata add up to a few more

CORE_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int16, torch.int32,
               torch.int64, torch.uint8, torch.bool, torch.complex64)
DTYPES = CORE_DTYPES + FP8_DTYPES


def picks(options: Any) -> st.SearchStrategy[Any]:
    """One of ``options`` with even odds.

    ``sampled_from`` leans hard on its first options and on choices it made before (over 300
    examples it drew float32 ten times as often as uint8, and some fp8 formats never), and so does a
    small integer. A drawn integer seeds a private RNG instead, which spreads categorical choices
    evenly (still seeded, still deterministic), while sizes keep Hypothesis's bias to the edges.
    """
    options = tuple(options)
    return st.integers(0, 2**32 - 1).map(lambda i: options[random.Random(i).randrange(len(options))])


# fp8 is one choice among the dtypes, then one of torch's fp8 formats: five fp8 slots would put a
# gap of the torch codecs into most batches and leave little to check exactly
DTYPE_CHOICES = picks((*CORE_DTYPES, "fp8")).flatmap(lambda d: picks(FP8_DTYPES) if d == "fp8" else st.just(d))
VIEWS = ("plain", "transpose", "step", "offset", "expand", "column", "conj", "imag-of-conj")
JAGGED_BUILDS = ("list", "transpose", "from-jagged-view", "transpose", "narrow")
KEYS = ("a", "b", "c", "d")
# sizes shrink towards 1, and 0 comes one time in seven: a zero-size leaf is a declared gap of the
# numpy codecs and hides every other leaf of its batch from the exact check
SIZES = st.sampled_from((1, 2, 3, 1, 2, 3, 0))


def _values(dtype: torch.dtype, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random bit patterns (NaN payloads, -0.0, subnormals included): only bit-exact counts."""
    n = int(np.prod(shape, dtype=np.int64))
    if n == 0:
        return torch.zeros(shape, dtype=dtype)
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g, dtype=torch.uint8).bool()
    raw = torch.randint(0, 256, (n * dtype.itemsize,), generator=g, dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def _dense(dtype: torch.dtype, shape: tuple[int, ...], view: str, seed: int, axis: int) -> torch.Tensor:
    """A tensor of exactly ``shape`` and ``dtype``, made as the kind of view ``view`` names."""
    nd = len(shape)
    if view == "transpose" and nd >= 2:
        i, j = sorted((axis % nd, (axis + 1) % nd))
        base = list(shape)
        base[i], base[j] = base[j], base[i]
        return _values(dtype, tuple(base), seed).transpose(i, j)
    if view == "step" and nd >= 1:
        d = axis % nd
        base = list(shape)
        base[d] *= 2
        return _values(dtype, tuple(base), seed)[(slice(None),) * d + (slice(None, None, 2),)]
    if view == "offset":  # a window into a larger storage, still contiguous
        return _values(dtype, (3 + int(np.prod(shape, dtype=np.int64)),), seed)[1:-2].view(shape)
    if view == "expand" and nd >= 1:
        d = axis % nd
        base = list(shape)
        base[d] = 1 if shape[d] else 0
        return _values(dtype, tuple(base), seed).expand(shape)
    if view == "column":  # one column of a wider tensor: stride 3 on the last dim
        return _values(dtype, (*shape, 3), seed)[..., 1]
    if view == "conj" and dtype.is_complex:
        return _values(dtype, shape, seed).conj()
    if view == "imag-of-conj" and dtype == torch.float32:
        return _values(torch.complex64, shape, seed).conj().imag
    return _values(dtype, shape, seed)


@dataclass(frozen=True)
class Focus:
    """What the first leaf of every batch of one stratum is; the other leaves are drawn freely.

    Hypothesis leans on its first options and on choices it made before, so 200 draws from one
    strategy left some dtypes and rare views out altogether. The examples are therefore split into
    strata, each still generated and shrunk by Hypothesis, that together cover every dtype and
    every kind of leaf by construction.
    """

    name: str
    kind: str = "any"  # dense | jagged | strided | sub | edge | any
    dtype: torch.dtype | None = None
    views: tuple[str, ...] = VIEWS
    builds: tuple[str, ...] = JAGGED_BUILDS
    examples: int = 8


STRATA = (
    *(Focus(f"dense {d}", "dense", dtype=d) for d in DTYPES),
    Focus("lazy and one-element views", "dense", views=("conj", "imag-of-conj", "column", "step", "offset"),
          examples=16),
    Focus("jagged nested", "jagged"),
    Focus("transposed jagged nested", "jagged", builds=("transpose",)),
    Focus("strided nested", "strided", examples=12),
    Focus("sub-TensorDict", "sub"),
    Focus("None, empty and zero-size batches", "edge"),
    Focus("anything", examples=40),
)


@st.composite
def dense_leaves(draw: Any, lead: tuple[int, ...], dtype: torch.dtype | None = None,
                 views: tuple[str, ...] = VIEWS) -> torch.Tensor:
    view = draw(picks(views))
    if dtype is None:  # lazy conj/neg views exist only for complex values (and the float .imag of them)
        dtype = {"conj": torch.complex64, "imag-of-conj": torch.float32}.get(view) or draw(DTYPE_CHOICES)
    # a lazy neg view or a column view is only a case of its own with at most one element: keep those small
    extra = tuple(draw(st.lists(SIZES, max_size=0 if view in ("imag-of-conj", "column") else 2)))
    return _dense(dtype, lead + extra, view, draw(st.integers(0, 2**31 - 1)), draw(st.integers(0, 3)))


@st.composite
def jagged_leaves(draw: Any, n: int, builds: tuple[str, ...] = JAGGED_BUILDS) -> torch.Tensor:
    dtype = draw(DTYPE_CHOICES)
    # one length for every component (a padded batch) is common, and what makes a transposed one ambiguous
    lengths = draw(st.one_of(SIZES.map(lambda ln: [ln] * n), st.lists(SIZES, min_size=n, max_size=n)))
    build = draw(picks(builds))
    inner = tuple(draw(st.lists(st.integers(1, 3), min_size=build == "transpose", max_size=1)))
    seed = draw(st.integers(0, 2**31 - 1))
    total = sum(lengths)
    if build == "from-jagged-view":  # values are every other row of a larger tensor
        values = _values(dtype, (2 * total + 1, *inner), seed)[1::2]
        offsets = torch.tensor([0, *np.cumsum(lengths)], dtype=torch.int64)
        return torch.nested.nested_tensor_from_jagged(values, offsets=offsets)
    if build == "narrow":  # windows of a padded dense tensor: a non-contiguous jagged view
        width = max(lengths) + 2
        starts = [seed % (width - ln + 1) for ln in lengths]
        base = _values(dtype, (n, width, *inner), seed)
        return torch.nested.narrow(base, 1, torch.tensor(starts), torch.tensor(lengths), layout=torch.jagged)
    parts = [_values(dtype, (ln, *inner), seed + i) for i, ln in enumerate(lengths)]
    nt = torch.nested.nested_tensor(parts, layout=torch.jagged)
    return nt.transpose(1, 2) if build == "transpose" else nt


@st.composite
def strided_nested_leaves(draw: Any, n: int) -> torch.Tensor:
    dtype = draw(picks(CORE_DTYPES))  # torch cannot build fp8 ones
    ndim = draw(st.integers(1, 2))
    shapes = draw(st.lists(st.tuples(*[st.integers(0, 3)] * ndim), min_size=n, max_size=n))
    seed = draw(st.integers(0, 2**31 - 1))
    with warnings.catch_warnings():  # torch calls this layout a prototype
        warnings.simplefilter("ignore", UserWarning)
        return torch.nested.nested_tensor([_values(dtype, s, seed + i) for i, s in enumerate(shapes)],
                                          layout=torch.strided)


@st.composite
def tensordicts(draw: Any, batch_size: tuple[int, ...], depth: int = 0, first: Focus | None = None) -> Any:
    from tensordict import TensorDict

    # nested tensors need a batch of at most one dim whose size is their number of components (>= 1)
    n_nested = batch_size[0] if len(batch_size) == 1 else draw(st.integers(1, 3)) if not batch_size else 0
    kinds = ["dense"] + (["jagged", "strided"] if n_nested else []) + (["sub"] if depth < 2 else [])
    n_keys = draw(st.sampled_from((1, 2, 3, 4, 0)))
    if first is not None:
        n_keys = max(n_keys, 1)
    leaves: dict[str, Any] = {}
    for i, key in enumerate(KEYS[:n_keys]):
        focus = first if i == 0 and first is not None else None
        kind = focus.kind if focus else draw(picks(kinds if i == 0 else ["dense", "dense", *kinds]))
        if kind == "dense":
            leaves[key] = draw(dense_leaves(batch_size, focus.dtype, focus.views) if focus else
                               dense_leaves(batch_size))
        elif kind == "jagged":
            leaves[key] = draw(jagged_leaves(n_nested, focus.builds if focus else JAGGED_BUILDS))
        elif kind == "strided":
            leaves[key] = draw(strided_nested_leaves(n_nested))
        else:
            sub_size = batch_size + tuple(draw(st.lists(st.integers(0, 2), max_size=1)))
            leaves[key] = draw(tensordicts(sub_size, depth + 1))
    return TensorDict(leaves, batch_size=list(batch_size))


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.floats(), st.text(max_size=6),
                     st.binary(max_size=4), st.integers(0, 3).map(np.arange))
objects = st.recursive(
    _scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.tuples(inner, inner),
                            st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=6,
)


def _object_array(values: list[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)  # element by element: lists must stay elements
    arr[:] = values
    return arr


@st.composite
def batches(draw: Any, focus: Focus) -> Batch:
    from tensordict import TensorDict

    nested = focus.kind in ("jagged", "strided")
    if focus.kind == "edge":
        shape = draw(picks(["none", "empty", "zero"]))
    else:  # nested leaves cannot sit in a batch of two dims
        shape = draw(picks(["0-dim", "1-dim", "1-dim", "1-dim"] if nested else
                           ["none", "0-dim", "1-dim", "1-dim", "1-dim", "1-dim", "2-dim", "2-dim"]))
    if shape == "none":
        td, n = None, draw(st.integers(0, 3))
    else:
        batch_size: tuple[int, ...] = {
            "0-dim": (),
            "1-dim": (draw(SIZES.filter(bool) if nested else SIZES),),
            "2-dim": (draw(SIZES), draw(SIZES)),
            "empty": tuple(draw(st.lists(SIZES, max_size=2))),
            "zero": (0,),
        }[shape]
        if shape == "empty":
            td = TensorDict({}, batch_size=list(batch_size))
        else:
            td = draw(tensordicts(batch_size, first=None if focus.kind in ("any", "edge") else focus))
        if draw(st.booleans()):
            td = td.to("cpu")  # a TensorDict with a device, as verl's usually are
        n = batch_size[0] if batch_size else draw(st.integers(0, 3))
    non_tensor = {k: _object_array(draw(st.lists(objects, min_size=n, max_size=n)))
                  for k in draw(st.lists(st.sampled_from(("prompts", "extra")), unique=True, max_size=2))}
    meta = draw(st.dictionaries(st.text(max_size=4), objects, max_size=3))
    return Batch(td, non_tensor, meta)


def _dtypes_in(b: Batch) -> set[torch.dtype]:
    if b.batch is None:
        return set()
    return {v.dtype for _, v, feats in iter_leaves(b.batch) if "sub-tensordict" not in feats}


def without_gaps(b: Batch, present: set[tuple[str, str]]) -> Batch | None:
    """``b`` without the top-level entries that hold a declared gap (None if the gap is the batch itself)."""
    if any(leaf == "<batch>" for leaf, _ in present):
        return None
    keys = {leaf.split(".")[0] for leaf, _ in present if not leaf.startswith("non_tensor_batch.")}
    dropped = {leaf.split(".", 1)[1] for leaf, _ in present if leaf.startswith("non_tensor_batch.")}
    td = b.batch.exclude(*keys) if keys else b.batch
    return Batch(td, {k: v for k, v in b.non_tensor_batch.items() if k not in dropped}, b.meta_info)


@pytest.mark.parametrize("codec", builtin_codec_names())
def test_every_batch_is_exact_or_a_declared_gap(codec: str) -> None:
    gaps = {u.feature: u.reason for u in get_codec(codec).unsupported}
    counts: Counter[str] = Counter()
    features: set[str] = set()
    exact_features: set[str] = set()
    dtypes: set[torch.dtype] = set()

    def check(b: Batch) -> None:
        present = {(leaf, f) for leaf, feats in batch_features(b).items() for f in feats if f in gaps}
        rest = without_gaps(b, present) if present else b
        for transport in IN_PROCESS_TRANSPORTS:
            if present:
                with pytest.raises(UnsupportedCase) as refused:
                    roundtrip(b, codec, transport)
                e = refused.value
                assert (e.leaf, e.feature) in present
                assert e.codec == codec and e.reason == gaps[e.feature]
                assert repr(e.leaf) in str(e) and e.reason in str(e)
                outcome = unchecked_outcome(b, codec, transport)
                assert outcome is not None, f"declared gap {e.feature!r} but the unchecked round trip is exact"
            if rest is not None:  # what is left once the gaps are dropped must be exact
                assert exact_problems(rest, codec, transport) == []
        counts["declared" if present else "exact"] += 1
        features.update(*batch_features(b).values())
        if rest is not None:
            exact_features.update(*batch_features(rest).values())
        dtypes.update(_dtypes_in(b))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # strided nested layout: torch's prototype warning
        for focus in STRATA:
            settings(max_examples=focus.examples, derandomize=True, deadline=None, database=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(
                given(b=batches(focus))(check))()
    assert counts["exact"] + counts["declared"] >= EXAMPLES_PER_CODEC, counts
    assert counts["exact"] >= EXAMPLES_PER_CODEC // 5, counts  # not everything hides behind a gap
    if gaps:
        assert counts["declared"] > 0
    assert set(FEATURES) <= features, f"never generated: {sorted(set(FEATURES) - features)}"
    supported = set(FEATURES) - set(gaps)
    assert supported <= exact_features, f"never shown exact: {sorted(supported - exact_features)}"
    assert set(DTYPES) <= dtypes, f"never generated: {sorted(map(str, set(DTYPES) - dtypes))}"
