# ---
# jupyter:
#   jupytext:
#     notebook_metadata_filter: -jupytext.text_representation.jupytext_version,-jupytext.text_representation.format_version
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Would my node have survived?
#
# *Short on time?* [The answer](#The-answer) gives it in a few sentences with the numbers this run
# measured; after it, a prediction for a machine too big for this one.
#
# New words are defined where they first appear; all of them are in the
# [glossary](../docs/glossary.md).
#
# **The question.** A training job ran for a while, then its machine (a *node*) ran out of host
# memory and a process was killed. Which process grew, at which *training step* (one round of the
# training loop, on one batch) would the node have
# died, and would the fixed serialization (or Python's garbage collector) have saved it?
#
# **The setting, from zero.** **verl** (an open-source library for reinforcement-learning training of
# large models) runs on **Ray** (a framework that starts and connects the processes of a job). One
# *driver* process (verl's TaskRunner) holds each *training batch* (the data of one training step),
# wrapped in a **DataProto** (verl's container for a batch: tensors plus columns of strings). Many
# *worker* processes (Ray *actors*: long-lived processes that Ray starts and whose methods other
# processes call; one per GPU in a real job) each compute on a piece of it. For a method registered
# as `DP_COMPUTE_PROTO` (verl's label for "split the batch over the workers, data-parallel, and join
# the answers"), verl splits the batch into one *chunk* per worker
# (`DataProto.chunk`) and calls the method on every worker with its chunk as the argument. To send
# an argument to another process, Ray must **pickle** it (turn it into bytes; Python calls the
# class's `__getstate__` to decide what those bytes are) in the driver; the worker unpickles it
# (`__setstate__`), computes, and returns a small result (a per-token tensor, like
# `compute_log_prob`) that the driver joins back together (`DataProto.concat`). That repeats every
# training step.
#
# **What went wrong.** verl has two ways to pickle a batch (two *codecs*: the pair
# `__getstate__`/`__setstate__`). In **numpy mode** (each tensor handed over as a view of its own
# memory, no copy) verl 0.9.0 and earlier still ran **consolidate** (a copy of every tensor into
# one new buffer) first and threw the copy away. That copy sits in a reference cycle, so only
# Python's cyclic garbage collector frees it: until a collection runs, the driver keeps one more
# copy of every chunk it sent. The codec `numpy-legacy` replays that behaviour and `numpy` the fix
# (verl 0.9.1). With a real verl installed (`picklescope verl install 0.9.0 0.9.1`) use
# `verl-0.9.0:numpy` and `verl-0.9.1:numpy`: the chunking and joining are then verl's own code.
#
# **What is measured.** `picklescope.node(...)` starts a driver and `workers` Ray actors, runs
# `steps` training steps, and samples every process on one clock (about every millisecond). Each
# process's curve is its private memory above its *baseline* (its memory once set up, before the
# first step). Ray's **object store** (shared memory where large arguments are written once for
# every process to read) is drawn once, not again inside each process that reads it.
# A *node budget* (a cap on the whole node's memory above its baseline) plays the part of the machine's
# RAM. Every figure below is measured in this notebook's run; nothing is typed in.

# %% tags=["parameters"]
workload = "flowgrpo"  # a preset (picklescope list) or a path to your own workload YAML
scale = 0.1  # fraction of the batch dimension
workers = 4
steps = 4
legacy = "numpy-legacy"  # or verl-0.9.0:numpy
fixed = "numpy"  # or verl-0.9.1:numpy
gc_modes = ["off"]  # compared with Python's default collector; add "each-step" (2 more replays)
engine = "replica"  # or "verl": verl's own RayWorkerGroup splits, calls and joins (needs a real verl codec)
data_planes = True  # section 5: the same batch and budget on verl's TransferQueue trainer (2 more replays)

# %%
# %load_ext picklescope
import textwrap
from pathlib import Path

from IPython.display import display

