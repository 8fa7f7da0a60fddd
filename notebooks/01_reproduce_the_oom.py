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
# **The question:** does verl's old numpy-mode `DataProto.__getstate__` really need a whole extra
# copy of the batch, and would the fix have saved the node?
#
# In verl <= 0.9.0, `__getstate__` ran `batch.contiguous().consolidate()` *before* it looked at
# `VERL_DATAPROTO_SERIALIZATION_METHOD`. In numpy mode that consolidated copy was thrown away unused,
# but it had already cost one full payload of host RAM (and tensordict keeps it alive in a reference
# cycle). verl 0.9.1 moved the numpy branch first.
#
# Below, each codec serializes the same batch in a **sender** process and deserializes it in a
# **receiver** process, as Ray would. The sender gets a memory **budget**, a fraction of the payload
# above its baseline; crossing it ends the sender with SIGKILL, exactly as the kernel's OOM killer
# would. This notebook's kernel never holds the batch, so it survives whatever happens.

# %% tags=["parameters"]
workload = "flowgrpo"  # a preset (picklescope list) or a path to your own workload YAML
scale = 0.1  # fraction of the batch dimension: 0.1 of flowgrpo is about 47 MiB
budget = "0.5x"  # sender budget above its baseline: half a payload, or bytes like "300MiB"
transport = "pickle5-oob"  # pickle protocol 5 with out-of-band buffers, what Ray does

# %%
# %load_ext picklescope
import os

import picklescope as ps
from picklescope import figures, table

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
# side by side (peaks are exact kernel high-water marks above each side's baseline).

# %%
print(f"kernel pid {os.getpid()} (before the runs: {kernel_pid}) is still running")
print(table.render(table.comparison_rows([legacy, fixed])))
print("verdicts:", {r.codec: r.outcome for r in (legacy, fixed)})

# %% [markdown]
# **Next:** `02_step_through_getstate` shows the line in `__getstate__` that costs the copy;
# `04_switch_codecs_confirm_fix` lets you change codec, scale and budget and watch the timeline.
