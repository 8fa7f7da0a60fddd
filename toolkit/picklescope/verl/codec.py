"""Codecs that run the real ``verl.protocol.DataProto.__getstate__`` / ``__setstate__``.

``verl-<label>:<mode>`` (``verl-0.9.0:numpy``, ``verl-local:torch``) is listed for every installed
environment (:mod:`picklescope.verl.envs`) through the codec registry's provider, so ``picklescope
run --codec verl-0.9.0:numpy`` measures the real code through the same isolated, traced runs as the
replica codecs. A candidate patch adds ``verl-<label>:<mode>+<patch stem>``; the patch path reaches
the children through the ``PICKLESCOPE_VERL_PATCH`` variable of the run's ``env``.

The codec wraps our :class:`~picklescope.batch.Batch` in a real ``DataProto`` holding the very same
TensorDict and arrays (no copy), and calls the real method with the mode variable set. verl imports
only in :meth:`VerlCodec.prepare`, which the child calls during setup, before the baseline.

Gaps are measured, not declared (``unsupported`` is empty): when the real code raises, the codec
finds the leaf that makes it fail by retrying leaf by leaf and raises
:class:`~picklescope.errors.UnsupportedCase` naming that leaf and verl's own error; a state written
in the other mode raises :class:`~picklescope.codecs.base.ModeMismatch` with the fix.

In torch mode verl's ``__setstate__`` calls ``torch.load(..., weights_only=False)`` itself. That is
left alone on purpose: it is the behaviour under measurement. It only ever reads bytes the same run's
sender produced, or a blob that passed :func:`picklescope.codecs.trust.check_trusted` (docs/safe_loading.md).
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from picklescope.batch import Batch
from picklescope.codecs.base import Codec, ModeMismatch, batch_features
from picklescope.errors import PicklescopeError, UnsupportedCase
from picklescope.verl import envs, loader

PATCH_ENV = "PICKLESCOPE_VERL_PATCH"
_candidates: dict[str, str] = {}  # codec name -> patch path, registered in this (parent) process


def describe_verl_state(state: Any) -> str:
    """Which verl mode wrote a ``DataProto.__getstate__`` value: ``torch``, ``numpy`` or ``unknown``."""
    if not (isinstance(state, tuple) and len(state) == 3):
        return "unknown"
    head = state[0]
    if isinstance(head, (bytes, bytearray, memoryview)):
        return "torch"
    if head is None or (isinstance(head, tuple) and len(head) == 3 and isinstance(head[2], dict)):
        return "numpy"  # numpy mode writes None for batch=None; torch mode always writes bytes
    return "unknown"


def main_feature(feats: set[str]) -> str:
    for f in ("zero-size", "fp8", "strided-nested", "jagged-nested", "sub-tensordict", "non-contiguous",
              "bfloat16", "bool", "complex", "empty-tensordict", "batch-none"):
        if f in feats:
            return f
    return sorted(feats)[0] if feats else "dense"


def _encoded_feature(item: Any) -> str:
    """The feature of one leaf as verl's numpy mode encoded it (the receiver has no tensor to look at)."""
    if isinstance(item, tuple) and len(item) == 2:
        return f"{item[0]}-nested"
    if isinstance(item, tuple) and len(item) == 3:
        dtype, shape, _ = item
        if math.prod(shape) == 0:
            return "zero-size"
        if "float8" in str(dtype):
            return "fp8"
        return str(dtype)
    return "sub-tensordict"


