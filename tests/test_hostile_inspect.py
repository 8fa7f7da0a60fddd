"""``picklescope inspect`` on hostile files, each built here: one line, and a reader that stays small.

``inspect`` runs in the user's own process (a shell, a notebook's kernel), so it must stay small whatever
it is given: it streams the blob through the shared bounded reader and the one inert pickle machine
(toolkit/picklescope/workloads/blobinfo.py). Each test runs the CLI in a process of its own and reads, from
the kernel, how far its resident memory rose above what it held once the command was imported
(``VmHWM`` after writing 5 to ``/proc/self/clear_refs``): under
``picklescope.core.safefile.READER_MEMORY_BOUND`` (256 MiB), and the whole process under 1 GiB, for
a deflate bomb, a file another process keeps appending to, a dict of 10 million keys, files of 1.5 GiB
and a polyglot. Large files are sparse (holes read as zeros), so they cost neither disk nor memory here.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import re
import struct
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path

import pytest

from picklescope.core.safefile import READER_MEMORY_BOUND

sys.path.insert(0, str(Path(__file__).resolve().parent))  # --import-mode=importlib leaves tests/ off the path
from hostile_files import deflate_bomb, many_keys  # noqa: E402

GiB, MiB = 1 << 30, 1 << 20

_PEAK = """
import json, sys
import picklescope.cli.commands.inspect  # what the command imports (torch, with the blob loader) is its baseline
from picklescope.cli import main


def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(key + ":"))

base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # VmHWM restarts from here: what follows is the command's own
code = main(sys.argv[2:])
with open(sys.argv[1], "w") as f:
    json.dump({"code": code, "base": base, "hwm": status("VmHWM")}, f)
