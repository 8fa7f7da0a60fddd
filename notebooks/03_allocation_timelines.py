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
# # 03 · What each memory tracker sees
#
# *Short on time?* [The answer](#The-answer), in one sentence with the number this run measured, is
# the last section.
#
# **The question:** if the OOM came from a copy, why did nobody's memory profile show it?
#
# Words first (every one is in the [glossary](../docs/glossary.md); notebook 01 tells the story).
# [verl](../docs/glossary.md#the-situation)'s bug is a copy of the whole batch made by
# **`consolidate`**, which copies every tensor of a *TensorDict* (the dictionary of tensors inside
# a batch) into one new buffer with torch. A *codec* is one way of turning the batch into bytes
# (`numpy-legacy` is the buggy one); the *sender* process does that and the *receiver* process
# rebuilds the batch. The *payload* is the batch's tensor bytes; costs are multiples of it.
# *RSS* is the memory of a process that is really in RAM; the kernel's *VmHWM* is its exact
# high-water mark. A *tracker* is any tool that watches memory.
#
# Python's *tracemalloc* only sees allocations made through Python's allocator, so a torch tensor
# is invisible to it; *torch-profiler* (`torch.profiler`) sees torch's allocator but not the `bytes`
# and `bytearray` buffers that [pickle](../docs/glossary.md#the-situation) and `BytesIO` make;
# *memray* records every allocation with its stack. Here one run is watched by every tracker at
# once and each is drawn next to the truth: RSS sampled by the parent at about 1 ms, and the exact
# per-step peaks from the kernel.

# %% tags=["parameters"]
workload = "flowgrpo"  # a preset (picklescope list) or a path to your own workload YAML
scale = 0.1  # fraction of the batch dimension
transport = "pickle5-oob"
tracer = "all"  # sampler + memray + tracemalloc + torch-profiler (unavailable ones say why)
cycle_mib = 32  # size of the TensorDict in the reference-cycle demonstration
show_ray = True  # section 4: one run over a local Ray cluster (skipped, with the reason, if Ray is missing)

# %%
# %load_ext picklescope
from IPython.display import display

import picklescope as ps
from picklescope import tracers
from picklescope.tracers import compare as trackers
from picklescope.views import figures, table
from picklescope.views.richtext import sentence

print({name: ("available" if a["available"] else f"unavailable: {a['reason']}")
       for name, a in tracers.availability().items()})

# %% [markdown]
# ## 1. The legacy codec, watched by every tracker
# Each tracker's view is its own trace on the timeline. The table puts what each one saw in each
# costly step (as a multiple of the payload) next to the kernel's exact figure; a sentence follows
# for each blind spot.

# %%
legacy = ps.run("numpy-legacy", transport, workload, scale, tracer=tracer)
display(table.Table(trackers.tracker_table(legacy), caption="memory added per step, x payload (steps nest: "
                    "pickle.dumps runs __getstate__, which runs consolidate, so one copy shows on all three)"))
for blind_spot in trackers.blind_spots(legacy):
    display(sentence(blind_spot))
figures.timeline_figure(legacy, show_tracers=True)

# %% [markdown]
# ## 2. Memory only the cyclic garbage collector frees
# tensordict's `consolidate()` leaves its new buffer inside a reference cycle, so dropping the result
# does not free it; only `gc.collect()` does. The torch codec consolidates on every send. *Held*
# memory is what the sender still had after serializing; *cycle-held* is how much of that a
# `gc.collect()` then released.

# %%
torch_run = ps.run("torch", transport, workload, scale)
s = torch_run.sender
print(f"torch codec sender: held {s.held_bytes / torch_run.payload_bytes:.2f}x payload after the send, "
      f"of which gc.collect() freed {s.cycle_held_bytes / torch_run.payload_bytes:.2f}x")

# %% [markdown]
# The same effect, isolated in a cell of your own: `%%picklescope` runs the cell in a child process
# and reports what it still held at the end and what only `gc.collect()` freed. This kernel's
# imports come along; other variables only when named with `--push` (here the parameter `cycle_mib`).

