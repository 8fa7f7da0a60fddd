"""The bad-input catalogue: every way a user can get picklescope's input wrong, and what must be said.

Each case is one wrong input (CLI arguments or a Python call), the words its one-line error must
contain to name the cause, and the words that name the way out. ``tests/test_bad_input.py`` runs
every case and checks exit status 2, one line, no traceback, and that nothing in the user's folder
changed; ``python tests/bad_input_cases.py`` runs them and writes ``docs/bad_input.md`` with the
message each one really printed on this machine.
"""

from __future__ import annotations

import pickle
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BLOBS = ROOT / "data" / "blobs"


@dataclass(frozen=True)
class Case:
    """One wrong input. ``argv`` for the CLI (``{tmp}`` is the user's folder), or ``call`` for the API."""

    id: str
    what: str  # the wrong input, as the docs table shows it
    cause: tuple[str, ...]  # every fragment must be in the message (case-insensitive)
    way_out: tuple[str, ...]  # and these name the fix
    argv: tuple[str, ...] = ()
    call: Callable[[Path], Any] | None = None
    # the user's folder before the case runs: text, bytes, or "@fifo", "@link:TARGET", "@sparse:BYTES",
    # "@pad:BYTES" (a regular file of comment lines), "@half:BLOB" / "@copy:BLOB" (a reference blob's bytes)
    files: dict[str, str | bytes] = field(default_factory=dict)
    subprocess: bool = False  # run as 'python -m picklescope' (the case sets environment variables)
    env: dict[str, str] = field(default_factory=dict)
    hide: tuple[str, ...] = ()  # modules made unimportable for the case ("not installed")
    needs: tuple[str, ...] = ()  # "verl-0.9.0": an installed verl 0.9.0 environment

    @property
    def surface(self) -> str:
        return "API" if self.call is not None else "CLI"


BAD_YAML_FIELD = "name: bad\nbatch_size: 8\ntensors:\n  obs: {shape: [N, 64], dtype: float33}\n"
BAD_YAML_SYNTAX = "name: bad\nbatch_size: 8\ntensors:\n  obs: {shape: [N, 64], dtype: float32\n"
BAD_YAML_BATCH = "name: bad\nbatch_size: -3\ntensors:\n  obs: {shape: [N, 64], dtype: float32}\n"
BAD_YAML_EXTRA = "name: bad\nbatch_size: 8\ntensors:\n  obs: {shape: [N, 5], dtype: float32, colour: red}\n"
BAD_YAML_SHAPE = "name: bad\nbatch_size: 8\ntensors:\n  obs: {shape: [N, -5], dtype: float32}\n"
W = "name: w\nbatch_size: 8\n"  # the head of a valid workload; the cases add one wrong thing
OBS = "tensors:\n  obs: {shape: [N, 4], dtype: float32}\n"
ALIAS_BOMB = ("a: &a [x, x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
              "c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b, *b]\nd: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c, *c]\n"
              "e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d, *d]\nf: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e, *e]\n"
              "g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f, *f]\nh: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g, *g]\n"
              "i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h, *h]\n" + W + "description: *i\n")
JAGGED_TRILLION = ("name: w\nbatch_size: 1000000000000\ntensors:\n"
                   "  r: {shape: [N, J, 64], dtype: float32, kind: jagged-nested}\n")
JAGGED_2M = "name: w\nbatch_size: 2000000\ntensors:\n  r: {shape: [N, J], dtype: uint8, kind: jagged-nested}\n"
NO_TENSORS = W + "non_tensor:\n  uid: {kind: strings, length: 8}\n"
PLUGIN_RAISES = "import os\nraise RuntimeError('the codec needs a GPU')\n"
DEEP = W + "meta_info: " + "[" * 40 + "]" * 40 + "\n"
SYNTAX_ERROR_PY = "def __getstate__(self):\n    return (\n"
NO_FUNCTION_PY = "x = 1\n"
BROKEN_VERL = "import not_a_real_dependency_xyz\n"
USER_NOTE = "my notes from the incident\n"


def _zip_bytes(members: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return buf.getvalue()


def _npy(descr: str, shape: tuple[int, ...], body: bytes) -> bytes:
    """A .npy member as numpy writes it (format 1.0): magic, header literal padded to 64 bytes, data."""
    import struct

    head = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
    head += " " * (63 - (10 + len(head)) % 64) + "\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(head)) + head.encode() + body


# what 'workload from' must refuse: a torch.save-shaped zip cut in half, a pickle that would run
# os.system, an .npz whose object array is built by a class, an .npz whose header claims 4 EB
_TORCH_ZIP = _zip_bytes({"archive/data.pkl": b"\x80\x02}q\x00.", "archive/version": b"3\n",
                         "archive/data/0": bytes(4096)})
HALF_ZIP = _TORCH_ZIP[: len(_TORCH_ZIP) // 2]
RUNS_CODE_PKL = b"cos\nsystem\n(S'touch pwned-by-pickle'\ntR."
OBJECT_NPZ = _zip_bytes({"uid.npy": _npy("|O", (2,), b"\x80\x02cfractions\nFraction\nq\x00X\x03\x00\x00\x001/2"
                                                    b"q\x01\x85q\x02Rq\x03."),
                         "obs.npy": _npy("<f4", (2, 4), bytes(32))})
HUGE_SHAPE_NPZ = _zip_bytes({"obs.npy": _npy("<f4", (10**12, 10**6), bytes(64))})


def _bad_crc_blob() -> bytes:
    """verl 0.9.0's torch-mode blob with the CRC-32 its carried zip records for data.pkl changed."""
    data = bytearray((BLOBS / "verl-0.9.0-torch.pkl").read_bytes())
    at = data.find(b"PK\x01\x02")
    while at >= 0 and not data[at + 46:at + 46 + int.from_bytes(data[at + 28:at + 30], "little")].endswith(b"data.pkl"):
        at = data.find(b"PK\x01\x02", at + 1)
    data[at + 16:at + 20] = bytes(b ^ 0xFF for b in data[at + 16:at + 20])
    return bytes(data)


def _zip_declaring(name: str, body: bytes, declared: int, entries: int | None = None) -> bytes:
    """A one-member stored zip whose zip64 directory says the member holds ``declared`` bytes (and, with
    ``entries``, that the archive has that many members), written field by field."""
    import struct
    import zlib

    fname = name.encode()
    crc = zlib.crc32(body)
    local = struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0, crc, len(body), len(body), len(fname), 0)
    extra = struct.pack("<HHQ", 1, 8, declared)
    central = struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0, crc, len(body), 0xFFFFFFFF,
                          len(fname), len(extra), 0, 0, 0, 0, 0) + fname + extra
    cd_at = len(local) + len(fname) + len(body)
    n = entries or 1
    eocd64_at = cd_at + len(central)
    eocd64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, n, n, len(central), cd_at)
    locator = struct.pack("<IIQI", 0x07064B50, 0, eocd64_at, 1)
    eocd = struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return local + fname + body + central + eocd64 + locator + eocd


_SYSTEM = b"cos\nsystem\n(S'touch pwned-by-pickle'\ntR."
_EXEC = b"cbuiltins\nexec\n(S'open(\"pwned-by-pickle\", \"w\").close()'\ntR."
_POPEN = b"csubprocess\nPopen\n((S'touch'\nS'pwned-by-pickle'\nltR."
_VERSION = b"3\n"
PT_SYSTEM = _zip_bytes({"archive/data.pkl": _SYSTEM, "archive/version": _VERSION})
PT_EXEC = _zip_bytes({"archive/data.pkl": b"(dp0\nS'x'\n" + _EXEC[:-1] + b"s.", "archive/version": _VERSION})
PT_POPEN = _zip_bytes({"archive/data.pkl": _POPEN, "archive/version": _VERSION})
POLYGLOT = _SYSTEM + _zip_bytes({"archive/data.pkl": b"\x80\x02}q\x00.", "archive/version": _VERSION,
                                 "archive/data/0": bytes(64)})
ZIP64_100G = _zip_declaring("archive/data.pkl", b"\x80\x02}q\x00.", 100 << 30)
ZIP_MILLION = _zip_declaring("archive/data.pkl", b"\x80\x02}q\x00.", 6, entries=1_000_000)
TRAILING = b"\x80\x02}q\x00." + b"left over after the pickle\n"
LONG_LINE = b"S'" + b"x" * (2 << 20)  # a protocol-0 string that never ends its line
HUGE_LONG4 = b"\x80\x02\x8b" + (1 << 30).to_bytes(4, "little") + bytes(64)
MANY_KEYS = pickle.dumps(dict.fromkeys(range(70_000), 0), protocol=2)  # pickle writes SETITEMS of 1000 pairs


