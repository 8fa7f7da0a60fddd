"""Errors a user can act on.

Every error the toolkit raises for bad input is a :class:`PicklescopeError`: it names the problem and
the way out in one line, so the CLI can print it without a traceback (exit status 2) and a notebook
user sees the fix next to the failure instead of a stack of library frames.
"""

from __future__ import annotations


class PicklescopeError(Exception):
    """A problem with what the user asked for; ``hint`` says how to fix it."""

    def __init__(self, problem: str, hint: str = "") -> None:
        self.problem = problem
        self.hint = hint
        super().__init__(f"{problem}: {hint}" if hint else problem)


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
