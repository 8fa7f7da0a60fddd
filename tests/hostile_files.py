"""Hostile files the tests build themselves, shared by the readers' tests (``inspect``, ``workload from``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def many_keys(path: Path, count: int, batch: int | None) -> None:
    """A pickle of one dict of ``count`` int keys, written opcode by opcode (building the dict would cost
    gigabytes here): SETITEMS every ``batch`` pairs as pickle writes them, or all under one MARK."""
    pairs = np.zeros(count, dtype=[("op", "u1"), ("key", "<i4"), ("op2", "u1"), ("val", "u1")])
    pairs["op"], pairs["key"], pairs["op2"] = ord("J"), np.arange(count, dtype="<i4"), ord("K")
    raw = pairs.view(np.uint8)
    with open(path, "wb") as f:
        f.write(b"\x80\x02}q\x00")
        step = batch or count
        for start in range(0, count, step):
            f.write(b"(" + raw[start * 7:(start + step) * 7].tobytes() + b"u")
        f.write(b".")


def deflate_bomb(path: Path, size: int) -> None:
    """A .pt whose deflated data.pkl is a whole pickle followed by zeros up to ``size`` bytes."""
    import pickle
    import zipfile

    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as z:
        z.writestr("archive/version", b"3\n")
        with z.open("archive/data.pkl", "w", force_zip64=True) as m:
            head = pickle.dumps({}, protocol=2)
            m.write(head)
            chunk, left = bytes(64 << 20), size - len(head)
            while left > 0:
                m.write(chunk[:left] if left < len(chunk) else chunk)
                left -= len(chunk)
