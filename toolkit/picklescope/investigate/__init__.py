"""Investigations: measured runs that answer one question each (headroom, the reproduce matrix, the
step-through, a node replay, a workload from a user's own batch, the capture probe)."""
