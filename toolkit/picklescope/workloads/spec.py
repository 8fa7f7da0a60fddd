"""Named, seeded workloads: what a training batch looks like, scaled on its batch dimension.

A workload is a small YAML file (``data/workloads/NAME.yaml``); a user passes a name or a path to a
file of their own in the same format. The payload size is computed from the spec before anything is
allocated, so budgets given as a multiple of the payload and the "does this fit the machine" check
happen before a child process spends memory. Errors in a file name the field and its line.

This module owns the format both ways: :func:`parse_workload` reads it, :func:`workload_text` writes it
(for ``workload from`` and the capture probe) and checks what it wrote with the same parser.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from picklescope.core.paths import DATA_DIR  # noqa: F401 - re-exported: the package data folder
from picklescope.core.safefile import WORKLOAD_LIMIT, read_text
from picklescope.core.units import (
    fmt_bytes,
    require_tensor_payload,  # noqa: F401 - re-exported: headroom imports it from here
)
from picklescope.errors import PicklescopeError, UnknownNameError, safe_text

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
        """Rows of the batch at ``scale``; refused (before anything is enumerated) above :data:`MAX_ROWS`."""
        check_scale(scale)
        exact = self.batch_size * scale
        if not math.isfinite(exact) or exact > MAX_ROWS:
            raise PicklescopeError(
                f"workload {safe_text(self.name, 80)!r} at scale {scale:g} has {_count(exact)} rows, more than the "
                f"{MAX_ROWS:,} a batch may have", "use a smaller --scale or batch_size")
        return max(1, int(round(exact)))

    def jagged_lengths(self, spec: TensorSpec, n: int) -> list[int]:
        """Per-row lengths of a nested leaf (deterministic); bounded by :data:`MAX_NESTED_ROWS` rows."""
        import random

        if n > MAX_NESTED_ROWS:
            raise _too_many_nested(self, spec, n)
        rng = random.Random(f"{self.seed}:{spec.name}")
        return [rng.randint(spec.min_len, spec.max_len) for _ in range(n)]

    def leaf_bounds(self, spec: TensorSpec, scale: float) -> tuple[int, int]:
        """(least, most) bytes the leaf can have at ``scale``, by arithmetic alone (nothing enumerated)."""
        n = self.rows(scale)
        inner = math.prod(int(d) for d in spec.shape[1:] if d not in ("N", "J")) * _ITEMSIZE[spec.dtype]
        if spec.kind in ("jagged-nested", "strided-nested"):
            return n * spec.min_len * inner, n * spec.max_len * inner
        return n * inner, n * inner

    def leaf_bytes(self, spec: TensorSpec, scale: float) -> int:
        low, high = self.leaf_bounds(spec, scale)
        if low == high:
            return low
        n = self.rows(scale)
        inner = low // (n * spec.min_len)
        return sum(self.jagged_lengths(spec, n)) * inner

    def payload_bytes(self, scale: float = 1.0) -> int:
        """Bytes of tensor data at ``scale`` (the P in "+P"), computed without allocating.

        The least the batch can hold is checked against the machine's physical memory first, by
        arithmetic, so an absurd batch size is refused at once instead of after enumerating its rows.
        """
        least = sum(self.leaf_bounds(s, scale)[0] for s in self.tensors)
        n = self.rows(scale)
        least += n * sum(s.length + 64 for s in self.non_tensor)  # each row of a non-tensor column is an object
        physical = physical_memory()
        if physical and least > physical:
            raise PicklescopeError(
                f"workload {safe_text(self.name, 80)!r} at scale {scale:g} ({n:,} rows) needs at least "
                f"{fmt_bytes(least)}, more than this machine's {fmt_bytes(physical)} of memory",
                "use a smaller --scale or batch_size")
        return sum(self.leaf_bytes(s, scale) for s in self.tensors)

    def build(self, scale: float = 1.0):  # -> Batch
        """Allocate the batch deterministically (same seed and scale, same bytes)."""
        # Deferred on purpose: build imports torch, which reading a spec and predicting its payload never need.
        from picklescope.workloads.build import build_batch

        return build_batch(self, scale)


def check_scale(scale: float) -> None:
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not math.isfinite(scale) or scale <= 0:
        raise PicklescopeError(f"scale {scale!r} must be a positive number", "use e.g. --scale 0.25 or --scale 1")


def _count(x: float) -> str:
    return f"{x:,.0f}" if math.isfinite(x) and x < 1e21 else f"{x:.3g}"


def _too_many_nested(w: Workload, spec: TensorSpec, n: int) -> PicklescopeError:
    return PicklescopeError(
        f"workload {safe_text(w.name, 80)!r}: nested leaf {safe_text(spec.name, 80)!r} would have {n:,} rows, more "
        f"than the {MAX_NESTED_ROWS:,} whose lengths picklescope draws", "use a smaller --scale or batch_size")


def physical_memory() -> int:
    """This machine's physical memory in bytes (0 if unknown); a bound no batch can exceed."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 0


