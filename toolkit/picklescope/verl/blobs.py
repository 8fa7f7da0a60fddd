"""Reference blobs written by real verl, and loading blobs safely.

A fix to ``__setstate__`` must still read what the old code wrote: batches saved with
``DataProto.save_to_disk`` or sitting in a queue during a rolling upgrade. ``data/blobs/`` ships small
blobs written by real verl 0.9.0 in both modes (by ``scripts/make_reference_blobs.py``, from the
installed wheel), with a manifest recording the versions that wrote them, each file's checksum and
the exact contents expected back (:func:`contents_record`: shapes, dtypes, sha256 of every leaf's bytes).

A blob is a pickle: unpickling runs code. So a blob is only loaded from the project's own ``data/``
folder, from files picklescope wrote itself (recorded with their checksum, see
:mod:`picklescope.codecs.trust`), or when the caller passes ``trust=True`` (``--trust``). A manifest next to
a blob only says what the blob should contain; it vouches for nothing, since whoever hands over a
blob can hand over a manifest too. Loading happens in a child process, with the
real (possibly patched) verl of the chosen environment; the ``DataProto`` in the stream is captured
and its state handed to the codec's real ``__setstate__``, so a wrong mode raises
:class:`~picklescope.codecs.base.ModeMismatch` with the variable to set.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import platform
from pathlib import Path
from typing import Any

from picklescope.batch import Batch, set_active_codec
from picklescope.codecs import get_codec
from picklescope.codecs import trust as _trust
from picklescope.codecs.base import PreparesInChild
from picklescope.errors import PicklescopeError
from picklescope.verl import childcall, envs, loader
from picklescope.verl.codec import VerlCodec
from picklescope.workloads.blobinfo import describe_blob, require_pickle
from picklescope.workloads.spec import DATA_DIR, load_workload

BLOB_DIR = DATA_DIR / "blobs"
MANIFEST = "manifest.json"
SPEC = BLOB_DIR / "reference.yaml"
GENERATOR = "picklescope scripts/make_reference_blobs.py"


def read_manifest(folder: str | Path = BLOB_DIR) -> dict[str, Any]:
    path = Path(folder) / MANIFEST
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PicklescopeError(f"cannot read blob manifest {path}: {exc}",
                               "regenerate it with 'python scripts/make_reference_blobs.py'") from None


def manifest_entry(path: str | Path, digest: str | None = None) -> dict[str, Any] | None:
    """The manifest entry listing this file (same name, same checksum), if any: what it should load as.

    Not a reason to trust the file (see :func:`check_trusted`). ``digest`` is the file's sha256 when the
    caller took it already (``inspect`` hashes what the file held at open, once).
    """
    p = Path(path).resolve()
    try:
        m = json.loads((p.parent / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not str(m.get("generator", "")).startswith("picklescope"):
        return None
    digest = digest or _trust.file_sha256(p)
    return next((b for b in m.get("blobs", []) if b.get("file") == p.name and b.get("sha256") == digest), None)


def check_trusted(path: str | Path, trust: bool = False) -> Path:
    """``path`` resolved if it may be unpickled, else a PicklescopeError saying why (see ``codecs.trust``)."""
    return _trust.check_trusted(path, trust, what="blob")


def _tensor_record(t: Any) -> dict[str, Any]:
    import torch

    h = hashlib.sha256()
    parts = list(t.unbind()) if t.is_nested else [t]
    for part in parts:
        flat = part.detach().resolve_conj().resolve_neg().contiguous().reshape(-1)
        if flat.numel():
            h.update(memoryview(flat.view(torch.uint8).numpy()))
    layout = ("jagged" if t.layout == torch.jagged else "strided-nested") if t.is_nested else "dense"
    shape = [list(p.shape) for p in parts] if t.is_nested else list(t.shape)
    return {"dtype": str(t.dtype), "layout": layout, "shape": shape, "sha256": h.hexdigest()}


def _json_sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=repr).encode()).hexdigest()


def contents_record(b: Any) -> dict[str, Any]:
    """What a blob must load back as, in a format of its own (stable JSON, sha256 of raw bytes).

    Independent of :mod:`picklescope.codecs.verify` on purpose: shipped manifests must stay checkable when
    the run-time verifier changes how it digests.
    """
    out: dict[str, Any] = {"format": 1, "batch_size": None, "leaves": {}}
    if b.batch is not None:
        out["batch_size"] = list(b.batch.batch_size)
        out["leaves"] = {k: _tensor_record(v) for k, v in b.batch.items()}
    out["non_tensor"] = {k: {"dtype": str(v.dtype), "len": len(v), "sha256": _json_sha(v.tolist())}
                         for k, v in b.non_tensor_batch.items()}
    out["meta_info_sha256"] = _json_sha(b.meta_info)
    return out


def compare_recorded(expected: dict[str, Any], got: Any) -> list[str]:
    """Every difference between a recorded :func:`contents_record` and the loaded object."""
    if not isinstance(got, Batch):
        return [f"loaded a {type(got).__name__}, expected a Batch"]
    actual = contents_record(got)
    problems = []
    for key in ("batch_size", "non_tensor", "meta_info_sha256"):
        if actual.get(key) != expected.get(key):
            problems.append(f"{key} differs: recorded {expected.get(key)!r}, loaded {actual.get(key)!r}")
    exp, act = expected.get("leaves", {}), actual["leaves"]
    for name in sorted(set(exp) | set(act)):
        e, g = exp.get(name), act.get(name)
        if e is None or g is None:
            problems.append(f"leaf {name!r}: {'missing after loading' if g is None else 'not recorded'}")
            continue
        problems += [f"leaf {name!r} {f}: " + ("values differ" if f == "sha256" else f"recorded {v!r}, loaded {g[f]!r}")
                     for f, v in e.items() if g.get(f) != v]
    return problems


# -- child side ---------------------------------------------------------------------------------------
class _Captured:
    """Stands in for ``verl.protocol.DataProto`` while unpickling: keeps the state for the codec."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _CapturingUnpickler(_trust.AllowListUnpickler):
    """The trusted load's unpickler: a DataProto is captured (its state goes to the codec's real
    ``__setstate__``), picklescope's own Batch (which saved blobs name) is allowed, and every other name
    must be on the allow-list of plain-data constructors: a stream that names other code is refused,
    with ``--trust`` or without (docs/safe_loading.md)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("verl.protocol", "DataProto"):
            return _Captured
        if (module, name) == ("picklescope.batch", "Batch"):
            return Batch
        return super().find_class(module, name)


def _load_with(codec: Any, path: str) -> Any:
    """Unpickle ``path``; a DataProto's state goes through ``codec``'s real ``__setstate__``."""
    set_active_codec(codec.name)
    try:
        with open(path, "rb") as f:
            obj = _CapturingUnpickler(f).load()
    finally:
        set_active_codec(None)
    if isinstance(obj, _Captured):
        if not isinstance(codec, VerlCodec):
            raise PicklescopeError(f"{path} holds a verl DataProto, which codec {codec.name!r} cannot read",
                                   "load it with a real verl codec, e.g. --as verl-0.9.1:numpy")
        b = Batch()
        codec.decode(b, obj.state)
        return b
    return obj


def load_in_child(path: str, codec_name: str, expected: dict[str, Any] | None = None) -> dict[str, Any]:
    """Child side of :func:`load_blob`: load, then compare with the expected contents if known."""
    codec = get_codec(codec_name)
    info = codec.prepare() if isinstance(codec, PreparesInChild) else {}
    got = _load_with(codec, path)
    problems = compare_recorded(expected, got) if expected is not None else None
    leaves = len(list(got.batch.keys())) if isinstance(got, Batch) and got.batch is not None else 0
    return {"type": type(got).__name__, "leaves": leaves, "problems": problems, "codec_info": info}


def check_in_child(label: str, patch: str | None, folder: str) -> list[dict[str, Any]]:
    """Child side of :func:`check_reference_blobs`: every blob through this verl (and patch)."""
    env = envs.get_env(label)
    m = read_manifest(folder)
    out = []
    for blob in m["blobs"]:
        path = os.path.join(folder, blob["file"])
        row = {"file": blob["file"], "mode": blob["mode"], "written_by": m["written_by"]["verl"],
               "ok": False, "problems": [], "error": None}
        if _trust.file_sha256(path) != blob["sha256"]:
            row["error"] = "the file changed since it was written (sha256 differs from the manifest)"
            out.append(row)
            continue
        codec = VerlCodec(env, blob["mode"], patch)
        codec.prepare()
        try:
            row["problems"] = compare_recorded(blob["expected"], _load_with(codec, path))
            row["ok"] = not row["problems"]
        except Exception as exc:  # noqa: BLE001 - a blob that no longer loads is the finding
            row["error"] = f"{type(exc).__name__}: {exc}"
        out.append(row)
    return out


def write_in_child(label: str, out_dir: str, spec: str) -> dict[str, Any]:
    """Child side of :func:`write_reference_blobs`: real ``DataProto.save_to_disk`` in each mode."""
    import numpy
    import tensordict
    import torch


    env = envs.get_env(label)
    info = VerlCodec(env, "numpy").prepare()
    batch = load_workload(spec).build(1.0)
    expected = contents_record(batch)
    data_proto = loader.loaded().DataProto
    blobs = []
    for mode in loader.MODES:
        loader.set_mode(mode)
        name = f"verl-{info['verl_version']}-{mode}.pkl"
        dp = data_proto(batch=batch.batch, non_tensor_batch=batch.non_tensor_batch, meta_info=batch.meta_info)
        dp.save_to_disk(os.path.join(out_dir, name))
        path = os.path.join(out_dir, name)
        blobs.append({"file": name, "mode": mode, "sha256": _trust.file_sha256(path), "bytes": os.path.getsize(path),
                      "expected": expected})
    return {
        "generator": GENERATOR, "format": 1,
        "written_by": {"verl": info["verl_version"], "verl_protocol_sha256": info["verl_protocol_sha256"],
                       "torch": torch.__version__, "tensordict": tensordict.__version__,
                       "numpy": numpy.__version__, "python": platform.python_version()},
        "how": "DataProto.save_to_disk (pickle.dump, default protocol "
               f"{pickle.DEFAULT_PROTOCOL}) with VERL_DATAPROTO_SERIALIZATION_METHOD set per blob",
        "contents": os.path.relpath(spec, out_dir) if Path(spec).is_relative_to(DATA_DIR) else spec,
        "blobs": blobs,
    }


# -- parent side --------------------------------------------------------------------------------------
def write_reference_blobs(label: str = "0.9.0", out_dir: str | Path = BLOB_DIR, spec: str | Path = SPEC) -> Path:
    """Write one blob per mode with real verl ``label`` into ``out_dir``, plus its manifest."""
    out = Path(out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    m = childcall.call("picklescope.verl.blobs.write_in_child", label=label, out_dir=str(out),
                       spec=str(Path(spec).resolve()))
    (out / MANIFEST).write_text(json.dumps(m, indent=1) + "\n")
    if not out.is_relative_to(DATA_DIR.resolve()):  # data/ is trusted as a folder already
        _trust.record_written([out / b["file"] for b in m["blobs"]])
    return out / MANIFEST


def check_reference_blobs(label: str, patch: str | None = None, folder: str | Path = BLOB_DIR, *,
                          trust: bool = False) -> list[dict[str, Any]]:
    """Load every reference blob with verl ``label`` (and ``patch``) in one child; one row per blob.

    Each blob the manifest lists must pass :func:`check_trusted` first (``folder`` may be any folder).
    """
    m = read_manifest(folder)
    for blob in m.get("blobs", []):
        check_trusted(Path(folder) / str(blob.get("file")), trust)
    return childcall.call("picklescope.verl.blobs.check_in_child", label=label, patch=patch,
                          folder=str(Path(folder).resolve()))


def load_blob(path: str | Path, codec_name: str, *, trust: bool = False) -> dict[str, Any]:
    """Load a blob with a codec in a child (after the trust check); compares with its manifest entry.

    A file that is not a whole pickle stream (empty, truncated, something else) is refused first,
    with the same one-line error as ``picklescope inspect``.
    """
    p = check_trusted(path, trust)
    info = describe_blob(p)
    require_pickle(info)
    entry = manifest_entry(p, info.sha256)
    return childcall.call("picklescope.verl.blobs.load_in_child", path=str(p), codec_name=codec_name,
                          expected=entry["expected"] if entry else None)
