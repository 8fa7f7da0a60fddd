"""Is there a Ray cluster at ``--ray-address``? Asked in the parent, in seconds, before any child starts.

Given an address where no GCS answers, ``ray.init`` in the driver retries for minutes before it
gives up, with the run's sender already started. The parent instead checks the address itself,
without importing Ray (or gRPC, which a plain ``ray`` install lacks): the form (``host:port``), the
name, a TCP connection, then the one call a driver makes first, the GCS's ``GetClusterId``, spoken
as a bare HTTP/2 request. A GCS answers it with a 28-byte cluster id (or, started with token auth,
with Ray's own ``InvalidAuthToken`` refusal: the token is ``ray.init``'s business); a database, a web
server, an echo service, another gRPC service or a proxy does not. Each failure is one line naming
the address, what went wrong and the way out. ``auto`` is left to Ray, which answers it at once.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

from picklescope.errors import PicklescopeError

TIMEOUT_S = 3.0  # per stage (name lookup, connection, reply)
WAY_OUT = "start one with 'ray start --head' or drop --ray-address to start a local one"
NOT_GCS_HINT = ("give the GCS address ('ray start --head' prints it; port 6379 by default), or drop --ray-address "
                "to start a local one")
# HTTP/2 (RFC 9113) as much as one unary gRPC call needs
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, GOAWAY = 0x0, 0x1, 0x3, 0x4, 0x7
END_STREAM, ACK, END_HEADERS = 0x1, 0x1, 0x4
METHOD = "/ray.rpc.NodeInfoGcsService/GetClusterId"
CLUSTER_ID_BYTES = 28  # Ray's ClusterID, field 2 of GetClusterIdReply


def parse(address: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) as (host, port); a malformed address is a PicklescopeError."""
    text = address.strip()
    if text.startswith("ray://"):
        raise PicklescopeError(f"Ray address {address!r} is a Ray Client address, which picklescope does not support",
                               "give the cluster's GCS address host:port (what 'ray start --head' prints, port "
                               "6379 by default), or drop --ray-address to start a local one")
    host, sep, port_text = text.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host:
        raise PicklescopeError(f"Ray address {address!r} is not host:port",
                               "give the GCS address as host:port, e.g. 127.0.0.1:6379 (what 'ray start --head' "
                               "prints), or drop --ray-address to start a local one")
    if len(host) > 253 or any(len(label) > 63 for label in host.split(".")) or not host.isprintable():
        raise PicklescopeError(f"Ray address {address[:80]!r}{'...' if len(address) > 80 else ''} has a host name "
                               "that cannot exist (more than 253 characters, a part longer than 63, or control "
                               "characters)", "give the GCS address as host:port, e.g. 127.0.0.1:6379, or drop "
                               "--ray-address to start a local one")
    if not port_text.isdigit() or len(port_text) > 5 or not 0 < int(port_text) < 65536:
        raise PicklescopeError(f"Ray address {address!r} has port {port_text!r}, not a number from 1 to 65535",
                               "give the GCS address as host:port, e.g. 127.0.0.1:6379, or drop --ray-address "
                               "to start a local one")
    return host, int(port_text)


def _resolve(host: str, port: int, timeout_s: float) -> list[tuple]:
    """getaddrinfo with a bound: a stuck resolver must not hang the run."""
    box: dict[str, object] = {}

    def lookup() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, ValueError) as exc:  # ValueError: IDNA refuses the name (e.g. an empty label)
            box["error"] = exc

    t = threading.Thread(target=lookup, name="picklescope-ray-resolve", daemon=True)
    t.start()
    t.join(timeout_s)
    if "infos" in box:
        return box["infos"]  # type: ignore[return-value]
    reason = "its name does not resolve" if "error" in box else f"no name lookup answer within {timeout_s:g} s"
    raise PicklescopeError(f"no Ray cluster answers at {host}:{port} ({reason})", WAY_OUT)


def _reason(exc: OSError, timeout_s: float) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    return exc.strerror or type(exc).__name__


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(text: str) -> bytes:
    """An HPACK string without Huffman coding (our names and values are all under 127 bytes)."""
    raw = text.encode()
    return bytes([len(raw)]) + raw


def _request(host: str, port: int) -> bytes:
    """Preface, empty SETTINGS, and ``GetClusterId`` with an empty request message on stream 1."""
    headers = [(":method", "POST"), (":scheme", "http"), (":path", METHOD), (":authority", f"{host}:{port}"),
               ("content-type", "application/grpc"), ("te", "trailers")]
    block = b"".join(b"\x00" + _literal(k) + _literal(v) for k, v in headers)  # literal, not indexed
    return (PREFACE + _frame(SETTINGS, 0, 0) + _frame(HEADERS, END_HEADERS, 1, block)
            + _frame(DATA, END_STREAM, 1, b"\x00\x00\x00\x00\x00"))