import picklescope as ps
from picklescope.core.units import fmt_bytes
from picklescope.investigate.node import compare_drivers, node_series
from picklescope.investigate.node.tq_plane import cpus_needed, plane_lines, plane_verdict
from picklescope.investigate.predict.fit import chunk_sizes
from picklescope.ray import transferqueue
from picklescope.ray.local_cluster import LocalCluster
from picklescope.ray.startup import RayStartError
from picklescope.views import figures, table
from picklescope.views.richtext import sentence

OUT = Path("out")  # every file this notebook writes goes under out/
OUT.mkdir(exist_ok=True)
wl = ps.load_workload(workload)
payload, rows = wl.payload_bytes(scale), wl.rows(scale)
cut = chunk_sizes(rows, workers)  # as DataProto.chunk (torch.chunk) cuts the batch: ceil(rows / workers) each
print(f"{workload} x{scale:g}: payload {fmt_bytes(payload)}, {workers} workers, {steps} training steps")
print(f"{rows} rows, cut {', '.join(map(str, cut))} among the workers"
      + ("" if cut == [cut[0]] * workers else ": a worker with fewer rows holds less")
      + ("; one with none gets no call" if len(cut) < workers else ""))

# %% [markdown]
# ## 1. One cluster for every run, one node for every series
# Starting a Ray cluster costs seconds to tens of seconds, so the runs below join one local cluster,
# exactly as `picklescope node --ray-address HOST:PORT` joins a real one. The notebook's last cell
# stops every process of it. If it cannot start (a busy machine can take longer than Ray allows), the
# cell says why in one sentence and every series below starts a cluster of its own instead.
#
# Starting a node's processes costs tens of seconds too (the driver and every worker import torch),
# so replays that can share them run as a *series* (`node_series`): one driver and one set of workers
# replay one codec (and collector) after the other. Before each replay of a series they run as many
# training steps of that replay unmeasured, then a full collection, and only then take their baselines,
# so no replay starts with what the one before it left (docs/node.md). Real verl's codecs each load
# their own verl, so with them every replay starts a node of its own.

# %%
try:
    # one logical CPU for each of TransferQueue's actors (section 5); the node's own actors reserve none
    cluster = LocalCluster(object_store_bytes=max(256 * 2**20, 4 * payload), num_cpus=cpus_needed()).start()
    address = cluster.address
    print("cluster at", address)
except RayStartError as exc:  # one sentence, then each series starts (and stops) a cluster of its own
    cluster = address = None
    print(f"The shared cluster is not used: {exc.problem}. Each series below starts a cluster of its own.")


def took(done: list[ps.NodeResult]) -> str:
    """How long the replays of one series took, in words."""
    ran = [r for r in done if r.wall_s is not None]  # not one never run, nor a driver that never started
    if len(ran) == 1:
        return f"1 replay on one driver and {workers} workers: {ran[0].wall_s:.1f} s, starting them included"
    return (f"{len(ran)} replays on one driver and {workers} workers, each (s): "
            + ", ".join(f"{r.wall_s:.1f}" for r in ran) + " (the first includes starting them)")


def replays(codecs: list[str], gc: list[str], say: bool = True, **kw) -> list[ps.NodeResult]:
    """One replay per codec, with the collector mode of the same position in ``gc``; ``say``: print how long
    they took (a cell whose answer comes first prints it after)."""
    kw = {"workers": workers, "steps": steps, "engine": engine, "ray_address": address, **kw}
    if any(c.startswith("verl-") for c in codecs):  # one node each: a process loads one verl
        return [ps.node(c, workload, scale, gc=mode, **kw) for c, mode in zip(codecs, gc)]
    done = node_series(codecs, workload, scale, gc=gc, **kw)
    if say:
        print(took(done))
    return done


