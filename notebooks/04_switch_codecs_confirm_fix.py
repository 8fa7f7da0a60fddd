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
# # 04 · Switch codecs, then confirm a fix before patching production
#
# *Short on time?* [The answer](#The-answer), in one sentence with the number this run measured, is
# the last section.
#
# **The question:** does my candidate `__getstate__` really remove the extra copy, without costing
# time or breaking the round trip?
#
# Words first (every one is in the [glossary](../docs/glossary.md); notebook 01 tells the story).
# A *codec* is one way of doing `__getstate__`/`__setstate__`: `numpy-legacy` is
# [verl](../docs/glossary.md#the-situation) 0.9.0's *numpy mode* with the bug (it runs
# **`consolidate`**, a full copy of every tensor, and throws the copy away), `numpy` is the fix. The
# *sender* process turns the batch into bytes and the *receiver* process rebuilds it; the
# *transport* is how the bytes travel between them. The *payload* is the batch's tensor bytes; a
# *budget* is a memory limit on the sender, as a multiple of the payload above its *baseline* (its
# memory when the work starts). *Held* memory is what a side still has when its work is done.
#
# First the explorer: pick a codec, transport, workload, tracer, scale and sender budget, press
# **run**, and watch the timeline fill in while the two child processes work. Every finished run
# joins the table below it, so switching codecs builds a side-by-side. An out-of-memory kill ends a
# child process, never this kernel. Then a candidate codec written in a cell is measured against the
# baseline on the same batch.

# %% tags=["parameters"]
workload = "flowgrpo"  # a preset (picklescope list) or a path to your own workload YAML
scale = 0.1  # fraction of the batch dimension
transport = "pickle5-oob"
baseline = "numpy-legacy"  # the production behaviour the candidate must beat

# %%
# %load_ext picklescope
from IPython.display import display

import picklescope as ps
from picklescope.views import figures, table
from picklescope.views.richtext import sentence
from picklescope.views.widgets import Explorer

# %% [markdown]
# ## 1. The explorer
# Try: run `numpy`, switch the codec to `numpy-legacy` and run again (the sender's curve gains a
# whole payload during `consolidate`); then set the budget to 0.5 and run `numpy-legacy` once more.

# %%
explorer = Explorer(codec="numpy", transport=transport, workload=workload, scale=scale)
explorer

# %%
# The same from code: one run with the current settings, waiting for it to finish.
explorer.run_with(codec="numpy")
explorer.wait()
explorer.summary()  # the status line: rendered here, plain text in a terminal

# %% [markdown]
# ## 2. A candidate `__getstate__`, written in a cell
# `%%picklescope_codec` registers the codec defined in the cell here *and* in the sender and
# receiver processes of later runs (they are separate processes, so the cell's source is saved as a
# plugin file that each of them loads). The candidate below is verl's fix: in numpy mode, do not
# consolidate at all.

# %%
# %%picklescope_codec
from picklescope.codecs.numpy_codec import NumpyLegacyCodec


class NumpyBranchFirst(NumpyLegacyCodec):
    """verl 0.9.0's numpy-mode __getstate__ with the numpy branch taken before any consolidate."""

    name = "candidate"
    description = "numpy mode without the discarded contiguous().consolidate()"

    def before_views(self, b):
        pass  # was: b.batch.contiguous().consolidate(), a full copy nobody used


# %% [markdown]
# ## 3. Candidate against baseline, same batch, same transport
# Peak and held memory per side, serialize and deserialize time, and the round trip (every leaf
# compared with what the sender built).

