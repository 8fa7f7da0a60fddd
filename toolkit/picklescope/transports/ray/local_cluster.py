"""A Ray cluster on this machine that several runs can join, and that is always fully stopped.

Each ``ray`` run normally starts (and kills) a cluster of its own, which costs seconds to tens of
seconds on a busy 2-core machine. A notebook comparing codecs, the benchmark and the tests instead
start one cluster here (``ray start --head --block`` in its own session) and pass its address to
every run (``transport_options={"ray_address": cluster.address}``, the same path as joining a real
multi-node cluster with ``--ray-address``). Leaving the ``with`` block kills every process of the
session and checks that none is left.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from typing import Any

from picklescope.core.leftovers import temp_name
from picklescope.measure.session import Cancelled, raise_if_cancelled
from picklescope.transports.ray import cluster

STARTUP_TIMEOUT_S = 240.0
ATTEMPTS = 3


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """``with LocalCluster() as c: picklescope.run(..., transport_options={"ray_address": c.address})``."""

    def __init__(self, object_store_bytes: int = 512 * 1024 * 1024, num_cpus: int = 1) -> None:
        self.object_store_bytes = int(object_store_bytes)
        self.num_cpus = num_cpus
        self.address: str | None = None
        self.proc: subprocess.Popen | None = None
        self.temp_dir: str | None = None
        self.report: dict[str, Any] = {}

    def start(self) -> LocalCluster:
        """Start the head node; a start-up that Ray itself times out is retried (see driver.init_ray)."""
        self.failures: list[str] = []
        for attempt in range(ATTEMPTS):
            try:
                return self._start_once()
            except RuntimeError as exc:
                if "timed out during startup" not in str(exc) or attempt == ATTEMPTS - 1:
                    raise
                self.failures.append(str(exc)[-300:])
        raise AssertionError("unreachable")

    def _start_once(self) -> LocalCluster:
        self.temp_dir = tempfile.mkdtemp(prefix=temp_name("psrayc-"), dir="/tmp")
        port = _free_port()
        env = dict(os.environ)
        env.setdefault("RAY_AUTH_MODE", "disabled")
        env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", f"--port={port}",
               "--node-ip-address=127.0.0.1", f"--num-cpus={self.num_cpus}",
               f"--object-store-memory={self.object_store_bytes}", f"--temp-dir={self.temp_dir}",
               "--include-dashboard=false", "--disable-usage-stats"]
        log = os.path.join(self.temp_dir, "start.log")
        with open(log, "wb") as out:
            # Its own session (every Ray process stays in it) at a raised priority for start-up only,
            # for the same reason as the per-run driver (see driver.restore_priority).
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=_raise_priority)
        self._ticks = cluster.start_ticks(self.proc.pid)
        self._watch()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                raise_if_cancelled()
            except Cancelled:
                self.stop()
                raise
            with open(log, "rb") as f:
                text = f.read().decode(errors="replace")
            if "Ray runtime started" in text:
                self.address = f"127.0.0.1:{port}"
                break
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"ray start exited ({self.proc.returncode}):\n{text[-2000:]}")
            time.sleep(0.2)
        else:
            self.stop()
            raise RuntimeError(f"ray start did not finish within {STARTUP_TIMEOUT_S:.0f} s")
        for pid in self.pids() | {self.proc.pid}:
            try:
                os.setpriority(os.PRIO_PROCESS, pid, 0)
            except OSError:
                pass
        return self

    def _watch(self) -> None:
        """A small process that ends the cluster if this one dies before :meth:`stop` (see cluster.watch_main)."""
        assert self.proc is not None
        me = os.getpid()
        args = [str(me), str(cluster.start_ticks(me)), str(self.proc.pid), str(self._ticks), self.temp_dir or ""]
        self.watcher = subprocess.Popen([sys.executable, "-S", cluster.__file__, *args], stdin=subprocess.DEVNULL,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def pids(self) -> set[int]:
        """Every live process of this cluster."""
        if self.proc is None:
            return set()
        return cluster.cluster_processes(self.proc.pid, self._ticks, (), self.temp_dir)

    def stop(self) -> dict[str, Any]:
        """Kill every process of the cluster; returns what was found and what is left (should be [])."""
        found = self.pids()
        killed, remaining = cluster.stop_all(self.pids)
        if self.proc is not None:
            self.proc.wait(timeout=10)
        self.report = {"found": sorted(found), "killed": killed, "remaining": remaining}
        watcher = getattr(self, "watcher", None)
        if watcher is not None:  # it would exit by itself within a second of the leader's end
            watcher.kill()
            watcher.wait(timeout=10)
            self.watcher = None
        if self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
        return self.report

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def _raise_priority() -> None:
    try:
        os.nice(-10)
    except OSError:
        pass
