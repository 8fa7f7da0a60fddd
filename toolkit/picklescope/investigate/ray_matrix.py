"""The Ray rows of the comparison table: every codec over ``ray`` on one cluster.

``picklescope reproduce`` adds these rows when Ray is installed. All codecs share one cluster (the
one at ``ray_address``, or a local one started for them and fully stopped afterwards), so the rows
cost one cluster start, not one per codec. They are plain matrix rows: no headroom search or budgeted
runs, which would each need their own cluster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from picklescope.core.result import RunResult
from picklescope.measure.runner import run
from picklescope.ray.local_cluster import LocalCluster
from picklescope.workloads.spec import load_workload

CLUSTER_START = "starting a local Ray cluster"  # the progress label while it starts (not a run)


def cluster_rows(workload: str, scale: float, codecs: tuple[str, ...], *, ray_address: str | None = None,
                 progress: Callable[[str], None] | None = None, also: Callable[[str], None] | None = None,
                 before_runs: Callable[[], None] | None = None,
                 **run_kw: Any) -> tuple[list[RunResult], dict[str, Any]]:
    """(results, cluster info): one ``ray`` run per codec, marked ``role="matrix"``; then ``also(address)``
    on the same cluster (the node pair), so it costs no second cluster start. ``before_runs()`` is called
    once the cluster is up, before the first run (``reproduce`` waits there for its forkserver)."""
    info: dict[str, Any] = {"address": ray_address or "local (started for these rows)"}

    def rows(address: str) -> list[RunResult]:
        if before_runs is not None:
            before_runs()
        out = []
        for c in codecs:
            if progress:
                progress(f"{c} over ray")
            r = run(c, "ray", workload, scale, transport_options={"ray_address": address}, **run_kw)
            r.role = "matrix"
            out.append(r)
        if also is not None:
            also(address)
        return out

    if ray_address:
        return rows(ray_address), info
    payload = load_workload(workload).payload_bytes(scale)
    if progress:
        progress(CLUSTER_START)
    with LocalCluster(object_store_bytes=max(512 * 1024**2, 3 * payload)) as cluster:
        results = rows(cluster.address or "")
    info["cleanup"] = cluster.report
    return results, info
