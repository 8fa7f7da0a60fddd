"""What each real verl codec can carry: a round trip per leaf kind, in both modes, measured.

The replica codecs declare their gaps (``codecs/*.py``); here the real ``DataProto`` is asked. One
child per verl environment imports verl once and, because verl reads its mode variable at call time,
runs both modes: every leaf of the ``mixed`` workload alone, the whole ``mixed`` batch, and the leaf
kinds ``mixed`` lacks (strided nested, a sub-TensorDict, ``batch=None``, an empty TensorDict). Each
case is pickled with protocol 5 and out-of-band buffers (as Ray does) and unpickled in the same
child; the result is compared bit for bit with what was sent. A case the real code cannot carry is
reported with the leaf, the side and verl's own exception, never as a crash.

The child also checks when verl reads ``VERL_DATAPROTO_SERIALIZATION_METHOD``: it switches the
variable after import and looks at the shape of what ``__getstate__`` returns.
"""

from __future__ import annotations

import pickle
import warnings
from dataclasses import asdict, dataclass, field
from typing import Any

from picklescope.batch import Batch, set_active_codec
from picklescope.codecs import get_codec
from picklescope.codecs.base import batch_features
from picklescope.codecs.verify import compare, manifest
from picklescope.errors import PicklescopeError, UnsupportedCase
from picklescope.verl import childcall, envs, loader
from picklescope.verl.codec import VerlCodec, describe_verl_state, main_feature
from picklescope.workloads.spec import load_workload

EXTRA_CASES = ("strided-nested", "sub-tensordict", "batch-none", "empty-tensordict")


@dataclass
class Cell:
    case: str  # "leaf embeds_bf16", "whole mixed batch", "strided-nested", ...
    feature: str
    mode: str
    status: str  # ok | unsupported | mismatch | error
    side: str | None = None  # where it failed
    message: str = ""
    leaf: str | None = None  # the leaf the real code fails on


@dataclass
class MatrixResult:
    label: str
    version: str
    verl_file: str
    workload: str
    mode_read_at_call_time: bool | None
    cells: list[Cell] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def unsupported(self, mode: str, *, single_leaf_only: bool = True) -> set[str]:
        """Features whose case failed in ``mode`` (by default ignoring the whole-batch row)."""
        return {c.feature for c in self.cells if c.mode == mode and c.status == "unsupported"
                and not (single_leaf_only and c.case.startswith("whole"))}

    def cell(self, case: str, mode: str) -> Cell:
        return next(c for c in self.cells if c.case == case and c.mode == mode)


def replica_for(version: str, mode: str) -> str:
    """The replica codec that models this verl version and mode."""
    if mode == "torch":
        return "torch"
    try:
        parts = tuple(int(x) for x in version.split(".")[:3])
    except ValueError:
        return "numpy"
    return "numpy-legacy" if parts <= (0, 9, 0) else "numpy"


def _cases(workload: str, scale: float) -> list[tuple[str, str, Any]]:
    import torch
    from tensordict import TensorDict


    full = load_workload(workload).build(scale)
    n = int(full.batch.batch_size[0])
    feats = batch_features(full)
    cases: list[tuple[str, str, Any]] = []
    for key in list(full.batch.keys()):  # iterating a TensorDict itself walks its batch dimension
        one = Batch(batch=full.batch.select(key), non_tensor_batch={}, meta_info={})
        cases.append((f"leaf {key}", main_feature(feats[key]), one))
    small = TensorDict({"ids": torch.arange(n)}, batch_size=[n])
    cases.append(("non_tensor_batch", "object-arrays", Batch(small, dict(full.non_tensor_batch), dict(full.meta_info))))
    cases.append((f"whole {workload} batch", "all", full))
    g = torch.Generator().manual_seed(5)
    parts = [torch.randn(i % 3 + 1, 4, generator=g) for i in range(n)]
    with warnings.catch_warnings():  # torch calls the strided layout a prototype; that is the point here
        warnings.simplefilter("ignore")
        strided = torch.nested.nested_tensor(parts, layout=torch.strided)
    extra = {
        "strided-nested": TensorDict({"nested": strided}, [n]),
        "sub-tensordict": TensorDict({"sub": TensorDict({"x": torch.randn(n, 3, generator=g)}, [n])}, [n]),
        "batch-none": None,
        "empty-tensordict": TensorDict({}, batch_size=[n]),
    }
    for feature in EXTRA_CASES:
        non_tensor = dict(full.non_tensor_batch) if feature == "batch-none" else {}
        cases.append((feature, feature, Batch(extra[feature], non_tensor, {})))
    return cases


