"""The measured run's lifecycle, written once: sample, launch, follow, end.

A pair over pickle, a notebook cell, a Ray pair and a node replay differ in which processes run and what
their events mean; they do not differ in how a run is carried out. Each hands the engine its processes
and two functions (what an event means, when the run is decided), and the engine does the rest the same
way for all of them:

1. one :class:`~picklescope.measure.session.Session` samples every process on one clock, with the budget
   watchdog and any live view watching each sample as it is taken;
2. a child is launched from the warm forkserver (or a process started elsewhere joins), is adopted by
   the session and guarded by the watchdog;
3. the one wait loop (:meth:`Session.follow`, through :meth:`MeasuredRun.relay`) hands every event to
   the topology until it says the run is decided, or the deadline passes;
4. sampling stops, then every child is released together and ended (:func:`launcher.end`: wait, kill,
   close), however the run ended: a Ctrl-C or a failure of ours kills them at once instead of waiting.

What stays with the topology is what is really its own: the events it folds, the verdict's words, the
cluster it starts. ``with MeasuredRun(...) as run:`` guarantees step 4 on every path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from picklescope.core.events import Release
from picklescope.core.result import Series
from picklescope.measure import launcher
from picklescope.measure.session import Drain, Handler, Session, Watcher


class MeasuredRun:
    """One run's session and children, from the first sample to the last child's end."""

    def __init__(self, t0: float, run_dir: str, interval_s: float, *, reading: str = "rss",
                 budget_bytes: int | None = None, guard: Any = None,
                 on_sample: Watcher | None = None) -> None:
        """``reading``: what a process's curve is (``rss`` for a pair, ``private`` for a node, see
        :mod:`~picklescope.measure.session`). ``budget_bytes``: a whole-node budget the session enforces.
        ``guard``: the per-process :class:`~picklescope.measure.watchdog.Watchdog`, which sees each sample."""
        self.session = Session(t0, run_dir, interval_s, budget_bytes, reading=reading)
        self.guard = guard
        if on_sample is not None:  # live views (the notebook explorer) see each sample as it is taken
            self.session.watchers.append(on_sample)
        if guard is not None:
            self.session.watchers.append(guard.watch)
        self.procs: dict[str, Any] = {}
        self.conns: dict[str, Any] = {}
        self.exit_codes: dict[str, int | None] = {}
        self._owned: list[str] = []  # launched here: released and ended here
        self._stopped = False

    def start(self) -> MeasuredRun:
        """Start sampling (a run that is not a ``with`` block stops it with :meth:`stop_sampling`)."""
        self.session.start()
        return self

    def __enter__(self) -> MeasuredRun:
        return self.start()

    def __exit__(self, exc_type: Any, *_: Any) -> None:
        if exc_type is not None:  # Ctrl-C (or a failure of ours): end the children now, not after their grace
            for name in self._owned:
                self.procs[name].kill()
        self.stop_sampling()
        self.end_children()

    def launch(self, name: str, target: Any, args: tuple, title: str, *, role: str | None = None,
               sampled: bool = True) -> tuple[Any, Any]:
        """Start ``target(conn, *args)`` in a warm child named ``name``, measured and guarded from now on."""
        proc, conn = launcher.start(target, args, title)
        self._owned.append(name)
        self.join(name, proc, conn, role=role, sampled=sampled)
        return proc, conn

    def join(self, name: str, proc: Any, conn: Any, *, role: str | None = None, sampled: bool = True) -> None:
        """Measure a process this run did not launch (a node's driver lives across a series of replays)."""
        self.procs[name], self.conns[name] = proc, conn
        if sampled:
            self.session.adopt(name, proc.pid, role=role or name)
        if self.guard is not None:
            self.guard.add(name, proc.pid)

    def relay(self, handler: Handler, deadline: float, decided: Callable[[list[str], Drain], bool], *,
               conns: dict[str, Any] | None = None, poll_s: float = 0.5) -> bool:
        """Relay the children's events to ``handler`` until ``decided``; False if ``deadline`` came first.

        ``conns`` replaces the joined pipes when the topology hears from processes it did not start (a Ray
        actor's pipe, a node's workers); the caller may add to it while the run is followed."""
        return self.session.follow(self.conns if conns is None else conns, self.procs, handler, deadline, decided,
                                   poll_s=poll_s)

    def stop_sampling(self) -> dict[str, Series]:
        """Stop the session (idempotent); each sampled process's curve."""
        if not self._stopped:
            self._stopped = True
            self.session.stop()
        return self.session.timelines()

    def end_children(self, wait_s: float = 5.0) -> dict[str, int | None]:
        """Release every launched child at once, then end each (they end side by side); their exit codes."""
        for name in self._owned:
            if name not in self.exit_codes:
                try:
                    self.conns[name].send(Release(type="release"))
                except (OSError, BrokenPipeError):
                    pass
        for name in self._owned:
            if name not in self.exit_codes:
                self.exit_codes[name] = launcher.end(self.procs[name], self.conns[name], wait_s)
        return self.exit_codes
