"""The codec's side of a node's loop: real verl's ``DataProto`` with a verl codec, else the toolkit's Batch.

The driver wraps the workload's batch, splits it among the workers and joins their results; each
worker builds its small result. With a ``verl-<version>:<mode>`` codec all of it is verl's own code
(``DataProto.chunk``, ``DataProto.concat``), instrumented with step markers only; with a built-in
codec the split and join follow the same shape on :class:`~picklescope.batch.Batch`.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from picklescope.batch import Batch, set_active_codec
from picklescope.codecs import get_codec
from picklescope.codecs.base import PreparesInChild
from picklescope.investigate.node_verl import mark_chunk_and_concat
from picklescope.verl import loader
from picklescope.verl.codec import VerlCodec


class NodeData:
    """One codec's batch operations in this process (the driver's or a worker's)."""

    def __init__(self, codec_name: str) -> None:
        self.codec = get_codec(codec_name)
        self.info = self.codec.prepare() if isinstance(self.codec, PreparesInChild) else None
        set_active_codec(codec_name)
        self.verl_cls = None
        if isinstance(self.codec, VerlCodec):
            self.verl_cls = loader.loaded().DataProto
            for name in ("__getstate__", "__setstate__"):  # where the chunks are serialized and read
                loader.mark_step(self.verl_cls, name)
            mark_chunk_and_concat(self.verl_cls)

    def split_join(self) -> dict[str, Any]:
        """Whose functions split the batch and join the results (the ``engine`` entry of the result)."""
        if self.verl_cls is None:
            return {"chunk": "TensorDict.chunk", "concat": "torch.cat", "data_class": "picklescope.batch.Batch"}
        return {"chunk": f"{self.verl_cls.__module__}.DataProto.chunk",
                "concat": f"{self.verl_cls.__module__}.DataProto.concat",
                "data_class": f"{self.verl_cls.__module__}.DataProto", "data_file": inspect.getfile(self.verl_cls)}

    def wrap(self, b: Any) -> Any:
        """The workload's batch as this codec's data (a verl ``DataProto``, or the Batch as it is)."""
        return self.codec.to_dataproto(b) if isinstance(self.codec, VerlCodec) else b

    def chunk(self, data: Any, n: int) -> list[Any]:
        """``n`` pieces along the rows (verl's ``DataProto.chunk``, or the same split of a Batch)."""
        if self.verl_cls is not None:
            return data.chunk(n)
        tds = data.batch.chunk(n, dim=0)
        sizes = [int(t.batch_size[0]) for t in tds]
        cuts = list(np.cumsum(sizes)[:-1])
        nts: list[dict[str, Any]] = [{} for _ in tds]
        for key, arr in data.non_tensor_batch.items():
            for i, part in enumerate(np.split(arr, cuts)):
                nts[i][key] = part
        return [Batch(td, nts[i], dict(data.meta_info)) for i, td in enumerate(tds)]

    def concat(self, parts: list[Any]) -> Any:
        """The workers' results joined (verl's ``DataProto.concat``, or ``torch.cat`` of the tensors)."""
        if self.verl_cls is not None:
            return self.verl_cls.concat(parts)
        import torch  # deferred: heavy, and only the node's processes compute

        return Batch(torch.cat([p.batch for p in parts], dim=0), {}, dict(parts[0].meta_info))

    def result(self, rows: int, width: int, dtype: Any) -> Any:
        """A worker's small per-token result: ``rows`` x ``width`` of ``dtype``."""
        import torch  # deferred: heavy, and only the node's processes compute
        from tensordict import TensorDict  # deferred with torch

        td = TensorDict({"old_log_probs": torch.full((rows, width), 1, dtype=dtype)}, batch_size=[rows])
        if self.verl_cls is not None:
            return self.verl_cls(batch=td, non_tensor_batch={}, meta_info={})
        return Batch(td, {}, {})