def _round_trip(codec_name: str, batch: Any) -> tuple[str, str | None, str, str | None]:
    expected = manifest(batch)
    set_active_codec(codec_name)
    side = "sender"
    try:
        buffers: list[pickle.PickleBuffer] = []
        data = pickle.dumps(batch, protocol=5, buffer_callback=buffers.append)
        side = "receiver"
        got = pickle.loads(data, buffers=buffers)
    except UnsupportedCase as exc:
        return "unsupported", side, str(exc), exc.leaf
    except PicklescopeError as exc:
        return "error", side, str(exc), None
    except Exception as exc:  # noqa: BLE001 - reported as a cell, not raised
        return "error", side, f"{type(exc).__name__}: {exc}", None
    finally:
        set_active_codec(None)
    problems = compare(expected, got)
    return ("mismatch", "receiver", "; ".join(problems), None) if problems else ("ok", None, "", None)


def _mode_read_at_call_time(codec: Any) -> bool:
    """Switch the variable after import and see whether ``__getstate__`` follows it."""
    import torch
    from tensordict import TensorDict


    dp = codec.to_dataproto(Batch(TensorDict({"x": torch.zeros(2, 2)}, [2]), {}, {}))
    seen = []
    for mode in ("numpy", "torch", "numpy"):
        loader.set_mode(mode)
        seen.append(describe_verl_state(dp.__getstate__()))
    return seen == ["numpy", "torch", "numpy"]


def matrix_in_child(label: str, workload: str = "mixed", scale: float = 1.0) -> dict[str, Any]:
    """Child side: import this verl once, run every case in both modes."""
    env = envs.get_env(label)
    codecs = {mode: VerlCodec(env, mode) for mode in loader.MODES}
    info = codecs["numpy"].prepare()
    result = MatrixResult(label, info["verl_version"], info["verl_file"], workload,
                          _mode_read_at_call_time(codecs["numpy"]))
    for case, feature, batch in _cases(workload, scale):
        for mode, codec in codecs.items():
            result.cells.append(Cell(case, feature, mode, *_round_trip(codec.name, batch)))
    return result.to_dict()


def capability_matrix(label: str, workload: str = "mixed", scale: float = 1.0) -> MatrixResult:
    """The measured matrix of verl ``label`` (both modes), computed in one fresh child."""
    d = childcall.call("picklescope.verl.matrix.matrix_in_child", label=label, workload=workload, scale=scale)
    cells = [Cell(**c) for c in d.pop("cells")]
    return MatrixResult(**d, cells=cells)


def _short(c: Cell) -> str:
    if c.status == "ok":
        return "ok"
    why = c.message.split(" raised ", 1)[-1].split(": drop or convert")[0]
    why = why if len(why) <= 60 else why[:57] + "..."
    where = f"{c.side}, leaf {c.leaf}" if c.case.startswith("whole") else c.side
    return f"{c.status} ({where}): {why}"


def matrix_rows(r: MatrixResult) -> list[dict[str, Any]]:
    """One row per case: each mode's status, and whether the matching replica codec declares the same."""
    rows = []
    for case in dict.fromkeys(c.case for c in r.cells):
        row: dict[str, Any] = {"case": case}
        agree = []
        for mode in ("torch", "numpy"):
            c = r.cell(case, mode)
            row["feature"] = c.feature
            row[mode] = _short(c)
            if c.feature != "all" and c.status in ("ok", "unsupported"):
                declared = not get_codec(replica_for(r.version, mode)).supports(c.feature)
                agree.append(declared == (c.status == "unsupported"))
        row["replica codecs"] = "-" if not agree else ("agree" if all(agree) else "DIFFER")
        rows.append(row)
    return rows