def available_workloads() -> list[str]:
    return sorted(p.stem for p in WORKLOAD_DIR.glob("*.yaml"))


def load_workload(name_or_path: str | Path) -> Workload:
    """A preset by name (``flowgrpo``) or a user's YAML file by path.

    A path is read only if it is a regular file of at most :data:`~picklescope.core.safefile.WORKLOAD_LIMIT`
    bytes (a FIFO, a folder or a link to ``/dev/zero`` is named as such, never read).
    """
    if isinstance(name_or_path, Workload):
        return name_or_path
    text = os.fspath(name_or_path)
    if not isinstance(text, str):
        raise PicklescopeError(f"workload {safe_text(repr(text), 80)} is not a name or a path",
                               "give a preset name such as tiny, or a path to a .yaml file")
    is_path = text.endswith((".yaml", ".yml")) or os.sep in text or os.path.lexists(text)
    if not is_path:
        path = WORKLOAD_DIR / f"{text}.yaml"
        if not path.is_file():
            raise UnknownNameError("workload", text, available_workloads() + ["(or a path to a .yaml file)"])
        text = str(path)
    elif not os.path.lexists(text):
        raise PicklescopeError(f"workload file {safe_text(text, 300)!r} does not exist",
                               "check the path, or use a preset name")
    source = str(Path(text).absolute())  # children (a Ray worker, a node's driver) run from other folders
    return parse_workload(read_text(text, "workload file", WORKLOAD_LIMIT, "check the path, or use a preset name"),
                          source)


# -- bounds every workload is checked against before a child starts ---------------------------------
MAX_ROWS = 2**40  # rows of a batch at its scale
MAX_NESTED_ROWS = 1_000_000  # rows whose lengths are drawn one by one (nested leaves)
MAX_DIMS = 16  # entries of a shape
MAX_DIM = 2**40  # one dimension
MAX_LEN = 2**31 - 1  # min_len / max_len of a nested leaf
MAX_STRING = 1 << 20  # length of one generated string of a non-tensor column
MAX_LEAVES = 4096  # tensors + non-tensor columns
MAX_SEED = 2**32 - 1
MAX_DEPTH = 32  # nesting of YAML collections
MAX_NAME = 200  # characters of a name or key
_INT_RANGE = {"int8": 2**7, "int16": 2**15, "int32": 2**31, "int64": 2**63, "uint8": 2**8}
_FORMAT = "fix that field; see data/workloads/tiny.yaml for the format"
_CONTROL_IN_NAME = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


class _Refused(Exception):
    """Raised inside the loader; turned into a PicklescopeError naming the file and the line."""

    def __init__(self, mark: Any, problem: str, way_out: str) -> None:
        super().__init__(problem)
        self.mark, self.problem, self.way_out = mark, problem, way_out