# %% [markdown]
# ## 2. Legacy and fixed, side by side (Python's default collector)
# This cell replays every run of this section and the next as one series: the two codecs under
# Python's default collector, then under each mode of `gc_modes` (section 3 shows those). The table gives each run's outcome and peaks as multiples of the payload (the batch's tensor
# bytes): *driver peak* is the kernel's exact high-water mark of the driver (it also counts the object
# store's pages the driver maps), *driver own peak* the highest sample of its private memory (the
# store apart), *node peak* the highest total of all processes plus the store, up to a kill. The three
# are read differently, so where they are close they can disagree slightly: the exact peak counts from
# the memory the driver reported at its baseline and the own peak from its sample at the moment every
# baseline was taken, and the node's total also subtracts a process that went below its baseline. The figure stacks
# every process's memory above its baseline, plus the store: the top edge is the node's total. Shaded
# bands are training steps. A worker whose chunk has fewer rows holds less (the set-up cell above prints
# how the batch's rows are cut among the workers). The store's band is often too thin to see here: the
# series' unmeasured steps wrote to the store's pages before the baselines were taken, and the store never
# gives pages back, so each replay's chunks reuse pages already counted in its baseline (about 0.00x above
# it; a replay on a fresh cluster shows the chunks' pages, docs/node.md).

# %%
modes = list(dict.fromkeys(["default", *gc_modes, "off"]))  # "off" always: section 4 places its budget by it
done = replays([c for _ in modes for c in (legacy, fixed)], [m for m in modes for _ in (legacy, fixed)])
by_mode = {m: {legacy: done[2 * i], fixed: done[2 * i + 1]} for i, m in enumerate(modes)}
runs = by_mode["default"]
display(sentence(compare_drivers(runs[legacy], runs[fixed]), strong=True))
display(table.Table(table.node_rows(runs.values()), caption="Python's default collector"))
for r in runs.values():
    display(figures.node_figure(r))
    display(table.Table(table.node_step_rows(r), caption=f"{r.codec}: memory at each training step's end, "
                                                        "above baseline, x payload"))

# %% [markdown]
# ## 3. The garbage collector decides how fast the driver grows
# With the collector off (some training loops disable it for speed, and a full collection is rare
# in a big process), every chunk's discarded copy stays: the driver grows by about one batch per
# training step. `gc.collect()` after every step frees it each time (add `"each-step"` to
# `gc_modes` to see it). These replays ran in section 2's series. The fixed codec never makes the copy, so the collector does not matter to it.

# %%
display(table.Table(table.node_rows([r for pair in by_mode.values() for r in pair.values()]),
                    caption="x payload (the batch's bytes). driver peak: the driver's highest memory, object-store "
                            "pages it maps included; driver own peak: its private memory alone; node peak: every "
                            "process and the object store together; driver at each step's end: above its "
                            "baseline; growth: from the first step's end to the last one's"))

# %% [markdown]
# ## 4. A node budget: which process would the kernel kill, and when?
# The budget is counted above the node's baseline (after set-up). At the crossing, picklescope kills
# the process the kernel's OOM killer would pick: the highest `/proc/PID/oom_score` (a score the
# kernel keeps for each process, mostly its resident memory). Ray raises its workers'
# `oom_score_adj` (a number added to that score, so those processes are picked first), so the kernel can pick a worker even though the driver is the one that
# grew; that is what happens on a real node too. With the collector off (so the legacy *growth*, the driver's memory at the last step's end minus the first's, does
# not depend on when a collection happens to run) and a budget halfway between the two codecs'
# peaks, the legacy codec dies and the fixed one completes every step. The two replay as one series, the
# fixed codec first: a kill ends a series (the killed process was part of its node), so the replay
# expected to die comes last. (On the command line,
# `picklescope node --node-budget 2x --enforcement cgroup` puts the cluster it starts in one memory
# *cgroup* (a Linux group of processes with one memory limit, enforced by the kernel) and lets the real kernel choose; it needs a cluster of its own, so it is not run here.)

# %%
off = by_mode["off"]
failed = [r for r in off.values() if r.node_peak_bytes is None]
if failed:  # the budget lies between the two peaks: without both there is nothing to place it by
    raise RuntimeError(f"{failed[0].codec} with the collector off ended {failed[0].outcome}: {failed[0].error}")
