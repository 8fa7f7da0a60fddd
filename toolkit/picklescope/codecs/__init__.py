"""The codec registry: what ``Batch.__getstate__`` returns, selected by name.

Built-in codecs replicate verl's behaviours; third parties add their own through the entry-point
group ``picklescope.codecs`` or :func:`register_codec` (a candidate ``__getstate__`` from a notebook
cell, for example).
"""

from __future__ import annotations

from picklescope.codecs.base import FEATURES, Codec, ModeMismatch, Unsupported, batch_features, describe_state
from picklescope.codecs.numpy_codec import NumpyCodec, NumpyLegacyCodec
from picklescope.codecs.torch_codec import TorchCodec
from picklescope.codecs.zerocopy_codec import NumpyZeroCopyCodec
from picklescope.core.registry import Registry
from picklescope.errors import PicklescopeError, UnknownNameError

CODECS: Registry[Codec] = Registry("codec")
for _cls in (TorchCodec, NumpyLegacyCodec, NumpyCodec, NumpyZeroCopyCodec):
    CODECS.register(_cls.name, _cls())


def _real_verl_codecs() -> dict[str, Codec]:
    """``verl-<version>:<mode>`` for every verl installed with ``picklescope verl install``."""
    from picklescope.verl.codec import installed_codecs

    return installed_codecs()


CODECS.add_provider(_real_verl_codecs)


def get_codec(name: str) -> Codec:
    """The codec called ``name``; an unknown name lists the known ones.

    A real verl codec (``verl-<version>:<mode>``) exists only when its version is in the cache; if the
    cache itself cannot be used, the error names the cache instead of calling the codec unknown.
    """
    try:
        return CODECS.get(name)
    except UnknownNameError:
        if name.startswith("verl-"):
            from picklescope.verl.envs import CACHE_ENV, cache_problem

            problem = cache_problem()
            if problem:
                label = name[len("verl-"):].partition(":")[0]
                raise PicklescopeError(f"codec {name!r} needs verl {label} from {problem}",
                                       f"point {CACHE_ENV} at a readable folder (or unset it), then run "
                                       f"'picklescope verl install {label}'") from None
        raise


def register_codec(codec: Codec, *, replace: bool = False) -> Codec:
    """Add a codec instance under ``codec.name``."""
    return CODECS.register(codec.name, codec, replace=replace)


__all__ = [
    "CODECS", "FEATURES", "Codec", "ModeMismatch", "Unsupported", "batch_features", "describe_state",
    "get_codec", "register_codec",
]
