"""A prediction as plain data, and its answer in words: each codec's predicted node, the check against a
real replay, and the sentences the summary, the report and the notebook print from them.

:mod:`.prediction` builds these from the fitted model; the views (``picklescope predict``'s summary,
``--out``'s report, the figure) draw them and add nothing of their own. Ray's kill policy, as the
prediction applies it, is in :mod:`.prediction`'s doc.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from picklescope.core.units import fmt_bytes

KILL_POLICY = ("Ray's memory monitor kills a worker (a task's or an actor's process), never the raylet nor the "
               "driver: retriable tasks first, then the most recently scheduled; no process here is retriable, so "
               "the victim is the step's last worker call")
KILL_POLICY_TQ = ("Ray's memory monitor kills a worker (a task's or an actor's process), never the raylet nor the "
                  "driver: retriable tasks first, then the most recently scheduled; no process here is retriable "
                  "(TransferQueue's storage units and controller actor, the producer and the workers set no "
                  "max_restarts) and the controller creates and calls the workers after TransferQueue's actors and "
                  "the producer, so the victim is the last worker, not the storage units that hold the batch")


@dataclass
class Check:
    """A real replay at the predicted size, against the prediction."""

    measured_node_peak_bytes: int | None
    predicted_node_peak_bytes: int
    measured_controller_peak_bytes: int | None  # the controller's own (private) peak
    predicted_controller_peak_bytes: int
    measured_release_steps: list[int] = field(default_factory=list)
    predicted_release_steps: list[int] = field(default_factory=list)
    outcome: str = "ok"
    # the prediction played each way a run inside a call's copy can go (CodecPrediction.copy_text), where it differs
    predicted_node_peak_copy_given_back_bytes: int | None = None
    predicted_controller_peak_copy_given_back_bytes: int | None = None
    predicted_node_peak_copy_kept_bytes: int | None = None
    predicted_controller_peak_copy_kept_bytes: int | None = None

    @staticmethod
    def error(pred: int, meas: int | None) -> float | None:
        return None if not meas else (pred - meas) / meas

    def to_json_dict(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["node_peak_error"] = self.error(self.predicted_node_peak_bytes, self.measured_node_peak_bytes)
        doc["controller_peak_error"] = self.error(self.predicted_controller_peak_bytes,
                                                  self.measured_controller_peak_bytes)
        for way in ("copy_given_back", "copy_kept"):
            ctl, node = doc[f"predicted_controller_peak_{way}_bytes"], doc[f"predicted_node_peak_{way}_bytes"]
            if ctl is not None:
                doc[f"controller_peak_{way}_error"] = self.error(ctl, self.measured_controller_peak_bytes)
            if node is not None:
                doc[f"node_peak_{way}_error"] = self.error(node, self.measured_node_peak_bytes)
        return doc


# the heap-sized share of a release's copies from which the summary says the controller's peak is an estimate:
# below it, what glibc keeps of them moves the peak by a few percent at most (docs/predict.md, "The allocator")
HEAP_SHARE_NOTED = 0.1
NO_BASELINES = ("these are the batch's own bytes: what each process held before it (model weights, optimizer "
                "state, the rollout's own data) counts as nothing here; add it with --process-baseline "
                "(e.g. controller=379GB, from your kill report) to compare with the node's memory")


@dataclass
class CodecPrediction:
    """One codec's predicted node: bytes are absolute (the baselines given plus the predicted growth)."""

    codec: str
    gc: str
    payload_bytes: int
    rows: int
    workers: int
    steps: int
    node_memory_bytes: int | None
    threshold: float
    baselines: dict[str, int]
    node_peak_bytes: int
    processes: dict[str, int]  # name -> peak bytes
    training_steps: list[dict[str, Any]]
    killed: dict[str, Any] | None
    largest_surviving_payload_bytes: int | None
    release_steps: list[int]
    terms: list[tuple[str, str, str]]
    fitted_on: list[str]
    check: Check | None = None
    data_plane: str = "dataproto"
    store_capacity_bytes: int | None = None  # the object store's capacity the prediction capped it at (None: none)
    store_capacity_source: str | None = None  # STORE_DEFAULT_SOURCE (maybe "..., at most 200 GB") or STORE_GIVEN_SOURCE
    store_full_step: int | None = None  # the first training step at which the store was at its capacity
    # were the store at its capacity from the first step (its pages rise at every step where steps follow each other
    # before Ray frees a step's objects, which the fits' idle step ends do not: docs/predict.md): the node's peak,
    # and the first step over the threshold
    node_peak_store_full_bytes: int | None = None
    store_full_killed_step: int | None = None
    largest_surviving_payload_store_full_bytes: int | None = None  # ... and the largest payload that survives so
    largest_surviving_node_peak_bytes: int | None = None  # the node's peak at the largest surviving payload (under
    # the threshold: what shows that it survives), None where the search stopped at the node's whole memory
    worker_compute_s: float = 0.0  # each worker's compute on its chunk, the call held open (--worker-compute)
    calls_open: int | None = None  # the workers' calls open at once, holding their chunks (Model.open_calls)
    node_peak_all_open_bytes: int | None = None  # the node's peak with every worker's call open at once, where
    # that is more (workers that compute longer than the controller takes to send every chunk, as a training
    # step's do), and the training step at which that node would cross Ray's threshold (None: never)
    all_open_killed_step: int | None = None
    # of the copies the controller's releases free, the share in heap-sized blocks (under glibc's mmap threshold),
    # whose return the fits measure only on average (allocator_text); None where no release is predicted
    release_heap_share: float | None = None
    # the same prediction where each run of the collector inside a call's copy (consolidate) comes after the copy's
    # block and so leaves nothing of it (docs/predict.md, "What a run inside a call's copy leaves"): the node's and
    # the controller's peaks and the step Ray would kill in; None where it plays the same
    node_peak_copy_given_back_bytes: int | None = None
    controller_peak_copy_given_back_bytes: int | None = None
    copy_given_back_killed_step: int | None = None
    # and where each such run comes before the block and so leaves the copy (the prediction plays each run as the
    # fit's replays found them); None where it plays the same
    node_peak_copy_kept_bytes: int | None = None
    controller_peak_copy_kept_bytes: int | None = None
    copy_kept_killed_step: int | None = None

    def to_json_dict(self) -> dict[str, Any]:
        return {"codec": self.codec, "gc": self.gc, "payload_bytes": self.payload_bytes, "rows": self.rows,
                "workers": self.workers, "steps": self.steps, "node_memory_bytes": self.node_memory_bytes,
                "threshold": self.threshold, "baselines": self.baselines, "node_peak_bytes": self.node_peak_bytes,
                "processes": {n: {"peak_bytes": v} for n, v in self.processes.items()},
                "training_steps": self.training_steps, "killed": self.killed,
                "largest_surviving_payload_bytes": self.largest_surviving_payload_bytes,
                "release_steps": self.release_steps,
                "terms": [{"role": r, "term": t, "value": v} for r, t, v in self.terms],
                "fitted_on": self.fitted_on, "data_plane": self.data_plane,
                "store_capacity_bytes": self.store_capacity_bytes,
                "store_capacity_source": self.store_capacity_source, "store_full_step": self.store_full_step,
                "node_peak_store_full_bytes": self.node_peak_store_full_bytes,
                "store_full_killed_step": self.store_full_killed_step,
                "largest_surviving_payload_store_full_bytes": self.largest_surviving_payload_store_full_bytes,
                "largest_surviving_node_peak_bytes": self.largest_surviving_node_peak_bytes,
                "worker_compute_s": self.worker_compute_s, "calls_open": self.calls_open,
                "node_peak_all_open_bytes": self.node_peak_all_open_bytes,
                "all_open_killed_step": self.all_open_killed_step,
                "release_heap_share": self.release_heap_share,
                "node_peak_copy_given_back_bytes": self.node_peak_copy_given_back_bytes,
                "controller_peak_copy_given_back_bytes": self.controller_peak_copy_given_back_bytes,
                "copy_given_back_killed_step": self.copy_given_back_killed_step,
                "node_peak_copy_kept_bytes": self.node_peak_copy_kept_bytes,
                "controller_peak_copy_kept_bytes": self.controller_peak_copy_kept_bytes,
                "copy_kept_killed_step": self.copy_kept_killed_step,
                "kill_policy": KILL_POLICY if self.data_plane == "dataproto" else KILL_POLICY_TQ,
                "check": self.check.to_json_dict() if self.check else None}

    def summary(self) -> str:
        p = self.payload_bytes
        plane = "" if self.data_plane == "dataproto" else f", data plane {self.data_plane}"
        out = [f"{self.codec} (gc {self.gc}{plane}), payload {fmt_bytes(p)} = {p / 1e9:.2f} GB (a batch of "
               f"{self.rows} rows), {self.workers} workers, {self.steps} steps: node peak "
               f"{fmt_bytes(self.node_peak_bytes)}, controller {fmt_bytes(self.processes['controller'])}"]
        out.append("  " + self.verdict_text())
        if not self.baselines:
            out.append("  " + NO_BASELINES)
        largest = self.largest_text()
        if largest:
            out.append(f"  {largest}")
        out.append("  " + self.store_text())
        calls = self.calls_text()
        if calls:
            out.append("  " + calls)
        if self.release_steps:
            shown = ", ".join(map(str, self.release_steps[:8])) + (", ..." if len(self.release_steps) > 8 else "")
            out.append(f"  controller memory falls back during steps {shown} "
                       "(a collection frees the copies held by then)")
        allocator = self.allocator_text()
        if allocator:
            out.append("  " + allocator)
        copy = self.copy_text()
        if copy:
            out.append("  " + copy)
        if self.check:
            out.append("  " + self.check_text())
        return "\n".join(out)

    def verdict_text(self) -> str:
        """Where Ray's memory monitor would kill and whom, or that the node survives, in one phrase (the
        summary's line and the report's sentence): the one place a prediction's verdict is put in words."""
        peak, steps = fmt_bytes(self.node_peak_bytes), self.steps
        if not self.node_memory_bytes:
            return f"the node peaks at {peak} over {steps} training steps (no --node-memory, so no threshold to cross)"
        limit = (f"{self.threshold:g} of its {fmt_bytes(self.node_memory_bytes)} "  # GiB, and the GB it was given in
                 f"({self.node_memory_bytes / 1e9:.0f} GB) = {fmt_bytes(self.threshold * self.node_memory_bytes)}")
        if self.killed:
            k = self.killed
            return (f"Ray's memory monitor would kill {k['process']} in training step {k['training_step']} of {steps}, "
                    f"when the node reaches {fmt_bytes(k['node_bytes'])}, over {limit}")
        out = f"survives all {steps} training steps; the node peaks at {peak}, under {limit}"
        if self.store_full_killed_step is not None:  # the bound of a store that fills over many steps
            out += (f"; but with its object store full it would cross that in training step "
                    f"{self.store_full_killed_step}")
        return out

    def allocator_text(self) -> str | None:
        """Where the controller's peak is an estimate, why, in one sentence (the summary's line and the report's):
        a release gives back its copies' mapped blocks whole, but of its heap-sized ones only what glibc can
        return, which depends on where it placed them; the fit's replays show that share on average, not run
        by run (docs/predict.md, "The allocator"). None where the released copies are almost all mapped."""
        share = self.release_heap_share
        if share is None or share < HEAP_SHARE_NOTED:
            return None
        return (f"{share:.0%} of the copies the controller's collections free are heap-sized blocks (under "
                "glibc's mmap threshold); how much of them glibc gives back depends on where it placed them, which "
                "the fit shows on average only: read the controller's peak as an estimate (docs/predict.md, "
                "\"The allocator\")")

    def copy_text(self) -> str | None:
        """The other ways the controller's collections can go, in one sentence (the summary's line and the
        report's): a run that comes inside a call's copy leaves that copy until an older generation's run if it
        comes before the copy's block is made, nothing of it if after. The prediction plays each run as the fit's
        replays found runs at its place in a call, but where in the copy a run comes is finer than it can place
        (docs/predict.md, "What a run inside a call's copy leaves"). None where every way plays the same."""
        given = self._other_way(self.node_peak_copy_given_back_bytes, self.controller_peak_copy_given_back_bytes,
                                self.copy_given_back_killed_step)
        kept = self._other_way(self.node_peak_copy_kept_bytes, self.controller_peak_copy_kept_bytes,
                               self.copy_kept_killed_step)
        if given is None and kept is None:
            return None
        if kept is None:
            assumed, other = "that it survives, as the fit's replays found at that moment; if it does not", given
        elif given is None:
            assumed, other = "that it does not, as the fit's replays found at that moment; if it survives", kept
        else:
            assumed, other = (f"that some of those copies survive and some do not, as the fit's replays found; "
                              f"if every one survives, {kept}; if none does"), given
        return (f"When Python's garbage collector runs in a training step, it is usually while the controller is "
                f"making a chunk's copy (the packed block the legacy codec makes and throws away), and whether that "
                f"copy survives the collection depends on the exact moment, which no prediction can place for "
                f"sure. The figures above assume {assumed}, {other} (docs/predict.md, \"What a run inside a call's "
                f"copy leaves\")")

    def _other_way(self, node: int | None, ctl: int | None, step: int | None) -> str | None:
        """The controller's and the node's peaks of one other way, and Ray's verdict where it changes, in words."""
        if node is None or ctl is None:
            return None
        main = self.killed["training_step"] if self.killed else None
        verdict = ""
        if self.node_memory_bytes and step != main:
            verdict = (", and the node would survive every step" if step is None
                       else f", and Ray would kill in training step {step}")
        return f"the controller would peak at {fmt_bytes(ctl)} and the node at {fmt_bytes(node)}{verdict}"

    def check_text(self) -> str:
        """The check against a real replay in one line: predicted vs measured node and controller peaks with
        their errors, and the steps at which memory falls back (the summary's and the report's line)."""
        c = self.check
        if c is None:
            return "not checked (predict --check replays the size for real)"
        ne = c.error(c.predicted_node_peak_bytes, c.measured_node_peak_bytes)
        ce = c.error(c.predicted_controller_peak_bytes, c.measured_controller_peak_bytes)
        pn, mn = fmt_bytes(c.predicted_node_peak_bytes), fmt_bytes(c.measured_node_peak_bytes)
        pc, mc = fmt_bytes(c.predicted_controller_peak_bytes), fmt_bytes(c.measured_controller_peak_bytes)
        other = "".join(
            f", {fmt_bytes(v)} with {words} ({_pct(c.error(v, c.measured_controller_peak_bytes))})"
            for v, words in ((c.predicted_controller_peak_copy_given_back_bytes, "each copy in hand given back"),
                             (c.predicted_controller_peak_copy_kept_bytes, "each copy in hand kept"))
            if v is not None)
        return (f"check (a real replay, {c.outcome}): node peak predicted {pn} vs measured {mn} "
                f"({_pct(ne)}); controller {pc} vs {mc} ({_pct(ce)}){other}; memory falls back at steps "
                f"predicted {c.predicted_release_steps or 'none'}, measured {c.measured_release_steps or 'none'}")

    def largest_text(self) -> str | None:
        """The largest payload that survives, in words. The search stops at the node's whole memory, so a codec
        that survives there is said to survive any payload up to it, not that one figure."""
        largest, mem = self.largest_surviving_payload_bytes, self.node_memory_bytes
        if largest is None or not mem:
            return None
        if largest >= mem:
            out = (f"any payload up to the node's whole memory ({fmt_bytes(mem)}) survives {self.steps} steps: "
                   "the search for the largest stops there")
        else:
            out = f"largest payload that survives {self.steps} steps: {fmt_bytes(largest)}"
            if self.largest_surviving_node_peak_bytes is not None:  # how it follows: its node peak, the threshold
                out += (f" (the node then peaks at {fmt_bytes(self.largest_surviving_node_peak_bytes)}, under "
                        f"{fmt_bytes(self.threshold * mem)}; a row more crosses it)")
        full = self.largest_surviving_payload_store_full_bytes
        if self.node_peak_store_full_bytes is not None and self.node_peak_store_full_bytes > self.node_peak_bytes:
            out += ("; with its object store full, none" if full is None else
                    f"; with its object store full, {fmt_bytes(full)}" if full < largest else "")
        return out

    def calls_text(self) -> str | None:
        """How many workers hold their chunk at once, where the workers compute (the assumption in words) or
        where that is fewer than all of them and all of them would peak higher: the replay's calls only read
        the chunk, a training step's compute on it."""
        if self.calls_open is None:
            return None
        if self.node_peak_all_open_bytes is None:
            if not self.worker_compute_s:
                return None
            held = f"all {self.workers}" if self.calls_open >= self.workers else f"{self.calls_open} of {self.workers}"
            return (f"workers: {held} hold their chunk at once, each computing {self.worker_compute_s:g} s on it "
                    "(--worker-compute)")
        doing = (f"computing {self.worker_compute_s:g} s on their chunk" if self.worker_compute_s else
                 "reading their chunk and returning a small result, as the replay's do")
        return (f"workers: {self.calls_open} of {self.workers} calls open at once, {doing}; workers that compute "
                f"on their chunk for longer than the controller takes to send every chunk (a training step's "
                f"do) hold all {self.workers} at once, and the node would peak at "
                f"{fmt_bytes(self.node_peak_all_open_bytes)}"
                + (f", over Ray's threshold in training step {self.all_open_killed_step}"
                   if self.all_open_killed_step is not None and self.killed is None else "")
                + " (--worker-compute S replays and predicts that)")

    def store_text(self) -> str:
        """The object store's predicted peak against the capacity it was capped at, and where that came from."""
        peak = fmt_bytes(self.processes.get("store", 0))
        if self.store_capacity_bytes is None:
            return f"object store: peak {peak}, unbounded (no --node-memory nor --store-capacity)"
        out = (f"object store: peak {peak} of its capacity {fmt_bytes(self.store_capacity_bytes)} "
               f"({self.store_capacity_source})")
        if self.store_full_step is not None:
            out += (f", full from training step {self.store_full_step} (Ray spills the rest to disk, not counted "
                    "in the node)")
        elif self.node_peak_store_full_bytes is not None and self.node_peak_store_full_bytes > self.node_peak_bytes:
            out += (". A training loop whose steps follow each other before Ray frees a step's objects puts each "
                    "step's chunks on fresh pages, up to its capacity (docs/predict.md, \"A store that fills\"); "
                    f"full, the node would peak at {fmt_bytes(self.node_peak_store_full_bytes)}")
            if self.store_full_killed_step is not None and self.killed is None:
                out += f", over the threshold in training step {self.store_full_killed_step}"
        return out


def _pct(e: float | None) -> str:
    return "no measurement" if e is None else f"error {e:+.1%}"
