"""Real verl, side by side: installed versions, codecs that run its DataProto, candidate patches.

Nothing here imports verl in the calling process. verl is imported only inside fresh child
processes (:mod:`picklescope.verl.loader`), one version per process, so a notebook kernel never pays
its ~5 s / ~360 MiB import and two versions never mix.

- :mod:`~picklescope.verl.envs`: ``picklescope verl install`` (one folder per version or checkout)
- :mod:`~picklescope.verl.codec`: the ``verl-<version>:<mode>`` codecs
- :mod:`~picklescope.verl.matrix`: what each real codec can carry (round trip per leaf kind)
- :mod:`~picklescope.verl.blobs`: reference blobs, ``inspect --as`` (the inert description of any blob
  file is :mod:`picklescope.workloads.blobinfo`)
- :mod:`~picklescope.verl.loader`: the child side (one verl on the path, patch, instrumentation)
- :mod:`~picklescope.verl.callsites`: the step-through of a real codec, for the confirm investigation
  (:mod:`picklescope.investigate.confirm`, drawn by :mod:`picklescope.views.confirm_text`; the regression
  test it emits for the verl repository is :mod:`picklescope.investigate.emit`)
"""

from __future__ import annotations

from picklescope.verl.envs import VerlEnv, cache_root, get_env, install_source, install_version, installed

__all__ = ["VerlEnv", "cache_root", "get_env", "install_source", "install_version", "installed"]
