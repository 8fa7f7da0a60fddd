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
# # Postmortem: host memory spent serializing a training batch
#
# Every number below was measured while this notebook ran. A *training batch* (the data of one
# training step, tensors plus prompts) is turned into bytes whenever
# [verl](../docs/glossary.md#the-situation) hands it to another process. Each *codec* (a way of
# turning the batch into bytes: `torch` is verl's default, `numpy-legacy` is verl <= 0.9.0's
# *numpy mode*, which makes one full copy it then throws away, `numpy` is verl >= 0.9.1's fixed
# numpy mode) serialized the workload's batch in a *sender* process and rebuilt it in a *receiver*
# process; each peak was read from the Linux kernel (*VmHWM*, the exact high-water mark of resident
# memory). The sender runs under a *budget*, a memory limit as a multiple of the *payload* (the
# batch's tensor bytes). Words in *italics* are defined in the [glossary](../docs/glossary.md).

# %% tags=["parameters"]
workload = "flowgrpo"  # a preset (picklescope list) or a path to a workload YAML
codecs = ["torch", "numpy-legacy", "numpy"]  # the codecs to compare
budget = "0.5x"  # sender budget for the verdict runs (None: halfway between numpy and numpy-legacy)
scale = 0.1  # fraction of the batch dimension
transport = "pickle5-oob"  # how the bytes travel (pickle5-oob is what Ray does)
headroom = True  # also find each codec's smallest surviving sender budget (2 more runs per codec)
trace = "all"  # tracers for one extra run of the legacy codec: what each tracker saw, who allocated (None: skip)
ray = False  # also send each codec through a local Ray cluster (slow to start)
out_dir = "out/postmortem"  # where report.html and results.json go (out/ is ignored by git)

# %%
# %load_ext picklescope
import json
import os
import shlex

from IPython.display import HTML, display

from picklescope.core import envinfo
from picklescope.core.units import fmt_bytes
from picklescope.investigate.reproduce import budgeted_results, investigate, matrix_results
from picklescope.tracers import compare as trackers
from picklescope.views import figures, report, table

command = shlex.join(["picklescope", "postmortem", "--workload", workload, "--codecs", ",".join(codecs),
                      "--budget", budget or "none", "--scale", f"{scale:g}", "--transport", transport,
                      "--tracer", trace or "none"] + ([] if headroom else ["--no-headroom"]) + (["--ray"] if ray else []))
inv = investigate(workload, scale, budget, codecs=tuple(codecs), transports=(transport,), headroom=headroom,
                  trace=trace, ray=ray, command=command)
os.makedirs(out_dir, exist_ok=True)
report.write_report(inv, os.path.join(out_dir, "report.html"))
with open(os.path.join(out_dir, "results.json"), "w") as f:
    json.dump(inv.to_dict(), f)

# %% [markdown]
# ## Verdict

# %%
display(HTML(f"<p style='font-size:1.15em'><b>{report.e(inv.headline)}</b></p>"))
table.Table([{"parameter": "workload", "value": f"{workload} x{scale:g} (payload {fmt_bytes(inv.results[0].payload_bytes if inv.results else None)})"},
             {"parameter": "codecs", "value": ", ".join(codecs)},
             {"parameter": "sender budget", "value": budget or "none"},
             {"parameter": "transport", "value": transport},
             {"parameter": "trackers", "value": trace or "none"},
             {"parameter": "through Ray", "value": "yes" if ray else "no"}])

# %% [markdown]
# ## Which codec survives the budget, and what does each cost?
# One row per run. *Peak* is the highest memory above the process's starting point (its
# *baseline*), also as a multiple of the *payload* (the batch's tensor bytes); *held* is what stayed
# after the call, *cycle-held* what only `gc.collect()` freed.

# %%
table.Table(table.comparison_rows(budgeted_results(inv) + matrix_results(inv)))

# %% [markdown]
# ## What happened under the budget?
# Each budgeted run's memory over time: both sides, the named steps as bands, the budget as a line.
# A killed side's curve stops where it was killed.

# %%
for r in budgeted_results(inv):
    display(figures.timeline_figure(r))

# %% [markdown]
# ## How do the codecs compare without a budget?
# Exact peak, held and cycle-held memory and time per codec.

# %%
figures.comparison_figure(matrix_results(inv))

# %% [markdown]
# ## What did each memory tracker see, and who allocated the peak?
# One more run of the legacy codec with in-process trackers. The table puts what each one saw in
# each costly step next to the kernel's exact figure; a sentence follows for each blind spot.

# %%
traced = [r for r in inv.results if r.tracer not in ("sampler", "none")]
for r in traced:
    seen_table = table.Table(trackers.tracker_table(r), caption=f"{r.codec}: memory added per step, x payload")
    display(seen_table)  # Table escapes its caption and cells
    for sentence in trackers.blind_spots(r):
        display(HTML(f"<p>{report.e(sentence)}</p>"))
    display(figures.attribution_figure(r))
if not traced:
    display(HTML("<p>No traced run in this postmortem (trace=None).</p>"))

# %% [markdown]
# ## Which step added the memory?
# What each named step of each unbudgeted run added, as a multiple of the payload.

# %%
for r in matrix_results(inv):
    steps_table = table.Table(table.steps_rows(r), caption=f"{r.codec} over {r.transport}: {r.outcome}")
    display(steps_table)  # Table escapes its caption and cells

# %% [markdown]
# ## Where was it measured, and how to run it again?

# %%
env = envinfo.collect()
table.Table([{"what": "python", "value": env["python"]}, {"what": "cpus", "value": env["cpus"]},
             {"what": "memory", "value": fmt_bytes(env["machine_memory_bytes"])},
             {"what": "platform", "value": env["platform"]},
             {"what": "packages", "value": ", ".join(f"{k} {v}" for k, v in sorted(env["packages"].items()))},
             {"what": "command", "value": inv.command}])
