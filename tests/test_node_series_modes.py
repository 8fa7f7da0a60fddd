"""A node series with one collector mode per replay: the collectors compared on the same processes.

Notebook 06 compares the legacy and fixed codecs under Python's default collector and with it off;
one series gives every replay its own mode, so the node's processes start once for all of them.
"""

from __future__ import annotations

import pytest

from picklescope.errors import PicklescopeError
from picklescope.investigate.node import node_series


def test_a_mode_list_of_the_wrong_length_is_refused_before_anything_starts():
    with pytest.raises(PicklescopeError, match="2 codec.* got 3 collector mode") as err:
        node_series(("numpy-legacy", "numpy"), "tiny", 1.0, 2, 2, gc=("off", "off", "default"))
    assert "one per codec" in str(err.value)


def test_an_unknown_mode_in_the_list_is_named():
    with pytest.raises(PicklescopeError, match="--gc 'sometimes' is not one of"):
        node_series(("numpy-legacy", "numpy"), "tiny", 1.0, 2, 2, gc=("off", "sometimes"))


def test_each_replay_runs_under_its_own_collector_on_the_same_processes(ray_cluster):
    """The legacy codec's discarded copies sit in reference cycles: with the collector off the driver keeps
    one per chunk it sent, so it grows about a payload per training step; under the default collector a
    collection frees them now and then, and ``each-step`` frees them at every step. The default replay
    comes between the two others (the collector is turned back on after being off), and the each-step replay
    follows an off one: its own mode, not the one before it, decides."""
    modes = ("off", "default", "off", "each-step")
    results = node_series(("numpy-legacy",) * 4, "flowgrpo", 0.05, 2, 3, gc=modes,
                          ray_address=ray_cluster.address)
    assert [r.outcome for r in results] == ["ok"] * 4, [(r.outcome, r.error) for r in results]
    assert [r.gc for r in results] == list(modes)
    pids = {n: q.pid for n, q in results[0].processes.items()}
    assert all({n: q.pid for n, q in r.processes.items()} == pids for r in results)
    p = results[0].payload_bytes
    ends = [[s.driver_bytes / p for s in r.training_steps] for r in results]
    for k in (0, 2):  # collector off: two steps' copies, kept by their cycles, between step 1 and step 3
        assert ends[k][-1] - ends[k][0] >= 1.7, ends[k]
    # each-step: the gc step after every training step frees that step's copies, so nothing is left in cycles
    # at the end; what the driver's heap keeps of the freed pages varies from step to step (one step of a
    # fresh-clone run rose 1.00 and another 1.50 payloads, the heap taking fresh pages while the freed ones
    # stayed), but at some step it takes the next copies from the freed pages and rises less than any step of
    # a collector-off replay, whose every step keeps its copies
    held = results[3].driver.cycle_held_bytes
    assert held is not None and held < 0.5 * p, held
    rises = [[b - a for a, b in zip(e, e[1:])] for e in ends]
    assert min(rises[3]) < 0.75 * min(rises[0] + rises[2]), ends
    assert any(st.name == "gc" for st in results[3].driver.steps), [st.name for st in results[3].driver.steps]
    # the driver records each run of its collector with the calls made and where the call in hand stood against
    # its copy (collector.PHASES): the gc step's full collection comes after the step's two calls, whose copies are
    # both made and thrown away, and before any next call's copy ('before-copy')
    for s in results[3].training_steps:
        assert [2, 2, "before-copy"] in [r[:3] for r in results[3].driver_runs[s.index]], results[3].driver_runs
