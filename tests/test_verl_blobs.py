"""Reference blobs and ``inspect`` without verl: identification from opcodes, manifest, trust."""

from __future__ import annotations

import hashlib
import json
import pickle
import subprocess
import sys

import pytest

from picklescope.errors import PicklescopeError
from picklescope.verl.blobs import BLOB_DIR, check_trusted, manifest_entry, read_manifest
from picklescope.workloads.blobinfo import describe_blob


def test_manifest_lists_both_modes_written_by_real_verl_090():
    m = read_manifest()
    assert m["written_by"]["verl"] == "0.9.0" and m["generator"].startswith("picklescope")
    assert sorted(b["mode"] for b in m["blobs"]) == ["numpy", "torch"]
    for b in m["blobs"]:
        data = (BLOB_DIR / b["file"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == b["sha256"] and len(data) == b["bytes"]
        assert set(b["expected"]["leaves"]) == {"obs", "latents", "ids", "mask", "transposed", "ragged"}


@pytest.mark.parametrize("mode", ["numpy", "torch"])
def test_describe_names_the_writer_without_unpickling(mode):
    info = describe_blob(BLOB_DIR / f"verl-0.9.0-{mode}.pkl")
    assert info.kind == "pickle" and info.container == "verl DataProto" and info.mode == mode
    assert "verl.protocol.DataProto" in info.globals
    assert (info.torch_archives == 1) == (mode == "torch")
    assert "verl" not in sys.modules  # nothing was imported, nothing was run


def test_describe_other_blobs(tmp_path):
    plain = tmp_path / "plain.pkl"
    plain.write_bytes(pickle.dumps({"a": 1}))
    assert describe_blob(plain).mode is None and describe_blob(plain).container == "plain Python data"
    junk = tmp_path / "junk.bin"
    junk.write_bytes(b"\x00not a pickle")
    assert describe_blob(junk).kind == "unknown"
    import torch

    archive = tmp_path / "t.pt"
    torch.save({"x": torch.zeros(2)}, archive)
    info = describe_blob(archive)
    assert info.kind == "torch-zip" and info.mode == "torch"


def test_trust_policy(tmp_path, monkeypatch):
    monkeypatch.setenv("PICKLESCOPE_CACHE", str(tmp_path / "cache"))  # a ledger of our own
    shipped = BLOB_DIR / "verl-0.9.0-numpy.pkl"
    assert check_trusted(shipped) == shipped.resolve()
    copy = tmp_path / "copy.pkl"
    copy.write_bytes(shipped.read_bytes())
    with pytest.raises(PicklescopeError, match="refusing to unpickle"):
        check_trusted(copy)
    assert check_trusted(copy, trust=True) == copy.resolve()
    # a manifest next to it tells what it should contain, but vouches for nothing: anyone can write one
    m = read_manifest()
    entry = next(b for b in m["blobs"] if b["file"] == "verl-0.9.0-numpy.pkl")
    (tmp_path / "manifest.json").write_text(json.dumps({**m, "blobs": [{**entry, "file": "copy.pkl"}]}))
    assert manifest_entry(copy) is not None
    with pytest.raises(PicklescopeError, match="refusing to unpickle"):
        check_trusted(copy)
    # a file picklescope wrote itself (recorded with its checksum) is trusted while it is unchanged
    from picklescope.codecs.trust import record_written

    record_written([copy])
    assert check_trusted(copy) == copy.resolve()
    copy.write_bytes(shipped.read_bytes() + b"\x00")  # changed after it was written: no longer trusted
    with pytest.raises(PicklescopeError, match="refusing"):
        check_trusted(copy)


def test_inspect_cli_static():
    p = subprocess.run([sys.executable, "-m", "picklescope", "inspect", str(BLOB_DIR / "verl-0.9.0-torch.pkl")],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "verl DataProto in torch mode" in p.stdout
    assert "read it with VERL_DATAPROTO_SERIALIZATION_METHOD=torch" in p.stdout
    assert "listed with this checksum" in p.stdout
