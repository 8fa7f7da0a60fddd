"""What a Ray run's numbers mean: the codec's cost apart from Ray's, private memory apart from the store's.

Over Ray each side's RSS mixes two kinds of pages: private memory the process allocated (the codec's
copies, pickle's buffers) and object-store pages it mapped (the driver's store write, the worker's
reads of the stored object), which the machine holds once, in the store. Step events carry
``RssShmem`` (:mod:`.events`), so each side's peak is split into the two, and the headline numbers
name the step that paid: on the driver, the serialize (what the codec controls) against the store
write (what Ray does for every codec); on the worker, the codec's copy (``frombuffer``,
``torch.load``) against the store pages it read.
"""

from __future__ import annotations

from typing import Any

from picklescope.core.result import Process, RunResult, Step
from picklescope.core.units import fmt_bytes

# The receiver step in which each codec makes its tensors (a copy, or views of the received buffers).
RECEIVER_WORK_STEPS = ("frombuffer", "torch.load", "from_numpy", "kv_batch_get")


def _dur(st: Step | None) -> float | None:
    return None if st is None or st.error is not None else st.duration_s


def _shared_by_step(side: Process, added: list[int | None]) -> dict[str, int]:
    out: dict[str, int] = {}
    for st, n in zip(side.steps, added):
        if n is not None and st.name not in out:
            out[st.name] = n
    return out


def _private(st: Step | None, shared: dict[str, int]) -> int | None:
    if st is None or st.added_bytes is None:
        return None
    return st.added_bytes - max(0, shared.get(st.name, 0))


def summarize(r: RunResult, shm: dict[str, dict[str, Any]], ray_path: str) -> None:
    """Fill the timing fields and ``extra`` (sender_cost, receiver_cost, per-side store pages)."""
    snd, rcv = r.sender, r.receiver
    r.serialize_s = _dur(snd.step("ray.put") or snd.step("actor.call") or snd.step("tq.put"))
    r.deserialize_s = _dur(rcv.step("ray.get") or rcv.step("ray.deserialize") or rcv.step("tq.get"))
    if ray_path == "tq":
        r.codec_note = (f"TransferQueue moves the TensorDict field by field: codec {r.codec!r} "
                                 "(Batch.__getstate__) is never called")
    shared: dict[str, dict[str, int]] = {}
    for name, side in r.processes.items():
        rec = shm.get(name, {})
        shared[name] = _shared_by_step(side, rec.get("added", []))
        side.store_pages_by_step = shared[name]
        if rec.get("baseline") is not None and rec.get("end") is not None:
            pages = max(0, rec["end"] - rec["baseline"])
            side.store_pages_bytes = pages
            if side.peak_bytes is not None:
                side.private_peak_bytes = max(0, side.peak_bytes - pages)
    p = r.payload_bytes or 1
    ser, write = snd.step("ray.serialize"), snd.step("object-store write")
    r.sender_cost = {
        "path": ray_path,
        "serialize_step": "ray.serialize",
        "serialize_s": _dur(ser),
        "serialize_added_bytes": None if ser is None else ser.added_bytes,
        "serialize_peak_bytes": None if ser is None else ser.peak_bytes,
        "store_write_s": _dur(write),
        "store_write_added_bytes": None if write is None else write.added_bytes,
        "store_write_store_pages_bytes": shared["sender"].get("object-store write"),
    }
    work = next((st for st in rcv.steps if st.name in RECEIVER_WORK_STEPS), None)
    status = (r.received or {}).get("status")
    cost: dict[str, Any] = {"step": None if work is None else work.name, "received": status,
                            "private_peak_bytes": rcv.private_peak_bytes,
                            "store_pages_bytes": rcv.store_pages_bytes}
    if work is not None:
        private = _private(work, shared["receiver"])
        cost.update({"step_private_added_bytes": private, "step_s": _dur(work),
                     "step_store_pages_bytes": shared["receiver"].get(work.name)})
        pages = cost["store_pages_bytes"]
        pages_txt = "" if pages is None else (f"; {fmt_bytes(pages)} of its peak are object-store pages it read "
                                              "(shared with the store, not new memory)")
        if status == "copied" and private is not None:
            cost["kind"] = "copy"
            cost["explanation"] = (f"the worker's cost is the codec's copy: {work.name} added {fmt_bytes(private)} "
                                   f"({private / p:.2f}x payload) of private memory{pages_txt}")
        elif status in ("shared", "read-only"):
            cost["kind"] = "zero-copy"
            cost["explanation"] = (f"no copy: the received tensors point into the object store{pages_txt}; "
                                   "an in-place write changes the object for every reader")
        else:
            cost["kind"] = status
    r.receiver_cost = cost