class WorkloadLoader(yaml.SafeLoader):
    """PyYAML's safe loader, stricter: what a workload file does not need is refused, not interpreted.

    - aliases and anchors (``&a`` / ``*a``): an alias bomb of a few hundred bytes expands to gigabytes;
    - explicit tags (``!!python/object``, ``!!str``, ``!custom``): a workload is plain data;
    - duplicate keys: YAML keeps the last silently, hiding a mistake;
    - keys that are not strings (``1:``, ``[a]:``, ``{}:``): a leaf or field name is a string;
    - collections nested deeper than :data:`MAX_DEPTH` (each level costs the parser stack).
    Each refusal names its line (:func:`parse_workload` turns it into one error line).
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - PyYAML's hook
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            raise _Refused(event.start_mark, f"uses the alias *{safe_text(event.anchor, 40)}; aliases and anchors "
                           "are refused (they can expand a small file into gigabytes)",
                           "write the value out in full where it is needed")
        if getattr(event, "anchor", None) is not None:
            raise _Refused(event.start_mark, f"defines the anchor &{safe_text(event.anchor, 40)}; aliases and "
                           "anchors are refused (they can expand a small file into gigabytes)",
                           "remove the anchor and write each value out in full")
        tag = getattr(event, "tag", None)
        if tag is not None and not (isinstance(event, yaml.ScalarEvent) and tag == "!" and event.implicit[1]):
            raise _Refused(event.start_mark, f"carries the tag {safe_text(tag, 60)}; tags are refused (a workload "
                           "is plain data: numbers, strings, lists and mappings)",
                           "remove the tag (for a string, quote the value instead)")
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _Refused(event.start_mark, f"nests lists and mappings more than {MAX_DEPTH} levels deep",
                               "flatten the structure")
            try:
                return super().compose_node(parent, index)
            finally:
                self._depth -= 1
        return super().compose_node(parent, index)

    def compose_mapping_node(self, anchor: Any) -> Any:  # noqa: D102 - PyYAML's hook
        node = super().compose_mapping_node(anchor)
        seen: dict[str, Any] = {}
        for key, _ in node.value:
            if not (isinstance(key, yaml.ScalarNode) and key.tag == "tag:yaml.org,2002:str"):
                shown = (f"the key {safe_text(key.value, 60)}" if isinstance(key, yaml.ScalarNode)
                         else "a " + ("list" if isinstance(key, yaml.SequenceNode) else "mapping") + " as a key")
                raise _Refused(key.start_mark, f"has {shown}, which is not a string",
                               "use a plain name as the key (quote it if it looks like a number)")
            if key.value in seen:
                raise _Refused(key.start_mark, f"repeats the key {safe_text(key.value, 60)!r} (first at line "
                               f"{seen[key.value].line + 1}); YAML would silently keep only the last",
                               "keep one of them")
            seen[key.value] = key.start_mark
        return node


_DECIMAL_INT = re.compile(r"^[-+]?(0|[1-9][0-9_]*)$")
_BASE60 = re.compile(r"^[-+]?[0-9][0-9_]*(:[0-5]?[0-9])+(\.[0-9_]*)?$")


def _yaml11_int(loader: WorkloadLoader, node: Any) -> int:
    """Integers in decimal only: YAML 1.1 reads ``1:30`` as 90 (base 60), ``0x10`` as 16, ``010`` as 8."""
    value = yaml.SafeLoader.construct_yaml_int(loader, node)
    text = str(node.value)
    if not _DECIMAL_INT.match(text):
        kind = ("base 60" if ":" in text else "hexadecimal" if "x" in text.lower() else
                "binary" if "b" in text.lower() else "octal")
        raise ValueError(f"{text} is {kind} in YAML 1.1, i.e. {value}; write {value}, or quote \"{text}\" for a string")
    return value


def _yaml11_float(loader: WorkloadLoader, node: Any) -> float:
    """Floats: YAML 1.1 reads ``1:30.5`` as 90.5 (base 60)."""
    value = yaml.SafeLoader.construct_yaml_float(loader, node)
    text = str(node.value)
    if _BASE60.match(text):
        raise ValueError(f"{text} is base 60 in YAML 1.1, i.e. {value}; write {value}, or quote \"{text}\" for a "
                         "string")
    return value


WorkloadLoader.add_constructor("tag:yaml.org,2002:int", _yaml11_int)
WorkloadLoader.add_constructor("tag:yaml.org,2002:float", _yaml11_float)


def _fail(where: str, node: Any, msg: str) -> PicklescopeError:
    line = f" (line {node.start_mark.line + 1})" if node is not None and hasattr(node, "start_mark") else ""
    return PicklescopeError(f"workload {where}{line}: {msg}", _FORMAT)


def _shown(value: Any) -> str:
    return safe_text(repr(value), 80)


def _mapping(node: Any, where: str) -> dict[str, Any]:
    if not isinstance(node, yaml.MappingNode):
        raise _fail(where, node, "must be a mapping")
    return {k.value: v for k, v in node.value}


class _Values:
    """Python values of composed nodes, built by the strict loader's constructor; failures are one line."""

    def __init__(self, loader: WorkloadLoader) -> None:
        self.loader = loader

    def __call__(self, node: Any, where: str) -> Any:
        try:
            return self.loader.construct_object(node, deep=True)
        except (yaml.YAMLError, ValueError, OverflowError, TypeError, RecursionError) as exc:
            raise _fail(where, node, f"cannot be read ({safe_text(str(exc).splitlines()[0] if str(exc) else exc, 120)})"
                        ) from None


