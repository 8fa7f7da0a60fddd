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
# # 02 · Step through `__getstate__` and `__setstate__`
#
# *Short on time?* [The answer](#The-answer), in one sentence with the number this run measured, is
# the last section.
#
# **The question:** *which line* of a serialization method costs the memory?
#
# Words first (every one is in the [glossary](../docs/glossary.md); notebook 01 tells the story).
# A *codec* is one way of doing `__getstate__`/`__setstate__`, the two methods [pickle](../docs/glossary.md#the-situation)
# calls to turn a batch into bytes in the *sender* process and back in the *receiver* process:
# `numpy-legacy` is [verl](../docs/glossary.md#the-situation) 0.9.0's numpy mode with the bug,
# `numpy` the fix, `torch` verl's default. The *payload* is the batch's tensor bytes; costs are
# multiples of it. **`consolidate`** copies every tensor of a *TensorDict* (the dictionary of
# tensors inside a batch) into one new buffer.
#
# A run's named steps already say "`consolidate` added one payload". The step-through goes further:
# it runs one `__getstate__` (or `__setstate__`) in a child process under a line tracer and reports,
# for every line executed, the memory it added and the exact kernel peak while it ran (*VmHWM*, the
# kernel's high-water mark of the process's resident memory, reset at every line boundary, so even
# a single C call that allocates and fills a full copy is caught). Then a finished run is replayed
# one step at a time on its timeline.

# %% tags=["parameters"]
workload = "flowgrpo"  # a preset (picklescope list) or a path to your own workload YAML
scale = 0.1  # fraction of the batch dimension
codecs = ["numpy-legacy", "numpy", "torch"]  # verl <= 0.9.0 numpy mode, verl >= 0.9.1, the verl default
transport = "pickle5-oob"

# %%
# %load_ext picklescope
import os

import picklescope as ps
from picklescope.core.units import fmt_bytes
from picklescope.investigate.stepthrough import stepthrough
from picklescope.views import figures, stepper, table
from picklescope.views.richtext import sentence

# %% [markdown]
# ## 1. Every codec, both directions, line by line
# For each codec and method: the costliest line and the exact peak of the whole call. A line's
# **self** cost is what its own code allocated: its *inclusive* cost (everything that happened
# while it ran, the functions it called included) minus what those functions added. Ranking by
# self cost names the line that really allocates, never a wrapper such as `return self.encode(b)`
# that only calls it.

# %%
throughs = {(c, m): stepthrough(codec=c, method=m, workload=workload, scale=scale, transport=transport)
            for c in codecs for m in ("__getstate__", "__setstate__")}
summary = []
for (c, m), st in throughs.items():
    top = st.culprit()
    if top is not None and top.self_bytes < 0.01 * st.payload_bytes:
        top = None  # under 1% of the payload is noise, not a culprit
    summary.append({"codec": c, "method": m, "outcome": st.outcome,
                    "peak (x payload)": f"{(st.peak_bytes or 0) / st.payload_bytes:.2f}x",
                    "costliest line": f"{os.path.basename(top.filename)}:{top.lineno}  {top.source.strip()}"
                    if top else "(none: no line added 1% of the payload by itself)",
                    "its own cost (x payload)": f"{top.self_bytes / st.payload_bytes:.2f}x" if top else "-"})
table.Table(summary)

# %% [markdown]
# The legacy codec's `__getstate__` in full: the `consolidate()` line adds about one payload and
# nothing else does; the fixed codec's lines add (almost) nothing. On the receiver side both copy
# each buffer once into a `bytearray` (about one payload), which is the price of owning the data.

# %%
legacy_get = throughs[(codecs[0], "__getstate__")]
fixed_get = throughs[(codecs[1], "__getstate__")]
scale_bytes = figures.stepthrough_scale([legacy_get, fixed_get])  # one absolute scale for both figures
stepper.show_stepthrough(legacy_get, scale_bytes=scale_bytes)

# %% [markdown]
# The fixed codec on the same scale: its bars are too small to see, and every line under 1% of
# the payload is drawn grey, not red.

# %%
stepper.show_stepthrough(fixed_get, scale_bytes=scale_bytes)

# %% [markdown]
# The same from any expression that names a function: a codec's method, `Batch.__getstate__`, or a
# class of your own defined in an importable file (a function defined in this notebook cannot be
# imported by the child; use a `%%picklescope_codec` cell for that, see notebook 04).

# %%
codec = ps.get_codec(codecs[1])
# %picklescope_stepthrough --workload $workload --scale $scale codec.getstate

# %% [markdown]
# ## 2. One step at a time on the timeline
# A real run of the legacy codec, replayed: press **next step** to reveal the next named step of the
# sender and then the receiver, with what it added. Nothing is re-measured; the run already holds
# every step's exact peak.

# %%
run = ps.run(codecs[0], transport, workload, scale)
reveal = stepper.reveal(run)
reveal

# %%
# The same control from code: reveal the first three steps.
for _ in range(3):
    reveal.next_button.click()
print(reveal.caption.value)

# %% [markdown]
# ## The answer

# %%
top = legacy_get.culprit()
fixed_top = max((r.self_bytes for r in fixed_get.rows), default=0)
sentence(f"The line that costs the memory is {os.path.basename(top.filename)}:{top.lineno} "
         f"`{top.source.strip()}`: by itself it added {fmt_bytes(top.self_bytes)} "
         f"({top.self_bytes / legacy_get.payload_bytes:.2f}x the payload) in the legacy codec's __getstate__, and no "
         f"line of the fixed codec's __getstate__ added more than {fmt_bytes(fixed_top)} "
         f"({fixed_top / fixed_get.payload_bytes:.4f}x).", strong=True)
