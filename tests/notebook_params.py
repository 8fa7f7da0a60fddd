"""The small parameters every notebook runs with in the tests, headless and in JupyterLab alike.

The tests check that a notebook runs and shows the right things, not the figures of a big run, so
each gets the smallest workload that still shows its answer. :func:`small_copy` writes a notebook's
``.py`` with these values in its parameters cell, for JupyterLab (which has no papermill to inject
them): the copy is what a person would have after typing them into the first cell.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

TINY = {"workload": "tiny", "scale": 1.0}
PARAMETERS: dict[str, dict[str, Any]] = {
    "01_reproduce_the_oom": TINY,
    "02_step_through_getstate": {**TINY, "codecs": ["numpy-legacy", "numpy"]},
    "03_allocation_timelines": {**TINY, "cycle_mib": 8},
    "04_switch_codecs_confirm_fix": TINY,
    "06_node_replay": {"workload": "flowgrpo", "scale": 0.05, "workers": 2, "steps": 2, "gc_modes": ["off"]},
}
POSTMORTEM = "05_postmortem_template"
# the postmortem notebook as a user runs it in Lab, small: two codecs, no headroom search
LAB_PARAMETERS: dict[str, dict[str, Any]] = {
    **PARAMETERS,
    POSTMORTEM: {**TINY, "codecs": ["numpy-legacy", "numpy"], "headroom": False},
}

_CELL = re.compile(r"^# %% tags=\[\"parameters\"\]\n(?P<body>.*?)(?=^# %%)", re.MULTILINE | re.DOTALL)


def with_parameters(text: str, values: dict[str, Any]) -> str:
    """``text`` (a jupytext percent notebook) with ``values`` assigned in its parameters cell.

    Each ``name = ...`` line keeps its comment; a name the cell does not assign is an error, so a
    renamed parameter cannot be skipped silently."""
    m = _CELL.search(text)
    if m is None:
        raise ValueError("no '# %% tags=[\"parameters\"]' cell")
    body = m.group("body")
    for name, value in values.items():
        body, n = re.subn(rf"^{re.escape(name)} = [^#\n]*?(?=\s*(#|$))", f"{name} = {value!r}", body, count=1,
                          flags=re.MULTILINE)
        if n != 1:
            raise ValueError(f"the parameters cell assigns no {name!r}")
    return text[:m.start("body")] + body + text[m.end("body"):]


def small_copy(notebooks: Path, dest: Path, parameters: dict[str, dict[str, Any]] = LAB_PARAMETERS) -> Path:
    """Copy every file of ``notebooks`` into ``dest``, each notebook with its small parameters."""
    dest.mkdir(parents=True, exist_ok=True)
    for p in sorted(notebooks.iterdir()):
        if not p.is_file():
            continue
        if p.suffix == ".py" and p.stem in parameters:
            (dest / p.name).write_text(with_parameters(p.read_text(), parameters[p.stem]))
        else:
            shutil.copy2(p, dest / p.name)
    return dest