def _scalar(value_of: _Values, node: Any, where: str, typ: type, required: bool = True, default: Any = None,
            low: int | float | None = None, high: int | float | None = None) -> Any:
    if node is None:
        if required:
            raise _fail(where, None, "is missing")
        return default
    if not isinstance(node, yaml.ScalarNode):
        got = "list" if isinstance(node, yaml.SequenceNode) else "mapping"
        raise _fail(where, node, f"must be {typ.__name__}, got a {got}")
    value = value_of(node, where)
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, typ) or isinstance(value, bool) and typ is not bool:
        raise _fail(where, node, f"must be {typ.__name__}, got {_shown(value)}")
    if low is not None and value < low or high is not None and value > high:
        raise _fail(where, node, f"must be from {low:,} to {high:,}, got {_shown(value)}")
    return value


def _name(value: str, node: Any, where: str) -> str:
    if not value or len(value) > MAX_NAME or _CONTROL_IN_NAME.search(value):
        raise _fail(where, node, f"{_shown(value)} must be 1 to {MAX_NAME} characters without control characters "
                    "(they would be printed to the terminal)")
    _encodable(value, node, where)
    return value


def _encodable(value: Any, node: Any, where: str) -> None:
    """Strings must be writable as UTF-8 (a YAML escape such as "\\ud800" makes a lone surrogate, which no
    terminal, JSON file or report can be sent); containers are checked through."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise _fail(where, node, f"{_shown(value)} holds the lone surrogate \\u{ord(value[exc.start]):04x}, "
                        "which cannot be written as UTF-8") from None
    elif isinstance(value, dict):
        for k, v in value.items():
            _encodable(k, node, where)
            _encodable(v, node, where)
    elif isinstance(value, (list, tuple)):
        for v in value:
            _encodable(v, node, where)


def check_name(name: str, what: str = "name", way_out: str = _FORMAT) -> str:
    """``name`` if it may name a workload (1 to 200 characters, printable, UTF-8); else one line naming ``what``."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME or _CONTROL_IN_NAME.search(name):
        raise PicklescopeError(f"{what} {_shown(name)} must be 1 to {MAX_NAME} characters without control characters",
                               way_out)
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        raise PicklescopeError(f"{what} {_shown(name)} holds a lone surrogate, which cannot be written as UTF-8",
                               way_out) from None
    return name


def parse_workload(text: str, source: str = "<string>") -> Workload:
    """Parse and validate a workload file; errors name the field and the line.

    Every bound a child relies on (rows, dims, nested lengths, ``high`` within the dtype's range, the
    seed's range, string lengths) is checked here, before any process starts or anything is allocated.
    """
    if not isinstance(text, str):
        raise PicklescopeError(f"workload {safe_text(source, 300)} is not text", "give the YAML file's text")
    source = safe_text(source, 300)
    loader = None
    try:
        try:
            loader = WorkloadLoader(text)  # its reader refuses control characters at once
            root = loader.get_single_node()
        except _Refused as exc:
            line = f" (line {exc.mark.line + 1})" if exc.mark is not None else ""
            raise PicklescopeError(f"workload {source}{line} {exc.problem}", exc.way_out) from None
        except yaml.reader.ReaderError as exc:
            line = text.count("\n", 0, exc.position) + 1
            raise PicklescopeError(f"workload file {source} is not valid YAML at line {line}: it holds the control "
                                   f"character 0x{exc.character:02x} at offset {exc.position}",
                                   "remove it (a workload file is plain text)") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            at = f" at line {mark.line + 1}" if mark else ""
            what = safe_text(getattr(exc, "problem", None) or type(exc).__name__, 120)
            raise PicklescopeError(f"workload file {source} is not valid YAML{at} ({what})",
                                   "fix the syntax; see data/workloads/tiny.yaml for the format") from None
        except RecursionError:
            raise PicklescopeError(f"workload file {source} nests too deeply to parse",
                                   "flatten the structure") from None
        return _parse(root, _Values(loader), source)
    finally:
        if loader is not None:
            loader.dispose()