# %%
# %%picklescope --push cycle_mib
import torch
from tensordict import TensorDict

td = TensorDict({"x": torch.ones(cycle_mib * 2**18)}, batch_size=[])  # cycle_mib MiB of float32
for _ in range(3):
    td.contiguous().consolidate()  # the result is dropped at once; its buffer stays in a cycle

# %%
cell = picklescope_result.processes["cell"]  # noqa: F821 - set by the %%picklescope cell above
rest = cell.held_bytes - cell.cycle_held_bytes
sentence(f"cell held {cell.held_bytes / 2**20:.0f} MiB at its end: gc.collect() freed "
         f"{cell.cycle_held_bytes / 2**20:.0f} MiB (the three consolidated copies, kept alive only by their reference "
         f"cycles); the other {rest / 2**20:.0f} MiB is still in use after the collection: the cell's own `td` "
         f"({cycle_mib} MiB) and what the cell's imports and torch's allocator keep.")

# %% [markdown]
# ## 3. Where the peak came from
# memray's capture, read after the run, gives the allocations live at the sender's peak with their
# stacks, each mapped to the step it happened in.

# %%
for row in trackers.attribution_rows(legacy)[:3]:
    where = f" in step {row['step']} ({row['side']})" if row.get("step") else ""
    display(sentence(f"{row['bytes'] / legacy.payload_bytes:.2f}x payload{where}: {' <- '.join(row['stack'][:3])}"))
figures.attribution_figure(legacy)

# %% [markdown]
# ## 4. Across a real process boundary: Ray
# verl ships the batch with *Ray* (the framework that runs its processes): the *driver*'s (the process that holds the batch) `ray.put`
# serializes it and copies it into the shared *object store* (Ray's shared memory in `/dev/shm`), a
# *worker*'s (a process that computes on the batch) `ray.get` maps it and deserializes it. Here the driver (sender, above), the
# object store (between) and the worker actor (receiver, below) share one time axis. Pages of the store
# that a process touches count in its RSS; the lines below say how much of each side's peak was its
# own memory, and whether the worker's tensors are its own copy or windows into the store.

# %%
from picklescope.errors import PicklescopeError
from picklescope.ray import ray_available
from picklescope.views.ray_figure import failed_sentence, ray_timeline_figure

ray_fig = None
if show_ray and ray_available():
    try:
        over_ray = ps.run("numpy", "ray", workload, scale)
    except PicklescopeError as exc:  # Ray could not start: said in one sentence, no figure to draw
        over_ray = None
        display(sentence(f"The Ray section did not run: {exc}."))
    if over_ray is not None and over_ray.outcome != "ok":  # one sentence, never an empty figure
        display(sentence(failed_sentence(over_ray)))
    elif over_ray is not None:
        cost = over_ray.sender_cost
        print(f"driver: serialize {cost['serialize_peak_bytes'] / 2**20:.1f} MiB, store write "
              f"{cost['store_write_store_pages_bytes'] / over_ray.payload_bytes:.2f}x payload")
        print(over_ray.receiver_cost.get("explanation"))
        print(f"received tensors: {over_ray.received['status']}")
        print(f"cluster processes left behind: {over_ray.ray['remaining']}")
        ray_fig = ray_timeline_figure(over_ray)
else:
    print("Ray section skipped:", "show_ray is False" if not show_ray else "ray is not installed")
ray_fig

# %% [markdown]
# ## The answer

# %%
blind = legacy.tracers.get("tracemalloc", {}).get("sides", {}).get("sender", {}).get("per_step", {})
exact = next((st.added_bytes for st in legacy.sender.steps if st.name == "consolidate"), None)
if exact and "consolidate" in blind:
    display(sentence(f"Because the usual tracker cannot see it: in the legacy codec's consolidate step the kernel "
                     f"measured {exact / legacy.payload_bytes:.2f}x the payload, and tracemalloc saw "
                     f"{(blind['consolidate'] or 0) / legacy.payload_bytes:.3f}x (torch tensor memory is invisible "
                     f"to it).", strong=True))
else:
    display(sentence("tracemalloc did not run here, so this notebook cannot show its blind spot: see the table above."))
