"""The capture probe under the short name a trainer's one line uses.

``import picklescope.capture; picklescope.capture.install("batch-capture/", limit=3)`` (or ``auto()`` with
``PICKLESCOPE_CAPTURE`` set): the probe itself is :mod:`picklescope.investigate.capture`. This module only
gives it the name the docs and the install check use, and imports nothing else, so the line stays as
light as the probe (no torch, numpy, plotly or Ray until something is recorded).
"""

from picklescope.investigate.capture import Probe, auto, install

__all__ = ["Probe", "auto", "install"]
