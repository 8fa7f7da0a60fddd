"""Old module names, kept importable for one release after the package moved into subpackages.

``import picklescope.runner`` (or ``from picklescope.figures import ...``) still works: the old name is
bound to the module at its new place (:data:`MOVED`), the same module object, so patches and
``isinstance`` checks agree. New code uses the new names; the README lists the move.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.machinery import ModuleSpec
from types import ModuleType

# old name -> new name, both under ``picklescope.``
MOVED: dict[str, str] = {
    "_quiet_start": "core.quiet_start",
    "budget": "measure.budget",
    "capabilities": "investigate.capabilities",
    "capture": "investigate.capture",
    "cellrun": "measure.cellrun",
    "cgroup": "core.cgroup",
    "child": "measure.child",
    "commands": "cli.commands",
    "commands.capabilities": "cli.commands.capabilities",
    "commands.common": "cli.commands.common",
    "commands.confirm": "cli.commands.confirm",
    "commands.headroom": "cli.commands.headroom",
    "commands.inspect": "cli.commands.inspect",
    "commands.list": "cli.commands.list",
    "commands.node": "cli.commands.node",
    "commands.postmortem": "cli.commands.postmortem",
    "commands.reproduce": "cli.commands.reproduce",
    "commands.run": "cli.commands.run",
    "commands.stepthrough": "cli.commands.stepthrough",
    "commands.verl": "cli.commands.verl",
    "commands.workload": "cli.commands.workload",
    "envinfo": "core.envinfo",
    "figures": "views.figures",
    "forkserver_setup": "measure.forkserver_setup",
    "headroom": "investigate.headroom",
    "inprocess": "measure.inprocess",
    "launcher": "measure.launcher",
    "leftovers": "core.leftovers",
    "linetrace": "measure.linetrace",
    "live": "views.live",
    "magic": "views.magic",
    "nbrun": "views.nbrun",
    "node": "investigate.node",
    "node_figure": "views.node_figure",
    "offline_html": "views.offline_html",
    "plugins": "core.plugins",
    "postmortem": "views.postmortem",
    "procmem": "core.procmem",
    "pytest_leftovers": "measure.pytest_leftovers",
    "registry": "core.registry",
    "report": "views.report",
    "reproduce": "investigate.reproduce",
    "result": "core.result",
    "richtext": "views.richtext",
    "runner": "measure.runner",
    "safefile": "core.safefile",
    "safeload": "core.safeload",
    "sampler": "measure.sampler",
    "session": "measure.session",
    "steplabels": "views.steplabels",
    "stepper": "views.stepper",
    "steps": "core.steps",
    "stepthrough": "investigate.stepthrough",
    "table": "views.table",
    "timeline": "views.timeline",
    "transports_ray": "transports.ray",
    "transports_ray.actor": "transports.ray.actor",
    "transports_ray.address": "transports.ray.address",
    "transports_ray.cluster": "transports.ray.cluster",
    "transports_ray.driver": "transports.ray.driver",
    "transports_ray.events": "transports.ray.events",
    "transports_ray.figure": "views.ray_figure",
    "transports_ray.hooks": "transports.ray.hooks",
    "transports_ray.local_cluster": "transports.ray.local_cluster",
    "transports_ray.matrix": "investigate.ray_matrix",
    "transports_ray.orchestrate": "transports.ray.orchestrate",
    "transports_ray.received": "transports.ray.received",
    "transports_ray.report": "transports.ray.costs",
    "transports_ray.store": "transports.ray.store",
    "transports_ray.tq": "transports.ray.transferqueue",
    "transports_ray.transport": "transports.ray.transport",
    "trust": "codecs.trust",
    "units": "core.units",
    "verdicts": "measure.verdicts",
    "verify": "codecs.verify",
    "watchdog": "measure.watchdog",
    "widgets": "views.widgets",
    "workload_build": "workloads.build",
    "workload_from": "investigate.workload_from",
}


class _OldNames:
    """Finds ``picklescope.<old>`` and hands back the module at its new name.

    A meta path finder and loader by its methods (the protocol), not by the ``importlib.abc`` classes:
    importing those costs about 10 ms (importlib.resources, tempfile, ...), and ``import picklescope``
    stays light for the capture probe."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):  # noqa: ANN201 - importlib API
        old = fullname.removeprefix("picklescope.")
        if fullname.startswith("picklescope.") and old in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: ModuleSpec) -> ModuleType:
        return importlib.import_module("picklescope." + MOVED[spec.name.removeprefix("picklescope.")])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module was imported under its new name."""


def install() -> None:
    """Put the finder on ``sys.meta_path`` once (called by ``picklescope/__init__``)."""
    if not any(isinstance(f, _OldNames) for f in sys.meta_path):
        sys.meta_path.insert(0, _OldNames())  # ahead of the path finder: a stale folder of an old name loses
