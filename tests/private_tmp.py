"""Run a command with ``/tmp`` replaced by an empty private one, to see exactly what it leaves there.

A mount namespace of its own (``unshare --mount``) with a fresh tmpfs on ``/tmp``: whatever the other
programs on the machine write to the real ``/tmp`` meanwhile, the listing after the command is the
command's alone.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

UNSHARE = shutil.which("unshare")
TORCH_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def _kept_under_tmp() -> list[str]:
    """The entries of the real ``/tmp`` the command needs to start: this checkout, its virtual environment and
    the test's working folder, where they lie under ``/tmp`` (a clone made with ``mktemp -d`` does)."""
    names = set()
    for path in (sys.prefix, sys.executable, str(Path(__file__).resolve().parents[1]), os.getcwd()):
        for p in (os.path.abspath(path), os.path.realpath(path)):
            parts = Path(p).parts
            if len(parts) > 2 and parts[:2] == ("/", "tmp"):
                names.add(parts[2])
    return sorted(names)


def private_tmp(command: list[str], tmpdir: str, timeout_s: float) -> tuple[int, str, str, list[str]]:
    """Run ``command`` with ``/tmp`` replaced by an empty private one (a mount namespace of its own) and
    ``TMPDIR`` set to ``tmpdir``: (exit status, stdout, stderr, what it left in that ``/tmp``).

    Exact, whatever the other programs on the machine write to the real ``/tmp`` meanwhile. The folders the
    command needs from the real ``/tmp`` (:func:`_kept_under_tmp`) are mounted back into the private one under
    their own names, which the listing leaves out."""
    keep = _kept_under_tmp()
    script = ('mkdir -p "$REAL" && mount --bind /tmp "$REAL" || exit 97\n'
              'mount -t tmpfs picklescope-test /tmp || exit 97\n'
              'for name in $KEEP; do mkdir "/tmp/$name" && mount --bind "$REAL/$name" "/tmp/$name" || exit 97; done\n'
              '"$@" >"$OUT" 2>"$ERR"\n'
              'echo "$?" >"$RC"\n'
              'ls -A /tmp >"$LEFT"\n')
    control = tempfile.mkdtemp(prefix="ps-c-", dir="/var/tmp")  # beside TMPDIR, not in it
    files = {k: os.path.join(control, k.lower()) for k in ("OUT", "ERR", "RC", "LEFT")}
    # as from a user's shell where it is unset: importing tensordict anywhere in this test process made torch
    # write its own default cache folder (/tmp/torchinductor_<user>) into os.environ as TORCHINDUCTOR_CACHE_DIR,
    # which the command would take for the user's choice and keep
    env = {k: v for k, v in os.environ.items() if k != TORCH_CACHE_ENV}
    env.update({"TMPDIR": tmpdir, "REAL": os.path.join(control, "real"), "KEEP": " ".join(keep), **files})
    try:
        # from a folder that exists inside the namespace: the test process's own may lie under the real /tmp
        r = subprocess.run([UNSHARE, "--mount", "--propagation", "private", "sh", "-c", script, "sh", *command],
                           env=env, timeout=timeout_s, check=False, cwd=control)
        assert r.returncode != 97, f"the private /tmp could not be set up (keeping {keep} of the real one)"
        read = {k: Path(v).read_text() if os.path.exists(v) else "" for k, v in files.items()}
    finally:
        shutil.rmtree(control, ignore_errors=True)
    return int(read["RC"] or -1), read["OUT"], read["ERR"], [n for n in read["LEFT"].split() if n not in keep]


def unshare_works() -> bool:
    if UNSHARE is None:
        return False
    r = subprocess.run([UNSHARE, "--mount", "--propagation", "private", "sh", "-c", "mount -t tmpfs x /tmp"],
                       capture_output=True, check=False)
    return r.returncode == 0
