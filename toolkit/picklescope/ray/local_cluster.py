"""A Ray cluster on this machine that several runs can join, and that is always fully stopped.

Each ``ray`` run normally starts (and kills) a cluster of its own, which costs seconds to tens of
seconds on a busy 2-core machine. A notebook comparing codecs, the benchmark and the tests instead
start one cluster here (``ray start --head --block`` in its own session) and pass its address to
every run (``transport_options={"ray_address": cluster.address}``, the same path as joining a real
multi-node cluster with ``--ray-address``). Leaving the ``with`` block kills every process of the
session and checks that none is left.

The same class adds a node to a running cluster (``join=`` its address): a second Ray node on this
machine, for a replay whose workers are placed on another node than the driver's (``--worker-resources``
names a custom resource that only the added node has). It starts under the same policy and stops the
same way, its own processes only.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from typing import Any

from picklescope.core.paths import make_temp_dir, torch_cache_env
from picklescope.measure.session import Cancelled, raise_if_cancelled
from picklescope.ray import cluster, startup


class _TryFailed(Exception):
    def __init__(self, reason: str, log: str) -> None:
        super().__init__(reason)
        self.reason, self.log = reason, log


def _last_error(text: str) -> str:
    """The line of ``ray start``'s output that says what went wrong (its last error line), shortened."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "Exception" in ln or "timed out" in ln or "failed" in ln.lower():
            return startup.short_reason(RuntimeError(ln))
    return startup.short_reason(RuntimeError(lines[-1])) if lines else "no output"



def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalCluster:
    """``with LocalCluster() as c: picklescope.run(..., transport_options={"ray_address": c.address})``.

    ``LocalCluster(join=c.address, num_cpus=0, resources={"node2": 1})`` adds a node to ``c``; its
    ``address`` is then ``c``'s, and :meth:`stop` ends the added node only."""

    def __init__(self, object_store_bytes: int = 512 * 1024 * 1024, num_cpus: int = 1, *,
                 join: str | None = None, resources: dict[str, float] | None = None) -> None:
        self.object_store_bytes = int(object_store_bytes)
        self.num_cpus = num_cpus
        self.join = join  # a running cluster's address: start a node of it instead of a head
        self.resources = dict(resources or {})  # custom resources of this node, {"node2": 1}
        self.address: str | None = None
        self.proc: subprocess.Popen | None = None
        self.temp_dir: str | None = None
        self.report: dict[str, Any] = {}
        self.watcher: subprocess.Popen | None = None  # removes the cluster if this process dies first

    def start(self, timeout_s: float | None = None) -> LocalCluster:
        """Start the head node under the start-up policy of :mod:`.startup` (a few tries, all of them
        bounded by ``timeout_s``, the core processes watched); a failure is one :class:`RayStartError`."""
        self.failures: list[str] = []
        log = ""
        t0 = time.monotonic()
        left = None if timeout_s is None else float(timeout_s)
        for budget in startup.try_budgets(left):
            try:
                return self._start_once(budget)
            except _TryFailed as exc:
                self.failures.append(exc.reason)
                log = exc.log
        what = f"a node joining the Ray cluster at {self.join}" if self.join else "the local Ray cluster"
        raise startup.RayStartError(time.monotonic() - t0, self.failures or ["no time was left to try"],
                                    startup.load_average(), log=log, what=what)

    def _start_once(self, budget_s: float) -> LocalCluster:
        self.temp_dir = make_temp_dir("psrayc-", for_ray=True)
        port = None if self.join else _free_port()
        env = dict(os.environ)
        for k, v in cluster.OWN_CLUSTER_ENV.items():  # the user's own RAY_* settings win
            env.setdefault(k, v)
        env.update(torch_cache_env(self.temp_dir))  # its workers import torch: the cache stays in our folder
        where = [f"--address={self.join}"] if self.join else ["--head", f"--port={port}", "--include-dashboard=false"]
        cmd = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block", *where,
               "--node-ip-address=127.0.0.1", f"--num-cpus={self.num_cpus}",
               f"--object-store-memory={self.object_store_bytes}", f"--temp-dir={self.temp_dir}",
               "--disable-usage-stats"]
        if self.resources:
            cmd.append(f"--resources={json.dumps(self.resources)}")
        log = os.path.join(self.temp_dir, "start.log")
        with open(log, "wb") as out:
            # Its own session (every Ray process stays in it) at a raised priority for start-up only,
            # for the same reason as the per-run driver (see driver.restore_priority).
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True,
                                         preexec_fn=_raise_priority)
        self._ticks = cluster.start_ticks(self.proc.pid)
        self._watch()
        watch = startup.ComponentWatch(self.pids)
        deadline = time.monotonic() + budget_s
        reason = None
        while reason is None:
            try:
                raise_if_cancelled()
            except Cancelled:
                self.stop()
                raise
            with open(log, "rb") as f:
                text = f.read().decode(errors="replace")
            if "Ray runtime started" in text:
                self.address = self.join or f"127.0.0.1:{port}"
                break
            if watch.poll() is not None:
                reason = watch.sentence("start-up")
            elif self.proc.poll() is not None:
                reason = f"'ray start' exited ({self.proc.returncode}): {_last_error(text)}"
            elif time.monotonic() > deadline:
                reason = f"'ray start' did not finish within {budget_s:.0f} s"
            else:
                time.sleep(0.2)
        if reason is not None:
            said = startup.raylet_said(self.temp_dir)
            if said and "raylet" in reason:
                reason += f" ({said})"
            self.stop()
            raise _TryFailed(reason, text[-4000:])
        for pid in self.pids() | {self.proc.pid}:
            try:
                os.setpriority(os.PRIO_PROCESS, pid, 0)
            except OSError:
                pass
        return self

    def _watch(self) -> None:
        """A small process that ends the cluster if this one dies before :meth:`stop` (see cluster.watch_main)."""
        assert self.proc is not None
        self.watcher = cluster.start_watch(os.getpid(), self.proc.pid, self._ticks, self.temp_dir)

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
        if self.watcher is not None:  # it would exit by itself within a second of the leader's end
            self.watcher.kill()
            self.watcher.wait(timeout=10)
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
