"""verl's numpy mode with the receiver's copy taken out: the tempting optimisation, kept as a codec.

The numpy codec's receiver copies every received buffer into a ``bytearray`` (+P). Dropping that
copy (``torch.from_numpy`` straight on the received array) saves the memory, and over Ray it also
makes every received tensor a window into the shared object store: numpy's read-only flag is lost,
torch lets the tensor be written in place, and the write changes the stored object for every other
reader (:mod:`picklescope.ray.received` detects it and the Ray tests demonstrate it).
The sender is exactly :class:`~picklescope.codecs.numpy_codec.NumpyCodec`'s, so a blob is
interchangeable with verl's numpy mode.
"""

from __future__ import annotations

import warnings

import numpy as np
import torch

from picklescope.codecs.numpy_codec import SENDER_GAPS, NumpyCodec, dtype_from_name


def _dense_view(spec: tuple[str, tuple[int, ...], np.ndarray]) -> torch.Tensor:
    dtype_name, shape, array = spec
    with warnings.catch_warnings():  # "the given NumPy array is not writable": exactly the hazard
        warnings.simplefilter("ignore", UserWarning)
        flat = torch.from_numpy(np.asarray(array).reshape(-1))
    return flat.view(dtype_from_name(dtype_name)).reshape(shape)


def _leaf_view(spec: tuple) -> torch.Tensor:
    if spec[0] == "nested":
        _, layout, comps = spec
        parts = [_dense_view(c) for c in comps]  # nested constructors copy: only dense leaves share
        return torch.nested.nested_tensor(parts, layout=torch.jagged if layout == "jagged" else torch.strided)
    return _dense_view(spec[1:])


class NumpyZeroCopyCodec(NumpyCodec):
    name = "numpy-zerocopy"
    description = ("numpy mode without the receiver's copy: torch.from_numpy on the received arrays "
                   "(shares the sender's buffers / Ray's object store)")
    verl_equivalent = "not in verl: a receiver that skips the bytearray copy of numpy mode"
    unsupported = SENDER_GAPS  # numpy mode's sender and nested rebuild; from_numpy takes empty buffers

    receive_step = "from_numpy"

    def leaf_from_numpy(self, spec: tuple) -> torch.Tensor:
        return _leaf_view(spec)