# %%
plugins = picklescope_plugins  # noqa: F821 - defined by the %%picklescope_codec cell above
explorer.plugins = plugins  # the explorer above now offers "candidate" too
explorer.refresh_codecs()
runs = [ps.run(c, transport, workload, scale, plugins=plugins) for c in (baseline, "candidate")]
display(table.Table(table.comparison_rows(runs)))
base, cand = runs
saved = (base.sender.peak_bytes or 0) - (cand.sender.peak_bytes or 0)
display(sentence(
    f"The candidate's sender peak was {(cand.sender.peak_bytes or 0) / base.payload_bytes:.2f}x the payload against "
    f"{(base.sender.peak_bytes or 0) / base.payload_bytes:.2f}x for {baseline}: "
    f"{saved / base.payload_bytes:.2f}x the payload lower than {baseline}'s; its round trip was "
    f"{'exact' if cand.roundtrip['ok'] else 'NOT exact: ' + str(cand.roundtrip['mismatches'][:3])}; it serialized in "
    f"{cand.serialize_s:.4f} s against {base.serialize_s:.4f} s, and serialize + deserialize (the figure's last "
    f"panel) took {(cand.serialize_s or 0) + (cand.deserialize_s or 0):.4f} s against "
    f"{(base.serialize_s or 0) + (base.deserialize_s or 0):.4f} s."))
figures.comparison_figure(runs)

# %% [markdown]
# And the candidate's own `__getstate__`, line by line: no line should add more than a sliver.

# %%
candidate_codec = ps.get_codec("candidate")
# %picklescope_stepthrough --workload $workload --scale $scale candidate_codec.getstate

# %% [markdown]
# ## Your own batch
# The same verdict on *your* batch instead of a preset. Anything saved with
# `save_to_disk` of a [DataProto](../docs/glossary.md#the-situation) (either serialization mode),
# `torch.save` of a [TensorDict](../docs/glossary.md#the-situation) or of a dict of
# tensors, or an `.npz` becomes a workload file with `picklescope workload from FILE`: it reads only
# the file's structure (pickle opcodes, the zip's `data.pkl`, the npz headers), never runs anything
# in it, and copies no value. A running job can write the same file itself with
# `picklescope.investigate.capture.install("batch-capture/")` ([docs/workload_from.md](../docs/workload_from.md)).
#
# Here a batch is saved with `torch.save` into `out/own-batch/` as a stand-in for your file; put the
# path of your own file in `saved_batch` instead.

# %%
from pathlib import Path

import torch

from picklescope import cli

own_dir = Path("out") / "own-batch"  # out/ is ignored by git; nothing is written beside the notebooks
own_dir.mkdir(parents=True, exist_ok=True)
saved_batch = own_dir / "my_batch.pt"
torch.save(ps.load_workload(workload).build(scale).batch, saved_batch)  # stand-in for your own saved batch
own_workload = own_dir / "my_batch.yaml"
exit_code = cli.main(["workload", "from", str(saved_batch), "--out", str(own_workload), "--force"])  # the command, here

# %% [markdown]
# Both numpy codecs on that workload, side by side: `numpy-legacy` is verl <= 0.9.0 in numpy mode
# (the discarded `consolidate()` copy), `numpy` is verl >= 0.9.1.

# %%
own_runs = [ps.run(c, transport, str(own_workload), 1.0) for c in ("numpy-legacy", "numpy")]
display(table.Table(table.comparison_rows(own_runs)))
legacy_run, fixed_run = own_runs
own_gap = ((legacy_run.sender.peak_bytes or 0) - (fixed_run.sender.peak_bytes or 0)) / legacy_run.payload_bytes
sentence(f"On your batch ({legacy_run.payload_bytes / 2**20:.1f} MiB of tensors), numpy-legacy's sender peaked "
         f"{own_gap:.2f}x the payload above numpy's: "
         + ("the fix removes one full copy of the batch." if own_gap > 0.5 else "no full copy to remove here."))

# %% [markdown]
# When the numbers hold, make the same change in production (for verl: `DataProto.__getstate__`)
# and keep a regression test that fails if `consolidate` is called in numpy mode.

# %% [markdown]
# ## The answer

# %%
verdict = "removes" if saved > 0.5 * base.payload_bytes and cand.roundtrip["ok"] else "does not remove"
sentence(f"The candidate {verdict} the extra copy: its sender peak was {saved / base.payload_bytes:.2f}x the payload "
         f"lower than {baseline}'s ({(cand.sender.peak_bytes or 0) / base.payload_bytes:.2f}x against "
         f"{(base.sender.peak_bytes or 0) / base.payload_bytes:.2f}x), with an "
         f"{'exact' if cand.roundtrip['ok'] else 'inexact'} round trip.", strong=True)