budget = (off[legacy].node_peak_bytes + off[fixed].node_peak_bytes) // 2
fixed_capped, legacy_capped = replays([fixed, legacy], ["off", "off"], node_budget=budget)
capped = {legacy: legacy_capped, fixed: fixed_capped}
display(table.Table(table.node_rows(capped.values()), caption=f"node budget {fmt_bytes(budget)} above the "
                                                              "node's baseline, collector off"))
fig = figures.node_figure(capped[legacy])
fig.write_html(OUT / "node_budget.html", include_plotlyjs=True)  # plotly.js inside: the file opens offline
display(fig)

# %% [markdown]
# ## 5. Would a different data plane have saved the node?
# Everything above moves the batch the way verl's usual trainer does: through the driver, which holds
# each batch, pickles one chunk per worker and joins the answers. verl has a second trainer
# (`main_ppo_sync.py`, verl PR #5401) built on **TransferQueue** (a separate package: a store for
# training data spread over Ray actors called *storage units*). There the *data plane* (the path the
# batch's tensors take between processes) avoids the driver: a *producer* (the rollout, which makes
# the batch) writes each training step's batch into the storage units; the driver receives only
# *metadata* (which rows and fields make up the batch) and hands each worker the metadata of its
# chunk; each worker fetches its rows from the storage units itself, computes, and writes its result
# back; the driver then asks the storage units for the per-token result alone. The tensors never pass
# through `DataProto.__getstate__`, so the codec does not matter on this plane.
#
# The cell replays the legacy run of section 4 on the TransferQueue plane, once freely and once under
# the same node budget, and puts each next to its DataProto replay. The question is not only whether
# the driver stops growing (it must: it never holds the tensors) but where the bytes go instead: the
# storage units hold every batch in flight, and the producer and the workers hold their own copies.
# docs/node.md says which parts of the TransferQueue trainer the replay follows and which it leaves out.

# %%
planes: dict[str, ps.NodeResult] = {}
plane_note = ""
if not data_planes:
    plane_note = "Section 5 was skipped (data_planes = False)."
elif transferqueue.missing():
    plane_note = (f"Section 5 needs TransferQueue: {transferqueue.missing()}; install it with "
                  f"{transferqueue.INSTALL_HINT}.")
else:
    tq_codec = legacy if not legacy.startswith("verl-") else "numpy-legacy"  # any codec: the tensors skip it
    tq_free = replays([tq_codec], ["off"], say=False, data_plane="transferqueue")[0]
    tq_capped = replays([tq_codec], ["off"], say=False, data_plane="transferqueue", node_budget=budget)[0]
    planes = {"free": tq_free, "capped": tq_capped}
    print(textwrap.fill("Would the TransferQueue plane have saved this node? "  # the answer first, then the rest
                        + plane_verdict(capped[legacy], tq_capped), 96))
    print(textwrap.fill("The TransferQueue replays took " + " and ".join(
        f"{r.wall_s:.1f} s ({name})" for name, r in (("free", tq_free), ("under the budget", tq_capped))
        if r.wall_s is not None) + ", each starting its own driver, workers and TransferQueue actors", 96))
    display(table.Table(table.node_rows([off[legacy], tq_free]),
                        caption="the same batch on both data planes, collector off, no budget"))
    display(figures.node_figure(tq_free))
    display(table.Table(table.node_rows([capped[legacy], tq_capped]),
                        caption=f"the same node budget, {fmt_bytes(budget)} above the node's baseline"))
    for line in plane_lines([off[legacy], tq_free, capped[legacy], tq_capped]):  # wrapped between items, not words
        print(textwrap.fill(line, 96, subsequent_indent="    ", break_long_words=False, break_on_hyphens=False))
if plane_note:
    print(plane_note)

