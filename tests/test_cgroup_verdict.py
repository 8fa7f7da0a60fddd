"""An OOM kill by a memory cgroup is reported with what the kernel charged, not only the sampled RSS.

Under cgroup enforcement the kernel charges a file a side writes to ``/dev/shm`` (the hand-off) to
that side's cgroup. A zero-copy codec over out-of-band pickle adds almost no RSS while it writes the
hand-off, so a budget of half the payload is crossed by shared memory alone: the sampled RSS at death
is about 0 B, and the verdict must say that the charge, and which part of it was shared memory,
reached the budget (see ``picklescope.measure.verdicts.cgroup_charge`` and ``picklescope.core.cgroup.counters``).
"""

from __future__ import annotations

import pytest

import picklescope as ps
from picklescope.core import cgroup
from picklescope.measure import verdicts

MIB = 1024 * 1024


def test_charge_above_the_join_point_splits_shared_memory_from_the_rest():
    counters = {"max_usage_bytes": 30 * MIB, "limit_bytes": 30 * MIB, "budget_bytes": 20 * MIB,
                "shmem_bytes": 12 * MIB, "oom_kill": 1}
    charged = verdicts.cgroup_charge(counters)
    assert charged["charge_at_join_bytes"] == 10 * MIB
    assert charged["above_baseline_bytes"] == 20 * MIB
    assert (charged["shmem_bytes"], charged["other_bytes"]) == (12 * MIB, 8 * MIB)
    assert verdicts.cgroup_charge({"oom_kill": 1}) is None  # no peak read: the RSS-based verdict stands


def test_a_handoff_killed_by_the_cgroup_reports_the_shared_memory_it_was_charged():
    base, why = cgroup.support()
    if base is None:
        pytest.skip(f"no memory cgroup can be created here: {why}")
    r = ps.run("numpy-zerocopy", "pickle5-oob", "flowgrpo", 0.05, budget="0.5x", enforcement="cgroup")
    if r.enforcement != "cgroup":
        pytest.skip(f"cgroup enforcement fell back: {r.enforcement_note}")
    budget = r.payload_bytes // 2
    assert (r.outcome, r.killed_side, r.killed_in_step) == ("oom-killed", "sender", "handoff"), r.error
    charged = r.charged_at_death
    # the kernel killed at its limit: the charge reached the budget, most of it the hand-off file
    assert charged["above_baseline_bytes"] >= 0.95 * budget, charged
    assert charged["shmem_bytes"] >= 0.5 * budget, charged
    assert r.memory_at_death_bytes >= 0.95 * budget
    assert "shared memory" in r.error and "/dev/shm" in r.error
