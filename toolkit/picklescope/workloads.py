"""Named, seeded workloads: what a training batch looks like, scaled on its batch dimension.

A workload is a small YAML file (``data/workloads/NAME.yaml``); a user passes a name or a path to a
file of their own in the same format. The payload size is computed from the spec before anything is
allocated, so budgets given as a multiple of the payload and the "does this fit the machine" check
happen before a child process spends memory. Errors in a file name the field and its line.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .errors import PicklescopeError, UnknownNameError

DATA_DIR = Path(__file__).resolve().parents[2] / "data"
WORKLOAD_DIR = DATA_DIR / "workloads"
DEFAULT_WORKLOAD = "flowgrpo"
KINDS = ("dense", "non-contiguous", "jagged-nested", "strided-nested")
NON_TENSOR_KINDS = ("strings", "dicts", "ints")
_ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16,
}


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int | str, ...]  # "N" is the batch dimension, "J" the jagged one
    dtype: str
    kind: str = "dense"
    high: int = 2
    min_len: int = 1
    max_len: int = 8


@dataclass(frozen=True)
class NonTensorSpec:
    name: str
    kind: str
    length: int = 8


@dataclass(frozen=True)
class Workload:
    """A parsed workload spec; :meth:`build` makes the batch, :meth:`payload_bytes` predicts its size."""

    name: str
    description: str
    batch_size: int
    seed: int
    tensors: tuple[TensorSpec, ...]
    non_tensor: tuple[NonTensorSpec, ...] = ()
    meta_info: dict[str, Any] = field(default_factory=dict)
    source: str = ""

    def rows(self, scale: float) -> int:
        check_scale(scale)
        return max(1, int(round(self.batch_size * scale)))

    def jagged_lengths(self, spec: TensorSpec, n: int) -> list[int]:
        import random

        rng = random.Random(f"{self.seed}:{spec.name}")
        return [rng.randint(spec.min_len, spec.max_len) for _ in range(n)]

    def leaf_bytes(self, spec: TensorSpec, scale: float) -> int:
        n = self.rows(scale)
        inner = math.prod(int(d) for d in spec.shape[1:] if d not in ("N", "J"))
        if spec.kind in ("jagged-nested", "strided-nested"):
            return sum(self.jagged_lengths(spec, n)) * inner * _ITEMSIZE[spec.dtype]
        return n * inner * _ITEMSIZE[spec.dtype]

    def payload_bytes(self, scale: float = 1.0) -> int:
        """Bytes of tensor data at ``scale`` (the P in "+P"), computed without allocating."""
        return sum(self.leaf_bytes(s, scale) for s in self.tensors)

    def build(self, scale: float = 1.0):  # -> Batch
        """Allocate the batch deterministically (same seed and scale, same bytes)."""
        from .workload_build import build_batch

        return build_batch(self, scale)


def check_scale(scale: float) -> None:
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise PicklescopeError(f"scale {scale!r} must be a positive number", "use e.g. --scale 0.25 or --scale 1")


def available_workloads() -> list[str]:
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))


def load_workload(name_or_path: str | Path) -> Workload:
    """A preset by name (``flowgrpo``) or a user's YAML file by path."""
    if isinstance(name_or_path, Workload):
        return name_or_path
    text = str(name_or_path)
    path = Path(text)
    if not (text.endswith((".yaml", ".yml")) or path.is_file()):
        path = WORKLOAD_DIR / f"{text}.yaml"
        if not path.is_file():
            raise UnknownNameError("workload", text, available_workloads() + ["(or a path to a .yaml file)"])
    if not path.is_file():
        raise PicklescopeError(f"workload file {text!r} does not exist", "check the path, or use a preset name")
    return parse_workload(path.read_text(), str(path))


def _fail(where: str, node: Any, msg: str) -> PicklescopeError:
    line = f" (line {node.start_mark.line + 1})" if node is not None and hasattr(node, "start_mark") else ""
    return PicklescopeError(f"workload {where}{line}: {msg}",
                            "fix that field; see data/workloads/tiny.yaml for the format")


def _mapping(node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, yaml.MappingNode):
        raise _fail(where, node, "must be a mapping")
    return {k.value: v for k, v in node.value}


def _scalar(node: Any, where: str, typ: type, required: bool = True, default: Any = None) -> Any:
    if node is None:
        if required:
            raise _fail(where, None, "is missing")
        return default
    try:
        value = yaml.safe_load(yaml.serialize(node))
    except yaml.YAMLError as exc:  # pragma: no cover - composed nodes always serialize
        raise _fail(where, node, str(exc)) from None
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or isinstance(value, bool) and typ is not bool:
        raise _fail(where, node, f"must be {typ.__name__}, got {value!r}")
    return value