# %% [markdown]
# The first table gives the controller's (the driver's) own peak on each plane, the second who was
# killed under the same budget; the lines under them add each kind of process's own peak (*storage
# units*: TransferQueue's storage actors, added up). The TransferQueue plane takes the bytes out of the
# driver, so the driver no longer grows from one training step to the next (the legacy copy never
# happens there); it does not remove them: the storage units hold each batch in flight and the producer
# and the workers their own copies, so a node short of memory at its first steps is not saved by the
# plane alone. Over many training steps with a growing driver (section 3) it is the growth that kills,
# and that is what this plane takes away.

# %% [markdown]
# ## The answer

# %%
# growth: the driver's memory at the end of the last training step minus at the end of the first
grew = {codec: None if off[codec].driver_growth_bytes is None else off[codec].driver_growth_bytes / payload
        for codec in (legacy, fixed)}
answer = compare_drivers(runs[legacy], runs[fixed])
if None not in grew.values():
    answer += (f" With the collector off, the {legacy} driver grew {grew[legacy]:.2f}x the payload from the end of "
               f"training step 1 to the end of step {steps} ({fixed}: {grew[fixed]:+.2f}x).")
k = capped[legacy].killed
ended = {c: "completed every step" if r.outcome == "ok" else
         "was not replayed" if not r.replayed else f"ended {r.outcome}"
         for c, r in capped.items()}
if k is not None:
    answer += (f" Under a node budget of {fmt_bytes(budget)}, {legacy} was killed ({k.process}, training step "
               f"{k.training_step}, {k.during()}) while {fixed} {ended[fixed]}.")
else:
    answer += f" Under a node budget of {fmt_bytes(budget)}, {legacy} {ended[legacy]} and {fixed} {ended[fixed]}."
if planes:
    tq_free, tq_capped = planes["free"], planes["capped"]

    def x(value: int | None) -> str:
        return "-" if value is None else f"{value / payload:.2f}x"

    dp = off[legacy]
    answer += (f" On verl's TransferQueue data plane the driver's own memory peaked at "
               f"{x(tq_free.own_peak_bytes('driver'))} the payload (DataProto plane, collector off: "
               f"{x(dp.own_peak_bytes('driver'))}) and grew {x(tq_free.driver_growth_bytes)} over the steps "
               f"(DataProto: {x(dp.driver_growth_bytes)}), but the storage units held {x(tq_free.own_peaks_sum_bytes('storage-'))}, "
               f"the producer {x(tq_free.own_peak_bytes('producer'))} and the workers "
               f"{x(tq_free.own_peaks_sum_bytes('worker-'))}: the node peaked at {x(tq_free.node_peak_bytes)} against "
               f"{x(dp.node_peak_bytes)}.")
    tk = tq_capped.killed
    answer += (" Under the same budget, the TransferQueue replay "
               + ("completed every step." if tk is None and tq_capped.outcome == "ok" else
                  f"lost its {tk.process} in training step {tk.training_step}." if tk is not None else
                  f"ended {tq_capped.outcome}."))
display(sentence(answer, strong=True))

# %%
if cluster is not None:
    cluster.stop()
    print("cluster stopped, left:", cluster.report["remaining"])

# %% [markdown]
# ### Next: your node
#
# The replays above fit on this machine. `picklescope predict` answers for a node that does not. It
# runs small replays like the ones above (three batch sizes, two worker counts: the *fit*; under Python's
# default collector each size also once with the collector off, where nothing frees a copy, so each step's
# rise is what the step keeps), reads from them how each process's memory grows with the batch, the
# workers and the training steps (a *cost model*), and plays that forward at your batch, your workers and
# your node's RAM (docs/predict.md).
# In a real job it is usually not the kernel that kills first but **Ray's memory monitor**: when the
# whole node passes a *threshold* (0.95 of its memory by default) it kills one of Ray's processes. The
# prediction names the training step at which the node would cross it and the process the monitor
# would pick. The *controller* is the process that runs the training loop and holds the batch: the
# driver above (verl's TaskRunner).
#
# The prediction counts the batch's own bytes: the memory each process had before the batch (model weights,
# optimizer state, the rollout's data) counts as nothing unless you give it in `your_baselines`, for
# example from the memory figures of your kill report. `your_worker_compute` is how long each worker
# computes on its chunk in a step: the replays above only read theirs and return a small result, so their
# calls overlap little, while a training step's workers compute for seconds to minutes and all hold their
# chunks at once. Set the sizes of your node below; add
# `"transferqueue"` to `your_planes` to predict verl's TransferQueue trainer beside the DataProto one
# (section 5). The fit's replays are cached after the first `picklescope predict` on this workload, and
# this cell uses them only if they are all cached (it says so otherwise, and runs nothing).

