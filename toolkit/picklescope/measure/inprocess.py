"""Round trips inside one process: a codec and a pickle transport, without the measuring machinery.

Measured runs need two processes (:mod:`picklescope.measure.runner`); proving that a codec carries a batch
exactly does not, and thousands of tiny property-based examples could never afford two processes
each. These helpers pickle a :class:`~picklescope.batch.Batch` the way the two pickle transports do
(protocol 4 in-band; protocol 5 with out-of-band buffers, which the receiver gets as read-only copies,
as from the transport's read-only mapping or Ray's object store) and compare bit for bit with
:mod:`picklescope.codecs.verify`.

:func:`unchecked_outcome` skips the codec's declared-gap check and runs the underlying operation, so a
declared gap can be shown to be a real failure (an exception, or a silent mismatch) and not an
invented one.
"""

from __future__ import annotations

import pickle
from typing import Any

from picklescope import batch as _batch_mod
from picklescope.batch import Batch, set_active_codec
from picklescope.codecs import get_codec
from picklescope.codecs.verify import compare, manifest
from picklescope.transports import TRANSPORTS

# The transports that are plain pickle and so can be replayed in one process.
IN_PROCESS_TRANSPORTS: tuple[str, ...] = ("pickle", "pickle5-oob")


def _dumps(obj: Any, transport: str) -> tuple[bytes, list[memoryview]]:
    t = TRANSPORTS.get(transport)
    if not t.out_of_band:
        return pickle.dumps(obj, protocol=t.protocol), []
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(obj, protocol=t.protocol, buffer_callback=buffers.append)
    # the receiver never sees the sender's memory: it gets read-only copies, as from the hand-off
    return data, [memoryview(bytes(buf.raw())) for buf in buffers]


def _loads(data: bytes, buffers: list[memoryview], transport: str) -> Any:
    if TRANSPORTS.get(transport).out_of_band:
        return pickle.loads(data, buffers=buffers)
    return pickle.loads(data)


def roundtrip(b: Batch, codec: str, transport: str = "pickle5-oob", receiver: str | None = None) -> Any:
    """Pickle ``b`` with ``codec`` active and unpickle it with ``receiver`` (default: the same codec).

    Goes through ``Batch.__getstate__``/``__setstate__`` like a real transport, so the codec's
    declared-gap check runs and an unsupported leaf raises :class:`~picklescope.errors.UnsupportedCase`.
    The process's previously chosen codec is restored afterwards.
    """
    previous = _batch_mod._active
    try:
        set_active_codec(codec)
        data, buffers = _dumps(b, transport)
        set_active_codec(receiver or codec)
        return _loads(data, buffers, transport)
    finally:
        set_active_codec(previous)


def exact_problems(b: Batch, codec: str, transport: str) -> list[str]:
    """Every difference after a round trip, and any change the sender's own batch suffered."""
    expected = manifest(b)
    got = roundtrip(b, codec, transport)
    problems = compare(expected, got)
    problems += [f"the sender's batch changed: {p}" for p in compare(expected, b)]
    return problems


def unchecked_outcome(b: Batch, codec: str, transport: str) -> str | None:
    """What the codec's underlying operation does with ``b`` when its gap check is skipped.

    None: the round trip is exact. Otherwise the real exception (``"KeyError: ..."``) or the first
    silent difference (``"silent mismatch: ..."``).
    """
    c = get_codec(codec)
    expected = manifest(b)
    got = Batch.__new__(Batch)
    got.batch, got.non_tensor_batch, got.meta_info = None, {}, {}
    try:
        data, buffers = _dumps(c.encode(b), transport)
        c.decode(got, _loads(data, buffers, transport))
    except Exception as exc:  # noqa: BLE001 - the exception is the finding
        return f"{type(exc).__name__}: {exc}"
    problems = compare(expected, got)
    return f"silent mismatch: {problems[0]}" if problems else None
