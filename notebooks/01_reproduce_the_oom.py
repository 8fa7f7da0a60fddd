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
# # 01 · Reproduce the OOM, keep the kernel
#
# *Short on time?* [The answer](#The-answer), in one sentence with the number this run measured, is
# the last section.
#
# New words are defined where they first appear; all of them are in the
# [glossary](../docs/glossary.md).
#
# **What this is about.** Training a large model with reinforcement learning in **verl** (an
# open-source library, [github.com/volcengine/verl](https://github.com/volcengine/verl)) works on
# one *training batch* at a time: the data of one
# step (for an image model, thousands of latents, masks and scores as tensors, plus the prompts), a
# few hundred MiB per *worker* (a process that computes on its share of the batch). verl keeps a batch in a
# **`DataProto`** object. Its processes run on
# **Ray**, and to move a `DataProto` from one process to another Ray **pickles** it: Python calls the
# object's `__getstate__` to turn it into bytes in the *sender* and `__setstate__` to rebuild it in
# the *receiver*.
#
# ```
#  driver process                                            worker process
#  DataProto --__getstate__--> bytes --(Ray: pickle, shared memory)--> __setstate__ --> DataProto
#            (sender: may copy the batch)                           (receiver: copies it once)
# ```
#
# verl has two ways to do it, chosen by `VERL_DATAPROTO_SERIALIZATION_METHOD`. **torch mode** (the
# default) packs every tensor into one new buffer (**`consolidate()`**) and writes it with `torch.save`:
# extra copies of the batch. **numpy mode** hands each tensor over as a numpy view of its memory: no
# copy in the sender. **What went wrong:** up to verl 0.9.0, `__getstate__` ran `consolidate()`
# *before* it checked the mode, so numpy mode still paid for one full copy it then threw away. With
# many batches in flight that extra copy ran real training *nodes* (the machines of a job) out of host
# memory (OOM).
# **The fix** (verl 0.9.1) checks the mode first.
#
# **The question:** does the old numpy mode really need a whole extra copy of the batch, and would
# the fix have saved the node?
#
# Below, each *codec* (a way of doing `__getstate__`/`__setstate__`: `numpy-legacy` is verl 0.9.0's
# numpy mode, `numpy` is the fix) serializes the same batch in a sender process and rebuilds it in a
# receiver process, as Ray would. The *payload* is the batch's tensor bytes; costs are given as
# multiples of it. The sender gets a memory *budget*, a fraction of the payload above its *baseline*
# (its memory when the work starts); crossing it ends the sender with SIGKILL (the signal that ends a
# process at once, with no chance to clean up or raise an exception), exactly as the kernel's OOM
# killer would. This notebook's kernel never holds the batch, so it survives.

# %% tags=["parameters"]
workload = "flowgrpo"  # a preset (picklescope list) or a path to your own workload YAML
scale = 0.1  # fraction of the batch dimension: 0.1 of flowgrpo is about 47 MiB
budget = "0.5x"  # sender budget above its baseline: half a payload, or bytes like "300MiB"
transport = "pickle5-oob"  # pickle protocol 5 with out-of-band buffers, what Ray does

# %%
# %load_ext picklescope
import os

import picklescope as ps
from picklescope.core.units import fmt_bytes
from picklescope.views import figures, table
from picklescope.views.richtext import sentence

kernel_pid = os.getpid()

# %% [markdown]
# ## 1. The legacy codec under the budget
# `numpy-legacy` is verl <= 0.9.0's numpy mode. Watch the sender's curve climb during `consolidate`
# and stop at the dashed budget line: that is the SIGKILL.

# %%
legacy = ps.run("numpy-legacy", transport, workload, scale, budget=budget)
print(f"{legacy.codec}: {legacy.outcome}" + (f" on the {legacy.killed_side} in step {legacy.killed_in_step}"
                                              if legacy.killed_side else ""))
figures.timeline_figure(legacy)

# %% [markdown]
# ## 2. The fixed codec under the same budget
# `numpy` is verl >= 0.9.1: the sender only makes numpy views of the tensors, so it barely moves.

# %%
fixed = ps.run("numpy", transport, workload, scale, budget=budget)
print(f"{fixed.codec}: {fixed.outcome}; exact sender peak {fixed.sender.peak_bytes / fixed.payload_bytes:.2f}x payload")
figures.timeline_figure(fixed)

# %% [markdown]
# ## 3. The kernel is still here
# Same process id as before the runs; both verdicts came back as data. The table puts the two
# side by side (peaks are exact kernel high-water marks above each side's baseline). *Held* is what
# the sender still had when it was done; *cycle-held* is the part of it that only `gc.collect()`
# freed (memory kept alive by a reference cycle); *round trip* says whether the receiver rebuilt
# every tensor exactly as the sender built it.

# %%
print(f"kernel pid {os.getpid()} (before the runs: {kernel_pid}) is still running")
print("verdicts:", {r.codec: r.outcome for r in (legacy, fixed)})
table.Table(table.comparison_rows([legacy, fixed]))

# %% [markdown]
# ## The answer

# %%
unfixed = ps.run("numpy-legacy", transport, workload, scale)  # once more without a budget: its full cost
p = legacy.payload_bytes
if legacy.killed_side:
    legacy_fate = (f"was killed in {legacy.killed_in_step} at {fmt_bytes(legacy.memory_at_death_bytes)} "
                   f"({(legacy.memory_at_death_bytes or 0) / p:.2f}x the payload)")
else:
    legacy_fate = f"ended {legacy.outcome}"
answer = (f"{'Yes' if legacy.killed_side and fixed.outcome == 'ok' else 'Not here'}: under a sender budget of "
          f"{budget} of the payload, verl 0.9.0's numpy mode {legacy_fate}, while the fixed numpy mode finished "
          f"with a sender peak of {fixed.sender.peak_bytes / fixed.payload_bytes:.2f}x the payload; without a "
          f"budget the old mode needs {unfixed.sender.peak_bytes / unfixed.payload_bytes:.2f}x the payload "
          f"({fmt_bytes(unfixed.sender.peak_bytes)}) of extra memory in the sender, one whole copy.")
sentence(answer, strong=True)

# %% [markdown]
# **Next:** `02_step_through_getstate` shows the line in `__getstate__` that costs the copy;
# `04_switch_codecs_confirm_fix` lets you change codec, scale and budget and watch the timeline.
