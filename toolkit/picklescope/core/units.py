"""Parsing and printing of memory sizes.

Budgets are given either as absolute sizes (``700MiB``, ``1.5GiB``) or as a multiple of the batch
payload (``1.5x``), because the question an engineer asks is "how many copies of the batch does this
codec need", not a byte count that changes with every workload. ``total:2GiB`` counts the whole
process instead (interpreter, torch and the batch included), the way a container limit does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

from picklescope.errors import PicklescopeError

KiB = 1024
MiB = 1024**2
GiB = 1024**3

_UNITS = {
    "": 1, "b": 1,
    "k": 1000, "kb": 1000, "kib": KiB,
    "m": 1000**2, "mb": 1000**2, "mib": MiB,
    "g": 1000**3, "gb": 1000**3, "gib": GiB,
    "t": 1000**4, "tb": 1000**4, "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


@dataclass(frozen=True)
class Size:
    """A size that is either absolute (``bytes``) or relative to the payload (``multiple``)."""

    bytes: int | None = None
    multiple: float | None = None
    total: bool = False  # the whole process's RSS, not the growth above its baseline

    def resolve(self, payload_bytes: int) -> int:
        """Bytes for a run whose batch payload is ``payload_bytes``."""
        if self.multiple is not None:
            if payload_bytes <= 0:
                require_tensor_payload(payload_bytes, f"a budget of {self.multiple:g}x")
            return int(round(self.multiple * payload_bytes))
        assert self.bytes is not None
        return self.bytes

    def __str__(self) -> str:
        if self.multiple is not None:
            return f"{self.multiple:g}x"
        return ("total:" if self.total else "") + fmt_bytes(self.bytes or 0)


def require_tensor_payload(payload: int, what: str) -> None:
    """Refuse a payload of zero bytes where ``what`` is a ratio to it (a budget as a multiple, a headroom)."""
    if payload <= 0:
        raise PicklescopeError(
            f"the workload has no tensor bytes (payload 0 B), so {what} has nothing to be a multiple of",
            "give a workload with at least one non-empty tensor, or a budget in bytes (e.g. 200MiB)")


def parse_size(text: str | int | float | Size, what: str = "size") -> Size:
    """Parse ``700MiB``, ``1.5GiB``, ``123456``, ``1.5x`` or ``total:2GiB``; anything else is a clear error."""
    if isinstance(text, Size):
        return text
    if isinstance(text, str) and text.strip().lower().startswith("total:"):
        inner = parse_size(text.strip()[6:], what)
        if inner.multiple is not None:
            raise PicklescopeError(f"{what} {text!r} mixes total: with a payload multiple",
                                   "give the whole process's limit in bytes, like total:2GiB")
        return Size(bytes=inner.bytes, total=True)
    if isinstance(text, bool):
        raise PicklescopeError(f"{what} {text!r} is not a size", "give bytes like 700MiB or a multiple like 1.5x")
    if isinstance(text, (int, float)):
        value, unit = float(text), ""
    else:
        raw = str(text).strip()
        if raw.startswith("-") and len(raw) > 1 and (raw[1].isdigit() or raw[1] == "."):
            raise PicklescopeError(f"{what} {text!r} is negative",
                                   "give a positive size like 700MiB or a multiple like 0.5x")
        if raw.lower().endswith("x"):
            try:
                mult = float(raw[:-1])
            except ValueError:
                raise PicklescopeError(
                    f"{what} {text!r} is not a size", "give bytes like 700MiB or a multiple like 1.5x"
                ) from None
            if not mult > 0:
                raise PicklescopeError(f"{what} {text!r} must be above zero", "give a multiple like 1.5x")
            if mult == float("inf"):
                raise PicklescopeError(f"{what} {text!r} is too large to be a multiple", "give a multiple like 1.5x")
            return Size(multiple=mult)
        m = _SIZE.match(raw)
        if not m or m.group(2).lower() not in _UNITS:
            raise PicklescopeError(
                f"{what} {text!r} is not a size", "give bytes like 700MiB, 1.5GiB or a multiple like 1.5x"
            )
        value, unit = float(m.group(1)), m.group(2).lower()
    if not value > 0:
        raise PicklescopeError(f"{what} {text!r} must be above zero", "give a positive size like 700MiB")
    if value == float("inf"):
        raise PicklescopeError(f"{what} {text!r} is too large to be a size", "give a size like 700MiB or 1.5x")
    return Size(bytes=int(value * _UNITS[unit]))


def seconds(name: str, value: Any, flag: str, what: str) -> float:
    """``value`` as seconds, or one line for a duration that is not a finite number of seconds, zero or more.
    One check for the API (``node``'s and ``predict``'s keyword ``name``, e.g. ``step_gap_s``) and the CLI
    (``name`` the flag itself, ``value`` the text as typed): ``flag`` is the flag with an example value
    (``--step-gap 2``), ``what`` what the duration is."""
    as_flag = name.startswith("--")
    number = value
    if as_flag and isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            number = None
    if isinstance(number, bool) or not (isinstance(number, (int, float)) and math.isfinite(number) and number >= 0):
        if as_flag:
            raise PicklescopeError(f"{name} {value!r} is not a number of seconds, zero or more",
                                   f"use e.g. {flag} ({what})")
        raise PicklescopeError(f"{name} {value!r} must be a number of seconds, zero or more",
                               f"use e.g. {name}={flag.split()[-1]} ({flag}): {what}")
    return float(number)


def fmt_bytes(n: float | None, signed: bool = False) -> str:
    """Human-readable MiB/GiB, the unit memory is discussed in."""
    if n is None:
        return "-"
    sign = "+" if signed and n > 0 else ""
    a = abs(n)
    if a >= GiB:
        return f"{sign}{n / GiB:.2f} GiB"
    if a >= MiB:
        return f"{sign}{n / MiB:.1f} MiB"
    if a >= KiB:
        return f"{sign}{n / KiB:.1f} KiB"
    return f"{sign}{int(n)} B"
