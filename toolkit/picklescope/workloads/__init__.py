"""Workloads: what a training batch looks like (named, seeded, scaled) and how its tensors are built.

The names below are importable from ``picklescope.workloads`` as they were before the package had
submodules; :mod:`picklescope.workloads.spec` parses and sizes, :mod:`picklescope.workloads.build` allocates.
"""

from picklescope.workloads.spec import (
    DATA_DIR,
    DEFAULT_WORKLOAD,
    WORKLOAD_DIR,
    NonTensorSpec,
    TensorSpec,
    Workload,
    available_workloads,
    check_scale,
    load_workload,
    parse_workload,
    physical_memory,
)

__all__ = ["DATA_DIR", "DEFAULT_WORKLOAD", "WORKLOAD_DIR", "NonTensorSpec", "TensorSpec", "Workload",
           "available_workloads", "check_scale", "load_workload", "parse_workload", "physical_memory"]
