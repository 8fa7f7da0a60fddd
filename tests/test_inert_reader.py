"""The one inert pickle reader, the one bounded reader and the workload format written by the module that reads it.

``workload from`` (tests/test_workload_from.py) and ``inspect`` (tests/test_verl_blobs.py) test what
users see; this file tests the shared pieces under them directly: that a window on a shared file
reads only its part, whoever else moves the file, that the machine never calls what
a stream names and refuses at its bounds with the count, that ``inspect``'s identification and the
workload reader are that one machine, and that what ``workload_text`` writes ``parse_workload`` reads
back to the same fields.
"""

from __future__ import annotations

import io
import os
import pickle

import pytest

from picklescope.core.safefile import BoundedFile
from picklescope.core.safeload import Bounds, InertUnpickler, Opaque, Refused, Skipped, Text
from picklescope.errors import PicklescopeError
from picklescope.workloads import blobinfo, inert
from picklescope.workloads.spec import parse_workload, workload_text


class _RunsCode:
    """A pickle of this calls ``os.mkdir(path)`` when it is loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_a_window_reads_only_its_part_whoever_else_moves_the_file():
    data = bytes(range(256)) * 4
    outer = BoundedFile(io.BytesIO(data), len(data), "outer")
    window = BoundedFile(outer, 100, "window", start=300)
    assert window.read(4) == data[300:304]
    outer.seek(10)  # the other reader of the shared file moves it
    assert outer.read(2) == data[10:12]
    assert window.read(2) == data[304:306]  # the window re-seeks the shared file before each read
    window.seek(0, 2)
    assert window.tell() == 100 and window.read(10) == b""  # it ends at its own end
    window.seek(500)
    assert window.tell() == 100  # a seek past the end stops there: a length that points past it shows
    capped = BoundedFile(io.BytesIO(data), len(data), "capped", max_read=16, start=0)
    with pytest.raises(PicklescopeError, match="asks for 17 B, over the 16 B"):
        capped.read(17)


def test_the_machine_never_calls_what_the_stream_names(tmp_path):
    target = tmp_path / "made-by-the-pickle"
    stream = pickle.dumps({"x": _RunsCode(str(target)), "big": b"\x00" * 200_000, "text": "t" * 100_000})
    u = InertUnpickler(io.BytesIO(stream))
    root = u.run()
    assert not target.exists()
    assert isinstance(root["x"], Opaque) and root["x"].name == f"{os.mkdir.__module__}.mkdir"
    assert u.named == [f"{os.mkdir.__module__}.mkdir"] and u.unknown == u.named
    assert isinstance(root["big"], Skipped) and root["big"].length == 200_000 and root["big"].data is None
    assert isinstance(root["text"], Text) and len(root["text"]) == 100_000


def test_the_machine_refuses_at_its_bounds_with_the_count():
    stream = pickle.dumps({i: i for i in range(5000)})
    with pytest.raises(Refused, match=r"a dict holds 2,000 entries by byte [0-9,]+, over the 1,000 the test allows"):
        InertUnpickler(io.BytesIO(stream), Bounds(dict_keys=1000, needs="the test allows")).run()
    assert len(InertUnpickler(io.BytesIO(stream)).run()) == 5000  # unbounded by default


def test_inspect_and_workload_from_read_through_the_one_machine():
    assert issubclass(inert._Unpickler, InertUnpickler)
    assert issubclass(blobinfo._Identify, InertUnpickler)
    assert inert._Unpickler(io.BytesIO(b"")).bounds is inert.BATCH_BOUNDS  # the batch's bounds, by name
    assert inert.BATCH_BOUNDS.dict_keys == inert.MAX_DICT_KEYS and inert.BATCH_BOUNDS.ops == inert.MAX_OPS
    # inspect's machine holds what workload from's may: the same bounds, in a blob's words
    assert blobinfo._Identify(BoundedFile(io.BytesIO(b""), 0, "x")).bounds is blobinfo.BLOB_BOUNDS
    shared = ("dict_keys", "list_items", "items", "stack", "memo", "kept", "ops")
    assert [getattr(blobinfo.BLOB_BOUNDS, k) for k in shared] == [getattr(inert.BATCH_BOUNDS, k) for k in shared]


def test_what_the_format_writes_it_reads_back():
    tensors = {"obs": {"shape": ["N", 3, 4], "dtype": "float32"},
               "yes": {"shape": ["N", "J", 2], "dtype": "bfloat16", "kind": "jagged-nested", "min_len": 1,
                       "max_len": 9},
               "a key: with colon": {"shape": ["N", 2, 3, 4], "dtype": "int64", "kind": "non-contiguous"}}
    non_tensor = {"uid": {"kind": "strings", "length": 12}, "null": {"kind": "dicts"}}
    meta = {"temperature": 1e-05, "on": True, "note": "#not a comment", "sizes": [1, 2]}
    text = workload_text("my batch", "2 tensor keys", 8, 7, tensors, non_tensor, meta, ["first line", "second"])
    assert text.startswith("# first line\n# second\n")
    w = parse_workload(text, "<written>")
    assert (w.name, w.batch_size, w.seed) == ("my batch", 8, 7)
    assert [t.name for t in w.tensors] == list(tensors) and [t.kind for t in w.tensors] == \
        ["dense", "jagged-nested", "non-contiguous"]
    assert {t.name: t.dtype for t in w.tensors} == {k: v["dtype"] for k, v in tensors.items()}
    assert [(n.name, n.kind, n.length) for n in w.non_tensor] == [("uid", "strings", 12), ("null", "dicts", 8)]
    assert w.meta_info == meta
    with pytest.raises(PicklescopeError):  # what it writes is checked by the same parser
        workload_text("bad", "", 8, 0, {"x": {"shape": ["N"], "dtype": "float99"}}, {}, {})
