"""Ray given a wrong address, or not installed: one line naming the cause and the way out, nothing started.

``ray.init`` given an address where no GCS answers retries for minutes; the parent checks the
address itself first (:mod:`picklescope.ray.address`). Each case here must be refused
before any child is started (``launcher.start`` is made to fail if it is called) and leave no run
directory behind. The GCS check's positive side is exercised by every joined run in test_ray.py
(a real GCS) and here by a server that answers like one.
"""

from __future__ import annotations

import os
import re
import socket
import struct
import subprocess
import sys
import threading
import tomllib
from pathlib import Path

import pytest

import picklescope as ps
from picklescope.measure import launcher
from picklescope.ray import address, ray_available

ROOT = Path(__file__).resolve().parents[1]


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def serve(reply) -> str:
    """A TCP server on 127.0.0.1 that answers each connection with ``reply(conn)``; returns host:port."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(8)

    def loop() -> None:
        while True:
            try:
                c, _ = ls.accept()
            except OSError:
                return
            threading.Thread(target=reply, args=(c,), daemon=True).start()

    threading.Thread(target=loop, daemon=True).start()
    return f"127.0.0.1:{ls.getsockname()[1]}"


def silent(c: socket.socket) -> None:
    c.recv(4096)
    threading.Event().wait(30)
    c.close()


def banner(c: socket.socket) -> None:
    c.sendall(b"SSH-2.0-OpenSSH_9.2\r\n")
    c.recv(4096)
    c.close()


def echo(c: socket.socket) -> None:
    while data := c.recv(4096):
        c.sendall(data)


def other_grpc(c: socket.socket) -> None:
    """An HTTP/2 server that answers every call UNIMPLEMENTED (gRPC status 12), as a non-Ray gRPC service."""
    c.sendall(frame(0x4, 0, 0))
    c.recv(4096)
    c.sendall(frame(0x1, 0x5, 1, b"\x00\x0bgrpc-status\x0212"))
    c.recv(4096)
    c.close()


def like_gcs(c: socket.socket) -> None:
    """What a Ray GCS sends back for GetClusterId: SETTINGS, then a 28-byte cluster id in a gRPC message."""
    c.sendall(frame(0x4, 0, 0))
    c.recv(4096)
    msg = b"\x0a\x00\x12\x1c" + os.urandom(28)
    c.sendall(frame(0x1, 0x4, 1, b"") + frame(0x0, 0, 1, b"\x00" + struct.pack(">I", len(msg)) + msg)
              + frame(0x1, 0x5, 1, b"\x00\x0bgrpc-status\x010"))
    c.recv(4096)
    c.close()


def gcs_with_token_auth(c: socket.socket) -> None:
    """What a GCS started with RAY_AUTH_MODE=token answers a call without the token (measured on Ray 2.60)."""
    c.sendall(frame(0x4, 0, 0))
    c.recv(4096)
    c.sendall(frame(0x1, 0x5, 1, b"\x00\x0bgrpc-status\x0216\x00\x0cgrpc-message>InvalidAuthToken: Authentication "
                                 b"token is missing or incorrect"))
    c.recv(4096)
    c.close()


@pytest.fixture
def no_children(monkeypatch):
    """Fail the test if anything tries to start a child; yield a function listing this process's run dirs."""
    def refuse(*a, **k):
        raise AssertionError("a child was started for a run that should have been refused")

    monkeypatch.setattr(launcher, "start", refuse)
    roots = [r for r in ("/dev/shm", "/tmp") if os.path.isdir(r)]
    mine = lambda: {n for r in roots for n in os.listdir(r) if n.startswith((f"picklescope-{os.getpid()}-",
                                                                            f"psray-{os.getpid()}-"))}
    before = mine()
    yield
    assert mine() == before  # the runner's run directory was removed again


CASES = [
    ("127.0.0.1:1", r"no Ray cluster answers at 127\.0\.0\.1:1 \(connection refused\): start one with 'ray start "
                    r"--head' or drop --ray-address to start a local one"),
    ("nothost", r"Ray address 'nothost' is not host:port: give the GCS address as host:port"),
    ("host:notaport", r"Ray address 'host:notaport' has port 'notaport', not a number from 1 to 65535"),
    ("127.0.0.1:70000", r"has port '70000', not a number from 1 to 65535"),
    ("no-such-host.invalid:6379", r"no Ray cluster answers at no-such-host\.invalid:6379 \(its name does not resolve"),
    ("ray://127.0.0.1:10001", r"is a Ray Client address, which picklescope does not support"),
    (silent, r"not a Ray GCS \(it sent nothing within 3 s\)"),
    (banner, r"not a Ray GCS \(it answered b'SSH-2\.0-OpenSSH_9\.2\\r\\n', not gRPC\)"),
    (echo, r"not a Ray GCS \(it answered b'PRI \* HTTP/2\.0.*not gRPC\)"),
    (other_grpc, r"not a Ray GCS \(it speaks HTTP/2 but did not answer Ray's GetClusterId call \(gRPC status 12\)\)"),
]


needs_ray = pytest.mark.skipif(not ray_available(), reason="ray is not installed (pip install 'picklescope[ray]')")


@needs_ray
@pytest.mark.parametrize(("where", "message"), CASES, ids=[c[0] if isinstance(c[0], str) else c[0].__name__
                                                         for c in CASES])
def test_bad_ray_address_is_refused_in_the_parent(where, message, no_children):
    addr = where if isinstance(where, str) else serve(where)
    with pytest.raises(ps.PicklescopeError) as e:
        ps.run("numpy", "ray", "tiny", 1.0, transport_options={"ray_address": addr})
    assert re.search(message, str(e.value)), str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("gcs", [like_gcs, gcs_with_token_auth])
def test_an_address_that_answers_like_a_gcs_passes_the_check(gcs):
    address.check(serve(gcs))  # no error: the check is not a wall (the token is ray.init's business)


@needs_ray
def test_unreachable_address_on_the_cli_exits_2_with_one_line():
    p = subprocess.run([sys.executable, "-m", "picklescope", "run", "--transport", "ray", "--workload", "tiny",
                        "--ray-address", "127.0.0.1:1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    assert p.stderr == ("picklescope: error: no Ray cluster answers at 127.0.0.1:1 (connection refused): start one "
                        "with 'ray start --head' or drop --ray-address to start a local one\n")


RAY_HIDDEN = """
import sys
sys.modules["ray"] = None  # as if Ray were not installed: import ray fails, find_spec finds nothing
from picklescope.cli import main
codes = [main(["run", "--transport", t, "--workload", "tiny"]) for t in ("ray", "ray-arg", "transferqueue")]
print(codes)
"""


def test_ray_not_installed_names_the_package_and_the_install_command():
    pin = next(d for d in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
               ["ray"] if d.startswith("ray"))
    p = subprocess.run([sys.executable, "-c", RAY_HIDDEN], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.stdout.strip() == "[2, 2, 2]", p.stderr
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 3 and "Traceback" not in p.stderr
    for transport, line in zip(("ray", "ray-arg", "transferqueue"), lines):
        assert line.startswith(f"picklescope: error: transport {transport!r} is unavailable here: the ray package "
                               "is not installed: install it with pip install"), line
        # the extra that brings Ray, and the oldest Ray the package accepts (pyproject.toml's range)
        assert "pip install 'picklescope[ray]'" in line and f"Ray {pin.split('>=')[1]} or later" in line, (pin, line)
