"""Steps inside Ray's own serialization, so a ``ray.put`` splits into "serialize" and "store write".

``ray.put`` (and a remote call with a large argument) first pickles the value (protocol 5, numpy
buffers out of band) and then copies the result into the shared-memory object store; a worker's
``ray.get`` maps the object and unpickles it. The toolkit cares about each part separately: the
serialize is what the codec controls (verl's ``__getstate__``), the store write is Ray's copy that
every codec pays. Ray has no callback for either, so this module wraps the two methods of Ray's
``SerializationContext`` that do the pickling, in the measured processes only (the driver and the
receiver actor, both ours), with :func:`picklescope.core.steps.step`. Outside a meter a step is free.

The store write has no method of its own to wrap: it is everything after the serialize inside the
caller's ``ray.put``/``.remote()``. The driver names the object it is about to send with
:func:`expect_store_write`; the serialize of that object (and only that one: ``.remote()`` also
serializes small things of Ray's own) becomes a ``ray.serialize`` step, the wrapper opens an
``object-store write`` step as it returns, and :func:`end_store_write` closes it when the caller's
call has returned.
"""

from __future__ import annotations

from typing import Any

from picklescope.core import steps

_state: dict[str, Any] = {"installed": False, "serialize": False, "deserialize": False,
                          "target": None, "open": False, "last": None}


def install(serialize: bool = False, deserialize: bool = False) -> None:
    """Wrap Ray's serializer (driver: ``serialize=True``; receiver: ``deserialize=True``)."""
    _state["serialize"] = serialize
    _state["deserialize"] = deserialize
    if _state["installed"]:
        return
    from ray._private.serialization import SerializationContext

    original_serialize = SerializationContext.serialize
    original_deserialize = SerializationContext.deserialize_objects

    def serialize(self: Any, value: Any) -> Any:
        meter = steps.current()
        if not _state["serialize"] or meter is None or value is not _state["target"]:
            return original_serialize(self, value)  # Ray's own small objects: not the measured one
        with steps.step("ray.serialize"):
            out = original_serialize(self, value)
        _state["last"] = {"total_bytes": int(getattr(out, "total_bytes", 0) or 0)}
        if not _state["open"]:
            meter.begin("object-store write")
            _state["open"] = True
        return out

    def deserialize_objects(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not _state["deserialize"] or steps.current() is None:
            return original_deserialize(self, *args, **kwargs)
        with steps.step("ray.deserialize"):
            return original_deserialize(self, *args, **kwargs)

    SerializationContext.serialize = serialize  # type: ignore[method-assign]
    SerializationContext.deserialize_objects = deserialize_objects  # type: ignore[method-assign]
    _state["installed"] = True


def expect_store_write(target: Any) -> None:
    """``target`` is about to be put: step its serialize, then the store write that follows it."""
    _state["target"] = target
    _state["open"] = False


def end_store_write() -> None:
    """Close the ``object-store write`` step opened after the serialize (no-op if none opened)."""
    _state["target"] = None
    if _state["open"]:
        _state["open"] = False
        meter = steps.current()
        if meter is not None:
            meter.end()


def last_serialized() -> dict[str, Any] | None:
    """Size of the last object the wrapper serialized (``total_bytes``: in-band plus buffers)."""
    return _state["last"]
