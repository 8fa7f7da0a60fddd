# ---
# jupyter:
#   jupytext:
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
# A parameterized postmortem. Run it from the command line to get a shareable, offline HTML file:
#
# ```
# picklescope postmortem --workload flowgrpo --codecs torch,numpy-legacy,numpy --budget 0.5x --out postmortem/
# ```
#
# which executes this notebook with papermill and exports it (plotly.js inlined, nothing fetched
# from the network). It also writes the same investigation as `report.html`, the toolkit's report.
# Every number below was measured while this notebook ran: each codec serialized the workload's
# batch in a sender process and deserialized it in a receiver process, peaks read from the kernel.

# %% tags=["parameters"]
workload = "flowgrpo"  # a preset (picklescope list) or a path to a workload YAML
codecs = ["torch", "numpy-legacy", "numpy"]  # the codecs to compare
budget = "0.5x"  # sender budget for the verdict runs (None: halfway between numpy and numpy-legacy)
scale = 0.1  # fraction of the batch dimension
transport = "pickle5-oob"  # how the bytes travel (pickle5-oob is what Ray does)
headroom = True  # also find each codec's smallest surviving sender budget (2 more runs per codec)
trace = "all"  # tracers for one extra run of the legacy codec: what each tracker saw, who allocated (None: skip)
ray = False  # also send each codec through a local Ray cluster (slow to start)

# %%
# %load_ext picklescope
import json
import shlex

from IPython.display import HTML, display

from picklescope import envinfo, figures, report, table, tracers
from picklescope.reproduce import budgeted_results, investigate, matrix_results

command = shlex.join(["picklescope", "postmortem", "--workload", workload, "--codecs", ",".join(codecs),
                      "--budget", budget or "none", "--scale", f"{scale:g}", "--transport", transport,
                      "--tracer", trace or "none"] + ([] if headroom else ["--no-headroom"]) + (["--ray"] if ray else []))
inv = investigate(workload, scale, budget, codecs=tuple(codecs), transports=(transport,), headroom=headroom,
                  trace=trace, ray=ray, command=command)
report.write_report(inv, "report.html")
with open("results.json", "w") as f:
    json.dump(inv.to_dict(), f)

# %% [markdown]
# ## Verdict

# %%
display(HTML(f"<p style='font-size:1.15em'><b>{report.e(inv.extra['headline'])}</b></p>"))
print(table.render(table.comparison_rows(budgeted_results(inv) + matrix_results(inv))))

# %% [markdown]
# ## Under the budget
# Each budgeted run's timeline: both sides' memory, the named steps as bands, the budget as a line.
# A killed side's curve stops at the kill.

# %%
for r in budgeted_results(inv):
    print(f"{r.codec}: {r.outcome}" + (f" ({r.error})" if r.error else ""))
    display(figures.timeline_figure(r))

# %% [markdown]
# ## Side by side, without a budget
# Exact peak, held and cycle-held memory (freed only by `gc.collect()`) and time per codec.

# %%
figures.comparison_figure(matrix_results(inv))

# %% [markdown]
# ## What each memory tracker saw, and who allocated the peak
# One more run of the legacy codec with in-process tracers: each one's view next to the kernel's
# exact figures (tracemalloc cannot see torch tensors; torch.profiler cannot see Python buffers),
# then memray's allocations live at the peak with their stacks.

# %%
traced = [r for r in inv.results if r.tracer not in ("sampler", "none")]
for r in traced:
    print("\n".join(tracers.report_lines(r)))
    display(figures.timeline_figure(r, show_tracers=True))
    display(figures.attribution_figure(r))
if not traced:
    print("no traced run in this postmortem (trace=None)")

# %% [markdown]
# ## Steps
# What each named step of each unbudgeted run added, as a multiple of the payload.

# %%
for r in matrix_results(inv):
    print(f"\n{r.codec} over {r.transport}: {r.outcome}")
    print(table.render(table.steps_rows(r)))

# %% [markdown]
# ## Environment and how to reproduce

# %%
env = envinfo.collect()
print({k: env[k] for k in ("python", "packages", "machine_memory_bytes", "cpus", "platform")})
print(inv.extra.get("command"))