def _parse(root: Any, value_of: _Values, source: str) -> Workload:
    if root is None:
        raise PicklescopeError(f"workload file {source} is empty", "see data/workloads/tiny.yaml for the format")
    top = _mapping(root, source)
    unknown = set(top) - {"name", "description", "batch_size", "seed", "tensors", "non_tensor", "meta_info"}
    if unknown:
        k = sorted(unknown)[0]
        raise _fail(f"{source}: {safe_text(k, 60)}", top[k], "unknown field")
    name = _name(_scalar(value_of, top.get("name"), f"{source}: name", str), top.get("name"), f"{source}: name")
    n = _scalar(value_of, top.get("batch_size"), f"{source}: batch_size", int)
    if not 0 < n <= MAX_ROWS:
        raise _fail(f"{source}: batch_size", top.get("batch_size"),
                    f"must be a positive integer up to {MAX_ROWS:,}, got {_shown(n)}")
    seed = _scalar(value_of, top.get("seed"), f"{source}: seed", int, required=False, default=0, low=0, high=MAX_SEED)
    desc = _scalar(value_of, top.get("description"), f"{source}: description", str, required=False, default="")
    _encodable(desc, top.get("description"), f"{source}: description")
    tensors = []
    tensor_nodes = _mapping(top.get("tensors") or yaml.MappingNode("", []), f"{source}: tensors")
    nt_nodes = _mapping(top.get("non_tensor") or yaml.MappingNode("", []), f"{source}: non_tensor")
    if len(tensor_nodes) + len(nt_nodes) > MAX_LEAVES:
        raise _fail(f"{source}: tensors", top.get("tensors"), f"more than {MAX_LEAVES} leaves in all")
    for key, node in tensor_nodes.items():
        where = f"{source}: tensors.{safe_text(key, 60)}"
        _name(key, node, where)
        tensors.append(_tensor(value_of, key, node, where))
    non_tensor = []
    for key, node in nt_nodes.items():
        where = f"{source}: non_tensor.{safe_text(key, 60)}"
        _name(key, node, where)
        f = _mapping(node, where)
        unknown = set(f) - {"kind", "length"}
        if unknown:
            k = sorted(unknown)[0]
            raise _fail(f"{where}.{safe_text(k, 60)}", f[k], "unknown field")
        kind = _scalar(value_of, f.get("kind"), f"{where}.kind", str)
        if kind not in NON_TENSOR_KINDS:
            raise _fail(f"{where}.kind", f.get("kind"),
                        f"unknown kind {_shown(kind)}; known: {', '.join(NON_TENSOR_KINDS)}")
        length = _scalar(value_of, f.get("length"), f"{where}.length", int, required=False, default=8, low=0,
                         high=MAX_STRING)
        non_tensor.append(NonTensorSpec(key, kind, length))
    meta_node = top.get("meta_info")
    meta = value_of(meta_node, f"{source}: meta_info") if meta_node is not None else {}
    if not isinstance(meta, dict):
        raise _fail(f"{source}: meta_info", meta_node, "must be a mapping")
    _encodable(meta, meta_node, f"{source}: meta_info")
    return Workload(name, desc, n, seed, tuple(tensors), tuple(non_tensor), meta, source)