def _api_run(**kw: Any) -> Callable[[Path], Any]:
    def go(tmp: Path) -> Any:
        from picklescope import run

        kw2 = {k: (v.format(tmp=tmp) if isinstance(v, str) else v) for k, v in kw.items()}
        if "plugins" in kw2:
            kw2["plugins"] = [p.format(tmp=tmp) for p in kw2["plugins"]]
        return run(**{"workload": "tiny", **kw2})

    return go


def _api(fn: str, *args: Any, **kw: Any) -> Callable[[Path], Any]:
    def go(tmp: Path) -> Any:
        import importlib

        module, _, name = fn.rpartition(".")
        a = [x.format(tmp=tmp) if isinstance(x, str) else x for x in args]
        return getattr(importlib.import_module(module), name)(*a, **kw)

    return go


CASES: list[Case] = [
    # -- names ---------------------------------------------------------------------------------
    Case("unknown-codec", "run --codec nope", ("unknown codec 'nope'",), ("numpy-legacy", "torch"),
         argv=("run", "--codec", "nope")),
    Case("unknown-transport", "run --transport carrier-pigeon", ("unknown transport 'carrier-pigeon'",),
         ("pickle5-oob", "ray"), argv=("run", "--transport", "carrier-pigeon")),
    Case("unknown-tracer", "run --tracer valgrind", ("unknown tracer 'valgrind'",), ("memray", "tracemalloc"),
         argv=("run", "--tracer", "valgrind")),
    Case("unknown-workload", "run --workload nope", ("unknown workload 'nope'",), ("flowgrpo", "tiny", ".yaml"),
         argv=("run", "--workload", "nope")),
    Case("unknown-receiver-codec", "run --receiver-codec nope", ("unknown codec 'nope'",), ("numpy-legacy",),
         argv=("run", "--receiver-codec", "nope")),
    Case("unknown-codec-api", "picklescope.run(codec='nope')", ("unknown codec 'nope'",), ("numpy-legacy",),
         call=_api_run(codec="nope")),
    Case("unknown-verl-mode", "run --codec verl-0.9.0:bogus", ("unknown codec 'verl-0.9.0:bogus'",),
         ("numpy",), argv=("run", "--codec", "verl-0.9.0:bogus")),
    Case("verl-cache-unusable", "run --codec verl-0.9.0:numpy with PICKLESCOPE_CACHE naming a file",
         ("needs verl 0.9.0", "PICKLESCOPE_CACHE", "is not a folder"), ("picklescope verl install 0.9.0",),
         argv=("run", "--workload", "tiny", "--codec", "verl-0.9.0:numpy"), subprocess=True,
         env={"PICKLESCOPE_CACHE": "{tmp}/cache-file"}, files={"cache-file": "not a folder\n"}),
    Case("unknown-command", "picklescope frobnicate", ("invalid choice: 'frobnicate'",), ("reproduce", "--help"),
         argv=("frobnicate",)),
    Case("unknown-enforcement", "run --enforcement magic", ("invalid choice: 'magic'",), ("watchdog", "cgroup"),
         argv=("run", "--enforcement", "magic")),
    # -- workload files ------------------------------------------------------------------------
    Case("workload-bad-field", "workload YAML with dtype float33 on line 4",
         ("tensors.obs.dtype", "line 4", "float33"), ("float32", "fix that field"),
         argv=("run", "--workload", "{tmp}/bad.yaml"), files={"bad.yaml": BAD_YAML_FIELD}),
    Case("workload-bad-yaml", "workload YAML with an unclosed brace", ("not valid YAML", "line"),
         ("fix the syntax",), argv=("run", "--workload", "{tmp}/bad.yaml"), files={"bad.yaml": BAD_YAML_SYNTAX}),
    Case("workload-bad-batch", "workload YAML with batch_size -3 (API)", ("batch_size", "line 2", "positive"),
         ("fix that field",), call=_api("picklescope.workloads.spec.load_workload", "{tmp}/bad.yaml"),
         files={"bad.yaml": BAD_YAML_BATCH}),
    Case("workload-unknown-field", "workload YAML with a misspelt field 'colour' on line 4",
         ("tensors.obs.colour", "line 4", "unknown field"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/bad.yaml"), files={"bad.yaml": BAD_YAML_EXTRA}),
    Case("workload-negative-shape", "workload YAML with shape [N, -5]", ("tensors.obs.shape", "-5"),
         ("integers >= 0",), argv=("run", "--workload", "{tmp}/bad.yaml"), files={"bad.yaml": BAD_YAML_SHAPE}),
    Case("workload-missing", "run --workload missing.yaml", ("missing.yaml", "does not exist"),
         ("check the path", "preset"), argv=("run", "--workload", "{tmp}/missing.yaml")),
    # -- workload files: what the parent reads, and how much (bounded reading) ------------------------
    Case("workload-alias-bomb", "workload YAML whose description is a 10^9-element alias bomb (300 bytes)",
         ("anchor &a", "line 1", "aliases and anchors are refused"), ("write each value out",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": ALIAS_BOMB}),
    Case("workload-alias", "workload YAML using an alias without an anchor", ("alias *x",), ("in full",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "description: *x\n"}),
    Case("workload-anchor", "workload YAML defining an anchor (&n) on batch_size",
         ("anchor &n", "line 2"), ("remove the anchor",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": "name: w\nbatch_size: &n 8\n"}),
    Case("workload-trillion-jagged", "workload YAML with batch_size 10^12 and a jagged-nested leaf",
         ("1,000,000,000,000 rows", "needs at least", "this machine's"), ("smaller --scale or batch_size",),
         argv=("run", "--workload", "{tmp}/w.yaml", "--scale", "1"), files={"w.yaml": JAGGED_TRILLION}),
    Case("workload-2m-nested-rows", "workload YAML with 2,000,000 rows of a nested leaf (lengths drawn per row)",
         ("2,000,000 rows", "more than the 1,000,000"), ("smaller --scale",),
         argv=("run", "--workload", "{tmp}/w.yaml", "--scale", "1"), files={"w.yaml": JAGGED_2M}),
    Case("workload-fifo", "run --workload pipe.yaml (a FIFO)", ("pipe.yaml", "is a FIFO", "not a regular file"),
         ("regular file",), argv=("run", "--workload", "{tmp}/pipe.yaml"), files={"pipe.yaml": "@fifo"}),
    Case("workload-folder", "run --workload dir.yaml (a folder)", ("dir.yaml", "is a folder"), ("regular file",),
         argv=("run", "--workload", "{tmp}/dir.yaml"), files={"dir.yaml/readme.txt": USER_NOTE}),
    Case("workload-dev-zero", "run --workload zero.yaml (a symlink to /dev/zero)",
         ("character device", "symlink to /dev/zero"), ("regular file",),
         argv=("run", "--workload", "{tmp}/zero.yaml"), files={"zero.yaml": "@link:/dev/zero"}),
    Case("workload-dangling-link", "run --workload gone.yaml (a symlink to nothing)",
         ("symlink to a path that does not exist",), ("check the path",),
         argv=("run", "--workload", "{tmp}/gone.yaml"), files={"gone.yaml": "@link:/nonexistent/w.yaml"}),
    Case("workload-sparse-3g", "run --workload big.yaml (a 3 GB sparse file)", ("3.00 GiB", "over the 4.0 MiB limit"),
         ("a few lines long",), argv=("run", "--workload", "{tmp}/big.yaml"), files={"big.yaml": "@sparse:3221225472"}),
    Case("workload-5mib", "run --workload padded.yaml (5 MiB of comments)", ("5.0 MiB", "4.0 MiB limit"),
         ("a few lines long",), argv=("run", "--workload", "{tmp}/padded.yaml"), files={"padded.yaml": "@pad:5242880"}),
    Case("workload-folder-no-suffix", "run --workload DIR (an existing folder)", ("is a folder",), ("regular file",),
         argv=("run", "--workload", "{tmp}/sub"), files={"sub/readme.txt": USER_NOTE}),
    Case("workload-latin1", "workload YAML saved as Latin-1 (name: café)", ("not UTF-8", "0xe9", "line 1"),
         ("save it as UTF-8",), argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": b"name: caf\xe9\n"}),
    Case("workload-utf16", "workload YAML saved as UTF-16", ("not UTF-8", "offset 0"), ("UTF-8",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": (W + OBS).encode("utf-16")}),
    Case("workload-nul-byte", "workload YAML holding a NUL byte", ("not valid YAML", "line 1", "0x00"), ("remove it",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": b"name: a\x00b\nbatch_size: 8\n"}),
    Case("workload-empty", "an empty workload file", ("is empty",), ("tiny.yaml",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": "# nothing\n"}),
    Case("workload-top-list", "workload YAML that is a list", ("must be a mapping",), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": "- name: w\n- batch_size: 8\n"}),
    Case("workload-deep-nesting", "workload YAML with meta_info nested 40 lists deep", ("more than 32 levels",),
         ("flatten",), argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": DEEP}),
    # -- workload files: structure the parser refuses -------------------------------------------------
    Case("workload-list-key", "workload YAML using a list as a tensor key", ("a list as a key", "line 4"),
         ("plain name",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  [a, b]: {shape: [N, 4], dtype: float32}\n"}),
    Case("workload-mapping-key", "workload YAML using a mapping as a key", ("a mapping as a key",), ("plain name",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "meta_info:\n  ? {a: 1}\n  : x\n"}),
    Case("workload-int-key", "workload YAML with a tensor named 1 (an integer key)", ("the key 1", "not a string"),
         ("quote it",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  1: {shape: [N, 4], dtype: float32}\n"}),
    Case("workload-duplicate-key", "workload YAML with batch_size given twice", ("repeats the key 'batch_size'",
         "first at line 2"), ("keep one",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "batch_size: 9\n"}),
    Case("workload-duplicate-tensor", "workload YAML with two tensors called obs", ("repeats the key 'obs'",),
         ("keep one",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + OBS + "  obs: {shape: [N, 8], dtype: float32}\n"}),
    Case("workload-python-tag-shape", "workload YAML with shape: !!python/tuple [N, 4]",
         ("python/tuple", "tags are refused"), ("remove the tag",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  obs: {shape: !!python/tuple [N, 4], dtype: float32}\n"}),
    Case("workload-python-tag-meta", "workload YAML with meta_info: !!python/object/apply:os.system",
         ("python/object/apply:os.system", "tags are refused"), ("remove the tag",),
         argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "meta_info: !!python/object/apply:os.system ['echo owned']\n"}),
    Case("workload-str-tag", "workload YAML with name: !!str w", ("tags are refused",), ("quote the value",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": "name: !!str w\nbatch_size: 8\n"}),
    Case("workload-custom-tag", "workload YAML with a local tag !mine", ("the tag !mine",), ("remove the tag",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "meta_info: !mine {a: 1}\n"}),
    Case("workload-escape-name", "workload YAML whose name holds terminal escape sequences",
         ("name", "\\x1b[31m", "control characters"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": 'name: "\\e[31mred\\e]0;title\\a"\nbatch_size: 8\n'}),
    Case("workload-newline-key", "workload YAML with a newline in a tensor key (a fake second error line)",
         ("a\\npicklescope: ok", "control characters"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + 'tensors:\n  "a\\npicklescope: ok, nothing wrong": {shape: [N], dtype: int8}\n'}),
    Case("workload-bidi-key", "workload YAML with a right-to-left override in a key", ("\\u202e",),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + 'tensors:\n  "evil\\u202etxt": {shape: [N], dtype: int8}\n'}),
    Case("workload-surrogate-name", 'workload YAML with name: "w\\ud800" (a lone surrogate)',
         ("name", "lone surrogate \\ud800", "cannot be written as UTF-8"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": 'name: "w\\ud800"\nbatch_size: 8\n' + OBS}),
    Case("workload-surrogate-key", 'workload YAML with a tensor key "x\\udc80"', ("tensors.x\\udc80", "lone surrogate"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + 'tensors:\n  "x\\udc80": {shape: [N], dtype: int8}\n'}),
    Case("workload-surrogate-meta", 'workload YAML with meta_info note: "\\ud83d" (half an emoji)',
         ("meta_info", "lone surrogate"), ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + OBS + 'meta_info:\n  note: "\\ud83d"\n'}),
    Case("workload-surrogate-description", 'workload YAML with description: "\\udfff"',
         ("description", "lone surrogate"), ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + 'description: "\\udfff"\n' + OBS}),
    Case("workload-yaml11-base60", "workload YAML with batch_size: 1:30 (YAML 1.1 reads 90)",
         ("batch_size", "1:30 is base 60 in YAML 1.1, i.e. 90"), ("write 90", "quote"),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": "name: w\nbatch_size: 1:30\n" + OBS}),
    Case("workload-yaml11-hex", "workload YAML with shape [N, 0x10] (YAML 1.1 reads 16)",
         ("tensors.obs.shape", "0x10 is hexadecimal in YAML 1.1, i.e. 16"), ("write 16",),
         argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  obs: {shape: [N, 0x10], dtype: float32}\n"}),
    Case("workload-yaml11-octal", "workload YAML with seed: 010 (YAML 1.1 reads 8)",
         ("seed", "010 is octal in YAML 1.1, i.e. 8"), ("write 8",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "seed: 010\n" + OBS}),
    Case("workload-yaml11-binary", "workload YAML with high: 0b101 (YAML 1.1 reads 5)",
         ("high", "0b101 is binary in YAML 1.1, i.e. 5"), ("write 5",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  ids: {shape: [N, 4], dtype: int32, high: 0b101}\n"}),
    Case("workload-yaml11-base60-float", "workload YAML with meta_info lr: 1:30.5 (YAML 1.1 reads 90.5)",
         ("meta_info", "1:30.5 is base 60 in YAML 1.1, i.e. 90.5"), ("write 90.5",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + OBS + "meta_info:\n  lr: 1:30.5\n"}),
    Case("workload-empty-name", "workload YAML with name: ''", ("name", "1 to 200 characters"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": "name: ''\nbatch_size: 8\n"}),
    Case("workload-long-name", "workload YAML with a 500-character name", ("1 to 200 characters",),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": "name: " + "n" * 500 + "\nbatch_size: 8\n"}),
    Case("workload-unknown-top-field", "workload YAML with a top-level field 'tensor' (singular)",
         ("tensor (line 3)", "unknown field"), ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensor: {}\n"}),
    Case("workload-tensors-list", "workload YAML whose tensors is a list", ("tensors", "must be a mapping"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "tensors: [a, b]\n"}),
    Case("workload-meta-list", "workload YAML whose meta_info is a list", ("meta_info", "must be a mapping"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "meta_info: [1, 2]\n"}),
    Case("workload-description-list", "workload YAML whose description is a list", ("description", "got a list"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "description: [a]\n"}),
    # -- workload files: bounds checked before a child starts -----------------------------------------
    Case("workload-seed-1e30", "workload YAML with seed: 1e30", ("seed", "must be int", "1e30"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "seed: 1e30\n"}),
    Case("workload-seed-float", "workload YAML with seed: 1.0e+30", ("seed", "must be int", "1e+30"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "seed: 1.0e+30\n"}),
    Case("workload-seed-range", "workload YAML with seed: 2**40", ("seed", "from 0 to 4,294,967,295"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "seed: 1099511627776\n"}),
    Case("workload-seed-negative", "workload YAML with seed: -1 (API)", ("seed", "got -1"), ("fix that field",),
         call=_api("picklescope.workloads.spec.load_workload", "{tmp}/w.yaml"), files={"w.yaml": W + "seed: -1\n"}),
    Case("workload-high-1e27", "workload YAML with high: 1e27", ("high", "must be int"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  ids: {shape: [N, 4], dtype: int64, high: 1.0e+27}\n"}),
    Case("workload-high-int8", "workload YAML with high: 100000 on an int8 leaf", ("high", "from 1 to 128", "100000"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  ids: {shape: [N, 4], dtype: int8, high: 100000}\n"}),
    Case("workload-high-uint8", "workload YAML with high: 257 on a uint8 leaf", ("from 1 to 256",), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  ids: {shape: [N, 4], dtype: uint8, high: 257}\n"}),
    Case("workload-high-int64", "workload YAML with high: 2**64 on an int64 leaf",
         ("high", "9,223,372,036,854,775,808"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  ids: {shape: [N, 4], dtype: int64, high: 18446744073709551616}\n"}),
    Case("workload-high-zero", "workload YAML with high: 0", ("high", "got 0"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  ids: {shape: [N, 4], dtype: int32, high: 0}\n"}),
    Case("workload-batch-huge", "workload YAML with batch_size 2**50", ("batch_size", "up to 1,099,511,627,776"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": "name: w\nbatch_size: 1125899906842624\n" + OBS}),
    Case("workload-batch-5000-digits", "workload YAML with a 5000-digit batch_size", ("batch_size", "cannot be read"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": "name: w\nbatch_size: " + "9" * 5000 + "\n"}),
    Case("workload-batch-float", "workload YAML with batch_size: 8.5", ("batch_size", "must be int", "8.5"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": "name: w\nbatch_size: 8.5\n"}),
    Case("workload-too-many-dims", "workload YAML with a 20-dimensional shape", ("20 dimensions", "more than 16"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  x: {shape: [N" + ", 1" * 19 + "], dtype: int8}\n"}),
    Case("workload-dim-huge", "workload YAML with a dimension of 2**50", ("tensors.x.shape", "up to 2**40"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  x: {shape: [N, 1125899906842624], dtype: int8}\n"}),
    Case("workload-dims-product", "workload YAML with shape [N, 2**40, 2**40] (fine dims, absurd product)",
         ("needs at least", "this machine's"), ("smaller --scale or batch_size",),
         argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  x: {shape: [N, 1099511627776, 1099511627776], dtype: int8}\n"}),
    Case("workload-shape-second-n", "workload YAML with shape [N, N]",
         ("N (the batch dimension) may appear only first",),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  x: {shape: [N, N], dtype: int8}\n"}),
    Case("workload-shape-string", "workload YAML with shape: N (not a list)", ("tensors.x.shape", "must be a list"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  x: {shape: N, dtype: int8}\n"}),
    Case("workload-shape-nested-list", "workload YAML with shape [N, [4]]", ("tensors.x.shape", "got a list"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  x: {shape: [N, [4]], dtype: int8}\n"}),
    Case("workload-dtype-list", "workload YAML with dtype: [float32]", ("dtype", "got a list"), ("fix that field",),
         argv=("run", "--workload", "{tmp}/w.yaml"), files={"w.yaml": W + "tensors:\n  x: {shape: [N], dtype: [a]}\n"}),
    Case("workload-min-over-max", "workload YAML with min_len 9 > max_len 3", ("min_len <= max_len",),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  r: {shape: [N, J], dtype: int8, kind: jagged-nested, min_len: 9, "
                              "max_len: 3}\n"}),
    Case("workload-max-len-huge", "workload YAML with max_len 2**40", ("max_len", "2,147,483,647"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "tensors:\n  r: {shape: [N, J], dtype: int8, kind: jagged-nested, "
                              "max_len: 1099511627776}\n"}),
    Case("workload-string-length-negative", "workload YAML with a non-tensor length of -1", ("length", "got -1"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "non_tensor:\n  uid: {kind: strings, length: -1}\n"}),
    Case("workload-string-length-huge", "workload YAML with a non-tensor length of 2**30", ("length", "1,048,576"),
         ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "non_tensor:\n  uid: {kind: strings, length: 1073741824}\n"}),
    Case("workload-non-tensor-field", "workload YAML with a misspelt non-tensor field 'lenght'",
         ("non_tensor.uid.lenght", "unknown field"), ("fix that field",), argv=("run", "--workload", "{tmp}/w.yaml"),
         files={"w.yaml": W + "non_tensor:\n  uid: {kind: strings, lenght: 4}\n"}),
    Case("scale-rows-overflow", "run --scale 1e300 (more rows than any batch)", ("rows", "more than the"),
         ("smaller --scale",), argv=("run", "--workload", "tiny", "--scale", "1e300")),
    Case("scale-inf-api", "picklescope.run(scale=float('inf'))", ("scale inf",), ("positive",),
         call=_api_run(scale=float("inf"))),
    # -- ratios to a payload of zero ------------------------------------------------------------------
    Case("headroom-no-tensors", "headroom on a workload with no tensors", ("no tensor bytes", "headroom"),
         ("at least one non-empty tensor",), argv=("headroom", "--workload", "{tmp}/w.yaml", "--scale", "1"),
         files={"w.yaml": NO_TENSORS}),
    Case("headroom-no-tensors-api", "find_headroom on a workload with no tensors (API)", ("payload 0 B",),
         ("non-empty tensor",), call=_api("picklescope.investigate.headroom.find_headroom",
                                               "numpy", "pickle", "{tmp}/w.yaml", 1.0),
         files={"w.yaml": NO_TENSORS}),
    Case("budget-multiple-no-tensors", "run --budget 0.5x on a workload with no tensors",
         ("no tensor bytes", "a budget of 0.5x"), ("a budget in bytes",),
         argv=("run", "--workload", "{tmp}/w.yaml", "--budget", "0.5x"), files={"w.yaml": NO_TENSORS}),
    Case("budget-zero-size-leaf", "run --receiver-budget 2x on a workload whose only leaf has 0 elements",
         ("payload 0 B", "2x"), ("a budget in bytes",),
         argv=("run", "--workload", "{tmp}/w.yaml", "--receiver-budget", "2x"),
         files={"w.yaml": W + "tensors:\n  empty: {shape: [N, 0], dtype: float32}\n"}),
    # -- the hand-off ---------------------------------------------------------------------------------
    Case("shm-too-small", "run on flowgrpo x0.25 where /dev/shm has 64 MiB free (Docker's default)",
         ("hand-off needs about", "/dev/shm", "64.0 MiB free"), ("--handoff-dir", "--shm-size"),
         argv=("run", "--workload", "flowgrpo", "--scale", "0.25"), subprocess=True,
         env={"PICKLESCOPE_SHM_FREE_BYTES": "64MiB"}),
    Case("shm-too-small-reproduce", "reproduce on flowgrpo x0.25 where /dev/shm has 64 MiB free",
         ("hand-off needs about", "/dev/shm"), ("--handoff-dir",),
         argv=("reproduce", "--workload", "flowgrpo", "--scale", "0.25", "--no-ray", "--out", "{tmp}/out"),
         subprocess=True, env={"PICKLESCOPE_SHM_FREE_BYTES": "64MiB"}),
    Case("shm-free-override-bad", "PICKLESCOPE_SHM_FREE_BYTES=lots", ("PICKLESCOPE_SHM_FREE_BYTES 'lots'",
         "not a size"), ("700MiB",), argv=("run", "--workload", "tiny"), subprocess=True,
         env={"PICKLESCOPE_SHM_FREE_BYTES": "lots"}),
    Case("handoff-dir-missing", "run --handoff-dir nothere/", ("--handoff-dir", "nothere", "does not exist"),
         ("existing folder",), argv=("run", "--workload", "tiny", "--handoff-dir", "{tmp}/nothere")),
    Case("handoff-dir-file", "run --handoff-dir notes.txt (a file)", ("notes.txt", "is not a folder"),
         ("existing folder",), argv=("run", "--workload", "tiny", "--handoff-dir", "{tmp}/notes.txt"),
         files={"notes.txt": USER_NOTE}),
    Case("handoff-dir-api", "picklescope.run(handoff_dir='nothere')", ("--handoff-dir", "does not exist"),
         ("existing folder",), call=_api_run(handoff_dir="{tmp}/nothere")),
    # -- blobs and plugins: what inspect and plugins read ---------------------------------------------
    Case("inspect-dev-zero", "inspect /dev/zero", ("/dev/zero", "character device"), ("regular file",),
         argv=("inspect", "/dev/zero")),
    Case("inspect-fifo", "inspect pipe.pkl (a FIFO)", ("pipe.pkl", "FIFO"), ("regular file",),
         argv=("inspect", "{tmp}/pipe.pkl"), files={"pipe.pkl": "@fifo"}),
    Case("inspect-folder", "inspect blobs.pkl (a folder)", ("blobs.pkl", "is a directory"), ("a file inside it",),
         argv=("inspect", "{tmp}/blobs.pkl"), files={"blobs.pkl/readme.txt": USER_NOTE}),
    Case("inspect-zero-link", "inspect zero.pkl (a symlink to /dev/zero)", ("symlink to /dev/zero",),
         ("regular file",), argv=("inspect", "{tmp}/zero.pkl"), files={"zero.pkl": "@link:/dev/zero"}),
    Case("inspect-over-limit", "inspect a sparse 5 GiB .pkl (over the 4 GiB limit of a blob to identify)",
         ("5.00 GiB", "over the 4.00 GiB limit"), ("PICKLESCOPE_MAX_BLOB_BYTES",),
         argv=("inspect", "{tmp}/big.pkl"), files={"big.pkl": "@sparse:5368709120"}),
    Case("inspect-as-over-limit", "inspect --as numpy --trust a sparse 3 GiB .pkl (over the 1 GiB limit of a load)",
         ("3.00 GiB", "over the 1.00 GiB limit"), ("PICKLESCOPE_MAX_BLOB_BYTES",),
         argv=("inspect", "{tmp}/big.pkl", "--as", "numpy", "--trust"), files={"big.pkl": "@sparse:3221225472"}),
    Case("inspect-sparse-zeros", "inspect a sparse 3 GiB .pkl of zeros (streamed from its first byte, never held)",
         ("big.pkl", "is not a pickle stream", "opcode b'\\x00' at byte 0"), ("pickle.dump",),
         argv=("inspect", "{tmp}/big.pkl"), files={"big.pkl": "@sparse:3221225472"}),
    Case("inspect-polyglot", "inspect poly.pt (a pickle calling os.system, then a valid torch.save zip)",
         ("poly.pt", "polyglot", "refused with or without --trust"), ("save the batch on its own",),
         argv=("inspect", "{tmp}/poly.pt"), files={"poly.pt": POLYGLOT}),
    Case("inspect-polyglot-load", "inspect poly.pt --as numpy --trust (the same polyglot, asked to load)",
         ("poly.pt", "polyglot", "refused with or without --trust"), ("save the batch on its own",),
         argv=("inspect", "{tmp}/poly.pt", "--as", "numpy", "--trust"), files={"poly.pt": POLYGLOT}),
    Case("inspect-trailing", "inspect t.pkl (a pickle followed by other bytes)",
         ("t.pkl", "the pickle stream stops at byte 6", "of other data follow"), ("save the batch on its own",),
         argv=("inspect", "{tmp}/t.pkl"), files={"t.pkl": TRAILING}),
    Case("inspect-zip64-100g", "inspect big.pt (its zip64 directory declares data.pkl as 100 GiB)",
         ("big.pt", "data.pkl declares 100.00 GiB", "over the 64.0 MiB limit"), ("copy the original again",),
         argv=("inspect", "{tmp}/big.pt"), files={"big.pt": ZIP64_100G}),
    Case("inspect-zip-million-members", "inspect many.pt (its zip64 directory declares 1,000,000 members)",
         ("many.pt", "declares 1,000,000 members", "over the 65,536"), ("not a saved batch",),
         argv=("inspect", "{tmp}/many.pt"), files={"many.pt": ZIP_MILLION}),
    Case("inspect-many-keys", "inspect keys.pkl (a pickle of one dict of 70,000 keys)",
         ("keys.pkl", "a dict holds", "over the 65,536 a batch blob's structure needs"),
         ("not in millions of Python objects",), argv=("inspect", "{tmp}/keys.pkl"), files={"keys.pkl": MANY_KEYS}),
    Case("inspect-long-line", "inspect line.pkl (a protocol-0 string of 2 MiB without a newline)",
         ("line.pkl", "runs over 1048576 bytes without ending"), ("not a saved batch",),
         argv=("inspect", "{tmp}/line.pkl"), files={"line.pkl": LONG_LINE}),
    Case("inspect-huge-int", "inspect int.pkl (a LONG4 opcode declaring a 1 GiB integer)",
         ("int.pkl", "an integer of 1,073,741,824 bytes"), ("the file is damaged",),
         argv=("inspect", "{tmp}/int.pkl"), files={"int.pkl": HUGE_LONG4}),
    Case("inspect-trust-fifo", "inspect --as numpy --trust pipe.pkl (a FIFO)", ("FIFO",), ("regular file",),
         argv=("inspect", "{tmp}/pipe.pkl", "--as", "numpy", "--trust"), files={"pipe.pkl": "@fifo"}),
    Case("blob-limit-bad", "PICKLESCOPE_MAX_BLOB_BYTES=0.5x", ("PICKLESCOPE_MAX_BLOB_BYTES", "multiple"),
         ("16GiB",), argv=("inspect", str(BLOBS / "verl-0.9.0-numpy.pkl")), subprocess=True,
         env={"PICKLESCOPE_MAX_BLOB_BYTES": "0.5x"}),
    Case("plugin-raises-at-import", "picklescope.run(plugins=['plug.py']) whose import raises",
         ("plug.py", "at line 2", "RuntimeError: the codec needs a GPU"), ("fix the file",),
         call=_api_run(plugins=["{tmp}/plug.py"]), files={"plug.py": PLUGIN_RAISES}),
    Case("plugin-fifo", "stepthrough --plugin pipe.py (a FIFO)", ("pipe.py", "FIFO"), ("regular file",),
         argv=("stepthrough", "--codec", "numpy", "--plugin", "{tmp}/pipe.py"), files={"pipe.py": "@fifo"}),
    # -- workload from FILE: a saved batch read without running it --------------------------------------
    Case("workload-from-not-pickle", "workload from notes.txt (a text file)", ("notes.txt", "not a pickle stream"),
         ("pickle.dump",), argv=("workload", "from", "{tmp}/notes.txt", "--out", "{tmp}/w.yaml"),
         files={"notes.txt": USER_NOTE}),
    Case("workload-from-truncated-zip", "workload from half.pt (the first half of a torch.save zip)",
         ("half.pt", "not a readable zip archive"), ("copy it again",),
         argv=("workload", "from", "{tmp}/half.pt", "--out", "{tmp}/w.yaml"), files={"half.pt": HALF_ZIP}),
    Case("workload-from-runs-code", "workload from evil.pkl (a pickle whose top object is os.system(...))",
         ("built by os.system", "refused with or without --trust"), ("docs/safe_loading.md",),
         argv=("workload", "from", "{tmp}/evil.pkl", "--out", "{tmp}/w.yaml"), files={"evil.pkl": RUNS_CODE_PKL}),
    Case("workload-from-npz-object", "workload from an .npz whose object array holds fractions.Fraction",
         ("leaf 'uid'", "object array built by fractions.Fraction", "never loaded with allow_pickle"),
         ("strings, dicts or ints",), argv=("workload", "from", "{tmp}/batch.npz", "--out", "{tmp}/w.yaml"),
         files={"batch.npz": OBJECT_NPZ}),
    Case("workload-from-empty", "workload from empty.pkl (0 bytes)", ("empty.pkl", "is empty"),
         ("copy or download it again",), argv=("workload", "from", "{tmp}/empty.pkl", "--out", "{tmp}/w.yaml"),
         files={"empty.pkl": b""}),
    Case("workload-from-folder", "workload from batch.pkl (a folder)", ("batch.pkl", "is a directory"),
         ("a file inside it",), argv=("workload", "from", "{tmp}/batch.pkl", "--out", "{tmp}/w.yaml"),
         files={"batch.pkl/readme.txt": USER_NOTE}),
    Case("workload-from-fifo", "workload from pipe.pkl (a FIFO)", ("pipe.pkl", "FIFO"), ("regular file",),
         argv=("workload", "from", "{tmp}/pipe.pkl", "--out", "{tmp}/w.yaml"), files={"pipe.pkl": "@fifo"}),
    Case("workload-from-huge-shape", "workload from an .npz whose header declares shape (10^12, 10^6) over 64 bytes",
         ("leaf 'obs'", "declares shape (1000000000000, 1000000)", "the member holds 64 B"), ("save it again",),
         argv=("workload", "from", "{tmp}/huge.npz", "--out", "{tmp}/w.yaml"), files={"huge.npz": HUGE_SHAPE_NPZ}),
    Case("workload-from-over-limit", "workload from a sparse 300 GiB .pkl (over the 256 GiB limit)",
         ("big.pkl", "over the 256.00 GiB limit for a saved batch"), ("PICKLESCOPE_MAX_BLOB_BYTES",),
         argv=("workload", "from", "{tmp}/big.pkl", "--out", "{tmp}/w.yaml"),
         files={"big.pkl": "@sparse:322122547200"}),
    Case("workload-from-polyglot", "workload from poly.pt (a pickle calling os.system, then a valid torch.save zip)",
         ("poly.pt", "polyglot", "refused with or without --trust"), ("save the batch on its own",),
         argv=("workload", "from", "{tmp}/poly.pt", "--out", "{tmp}/w.yaml"), files={"poly.pt": POLYGLOT}),
    Case("workload-from-polyglot-trust", "workload from poly.pt --trust (the same polyglot)",
         ("poly.pt", "polyglot", "refused with or without --trust"), ("save the batch on its own",),
         argv=("workload", "from", "{tmp}/poly.pt", "--trust", "--out", "{tmp}/w.yaml"), files={"poly.pt": POLYGLOT}),
    Case("workload-from-pt-system", "workload from sys.pt (a .pt whose data.pkl calls os.system)",
         ("sys.pt", "built by os.system", "--trust or not"), ("save tensors, TensorDicts or numpy arrays",),
         argv=("workload", "from", "{tmp}/sys.pt", "--out", "{tmp}/w.yaml"), files={"sys.pt": PT_SYSTEM}),
    Case("workload-from-pt-system-trust", "workload from sys.pt --trust (data.pkl calls os.system)",
         ("sys.pt", "built by os.system", "--trust or not"), ("save tensors, TensorDicts or numpy arrays",),
         argv=("workload", "from", "{tmp}/sys.pt", "--trust", "--out", "{tmp}/w.yaml"), files={"sys.pt": PT_SYSTEM}),
    Case("workload-from-pt-exec-trust", "workload from exec.pt --trust (data.pkl is a dict holding builtins.exec(...))",
         ("exec.pt", "builtins.exec", "--trust or not"), ("save tensors, TensorDicts or numpy arrays",),
         argv=("workload", "from", "{tmp}/exec.pt", "--trust", "--out", "{tmp}/w.yaml"), files={"exec.pt": PT_EXEC}),
    Case("workload-from-pt-popen-trust", "workload from popen.pt --trust (data.pkl calls subprocess.Popen)",
         ("popen.pt", "subprocess.Popen", "--trust or not"), ("save tensors, TensorDicts or numpy arrays",),
         argv=("workload", "from", "{tmp}/popen.pt", "--trust", "--out", "{tmp}/w.yaml"), files={"popen.pt": PT_POPEN}),
    Case("workload-from-runs-code-trust", "workload from evil.pkl --trust (its top object is os.system(...))",
         ("built by os.system", "outside the globals any load may resolve", "refused with or without --trust"),
         ("docs/safe_loading.md",), argv=("workload", "from", "{tmp}/evil.pkl", "--trust", "--out", "{tmp}/w.yaml"),
         files={"evil.pkl": RUNS_CODE_PKL}),
    Case("workload-from-zip64-100g", "workload from big.pt (its zip64 directory declares data.pkl as 100 GiB)",
         ("big.pt", "data.pkl declares 100.00 GiB", "over the 64.0 MiB limit"), ("copy the original again",),
         argv=("workload", "from", "{tmp}/big.pt", "--out", "{tmp}/w.yaml"), files={"big.pt": ZIP64_100G}),
    Case("workload-from-zip-million-members", "workload from many.pt (its zip64 directory declares 1,000,000 members)",
         ("many.pt", "declares 1,000,000 members", "over the 65,536"), ("not a saved batch",),
         argv=("workload", "from", "{tmp}/many.pt", "--out", "{tmp}/w.yaml"), files={"many.pt": ZIP_MILLION}),
    Case("workload-from-bad-crc", "workload from crc.pkl (a torch-mode DataProto whose carried zip fails its CRC)",
         ("crc.pkl", "data.pkl is damaged", "Bad CRC-32"), ("copy the file again",),
         argv=("workload", "from", "{tmp}/crc.pkl", "--out", "{tmp}/w.yaml"), files={"crc.pkl": _bad_crc_blob()}),
    Case("workload-from-trailing", "workload from t.pkl (a pickle followed by other bytes)",
         ("t.pkl", "the pickle stream stops at byte 6", "of other data follow"), ("save the batch on its own",),
         argv=("workload", "from", "{tmp}/t.pkl", "--out", "{tmp}/w.yaml"), files={"t.pkl": TRAILING}),
    Case("workload-from-long-line", "workload from line.pkl (a protocol-0 string of 2 MiB without a newline)",
         ("line.pkl", "runs over 1048576 bytes without ending"), ("not a saved batch",),
         argv=("workload", "from", "{tmp}/line.pkl", "--out", "{tmp}/w.yaml"), files={"line.pkl": LONG_LINE}),
    Case("workload-from-huge-int", "workload from int.pkl (a LONG4 opcode declaring a 1 GiB integer)",
         ("int.pkl", "an integer of 1,073,741,824 bytes"), ("not a saved batch",),
         argv=("workload", "from", "{tmp}/int.pkl", "--out", "{tmp}/w.yaml"), files={"int.pkl": HUGE_LONG4}),
    Case("workload-from-bad-name", "workload from sys.pt --name 'a<ESC>' (a control character in --name)",
         ("--name", "without control characters"), ("choose another with --name",),
         argv=("workload", "from", "{tmp}/sys.pt", "--name", "a\x1b", "--out", "{tmp}/w.yaml"),
         files={"sys.pt": PT_SYSTEM}),
    Case("workload-from-surrogate-name", "workload from sys.pt --name 'w\\udc80' (undecodable bytes in --name)",
         ("--name", "lone surrogate"), ("choose another with --name",),
         argv=("workload", "from", "{tmp}/sys.pt", "--name", "w\udc80", "--out", "{tmp}/w.yaml"),
         files={"sys.pt": PT_SYSTEM}),
    # -- Ray addresses --------------------------------------------------------------------------------
    Case("ray-long-host", "run --transport ray --ray-address <300-character host>:6379",
         ("host name that cannot exist", "253"), ("host:port",),
         argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address", "h" * 300 + ":6379")),
    Case("ray-control-host", "run --transport ray --ray-address with an escape sequence in the host",
         ("\\x1b", "control characters"), ("host:port",),
         argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address", "evil\x1b[2J:6379")),
    Case("ray-long-port", "run --transport ray --ray-address 127.0.0.1:000000000080", ("000000000080",),
         ("1 to 65535",), argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address",
                                "127.0.0.1:000000000080")),
    # -- scale ---------------------------------------------------------------------------------
    Case("scale-zero", "run --scale 0", ("scale 0.0 must be a positive number",), ("--scale 0.25",),
         argv=("run", "--scale", "0")),
    Case("scale-negative", "run --scale -1", ("scale -1.0 must be a positive number",), ("--scale",),
         argv=("run", "--scale", "-1")),
    Case("scale-nan-api", "picklescope.run(scale=float('nan'))", ("scale nan",), ("positive",),
         call=_api_run(scale=float("nan"))),
    Case("scale-too-big", "run --scale 100000 (45 TiB of batch)", ("needs at least", "this machine's"),
         ("smaller --scale",), argv=("run", "--scale", "100000")),
    # -- budgets -------------------------------------------------------------------------------
    Case("budget-unparsable", "run --budget lots", ("--budget 'lots' is not a size",), ("700MiB", "1.5x"),
         argv=("run", "--budget", "lots")),
    Case("budget-zero", "run --budget 0", ("must be above zero",), ("positive size",),
         argv=("run", "--budget", "0")),
    Case("budget-negative", "run --budget -1MiB", ("'-1MiB' is negative",), ("positive size",),
         argv=("run", "--budget", "-1MiB")),
    Case("budget-below-baseline", "run --budget total:64MiB (the child holds torch and the batch)",
         ("below the sender's baseline", "total:64.0 MiB"), ("give a total above",),
         argv=("run", "--workload", "tiny", "--budget", "total:64MiB")),
    Case("budget-above-machine", "run --budget 100TiB", ("more than this machine can give",),
         ("use a budget under",), argv=("run", "--workload", "tiny", "--budget", "100TiB")),
    Case("budget-total-multiple", "run --budget total:0.5x", ("mixes total: with a payload multiple",),
         ("total:2GiB",), argv=("run", "--budget", "total:0.5x")),
    Case("receiver-budget-api", "picklescope.run(receiver_budget='12 parsecs')",
         ("--receiver-budget '12 parsecs' is not a size",), ("700MiB",), call=_api_run(receiver_budget="12 parsecs")),
    Case("budget-without-sampling", "picklescope.run(budget='1x', tracer='none')",
         ("turns off the sampling a budget is enforced with",), ("drop --tracer none",),
         call=_api_run(budget="1x", tracer="none")),
    Case("budget-infinite", "run --budget 1e400MiB", ("too large to be a size",), ("700MiB",),
         argv=("run", "--budget", "1e400MiB")),
    Case("timeout-zero", "run --timeout 0", ("--timeout '0' must be a positive number of seconds",),
         ("--timeout 300",), argv=("run", "--timeout", "0")),
    Case("timeout-api", "picklescope.run(timeout_s=-5)", ("timeout_s -5 must be a positive",), ("timeout_s=300",),
         call=_api_run(timeout_s=-5)),
    # -- tracers -------------------------------------------------------------------------------
    Case("tracer-not-installed", "run --tracer memray where memray is not installed",
         ("tracer 'memray' is not available", "memray is not installed"), ("pip install", "drop it"),
         argv=("run", "--workload", "tiny", "--tracer", "memray"), hide=("memray",)),
    Case("tracers-conflict", "run --tracer memray,memray-native", ("memray and memray-native cannot run",),
         ("choose one",), argv=("run", "--tracer", "memray,memray-native")),
    # -- verl ----------------------------------------------------------------------------------
    Case("verl-not-installable", "verl install 0.0.99", ("verl 0.0.99 is not on the package index",),
         ("0.9.1", "pick one"), argv=("verl", "install", "0.0.99"), subprocess=True,
         env={"PICKLESCOPE_CACHE": "{tmp}/.cache"}),
    Case("verl-bad-version", "verl install latest-please", ("is not a verl version number",), ("0.9.0",),
         argv=("verl", "install", "latest-please")),
    Case("verl-not-importable", "run --codec verl-broken:numpy (its protocol.py imports a missing package)",
         ("verl broken", "cannot be imported", "not_a_real_dependency_xyz"), ("not installed here",),
         argv=("run", "--workload", "tiny", "--codec", "verl-broken:numpy"), subprocess=True,
         env={"PICKLESCOPE_CACHE": "{tmp}/.cache"}, needs=("verl-broken",),
         files={"checkout/verl/__init__.py": "", "checkout/verl/protocol.py": BROKEN_VERL}),
    Case("verl-check-not-importable", "verl check broken", ("cannot be imported", "not_a_real_dependency_xyz"),
         ("pip install",), argv=("verl", "check", "broken"), subprocess=True,
         env={"PICKLESCOPE_CACHE": "{tmp}/.cache"}, needs=("verl-broken",),
         files={"checkout/verl/__init__.py": "", "checkout/verl/protocol.py": BROKEN_VERL}),
    Case("verl-checkout-missing", "verl install --source a-folder-without-verl", ("is not a verl checkout",),
         ("protocol.py",), argv=("verl", "install", "--source", "{tmp}"), files={"readme.txt": "not verl\n"}),
    # -- Ray -----------------------------------------------------------------------------------
    Case("ray-unreachable", "run --transport ray --ray-address 127.0.0.1:1",
         ("127.0.0.1:1",), ("ray start", "--ray-address"),
         argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address", "127.0.0.1:1")),
    Case("ray-bad-address", "run --transport ray --ray-address nothost", ("nothost",), ("host:port",),
         argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address", "nothost")),
    Case("ray-bad-port", "run --transport ray --ray-address 127.0.0.1:99999", ("port '99999'",),
         ("1 to 65535",), argv=("run", "--transport", "ray", "--workload", "tiny", "--ray-address", "127.0.0.1:99999")),
    Case("ray-not-installed", "run --transport ray where Ray is not installed", ("ray",), ("pip install",),
         argv=("run", "--transport", "ray", "--workload", "tiny"), hide=("ray",)),
    # -- blobs ---------------------------------------------------------------------------------
    Case("blob-missing", "inspect missing.pkl", ("missing.pkl",), ("check the path",),
         argv=("inspect", "{tmp}/missing.pkl")),
    Case("blob-not-pickle", "inspect notes.txt --trust", ("not a pickle",), ("",),
         argv=("inspect", "{tmp}/notes.txt", "--trust"), files={"notes.txt": USER_NOTE}),
    Case("blob-truncated", "inspect half.pkl --trust (first half of a real blob)", ("truncated",), ("",),
         argv=("inspect", "{tmp}/half.pkl", "--trust"), files={"half.pkl": "@half:verl-0.9.0-numpy.pkl"}),
    Case("blob-untrusted", "inspect --as numpy a pickle outside data/ without --trust", ("--trust",), ("trust",),
         argv=("inspect", "{tmp}/copy.pkl", "--as", "numpy"), files={"copy.pkl": "@copy:verl-0.9.0-numpy.pkl"}),
    Case("blob-other-codec", "inspect a numpy-mode blob --as verl-0.9.0:torch",
         ("written in numpy mode, read in torch mode",), ("VERL_DATAPROTO_SERIALIZATION_METHOD=numpy",),
         argv=("inspect", str(BLOBS / "verl-0.9.0-numpy.pkl"), "--as", "verl-0.9.0:torch"), needs=("verl-0.9.0",)),
    Case("blob-not-verl-codec", "inspect a verl blob --as torch", ("holds a verl DataProto", "'torch' cannot read"),
         ("verl-0.9.1:numpy",), argv=("inspect", str(BLOBS / "verl-0.9.0-numpy.pkl"), "--as", "torch")),
    # -- output folders ------------------------------------------------------------------------
    Case("out-not-empty", "reproduce --out notes/ (holds the user's file)", ("already holds other files", "mine.txt"),
         ("--force",), argv=("reproduce", "--workload", "tiny", "--out", "{tmp}/notes"),
         files={"notes/mine.txt": USER_NOTE}),
    Case("out-is-a-file", "reproduce --out notes.txt (a file)", ("exists and is not a folder",),
         ("folder path",), argv=("reproduce", "--workload", "tiny", "--out", "{tmp}/notes.txt"),
         files={"notes.txt": USER_NOTE}),
    Case("out-unwritable", "reproduce --out /proc/1/picklescope-out (cannot be created)", ("/proc/1/picklescope-out",),
         ("permissions",), argv=("reproduce", "--workload", "tiny", "--out", "/proc/1/picklescope-out")),
    Case("postmortem-out-not-empty", "postmortem --out notes/", ("is not empty", "mine.txt"), ("--force",),
         argv=("postmortem", "--workload", "tiny", "--out", "{tmp}/notes"), files={"notes/mine.txt": USER_NOTE}),
    # -- patches, plugins, functions -----------------------------------------------------------
    Case("candidate-syntax-error", "confirm --candidate broken.py (unclosed parenthesis)",
         ("broken.py", "line"), ("__getstate__",),
         argv=("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", "{tmp}/broken.py"),
         files={"broken.py": SYNTAX_ERROR_PY}),
    Case("candidate-no-function", "confirm --candidate empty.py (no __getstate__)",
         ("defines neither __getstate__ nor __setstate__",), ("def __getstate__(self)",),
         argv=("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", "{tmp}/empty.py"),
         files={"empty.py": NO_FUNCTION_PY}),
    Case("confirm-baseline-not-verl", "confirm --baseline numpy (a built-in codec)",
         ("'numpy' is not a verl codec name",), ("verl-0.9.0:numpy",),
         argv=("confirm", "--baseline", "numpy", "--candidate", "{tmp}/empty.py"), files={"empty.py": NO_FUNCTION_PY}),
    Case("candidate-missing", "confirm --candidate missing.py", ("missing.py does not exist",), (".py patch",),
         argv=("confirm", "--baseline", "verl-0.9.0:numpy", "--candidate", "{tmp}/missing.py")),
    Case("plugin-syntax-error", "picklescope.run(plugins=['plug.py']) with a syntax error",
         ("plug.py", "syntax error", "line 2"), ("fix the file",),
         call=_api_run(plugins=["{tmp}/plug.py"]), files={"plug.py": SYNTAX_ERROR_PY}),
    Case("plugin-missing", "stepthrough --codec numpy --plugin nothere.py", ("nothere.py", "does not exist"),
         ("check the path",), argv=("stepthrough", "--codec", "numpy", "--plugin", "{tmp}/nothere.py")),
    Case("function-no-module", "stepthrough --function nope.mod:Thing",
         ("'nope.mod:Thing' does not resolve", "cannot be imported"), ("--path",),
         argv=("stepthrough", "--workload", "tiny", "--function", "nope.mod:Thing")),
    Case("function-no-attribute", "stepthrough --function json:JSONDecoder.nope",
         ("does not resolve", "has no attribute 'nope'"), ("module:Class.method",),
         argv=("stepthrough", "--workload", "tiny", "--function", "json:JSONDecoder.nope")),
    Case("function-no-colon", "stepthrough --function verl.protocol.DataProto", ("is not module:qualname",),
         ("verl.protocol:DataProto.__getstate__",), argv=("stepthrough", "--function", "verl.protocol.DataProto")),
    Case("function-api", "stepthrough(function='json:nothing')", ("has no attribute 'nothing'",),
         ("module:Class.method",),
         call=_api("picklescope.investigate.stepthrough.stepthrough", "json:nothing", workload="tiny")),
    Case("stepthrough-unknown-method", "stepthrough --codec numpy --method __reduce__",
         ("unknown method '__reduce__'",), ("__getstate__",), argv=("stepthrough", "--codec", "numpy", "--method",
                                                                    "__reduce__")),
    Case("stepthrough-bad-env", "stepthrough --codec numpy --env NOEQUALS", ("'NOEQUALS' is not KEY=VALUE",),
         ("VERL_DATAPROTO_SERIALIZATION_METHOD=numpy",), argv=("stepthrough", "--codec", "numpy", "--env", "NOEQUALS")),
    Case("capabilities-unknown", "capabilities --codec nope", ("unknown codec 'nope'",), ("numpy",),
         argv=("capabilities", "--codec", "nope")),
]


def materialize(case: Case, tmp: Path) -> None:
    """Write the user's folder of ``case`` (``@half:`` / ``@copy:`` take bytes of a reference blob)."""
    import os

    for rel, text in case.files.items():
        p = tmp / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(text, bytes):
            p.write_bytes(text)
        elif text == "@fifo":
            os.mkfifo(p)
        elif text.startswith("@link:"):
            os.symlink(text[6:], p)
        elif text.startswith("@sparse:"):
            with open(p, "wb") as f:
                f.truncate(int(text[8:]))
        elif text.startswith("@pad:"):
            line = b"# " + b"x" * 77 + b"\n"
            p.write_bytes(line * (int(text[5:]) // len(line) + 1))
        elif text.startswith("@"):
            how, _, name = text[1:].partition(":")
            data = (BLOBS / name).read_bytes()
            p.write_bytes(data[: len(data) // 2] if how == "half" else data)
        else:
            p.write_text(text)


def fill(case: Case, tmp: Path) -> tuple[list[str], dict[str, str]]:
    return [a.format(tmp=tmp) for a in case.argv], {k: v.format(tmp=tmp) for k, v in case.env.items()}


def run_case(case: Case, tmp: Path) -> tuple[int, str]:
    """Run one case; returns (exit status or 2 for an API error, the error text). Raises if the API
    call does not raise a PicklescopeError (the test reports that)."""
    import contextlib
    import io
    import os
    import subprocess

    from picklescope.errors import PicklescopeError

    argv, env = fill(case, tmp)
    hidden = {m: sys.modules.get(m) for m in case.hide}
    for m in case.hide:  # what 'pip uninstall' would leave: the import fails
        sys.modules[m] = None  # type: ignore[assignment]
    try:
        if case.call is not None:
            try:
                case.call(tmp)
            except PicklescopeError as exc:
                return 2, str(exc)
            raise AssertionError(f"{case.id}: the call returned instead of raising PicklescopeError")
        if case.subprocess:
            p = subprocess.run([sys.executable, "-m", "picklescope", *argv], capture_output=True, text=True,
                               env={**os.environ, **env}, cwd=tmp, timeout=600)
            return p.returncode, p.stderr
        from picklescope.cli import main

        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(argv)
        return code, err.getvalue()
    finally:
        for m, mod in hidden.items():
            if mod is None:
                sys.modules.pop(m, None)
            else:
                sys.modules[m] = mod


def prepare_needs(case: Case, tmp: Path) -> None:
    """Install what a case needs before it runs (a verl environment)."""
    import os
    import subprocess

    _, env = fill(case, tmp)
    full_env = {**os.environ, **env}
    for need in case.needs:
        if need == "verl-broken":
            args = ["verl", "install", "--source", str(tmp / "checkout"), "--name", "broken"]
        else:
            args = ["verl", "install", need.removeprefix("verl-")]
        p = subprocess.run([sys.executable, "-m", "picklescope", *args], capture_output=True, text=True,
                           env=full_env, timeout=900)
        if p.returncode != 0:
            raise RuntimeError(f"could not prepare {need}: {p.stderr}")


def error_line(stderr: str) -> str:
    return "\n".join(ln for ln in stderr.splitlines() if ln.startswith("picklescope: error:"))


def markdown(rows: list[tuple[Case, str]]) -> str:
    """The docs page: one row per case with the message it printed."""
    def cell(s: str) -> str:  # a code span: shown as printed, '<' and '*' included
        return "`" + s.replace("`", "'").replace("|", "\\|").replace("\n", " ") + "`"

    out = [
        "# Bad input: what picklescope says",
        "",
        "Every wrong input below ends with one line on stderr that names the problem and the way out,",
        "exit status 2 and no traceback (`picklescope --debug ...` shows it). Nothing in the user's",
        "folder is changed. The Python API raises `picklescope.PicklescopeError` (`UnknownNameError`",
        "for names, also a `KeyError`) with the same text. The catalogue lives in",
        "`tests/bad_input_cases.py`; `tests/test_bad_input.py` runs every case and checks each",
        "message for the named cause and fix. This page is written by",
        "`python tests/bad_input_cases.py` with the messages printed on the machine that ran it",
        "(sizes differ by machine).",
        "",
        "What the parent reads and how much is bounded before anything is parsed or allocated:",
        "",
        "- a file picklescope reads for the user (a workload, a blob, a plugin) must be a regular file:",
        "  a folder, a FIFO, a socket, a device or a symlink to one is named as such and never opened for",
        "  reading; a workload file may hold 4 MiB, a blob `inspect` identifies 4 GiB and a blob loaded in a",
        "  child 1 GiB (`PICKLESCOPE_MAX_BLOB_BYTES` changes both), a plugin 16 MiB;",
        "- workload YAML is read by a strict loader: UTF-8 only, and no aliases or anchors, no tags (`!!python/...`",
        "  or any other), no duplicate keys, no keys that are not strings, no nesting deeper than 32 levels;",
        "  numbers in decimal only (YAML 1.1 reads `1:30` as 90, `0x10` as 16, `010` as 8, `0b101` as 5: such a",
        "  value is refused with the number it would have been, rather than silently changed), and strings that",
        "  UTF-8 can carry (a `\\ud800` escape makes a lone surrogate, which is refused);",
        "- `workload from` reads a saved batch no further than its size at open, checks every declared size",
        "  (zip directories, zip64 records, members, pickle frames and opcodes) against the file and a stated",
        "  limit, counts what a stream makes it hold, and refuses code outside its allow-list with or without",
        "  `--trust` (docs/safe_loading.md); `inspect` streams a blob through the same bounded reader, inert",
        "  machine and zip checks, and refuses a pickle followed by a zip (a polyglot) before any load;",
        "- every bound a child relies on is checked by arithmetic first: rows (at most 2^40, and 1,000,000",
        "  for nested leaves, whose lengths are drawn per row), the least the batch can hold against the",
        "  machine's physical memory, 16 dimensions of at most 2^40, `high` within the dtype's range, the",
        "  seed in 0..2^32-1, string lengths up to 1 MiB; names and keys carry no control characters;",
        "- a payload of 0 bytes is refused wherever a multiple of it is asked for (a budget like `0.5x`,",
        "  `headroom`);",
        "- the hand-off must fit: `/dev/shm`'s free space is read (`statvfs`) before any child starts;",
        "  `--handoff-dir DIR` (Python `handoff_dir=`) writes it to a folder on disk instead.",
        "  `PICKLESCOPE_SHM_FREE_BYTES` replaces the reading of `/dev/shm` (to act out a 64 MiB Docker",
        "  container, as the `shm-too-small` case does).",
        "",
        "Every message is one line: control characters in anything the user named are printed escaped",
        "(`\\x1b`, `\\n`). `tests/test_bad_input.py` also runs the once-unbounded cases in a real CLI",
        "process and checks, from the kernel's `VmHWM`, that it grows by less than 200 MiB, and",
        "`tests/test_fuzz_workloads.py` feeds random and mutated workload files to the parser.",
        "",
        f"{len(rows)} cases.",
        "",
        "| case | surface | input | message |",
        "|---|---|---|---|",
    ]
    for case, msg in rows:
        out.append(f"| `{case.id}` | {case.surface} | {cell(case.what)} | {cell(msg)} |")
    return "\n".join(out) + "\n"


def _printed() -> dict[str, str]:
    """The message each case printed, as the docs page lists it now (case id -> message)."""
    import re

    page = ROOT / "docs" / "bad_input.md"
    if not page.exists():
        return {}
    rows = re.findall(r"^\| `([^`]+)` \| [^|]+ \| `.*?` \| `(.*)` \|$", page.read_text(), flags=re.M)
    return {cid: msg.replace("\\|", "|") for cid, msg in rows}


def main(argv: list[str] | None = None) -> None:  # pragma: no cover - writes the docs page
    """Run every case (or, with ``--new``, only those the page does not list yet, plus the ids given) and
    write the page with the message each printed."""
    import argparse
    import os
    import tempfile

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new", action="store_true", help="run only cases missing from the page (and IDS)")
    ap.add_argument("ids", nargs="*", help="cases to run again with --new")
    args = ap.parse_args(argv)
    known = _printed() if args.new else {}
    rows = []
    for case in CASES:
        if case.id in known and case.id not in args.ids:
            rows.append((case, known[case.id]))
            continue
        with tempfile.TemporaryDirectory(prefix=f"picklescope-badinput-{os.getpid()}-") as d:  # creator pid: a
            # concurrent leftover check then knows the folder is another live process's
            tmp = Path(d)
            materialize(case, tmp)
            prepare_needs(case, tmp)
            code, text = run_case(case, tmp)
            msg = text.strip() if case.call is not None else error_line(text)
            msg = msg.replace(str(tmp), "<folder>")
            print(f"{case.id}: exit {code}: {msg}", file=sys.stderr)
            rows.append((case, msg))
    (ROOT / "docs" / "bad_input.md").write_text(markdown(rows))


if __name__ == "__main__":  # pragma: no cover
    main()
