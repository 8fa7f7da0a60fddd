"""TransferQueue (the ``transferqueue`` package, the seed's "TQ"): the batch by field, not by pickle.

TransferQueue runs a controller actor and storage-unit actors on a Ray cluster; a producer writes a
TensorDict row by row (``kv_batch_put``), tensors travel over ZeroMQ to a storage unit's memory, and a
consumer reads them back (``kv_batch_get``). ``DataProto.__getstate__`` is never called, so the codec
does not apply (the result says so). Measured the same way as ``ray``: the driver (producer) as
``sender``, the receiver actor (consumer) as ``receiver``, and the storage unit's RSS as the store
between them, all on one clock. The transport itself is
:class:`~picklescope.ray.transport.TransferQueueTransport`; this module is what the driver and
the actor run.

It runs on one machine. Its wheel declares ``ray[default]`` (the full dashboard stack, which makes
Ray's start-up slower still) and ``hydra-core`` (which downgrades omegaconf), and it installs
top-level ``tests``/``scripts``/``recipe`` packages; at import it needs only ``msgspec`` beyond
picklescope's own dependencies. So it is installed apart, with ``--no-deps --target`` (see
:data:`INSTALL_HINT`), and put on the path of the run's processes only.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path
from typing import Any

from picklescope.batch import Batch
from picklescope.core import steps

TQ_VERSION = "0.1.11"
PARTITION = "picklescope"


def tq_dir() -> Path:
    """Where TransferQueue is installed apart: ``$PICKLESCOPE_TQ_DIR`` or ``<venv>/picklescope-tq``."""
    return Path(os.environ.get("PICKLESCOPE_TQ_DIR") or Path(sys.prefix) / "picklescope-tq")


INSTALL_HINT = (f"pip install --no-deps --target {tq_dir()} transferqueue=={TQ_VERSION} msgspec "
                "(not a plain install: its declared ray[default] and hydra-core would change this environment)")


def missing() -> str | None:
    """Why TransferQueue cannot be imported here (None: it can)."""
    path = [str(tq_dir()), *sys.path]
    for module in ("transfer_queue", "msgspec", "zmq", "omegaconf"):
        if importlib.machinery.PathFinder.find_spec(module, path) is None:
            return f"module {module!r} not found in {tq_dir()} or on sys.path"
    return None


# -- inside the driver and the actor ---------------------------------------------------------------
def activate() -> Any:
    """Put the separate install on this process's path and import TransferQueue."""
    d = str(tq_dir())
    if d not in sys.path:
        sys.path.insert(0, d)
    import transfer_queue

    return transfer_queue


def start(conn: Any) -> int | None:
    """Driver: start the controller and one storage unit; returns the storage unit's pid."""
    import ray

    tq = activate()
    tq.init({"backend": {"SimpleStorage": {"num_data_storage_units": 1}}})
    from transfer_queue import interface

    handles = list(((interface._TQ_STORAGE or {}).get("SimpleStorage") or {}).values())
    if not handles:
        return None
    return ray.get(handles[0].__ray_call__.remote(lambda self: os.getpid()))


def keys_for(n: int) -> list[str]:
    return [f"row{i}" for i in range(n)]


def fields_of(batch: Any) -> Any:
    """The batch as one TensorDict of rows: its tensors plus each non-tensor column as a NonTensorStack."""
    from tensordict import NonTensorStack, TensorDict

    td = TensorDict({k: v for k, v in batch.batch.items()}, batch_size=batch.batch.batch_size)
    for key, values in batch.non_tensor_batch.items():
        td[f"non_tensor__{key}"] = NonTensorStack(*list(values))
    return td


def put(batch: Any) -> list[str]:
    """Driver, measured: write every row of the batch; returns the keys."""
    tq = activate()
    n = int(batch.batch.batch_size[0])
    keys = keys_for(n)
    with steps.step("kv_batch_put"):
        tq.kv_batch_put(keys=keys, partition_id=PARTITION, fields=fields_of(batch))
    return keys


def _dense(t: Any, shape: list[int]) -> Any:
    """A stored field back in the sent shape: a view of TransferQueue's buffer when possible."""
    import torch

    if getattr(t, "is_nested", False):
        if t.layout == torch.jagged:
            values = t.values()
            if values.is_contiguous() and values.numel() == _numel(shape):
                return values.view(shape)
        return torch.stack(t.unbind()).reshape(shape)
    return t.reshape(shape)


def _numel(shape: list[int]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def get(keys: list[str], layout: dict[str, Any], meta_info: dict[str, Any]) -> Any:
    """Receiver, measured: read the rows back and rebuild the Batch (tensors, non-tensor columns, meta)."""
    import numpy as np
    from tensordict import TensorDict


    tq = activate()
    with steps.step("kv_batch_get"):
        got = tq.kv_batch_get(keys=keys, partition_id=PARTITION)
    with steps.step("to_dense"):
        tensors = {k: _dense(got[k], shape) for k, shape in layout["tensors"].items()}
        td = TensorDict(tensors, batch_size=layout["batch_size"], device=layout["device"])
    non_tensor = {}
    for key in layout["non_tensor"]:
        stack = got[f"non_tensor__{key}"]
        items = stack.tolist() if hasattr(stack, "tolist") else list(stack)
        arr = np.empty(len(items), dtype=object)
        arr[:] = items
        non_tensor[key] = arr
    return Batch(batch=td, non_tensor_batch=non_tensor, meta_info=meta_info)


def layout_of(batch: Any) -> dict[str, Any]:
    """What the receiver needs to rebuild the batch (shapes, batch size, non-tensor column names)."""
    td = batch.batch
    return {"tensors": {k: list(v.shape) for k, v in td.items()}, "batch_size": list(td.batch_size),
            "device": None if td.device is None else str(td.device), "non_tensor": list(batch.non_tensor_batch)}


def close() -> None:
    """Driver: stop TransferQueue's actors before the cluster goes (best effort; the parent reaps)."""
    try:
        activate().close()
    except Exception:  # noqa: BLE001
        pass