def _tensor(value_of: _Values, key: str, node: Any, where: str) -> TensorSpec:
    f = _mapping(node, where)
    unknown = set(f) - {"shape", "dtype", "kind", "high", "min_len", "max_len"}
    if unknown:
        k = sorted(unknown)[0]
        raise _fail(f"{where}.{safe_text(k, 60)}", f[k], "unknown field")
    shape_node = f.get("shape")
    if not isinstance(shape_node, yaml.SequenceNode) or not shape_node.value:
        raise _fail(f"{where}.shape", shape_node or node, "must be a list starting with N")
    if len(shape_node.value) > MAX_DIMS:
        raise _fail(f"{where}.shape", shape_node, f"has {len(shape_node.value)} dimensions, more than {MAX_DIMS}")
    shape: list[int | str] = []
    for d in shape_node.value:
        v = value_of(d, f"{where}.shape") if isinstance(d, yaml.ScalarNode) else d
        if not (v in ("N", "J") or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM)):
            shown = _shown(v) if isinstance(d, yaml.ScalarNode) else "a " + ("list" if isinstance(d, yaml.SequenceNode)
                                                                               else "mapping")
            raise _fail(f"{where}.shape", d, f"entries are N, J or integers >= 0 (up to 2**40), got {shown}")
        shape.append(v)
    if shape[0] != "N":
        raise _fail(f"{where}.shape", shape_node, "the first dimension must be N (the batch dimension)")
    if shape.count("N") > 1:
        raise _fail(f"{where}.shape", shape_node, "N (the batch dimension) may appear only first")
    dtype = _scalar(value_of, f.get("dtype"), f"{where}.dtype", str)
    if dtype not in _ITEMSIZE:
        raise _fail(f"{where}.dtype", f.get("dtype"), f"unknown dtype {_shown(dtype)}; known: {', '.join(_ITEMSIZE)}")
    kind = _scalar(value_of, f.get("kind"), f"{where}.kind", str, required=False, default="dense")
    if kind not in KINDS:
        raise _fail(f"{where}.kind", f.get("kind"), f"unknown kind {_shown(kind)}; known: {', '.join(KINDS)}")
    nested = kind.endswith("nested")
    if nested != (len(shape) > 1 and shape[1] == "J") or shape.count("J") > 1 or ("J" in shape and not nested):
        raise _fail(f"{where}.shape", shape_node, "nested kinds need shape [N, J, ...]; only they may use J")
    if kind == "non-contiguous" and len(shape) < 3:
        raise _fail(f"{where}.shape", shape_node, "non-contiguous leaves need at least 3 dimensions")
    top = _INT_RANGE.get(dtype, 2**63)
    high = _scalar(value_of, f.get("high"), f"{where}.high", int, required=False, default=2, low=1, high=top)
    min_len = _scalar(value_of, f.get("min_len"), f"{where}.min_len", int, required=False, default=1, low=1,
                      high=MAX_LEN)
    max_len = _scalar(value_of, f.get("max_len"), f"{where}.max_len", int, required=False, default=8, low=1,
                      high=MAX_LEN)
    if min_len > max_len:
        raise _fail(f"{where}.min_len", f.get("min_len") or node, "need 0 < min_len <= max_len")
    return TensorSpec(name=key, shape=tuple(shape), dtype=dtype, kind=kind, high=high, min_len=min_len,
                      max_len=max_len)


# -- writing the format ------------------------------------------------------------------------------------
_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
_YAML_WORDS = {"yes", "no", "on", "off", "true", "false", "null", "none", "~"}


def _yaml_value(v: Any) -> str:
    """One value in YAML flow style, written directly (no YAML library on the capture probe's path)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        text = repr(v)
        return text if ("." in text or "n" in text) else text.replace("e", ".0e", 1)  # 1e-05 -> 1.0e-05
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_yaml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_yaml_key(str(k))}: {_yaml_value(x)}" for k, x in v.items()) + "}"
    return _yaml_key(str(v))


def _yaml_key(k: str) -> str:
    if _PLAIN_KEY.match(k) and k.lower() not in _YAML_WORDS:
        return k
    return json.dumps(k)  # a JSON string is a YAML double-quoted scalar


def workload_text(name: str, description: str, batch_size: int, seed: int, tensors: dict[str, dict[str, Any]],
                  non_tensor: dict[str, dict[str, Any]], meta_info: dict[str, Any], comments: Sequence[str] = (),
                  validate: bool = True) -> str:
    """A workload file's text: ``comments`` first, then the fields, one leaf a line.

    ``validate`` parses the text back with :func:`parse_workload` (what is written must load); the
    capture probe skips it, because parsing costs more than the call it watches.
    """
    lines = [f"# {c}" for c in comments]
    lines += [f"name: {_yaml_key(name)}", f"description: {_yaml_key(description)}", f"batch_size: {batch_size}",
              f"seed: {seed}"]
    width = max((len(_yaml_key(k)) for k in [*tensors, *non_tensor]), default=0) + 1
    lines.append("tensors:" + ("" if tensors else " {}"))
    lines += [f"  {(_yaml_key(k) + ':').ljust(width + 1)} {_yaml_value(v)}" for k, v in tensors.items()]
    lines.append("non_tensor:" + ("" if non_tensor else " {}"))
    lines += [f"  {(_yaml_key(k) + ':').ljust(width + 1)} {_yaml_value(v)}" for k, v in non_tensor.items()]
    lines.append("meta_info:" + ("" if meta_info else " {}"))
    lines += [f"  {_yaml_key(str(k))}: {_yaml_value(v)}" for k, v in meta_info.items()]
    text = "\n".join(lines) + "\n"
    if validate:
        parse_workload(text, "<derived workload>")
    return text
