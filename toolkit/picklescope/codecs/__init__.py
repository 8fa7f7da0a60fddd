"""The codec registry: what ``Batch.__getstate__`` returns, selected by name.

Built-in codecs replicate verl's behaviours; third parties add their own through the entry-point
group ``picklescope.codecs`` or :func:`register_codec` (a candidate ``__getstate__`` from a notebook
cell, for example).
"""

from __future__ import annotations

from picklescope.batch import use_codec_lookup
from picklescope.codecs.base import FEATURES, Codec, ModeMismatch, Unsupported, batch_features, describe_state
from picklescope.codecs.numpy_codec import NumpyCodec, NumpyLegacyCodec
from picklescope.codecs.torch_codec import TorchCodec
from picklescope.codecs.zerocopy_codec import NumpyZeroCopyCodec
from picklescope.core.cache import CACHE_ENV, cache_problem
from picklescope.core.registry import Registry
from picklescope.errors import PicklescopeError, UnknownNameError

CODECS: Registry[Codec] = Registry("codec")
for _cls in (TorchCodec, NumpyLegacyCodec, NumpyCodec, NumpyZeroCopyCodec):
    CODECS.register(_cls.name, _cls())
# ``verl-<version>:<mode>`` for every verl installed with ``picklescope verl install``, named rather than imported:
# the real-verl codecs build on this package's base classes, so importing them here would close a cycle.
CODECS.add_provider("picklescope.verl.codec:installed_codecs")


def get_codec(name: str) -> Codec:
    """The codec called ``name``; an unknown name lists the known ones.

    A real verl codec (``verl-<version>:<mode>``) exists only when its version is in the cache; if the
    cache itself cannot be used, the error names the cache instead of calling the codec unknown.
    """
    try:
        return CODECS.get(name)
    except UnknownNameError:
        if name.startswith("verl-"):
            problem = cache_problem()
            if problem:
                label = name[len("verl-"):].partition(":")[0]
                raise PicklescopeError(f"codec {name!r} needs verl {label} from {problem}",
                                       f"point {CACHE_ENV} at a readable folder (or unset it), then run "
                                       f"'picklescope verl install {label}'") from None
        raise


use_codec_lookup(get_codec)  # Batch pickles through this registry from now on (batch.py says why it is handed in)


def register_codec(codec: Codec, *, replace: bool = False) -> Codec:
    """Add a codec instance under ``codec.name``."""
    return CODECS.register(codec.name, codec, replace=replace)


__all__ = [
    "CODECS", "FEATURES", "Codec", "ModeMismatch", "Unsupported", "batch_features", "describe_state",
    "get_codec", "register_codec",
]