def _is_cluster_id_reply(data: bytes) -> bool:
    """A gRPC message (uncompressed, length-prefixed) holding field 2 as a 28-byte cluster id."""
    if len(data) < 5 or data[0] != 0 or int.from_bytes(data[1:5], "big") != len(data) - 5:
        return False
    return bytes([0x12, CLUSTER_ID_BYTES]) in data[5:]


class _Exchange:
    """Reads HTTP/2 frames until stream 1 ends, with one deadline for the whole exchange."""

    def __init__(self, sock: socket.socket, timeout_s: float) -> None:
        self.sock = sock
        self.deadline = time.monotonic() + timeout_s
        self.buf = b""
        self.received = b""  # everything, for the message when it is not HTTP/2 at all

    def _read(self, n: int) -> bytes:
        while len(self.buf) < n:
            self.sock.settimeout(max(0.01, self.deadline - time.monotonic()))
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
            self.received += chunk
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def run(self, timeout_s: float) -> str | None:
        """None when a GCS answered, else why what answered is not one."""
        data, trailers = b"", b""
        try:
            head = self._read(9)
            if head[3] != SETTINGS or head[5:9] != b"\x00\x00\x00\x00":
                return f"it answered {self.received[:24]!r}, not gRPC"
            self._read(int.from_bytes(head[:3], "big"))
            self.sock.sendall(_frame(SETTINGS, ACK, 0))
            while True:
                head = self._read(9)
                kind, flags, stream = head[3], head[4], int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
                payload = self._read(int.from_bytes(head[:3], "big"))
                if kind == SETTINGS and not flags & ACK:
                    self.sock.sendall(_frame(SETTINGS, ACK, 0))
                elif kind in (GOAWAY, RST_STREAM):
                    break
                elif stream == 1 and kind == DATA:
                    data += payload
                elif stream == 1 and kind == HEADERS:
                    trailers = payload
                if stream == 1 and flags & END_STREAM:
                    break
        except TimeoutError:
            if not self.received:
                return f"it sent nothing within {timeout_s:g} s"
        except EOFError:
            if not self.received:
                return "it closed the connection without a word"
        except OSError as exc:
            return _reason(exc, timeout_s)
        if _is_cluster_id_reply(data):
            return None
        status = _grpc_field(trailers, b"grpc-status")
        if status == "16" and "AuthToken" in (_grpc_field(trailers, b"grpc-message") or ""):
            return None  # a GCS with token auth: ray.init will present the environment's token
        return ("it speaks HTTP/2 but did not answer Ray's GetClusterId call"
                + (f" (gRPC status {status})" if status else ""))


def _grpc_field(block: bytes, name: bytes) -> str | None:
    """A trailer's value from a header block, when it came as a plain literal (grpc-core sends them so)."""
    i = block.find(name)
    j = i + len(name)
    if i < 0 or j >= len(block) or block[j] & 0x80:  # absent, or Huffman-coded
        return None
    n, j = block[j], j + 1
    if n == 0x7F:  # 127 or more: an HPACK integer continues in the next bytes
        shift = 0
        while j < len(block):
            b = block[j]
            n += (b & 0x7F) << shift
            shift, j = shift + 7, j + 1
            if not b & 0x80:
                break
    return block[j:j + n].decode(errors="replace")


def check(address: str, timeout_s: float = TIMEOUT_S) -> None:
    """Raise a one-line :class:`PicklescopeError` unless a Ray GCS answers at ``address``."""
    if address.strip() == "auto":
        return
    host, port = parse(address)
    where = address.strip()
    last: OSError | None = None
    for family, kind, proto, _, sockaddr in _resolve(host, port, timeout_s):
        sock = socket.socket(family, kind, proto)
        sock.settimeout(timeout_s)
        try:
            sock.connect(sockaddr)
        except OSError as exc:
            last = exc
            sock.close()
            continue
        try:
            sock.sendall(_request(host, port))
            why = _Exchange(sock, timeout_s).run(timeout_s)
        except OSError as exc:
            why = _reason(exc, timeout_s)
        finally:
            sock.close()
        if why is None:
            return
        raise PicklescopeError(f"something accepts connections at {where} but it is not a Ray GCS ({why})",
                               NOT_GCS_HINT)
    reason = _reason(last, timeout_s) if last is not None else "no address to connect to"
    raise PicklescopeError(f"no Ray cluster answers at {where} ({reason})", WAY_OUT)