# %%
import textwrap  # noqa: E402

from picklescope.investigate.predict import fit as fitting  # noqa: E402
from picklescope.investigate.predict.prediction import fit_modes, fit_scales, predict  # noqa: E402
from picklescope.workloads.spec import load_workload  # noqa: E402

your_payload = "44GB"  # the batch's tensor payload (verl-omni #402: 512 videos of about 86 MB)
your_workers, your_steps, your_node_memory = 8, 120, "1507GB"
your_store_capacity = None  # your cluster's object_store_memory, e.g. "100GB"; None: Ray's default for the node
your_gc = "default"
your_baselines = []  # what each process held before the batch, e.g. ["controller=379GB", "worker=40GB"]
your_worker_compute = 60  # seconds each worker computes on its chunk per step: longer than the controller takes to
# send every chunk, so all your workers hold theirs at once, as in a training step (0: as the replay's workers do)
your_planes = ["dataproto"]  # and/or "transferqueue" (built-in codecs only: the tensors skip the codec there)
wl_fit = load_workload(workload)
missing = [(plane, c, s, w) for plane in your_planes for mode in fit_modes(your_gc, plane) for c in (legacy, fixed)
           for w in fitting.FIT_WORKERS for s in fit_scales(wl_fit, c, fitting.FIT_SCALES, fitting.FIT_WORKERS)
           if fitting.load_cached(fitting.cache_path(wl_fit, c, mode, s, w, fitting.FIT_STEPS, plane), plane) is None]
if missing:
    plane, codec, s, w = missing[0]
    options = [f"--workload {workload}", f"--codec {legacy},{fixed}", f"--gc {your_gc}",
               f"--data-plane {','.join(your_planes)}", f"--payload {your_payload}", f"--workers {your_workers}",
               f"--steps {your_steps}", f"--node-memory {your_node_memory}",
               f"--worker-compute {your_worker_compute:g}",
               *([f"--store-capacity {your_store_capacity}"] if your_store_capacity else []),
               *(f"--process-baseline {b}" for b in your_baselines)]
    # the command wrapped between its options (a shell reads the backslashes as one line), never inside one
    command = textwrap.fill(" ".join(o.replace(" ", "\0") for o in options), 88, initial_indent="  picklescope predict ",
                            subsequent_indent="      ", break_long_words=False, break_on_hyphens=False)
    print(textwrap.fill(f"not predicted: {len(missing)} of the fit's replays are not cached (first: {codec} at "
                        f"x{s:g} with {w} workers, data plane {plane}). Run once, outside the notebook:", 96))
    print(command.replace("\n", " \\\n").replace("\0", " "))
else:
    yours = [p for plane in your_planes
             for p in predict((legacy, fixed), workload, payload=your_payload, workers=your_workers, steps=your_steps,
                              gc=your_gc, node_memory=your_node_memory, store_capacity=your_store_capacity,
                              process_baselines=your_baselines, data_plane=plane,
                              worker_compute_s=your_worker_compute)]
    for p in yours:  # each line wrapped to the page, so no word is cut in two
        print("\n".join(textwrap.fill(line, 110, subsequent_indent=" " * (len(line) - len(line.lstrip()) + 2))
                        for line in p.summary().splitlines()), end="\n\n")
    # per codec: the node (solid), the controller (dotted) and the object store (dashed) per training step,
    # Ray's threshold, the store's capacity and where Ray would kill
    display(figures.predict_figure(yours))