class VerlCodec(Codec):
    """The real verl ``DataProto`` methods of one environment in one mode (optionally patched)."""

    unsupported = ()
    capabilities_note = "gaps measured, not declared: see 'picklescope verl matrix'"

    def __init__(self, env: envs.VerlEnv, mode: str, patch: str | None = None) -> None:
        self.env = env
        self.mode = mode
        self.patch = patch
        suffix = f"+{Path(patch).stem}" if patch else ""
        self.name = f"{env.codec_prefix}:{mode}{suffix}"  # type: ignore[misc]
        what = "patched by " + Path(patch).name if patch else f"from {env.source}"
        self.description = f"real verl {env.version} DataProto ({what}), {loader.MODE_ENV}={mode}"  # type: ignore[misc]
        self.verl_equivalent = f"verl {env.version}, {loader.MODE_ENV}={mode}"  # type: ignore[misc]

    # -- child side ---------------------------------------------------------------------------------
    def prepare(self) -> dict[str, Any]:
        """Import this environment's verl (setup phase, before the baseline); returns what to record."""
        loaded = loader.load(self.env, self.patch)
        loader.set_mode(self.mode)
        return {**loaded.info, "codec": self.name, "mode": self.mode}

    def _cls(self) -> type:
        loaded = loader.loaded() or loader.load(self.env, self.patch)
        if loaded.env.root != self.env.root or loaded.patch != self.patch:
            raise PicklescopeError(f"codec {self.name} cannot run in a process that loaded verl from "
                                   f"{loaded.env.site}", "use one verl codec per process")
        return loaded.DataProto

    def to_dataproto(self, b: Batch) -> Any:
        """A real DataProto over the same objects (no tensor is copied)."""
        dp = self._cls()(batch=b.batch, non_tensor_batch=b.non_tensor_batch, meta_info=b.meta_info)
        return dp

    def encode(self, b: Batch) -> Any:
        dp = self.to_dataproto(b)
        loader.set_mode(self.mode)
        try:
            return dp.__getstate__()
        except Exception as exc:  # noqa: BLE001 - mapped to a message naming the leaf
            raise self._sender_failure(b, exc) from exc

    def decode(self, b: Batch, state: Any) -> None:
        cls = self._cls()
        kind = describe_verl_state(state)
        dp = cls.__new__(cls)
        loader.set_mode(self.mode)
        try:
            dp.__setstate__(state)
        except Exception as exc:  # noqa: BLE001
            if kind not in (self.mode, "unknown"):
                raise ModeMismatch(kind, self.mode, f"{type(exc).__name__}: {exc}") from exc
            raise self._receiver_failure(state, exc) from exc
        if kind not in (self.mode, "unknown"):
            raise ModeMismatch(kind, self.mode)
        b.batch, b.non_tensor_batch, b.meta_info = dp.batch, dp.non_tensor_batch, dp.meta_info

    # -- naming the leaf that breaks the real code ----------------------------------------------------
    def _sender_failure(self, b: Batch, exc: BaseException) -> PicklescopeError:
        original = f"{type(exc).__name__}: {exc}"
        feats = batch_features(b)
        generic = PicklescopeError(f"__getstate__ of {self.name} failed: {original}",
                                   "it fails on a plain float32 leaf too: no leaf kind is to blame; see the traceback")
        if b.batch is None:
            return generic
        import torch
        from tensordict import TensorDict

        n = list(b.batch.batch_size)
        probe = Batch(batch=TensorDict({"probe": torch.zeros(*n, 1)}, batch_size=n), non_tensor_batch={}, meta_info={})
        if not self._encodes(probe):
            return generic
        for key in list(b.batch.keys()):  # iterating a TensorDict itself walks its batch dimension
            if not self._encodes(Batch(batch=b.batch.select(key), non_tensor_batch={}, meta_info={})):
                leaf_feats = {f for name, fs in feats.items() if name == key or name.startswith(key + ".") for f in fs}
                return UnsupportedCase(self.name, key, main_feature(leaf_feats),
                                       f"its __getstate__ raised {original}")
        return PicklescopeError(f"__getstate__ of {self.name} failed on the batch: {original}",
                                "no single leaf reproduces it; see the traceback")

    def _encodes(self, b: Batch) -> bool:
        try:
            self.to_dataproto(b).__getstate__()
        except Exception:  # noqa: BLE001 - only whether it fails matters here
            return False
        return True

    def _receiver_failure(self, state: Any, exc: BaseException) -> PicklescopeError:
        original = f"{type(exc).__name__}: {exc}"
        head = state[0] if isinstance(state, tuple) and state else None
        if self.mode == "numpy" and isinstance(head, tuple) and len(head) == 3 and isinstance(head[2], dict):
            batch_size, device, items = head
            cls = self._cls()
            failing = []
            for key, item in items.items():
                dp = cls.__new__(cls)
                try:
                    dp.__setstate__(((batch_size, device, {key: item}), {}, {}))
                except Exception:  # noqa: BLE001
                    failing.append((key, item))
            if failing and (len(failing) < len(items) or len(items) == 1):
                key, item = failing[0]
                return UnsupportedCase(self.name, key, _encoded_feature(item),
                                       f"its __setstate__ raised {original}")
        return PicklescopeError(f"__setstate__ of {self.name} failed: {original}",
                                "no single leaf is to blame; see the traceback")


def register_candidate(patch: str | os.PathLike) -> str:
    """Make ``verl-<label>:<mode>+<stem>`` names resolvable in this process; returns the patch path."""
    path = str(Path(patch).expanduser().resolve())
    loader.patch_functions(path)
    for env in envs.installed():
        for mode in loader.MODES:
            _candidates[f"{env.codec_prefix}:{mode}+{Path(path).stem}"] = path
    return path


def installed_codecs() -> dict[str, Codec]:
    """The registry provider: two codecs per installed verl, plus the candidate patch if any."""
    out: dict[str, Codec] = {}
    patches = {p for p in _candidates.values()}
    if os.environ.get(PATCH_ENV):
        patches.add(os.environ[PATCH_ENV])
    for env in envs.installed():
        for mode in loader.MODES:
            out[f"{env.codec_prefix}:{mode}"] = VerlCodec(env, mode)
            for patch in sorted(patches):
                c = VerlCodec(env, mode, patch)
                out[c.name] = c
    return out


def split_name(name: str) -> tuple[str, str, str | None]:
    """``verl-0.9.0:numpy+fix`` -> (``0.9.0``, ``numpy``, ``fix``); a PicklescopeError if malformed."""
    if not name.startswith("verl-") or ":" not in name:
        raise PicklescopeError(f"{name!r} is not a verl codec name", "use verl-<version>:<torch|numpy>, "
                               "e.g. verl-0.9.0:numpy")
    label, _, rest = name[len("verl-"):].partition(":")
    mode, _, patch = rest.partition("+")
    if mode not in loader.MODES:
        raise PicklescopeError(f"{name!r}: unknown mode {mode!r}", "the mode is torch or numpy")
    return label, mode, patch or None
