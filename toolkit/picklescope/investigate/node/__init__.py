"""A node replayed: one driver and N worker actors on a Ray cluster, K training steps, one clock.

verl's single controller hands every training step's batch to its workers: the driver chunks the
DataProto into N pieces (``DataProto.chunk``), calls one method per worker with its chunk as the
argument (Ray pickles each chunk in the driver, so the chunk's ``__getstate__`` runs there), each
worker deserializes its chunk and returns a small per-token result, and the driver concatenates the
results (``DataProto.concat``). This package replays that loop with the toolkit's codecs, or with
real verl's ``DataProto`` when a ``verl-<version>:<mode>`` codec is chosen (its own ``chunk`` and
``concat`` then do the splitting and joining).

Three places run code, each in modules of its own:

- the parent (:func:`node`, :mod:`.parent`), which imports no Ray: its input checks (:mod:`.checks`),
  its fold of the events into one :class:`~picklescope.measure.session.Session` (:mod:`.follow`,
  :mod:`.tracking`), the cgroup enforcement (:mod:`.enforce`), and whatever happens, the kill of
  what is left of the cluster it started;
- the driver (:func:`node_driver_main`, :mod:`.driver`), a session leader that starts or joins the
  cluster, creates the workers (:mod:`.replica`, or real verl's worker group in
  :mod:`picklescope.investigate.node_verl`) and runs the training steps with named, exactly measured
  steps, on the codec's data (:mod:`.data`) under the chosen collector (:mod:`.collector`);
- the workers (:class:`NodeWorker`, :mod:`.worker`), Ray actors that connect back to the parent and
  stream their own steps.

The result and its words are :mod:`.result`.
"""

from picklescope.investigate.node.checks import (
    DEFAULT_SCALE,
    DISPATCHES,
    ENFORCEMENTS,
    ENGINES,
    GC_MODES,
    NODE_TRANSPORTS,
)
from picklescope.investigate.node.driver import node_driver_main
from picklescope.investigate.node.parent import cleanup_reserve, node, node_series
from picklescope.investigate.node.result import NodeResult, compare_drivers
from picklescope.investigate.node.worker import NodeWorker

__all__ = [
    "DEFAULT_SCALE", "DISPATCHES", "ENFORCEMENTS", "ENGINES", "GC_MODES", "NODE_TRANSPORTS", "NodeResult", "NodeWorker",
    "cleanup_reserve", "compare_drivers", "node_driver_main", "node", "node_series",
]
