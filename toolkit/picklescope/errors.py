"""Errors a user can act on.

Every error the toolkit raises for bad input is a :class:`PicklescopeError`: it names the problem and
the way out in one line, so the CLI can print it without a traceback (exit status 2) and a notebook
user sees the fix next to the failure instead of a stack of library frames.
"""

from __future__ import annotations

import re

# C0 and C1 control characters, DEL, and the Unicode line/paragraph separators and bidi overrides:
# anything that moves the cursor, changes the terminal's colours or title, or starts a new line; and lone
# surrogates (a name from undecodable bytes, or a YAML "\ud800"), which no UTF-8 terminal can be sent.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(m: re.Match[str]) -> str:
    c = m.group(0)
    return {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(c) or (
        f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def safe_text(text: object, limit: int | None = None) -> str:
    """``text`` with control characters and lone surrogates escaped (``\\x1b``, ``\\n``, ``\\udc80``), for names
    that came from the user.

    A workload name holding an escape sequence would otherwise recolour the terminal or set its
    title, and a newline in a key would split an error into several lines (one of which could
    pretend to be a ``Traceback``). ``limit`` shortens the result to that many characters (with
    ``...``), so a megabyte-long name cannot flood a terminal either.
    """
    s = _CONTROL.sub(_escape, str(text))
    if limit is not None and len(s) > limit:
        s = s[: max(0, limit - 3)] + "..."
    return s


class PicklescopeError(Exception):
    """A problem with what the user asked for; ``hint`` says how to fix it.

    Both parts are printed as one line: control characters in them (often from a name the user
    gave) are escaped by :func:`safe_text`.
    """

    def __init__(self, problem: str, hint: str = "") -> None:
        self.problem = safe_text(problem)
        self.hint = safe_text(hint)
        super().__init__(f"{self.problem}: {self.hint}" if self.hint else self.problem)


class UnknownNameError(PicklescopeError, KeyError):
    """A name looked up in a registry (codec, transport, tracer, workload) does not exist."""

    def __init__(self, kind: str, name: str, known: list[str]) -> None:
        self.kind = kind
        self.name = name
        self.known = known
        super().__init__(f"unknown {kind} {name!r}", f"known {kind}s: {', '.join(known) or '(none)'}")

    def __str__(self) -> str:  # KeyError would otherwise repr() the message
        return self.args[0]


class UnsupportedCase(PicklescopeError):
    """A codec was given data it declared it cannot carry (named leaf, named reason).

    Raised before any work starts, so an unsupported batch never turns into silent corruption.
    """

    def __init__(self, codec: str, leaf: str, feature: str, reason: str) -> None:
        self.codec = codec
        self.leaf = leaf
        self.feature = feature
        self.reason = reason
        super().__init__(
            f"codec {codec!r} cannot carry leaf {leaf!r} ({feature}): {reason}",
            "drop or convert that leaf, or use a codec whose capability matrix supports it",
        )
