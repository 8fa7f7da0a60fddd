"""The fitted terms of :mod:`.model`: a linear function of named features, fitted by least squares.

Kept apart from the model so that the model module holds what the terms mean (roles, features, how a
step is played) and this one only how a term is fitted and written out. Plain Python: a term is fitted
on a handful of points (one per replay), where a numerical library would add nothing but an import.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Term:
    """A fitted linear function of named features, and how well it fitted (largest residual)."""

    name: str
    features: tuple[str, ...]
    coef: list[float]
    max_residual: float = 0.0
    points: int = 0

    def __call__(self, x: dict[str, float]) -> float:
        return sum(c * x[f] for c, f in zip(self.coef, self.features))

    def describe(self, unit: float, digits: int = 4) -> str:
        """The term in words, bytes as multiples of ``unit`` where they are bytes; a count or a rate (``unit``
        1) with ``digits`` decimals (allocations are whole objects: 1)."""
        parts = []
        for c, f in zip(self.coef, self.features):
            if f in ("P", "c", "h", "H"):
                what = {"P": "payload", "c": "chunk payload", "h": "chunk's heap-sized leaves",
                        "H": "all chunks' heap-sized leaves"}[f]
                parts.append(f"{_share(c)} x {what}")
            elif f == "W":
                parts.append(f"{_bytes(c, unit)} x workers" if unit != 1 else f"{c:+.{digits}f} x workers")
            elif f == "objects":
                parts.append(f"{c:+.2e} x non-tensor objects")
            elif f == "calls":
                parts.append(f"{c:+.1f} x worker calls")
            else:
                parts.append(_bytes(c, unit) if unit != 1 else f"{c:+.{digits}f}")
        return " ".join(parts).lstrip("+")


def _share(c: float) -> str:
    """A multiple of a payload with the digits that matter: a coefficient under 0.0005 would print as
    0.000, yet times a production payload over a hundred steps it can still be gigabytes."""
    if abs(c) < 1e-9:  # a least-squares zero
        return "+0.000"
    return f"{c:+.3f}" if abs(c) >= 0.0005 else f"{c:+.1e}"


def _bytes(c: float, unit: float) -> str:
    """Bytes in MiB, or in KiB when they would print as 0.00 MiB."""
    if abs(c) < 1:  # under a byte: a least-squares zero
        return "+0.00 MiB"
    if abs(c) >= 0.005 * unit:
        return f"{c / unit:+.2f} MiB"
    return f"{c / 1024:+.1f} KiB"


def lstsq(xs: Sequence[Sequence[float]], ys: Sequence[float]) -> list[float]:
    """Least squares by the normal equations with a tiny ridge (the features differ by orders of magnitude,
    so each column is scaled to unit size first); plain Python, a handful of points."""
    n = len(xs[0])
    scale = [max(abs(r[j]) for r in xs) or 1.0 for j in range(n)]
    a = [[sum(r[i] / scale[i] * r[j] / scale[j] for r in xs) + (1e-9 if i == j else 0.0) for j in range(n)]
         for i in range(n)]
    b = [sum(r[i] / scale[i] * y for r, y in zip(xs, ys)) for i in range(n)]
    for col in range(n):  # Gauss-Jordan with partial pivoting
        piv = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[piv], b[col], b[piv] = a[piv], a[col], b[piv], b[col]
        if abs(a[col][col]) < 1e-15:
            continue
        for r in range(n):
            if r != col:
                f = a[r][col] / a[col][col]
                a[r] = [v - f * w for v, w in zip(a[r], a[col])]
                b[r] -= f * b[col]
    return [(b[i] / a[i][i] if abs(a[i][i]) >= 1e-15 else 0.0) / scale[i] for i in range(n)]


def fit_term(name: str, features: tuple[str, ...], xs: Sequence[dict[str, float]], ys: Sequence[float],
             robust: bool = False) -> Term:
    """``ys`` as a linear function of ``features``; fewer points than features drops the last features. ``robust``:
    least absolute deviations (reweighted), so that one replay far off the others' line moves it little."""
    usable = features[:max(1, min(len(features), len(ys)))]
    rows = [[x[f] for f in usable] for x in xs]
    coef = lstsq(rows, ys)
    floor = max(1.0, 1e-6 * max((abs(y) for y in ys), default=1.0))  # a byte, or a millionth of the largest
    for _ in range(30 if robust and len(ys) > len(usable) else 0):  # each point weighs 1 / its residual
        w = [1.0 / math.sqrt(max(abs(sum(c * v for c, v in zip(coef, r)) - y), floor)) for r, y in zip(rows, ys)]
        coef = lstsq([[v * wi for v in r] for r, wi in zip(rows, w)], [y * wi for y, wi in zip(ys, w)])
    res = max((abs(sum(c * v for c, v in zip(coef, r)) - y) for r, y in zip(rows, ys)), default=0.0)
    return Term(name, usable, coef, res, len(ys))


def fit_supported(name: str, features: tuple[str, ...], xs: Sequence[dict[str, float]], ys: Sequence[float],
                  optional: str = "objects", tolerance: float = 0.02) -> Term:
    """``ys`` as :func:`fit_term` fits it, without the ``optional`` feature unless the fits need it: kept only
    where it brings the largest residual down by more than ``tolerance`` of the mean value. A count that
    does not move with the batch's objects at the fit sizes (flowgrpo's: its non-tensor keys hold no
    containers) would otherwise get a least-squares slope from noise, and at a production batch, hundreds
    of times more objects, that slope alone would set the schedule."""
    full = fit_term(name, features, xs, ys)
    if optional not in features:
        return full
    reduced = fit_term(name, tuple(f for f in features if f != optional), xs, ys)
    scale = sum(abs(y) for y in ys) / len(ys) if ys else 0.0
    return reduced if reduced.max_residual <= full.max_residual + tolerance * scale else full