sys.exit(code)
"""


def inspect_measured(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess, int, int]:
    """``picklescope inspect ARGS`` in a process of its own: its result, its peak resident memory above its
    baseline, and that peak in all."""
    report = tmp / "peak.json"
    report.unlink(missing_ok=True)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-c", _PEAK, str(report), "inspect", *args], capture_output=True, text=True,
                       timeout=900)
    got = json.loads(report.read_text())
    above = got["hwm"] - got["base"]
    print(f"inspect {' '.join(args)[-60:]}: exit {p.returncode}, peak {above / MiB:.0f} MiB above the baseline "
          f"({got['hwm'] / MiB:.0f} MiB in all) in {time.monotonic() - t0:.1f} s; load {os.getloadavg()[0]:.1f}; "
          f"{p.stderr.strip()[:300]}")
    return p, above, got["hwm"]


def assert_small(above: int, hwm: int) -> None:
    assert above < READER_MEMORY_BOUND, f"inspect rose {above / MiB:.0f} MiB above its baseline"
    assert hwm < GiB, f"inspect's peak resident memory was {hwm / MiB:.0f} MiB"


def assert_one_line(p: subprocess.CompletedProcess, *needles: str) -> str:
    line = p.stderr.strip()
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout[-500:], p.stderr[-2000:])
    assert len(line.splitlines()) == 1 and "Traceback" not in line, p.stderr[-2000:]
    for n in needles:
        assert n in line, line
    return line


def _sparse(path: Path, size: int, head: bytes, tail: bytes = b"") -> None:
    """A file of ``size`` bytes: ``head``, a hole (zeros that take no disk), ``tail`` at the end."""
    with open(path, "wb") as f:
        f.write(head)
        f.truncate(size - len(tail))
        f.seek(size - len(tail))
        f.write(tail)


# -- a deflate bomb --------------------------------------------------------------------------------------
@pytest.mark.parametrize("size", [512 * MiB, pytest.param(3 * GiB, marks=pytest.mark.slow)], ids=["512MiB", "3GiB"])
def test_a_deflate_bomb_is_refused_by_its_declared_size(tmp_path, size):
    pt = tmp_path / "expands.pt"
    deflate_bomb(pt, size)
    assert pt.stat().st_size < size // 100  # a small file that claims a big member
    for extra in ([], ["--json"], ["--as", "numpy", "--trust"]):
        p, above, hwm = inspect_measured(tmp_path, str(pt), *extra)
        assert_one_line(p, "data.pkl declares", f"{size / GiB:.2f} GiB" if size >= GiB else f"{size // MiB}.0 MiB",
                        "over the 64.0 MiB limit")
        assert_small(above, hwm)


# -- a file another process keeps appending to -----------------------------------------------------------
_CHUNK = 1 * MiB  # each appended opcode pushes a byte string of this size (skipped by seeking), then pops it


def _append_without_end(path: Path, stop: threading.Event, sizes: list[int], cap: int) -> None:
    """Append BINBYTES + POP pairs to ``path`` until ``stop`` or ``cap`` bytes: a stream that is valid as far
    as it goes and never reaches STOP, whose opcodes hold nothing, so only the end seen at open can end a
    reader. Each byte string is a hole (sparse), so the file costs no disk."""
    with open(path, "r+b") as f:
        end = f.seek(0, 2)
        while not stop.is_set() and end < cap:
            f.seek(end)
            f.write(b"B" + struct.pack("<I", _CHUNK))
            f.seek(end + 5 + _CHUNK)
            f.write(b"0")
            f.flush()
            end += 5 + _CHUNK + 1
            sizes.append(end)
            stop.wait(0.02)


def test_a_growing_file_is_read_only_as_far_as_it_was_at_open(tmp_path):
    """A reader that followed the file would go on for as long as the writer writes; this one stops at
    the size it saw at open, says the stream is truncated there, and ends while the file still grows."""
    grow = tmp_path / "growing.pkl"
    grow.write_bytes(b"\x80\x03")
    stop, sizes = threading.Event(), [2]
    cap = 2 * GiB  # about 40 s of appending at full speed: far longer than inspect needs, even under load
    writer = threading.Thread(target=_append_without_end, args=(grow, stop, sizes, cap), daemon=True)
    writer.start()
    try:
        while len(sizes) < 3:
            stop.wait(0.01)
        before = sizes[-1]
        p, above, hwm = inspect_measured(tmp_path, str(grow))
        after, still_growing = sizes[-1], sizes[-1] < cap
    finally:
        stop.set()
        writer.join()
    line = assert_one_line(p, f"{grow} is truncated", "before its STOP opcode")
    assert_small(above, hwm)
    ended = int(re.search(r"ends at byte (\d+)", line).group(1))
    assert before <= ended < after, (before, ended, after)  # the size at open: after the launch, before the end
    assert still_growing and after - ended > 2 * _CHUNK, "the writer had stopped early: the test proves nothing"
    print(f"inspect stopped at byte {ended:,}; the file had grown to {after:,} bytes when it ended")


# -- a dict of 10 million keys ---------------------------------------------------------------------------
@pytest.mark.parametrize("batch", [1000, None], ids=["setitems-of-1000", "one-mark"])
def test_ten_million_keys_are_refused_early_with_the_count(tmp_path, batch):
    big = tmp_path / "keys.pkl"
    many_keys(big, 10_000_000, batch)
    assert big.stat().st_size > 60 * MiB
    p, above, hwm = inspect_measured(tmp_path, str(big))
    assert_one_line(p, str(big), "entries by byte", "refused before reading the rest",
                    "a dict holds 6" if batch else "stack holds 1,")
    assert_small(above, hwm)


# -- files of 1.5 GiB --------------------------------------------------------------------------------------
def test_a_large_file_that_is_no_pickle_is_named_from_its_first_byte(tmp_path):
    notes = tmp_path / "notes.pkl"
    _sparse(notes, 3 * GiB // 2, b"my notes from the incident\n")
    p, above, hwm = inspect_measured(tmp_path, str(notes))
    assert_one_line(p, f"{notes} is not a pickle stream", "opcode b'm' at byte 0 is no pickle opcode")
    assert_small(above, hwm)


def test_a_large_whole_pickle_is_identified_and_hashed_in_chunks(tmp_path):
    """A 1.5 GiB pickle of a dict holding one byte string: identified and hashed, never held."""
    size = 3 * GiB // 2
    head = b"\x80\x04}\x94\x8c\x01x\x94\x8e" + (size - 17 - 2).to_bytes(8, "little")  # BINBYTES8 up to the tail
    big = tmp_path / "big.pkl"
    _sparse(big, size, head, b"s.")
    p, above, hwm = inspect_measured(tmp_path, str(big), "--json")
    assert p.returncode == 0, p.stderr[-2000:]
    assert_small(above, hwm)
    blob = json.loads(p.stdout)["blob"]
    assert blob["bytes"] == size and blob["kind"] == "pickle" and blob["problem"] is None
    assert blob["container"] == "plain Python data" and blob["pickle_protocol"] == 4
    h = hashlib.sha256()
    with open(big, "rb") as f:
        for chunk in iter(lambda: f.read(64 * MiB), b""):
            h.update(chunk)
    assert blob["sha256"] == h.hexdigest()


def test_a_large_truncated_pickle_names_what_it_needs(tmp_path):
    """A BINBYTES8 that declares 3 GiB in a 1.5 GiB file: the walk that words where the stream ends seeks past
    the byte string instead of reading it."""
    size, declared = 3 * GiB // 2, 3 * GiB
    big = tmp_path / "cut.pkl"
    _sparse(big, size, b"\x80\x04}\x94\x8c\x01x\x94\x8e" + declared.to_bytes(8, "little"))
    p, above, hwm = inspect_measured(tmp_path, str(big), "--trust")
    assert_one_line(p, f"{big} is truncated: the pickle stream ends at byte {size} of at least {17 + declared}",
                    "inside the BINBYTES8 opcode at byte 8")
    assert_small(above, hwm)


# -- a polyglot: a pickle that runs a command, then a valid torch.save zip ------------------------------------
class _Touch:
    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (os.system, (f"touch {self.path}",))


def _polyglot(marker: Path) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save({"x": torch.zeros(4, 2)}, buf)
    return pickle.dumps(_Touch(marker), protocol=2) + buf.getvalue()


def test_a_polyglot_is_refused_with_and_without_trust_and_never_run(tmp_path):
    control = tmp_path / "control"
    live = subprocess.run([sys.executable, "-c", "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                          input=_polyglot(control), capture_output=True, timeout=120)
    assert live.returncode == 0 and control.exists(), "the payload is not live: the test would prove nothing"
    marker = tmp_path / "marker-created-by-the-file"
    poly = tmp_path / "poly.pt"
    poly.write_bytes(_polyglot(marker))
    with zipfile.ZipFile(poly) as z:  # a zip reader sees a normal .pt archive
        assert any(n.endswith("data.pkl") for n in z.namelist())
    for extra in ([], ["--trust"], ["--as", "numpy", "--trust"], ["--as", "torch", "--trust", "--json"]):
        p, above, hwm = inspect_measured(tmp_path, str(poly), *extra)
        assert_one_line(p, str(poly), "polyglot", "refused with or without --trust", "save the batch on its own")
        assert_small(above, hwm)
        assert not marker.exists(), extra


def test_a_trusted_load_of_a_pickle_that_names_code_is_refused_and_never_run(tmp_path):
    """``--trust`` allows the loader the file's format calls for, nothing more (docs/safe_loading.md): a whole
    pickle whose ``__reduce__`` calls ``os.system`` is refused by ``inspect --as`` with ``--trust``, in its
    child, before the call, and the command never runs."""
    marker = tmp_path / "marker-created-by-the-file"
    evil = tmp_path / "evil.pkl"
    evil.write_bytes(pickle.dumps(_Touch(marker), protocol=4))
    for codec in ("numpy", "numpy-legacy"):
        p, above, hwm = inspect_measured(tmp_path, str(evil), "--as", codec, "--trust")
        assert "classes named: posix.system" in p.stdout  # identified first, without loading
        line = p.stderr.strip()
        assert p.returncode == 2 and len(line.splitlines()) == 1 and "Traceback" not in line, p.stderr[-2000:]
        assert "posix.system" in line and "not on the allow-list of a trusted load" in line, line
        assert not marker.exists(), codec
