"""``picklescope predict``: a node too large to run here, predicted from replays at sizes that do run.

:mod:`.fit` runs the small replays and keeps their per-step numbers; :mod:`.model` fits how each
role's memory grows with the payload, the workers, the steps and the collector; :mod:`.prediction`
plays the fitted model forward at the user's size and applies Ray's memory monitor.
"""
