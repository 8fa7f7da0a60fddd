"""Workloads: what a training batch looks like (named, seeded, scaled) and how its tensors are built."""