def parse_workload(text: str, source: str = "<string>") -> Workload:
    """Parse and validate a workload file; errors name the field and the line."""
    try:
        root = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise PicklescopeError(f"workload file {source} is not valid YAML{at}",
                               "fix the syntax; see data/workloads/tiny.yaml for the format") from None
    top = _mapping(root, source)
    name = _scalar(top.get("name"), f"{source}: name", str)
    n = _scalar(top.get("batch_size"), f"{source}: batch_size", int)
    if n <= 0:
        raise _fail(f"{source}: batch_size", top.get("batch_size"), "must be a positive integer")
    seed = _scalar(top.get("seed"), f"{source}: seed", int, required=False, default=0)
    desc = _scalar(top.get("description"), f"{source}: description", str, required=False, default="")
    tensors = []
    for key, node in _mapping(top.get("tensors") or yaml.MappingNode("", []), f"{source}: tensors").items():
        where = f"{source}: tensors.{key}"
        f = _mapping(node, where)
        unknown = set(f) - {"shape", "dtype", "kind", "high", "min_len", "max_len"}
        if unknown:
            raise _fail(f"{where}.{sorted(unknown)[0]}", f[sorted(unknown)[0]], "unknown field")
        shape_node = f.get("shape")
        if not isinstance(shape_node, yaml.SequenceNode) or not shape_node.value:
            raise _fail(f"{where}.shape", shape_node or node, "must be a list starting with N")
        shape: list[int | str] = []
        for d in shape_node.value:
            v = yaml.safe_load(yaml.serialize(d))
            if not (v in ("N", "J") or (isinstance(v, int) and not isinstance(v, bool) and v >= 0)):
                raise _fail(f"{where}.shape", d, f"entries are N, J or integers >= 0, got {v!r}")
            shape.append(v)
        if shape[0] != "N":
            raise _fail(f"{where}.shape", shape_node, "the first dimension must be N (the batch dimension)")
        dtype = _scalar(f.get("dtype"), f"{where}.dtype", str)
        if dtype not in _ITEMSIZE:
            raise _fail(f"{where}.dtype", f.get("dtype"), f"unknown dtype {dtype!r}; known: {', '.join(_ITEMSIZE)}")
        kind = _scalar(f.get("kind"), f"{where}.kind", str, required=False, default="dense")
        if kind not in KINDS:
            raise _fail(f"{where}.kind", f.get("kind"), f"unknown kind {kind!r}; known: {', '.join(KINDS)}")
        nested = kind.endswith("nested")
        if nested != (len(shape) > 1 and shape[1] == "J") or shape.count("J") > 1 or ("J" in shape and not nested):
            raise _fail(f"{where}.shape", shape_node, "nested kinds need shape [N, J, ...]; only they may use J")
        if kind == "non-contiguous" and len(shape) < 3:
            raise _fail(f"{where}.shape", shape_node, "non-contiguous leaves need at least 3 dimensions")
        spec = TensorSpec(
            name=key, shape=tuple(shape), dtype=dtype, kind=kind,
            high=_scalar(f.get("high"), f"{where}.high", int, required=False, default=2),
            min_len=_scalar(f.get("min_len"), f"{where}.min_len", int, required=False, default=1),
            max_len=_scalar(f.get("max_len"), f"{where}.max_len", int, required=False, default=8),
        )
        if not 0 < spec.min_len <= spec.max_len:
            raise _fail(f"{where}.min_len", f.get("min_len") or node, "need 0 < min_len <= max_len")
        if spec.high < 1:
            raise _fail(f"{where}.high", f.get("high"), "must be >= 1")
        tensors.append(spec)
    non_tensor = []
    for key, node in _mapping(top.get("non_tensor") or yaml.MappingNode("", []), f"{source}: non_tensor").items():
        where = f"{source}: non_tensor.{key}"
        f = _mapping(node, where)
        kind = _scalar(f.get("kind"), f"{where}.kind", str)
        if kind not in NON_TENSOR_KINDS:
            raise _fail(f"{where}.kind", f.get("kind"), f"unknown kind {kind!r}; known: {', '.join(NON_TENSOR_KINDS)}")
        length = _scalar(f.get("length"), f"{where}.length", int, required=False, default=8)
        non_tensor.append(NonTensorSpec(key, kind, length))
    meta_node = top.get("meta_info")
    meta = yaml.safe_load(yaml.serialize(meta_node)) if meta_node is not None else {}
    if not isinstance(meta, dict):
        raise _fail(f"{source}: meta_info", meta_node, "must be a mapping")
    unknown = set(top) - {"name", "description", "batch_size", "seed", "tensors", "non_tensor", "meta_info"}
    if unknown:
        k = sorted(unknown)[0]
        raise _fail(f"{source}: {k}", top[k], "unknown field")
    return Workload(name, desc, n, seed, tuple(tensors), tuple(non_tensor), meta, source)
