"""The events a measured process and its parent send each other: the run protocol, in the order of a run.

Every measured process (a sender or receiver child, the cell magic's child, the Ray driver, the
receiver actor, a node's driver and workers) reports to the parent with small dicts sent as they
happen, over a ``multiprocessing`` pipe (our own children) or a socket (Ray actors, see
:mod:`picklescope.ray.channel`). A SIGKILL therefore loses nothing already sent. The
parent folds them into a result: :class:`picklescope.measure.fold.RunFold` (a two-sided run),
:func:`picklescope.measure.cellrun.run_cell` (a cell), :class:`picklescope.ray.orchestrate.RayRun`
(a run over Ray) and :meth:`picklescope.measure.session.Session.fold` (a node of processes).
Every event is also handed to the caller's ``on_event`` hook (the live views) and to the
watchdog and the tracers' collector.

Each kind is a :class:`~typing.TypedDict`: at run time still a plain dict (a ``TypedDict`` call
builds one), so events pickle as before and a consumer reads them with ``ev["..."]``. The ``type``
key names the kind; :data:`KINDS` maps it to its class and :data:`Event` is the union of them all.
Keys marked ``NotRequired`` are sent by some producers only; the docstring of each kind says which.
``tests/test_events.py`` checks that every kind the package sends is declared here and that a real
run sends no key its kind does not declare.

Sizes are bytes, times ``*_s`` are seconds on the run's clock (``time.monotonic() - t0``, the
parent's ``t0``), and ``side`` is the process's name in the result (``sender``, ``receiver``,
``cell``, ``driver``, ``worker-N``).
"""

# No ``from __future__ import annotations`` here: with string annotations, Python 3.11's TypedDict
# cannot see ``NotRequired`` and would count every key as required.
import sys
from collections.abc import Callable
from typing import Any, Literal, Union

if sys.version_info >= (3, 11):
    from typing import NotRequired, TypedDict
else:  # Python 3.10: typing's TypedDict there does not know NotRequired
    from typing_extensions import NotRequired, TypedDict

# -- 1. Set-up: the process starts, loads what it needs, says it is ready ----------------------------


class Hello(TypedDict):
    """A process the parent did not start announces itself, once, as soon as it connects.

    Sent by the Ray receiver actor (``ray/actor.py``: ``side`` and ``role``) and by each
    worker actor of a node run (``investigate/node.py``: ``name`` and ``node_id``). The parent starts
    sampling ``pid`` when ``machine`` (host name and boot id) is its own, and from then on attributes
    the connection's events to that process.
    """

    type: Literal["hello"]
    pid: int
    machine: str
    side: NotRequired[str]
    role: NotRequired[str]
    name: NotRequired[str]
    node_id: NotRequired[str]


class Note(TypedDict):
    """Something the parent should record but that changes no figure (a retried Ray start-up).

    Sent by the Ray driver (``ray/driver.py``) and a node's driver; the parent keeps the
    message in the run's notes (``RunResult.ray["notes"]``, ``NodeResult.notes``).
    """

    type: Literal["note"]
    side: str
    message: str


class CodecInfo(TypedDict):
    """What a codec loaded while it prepared, before the baseline (real verl: its version and file).

    Sent by a sender or receiver child (``measure/child.py``) and a node's driver when the codec's
    ``prepare`` returned something; the parent records it in ``side.codec_info`` and
    ``result.codec_info[side]``.
    """

    type: Literal["codec_info"]
    side: str
    info: dict[str, Any]


class RayInfo(TypedDict):
    """The Ray cluster is up: the pids of its processes and where it keeps its files.

    Sent by the Ray driver and a node's driver (``ray/driver.cluster_info``) right after
    ``ray.init``. The parent finds the object store's plasma file from the raylet's pid (or, having
    joined a cluster, from ``raylet_socket``), samples it, and later kills every process listed.
    ``pids`` is empty when the driver only joined a cluster; ``error`` says why the lists are
    incomplete (a Ray version whose internals differ); ``node_id`` is sent by a node's driver.
    """

    type: Literal["ray_info"]
    side: str
    pids: dict[str, list[int]]
    session_dir: str | None
    node_ip: str | None
    raylet_socket: NotRequired[str]
    error: NotRequired[str]
    node_id: NotRequired[str]


class StoreProcess(TypedDict):
    """The store is a process of its own (TransferQueue's storage unit), not a shared-memory file.

    Sent by the Ray driver on the ``transferqueue`` path; the parent samples that process's RSS as
    the run's object store (``pid`` None: the unit was not found, the store is not sampled).
    """

    type: Literal["store_process"]
    side: str
    pid: int | None
    what: str


class Waiting(TypedDict):
    """The receiver child has set up and waits for the hand-off (``measure/child.receiver_main``).

    The parent only passes it on: the receiver's baseline comes later, after it maps the hand-off.
    """

    type: Literal["waiting"]
    side: str
    pid: int


class Ready(TypedDict):
    """Set-up is over: what follows is the measured phase.

    The sender child and the Ray driver send the batch's ``manifest`` (``codecs.verify.manifest``),
    which the parent keeps and passes to the receiver in :class:`Go`; the cell's child sends the
    kernel imports that failed to re-run (``import_errors``, shown with the cell's result); a
    node's driver sends only its side, and the parent takes the node's baseline and answers
    :class:`Go`.
    """

    type: Literal["ready"]
    side: str
    pid: NotRequired[int]
    manifest: NotRequired[dict[str, Any]]
    import_errors: NotRequired[list[str]]


class Handoff(TypedDict):
    """Where the sender left the serialized batch, and its sizes (``Transport.send`` returns it).

    In-process transports: the file in the run directory, its in-band bytes and the out-of-band
    buffers as (offset, length) pairs. Over Ray: ``path`` is the Ray path (``put``, ``arg``, ``tq``)
    and only ``blob_bytes`` is known (what Ray's serializer produced), the others are None.
    """

    path: str
    blob_bytes: int | None
    inband_bytes: int | None
    oob_bytes: int | None
    buffers: NotRequired[list[tuple[int, int]]]


class Go(TypedDict):
    """Parent to child: start the measured phase.

    The runner (``measure/runner._relay_pair``) sends it to the receiver child once the sender is done,
    with the sender's hand-off and manifest; the receiver maps the hand-off, then unpickles and
    checks the batch against the manifest. A node run sends it bare to its driver after taking the
    node's baseline, and the driver starts the training steps.
    """

    type: Literal["go"]
    handoff: NotRequired[Handoff | dict[str, Any]]
    manifest: NotRequired[dict[str, Any] | None]


# -- 2. The measured phase: baseline, steps, what the tracers saw --------------------------------------


class Tracer(TypedDict):
    """An in-process tracer (memray, tracemalloc, torch's profiler) started or stopped in a side.

    Sent by ``tracers/child.ChildTracing``. ``phase`` "start" carries ``ok`` and the ``reason`` it
    could not start; "stop" carries the tracer's ``data`` (or the ``reason`` it failed). The
    parent's :class:`picklescope.tracers.Collector` turns them into ``result.tracers``.
    """

    type: Literal["tracer"]
    side: str
    tracer: str
    phase: Literal["start", "stop"]
    reason: str | None
    ok: NotRequired[bool]
    data: NotRequired[dict[str, Any] | None]


class Baseline(TypedDict):
    """The measured phase starts: resident bytes now, and the kernel's high-water mark reset.

    Sent by :meth:`picklescope.core.steps.Meter.start` in every measured process. Every later peak
    of that process is above this baseline; the watchdog arms the side's budget on it. Over Ray the
    event also carries the process's resident shared-memory pages (``shm_bytes``,
    ``ray/channel.with_shared``), which belong to the object store.
    """

    type: Literal["baseline"]
    side: str
    t_s: float
    baseline_bytes: int
    shm_bytes: NotRequired[int]


class StepStart(TypedDict):
    """A named step begins (``with step("consolidate"):``): ``depth`` is how many steps are open around it.

    Sent by :meth:`picklescope.core.steps.Meter.begin`. The parent opens a step in the side's list.
    With a tracer running, ``tracer_points`` holds each tracer's reading at this boundary and, when
    a tracer attributes by stack (memray), ``where`` the ``with`` statement's file, function and
    line (``tracers/child.step_block``). Over Ray, ``shm_bytes`` as in :class:`Baseline`.
    """

    type: Literal["step_start"]
    side: str
    name: str
    t_s: float
    depth: int
    rss_bytes: int
    where: NotRequired[dict[str, Any] | None]
    tracer_points: NotRequired[dict[str, Any]]
    shm_bytes: NotRequired[int]


class StepEnd(TypedDict):
    """A named step ends, with its exact kernel peak (``VmHWM``) above the side's baseline.

    Sent by :meth:`picklescope.core.steps.Meter.end` at once, so a later SIGKILL keeps it. The
    parent closes the innermost open step with these figures; the watchdog kills a side whose
    ``peak_bytes`` is over its budget. ``added_bytes`` is the peak above the step's own start,
    ``retained_bytes`` what the step left resident, ``error`` the exception that ended it. The
    keyword arguments of ``step(name, **info)`` are added as they are: real verl's instrumented
    ``consolidate`` (``verl/loader.instrument_consolidate``) gives its caller's ``file``,
    ``function`` and ``line``. ``tracer_points`` and ``shm_bytes`` as in :class:`StepStart`.
    """

    type: Literal["step_end"]
    side: str
    name: str
    start_s: float
    end_s: float
    depth: int
    peak_bytes: int
    added_bytes: int
    retained_bytes: int
    rss_end_bytes: int
    error: str | None
    file: NotRequired[str]
    function: NotRequired[str]
    line: NotRequired[int]
    tracer_points: NotRequired[dict[str, Any]]
    shm_bytes: NotRequired[int]


class Probe(TypedDict):
    """One independent high-water-mark reading for ``benchmarks/fidelity.py`` (``core/steps.ProbeMeter``).

    Sent instead of steps when a side runs with ``probe=``: the peak of the one named step (with
    ``added_bytes``), or of the whole measured phase (``name`` None). The parent passes it on.
    """

    type: Literal["probe"]
    side: str
    name: str | None
    peak_bytes: int
    added_bytes: NotRequired[int]


class Output(TypedDict):
    """A write to the cell's ``sys.stdout`` or ``sys.stderr`` (``measure/cellrun``), as it happens.

    The parent appends (``stream``, ``text``) to ``result.output``; the magic prints it.
    """

    type: Literal["output"]
    side: str
    stream: Literal["stdout", "stderr"]
    text: str


class Engine(TypedDict):
    """The node driver, once its workers are up: which engine drives the exchange and how it splits and
    joins a batch (``picklescope node``: the replica or real verl's single controller). The parent keeps
    ``info`` as the result's ``engine_info``."""

    type: Literal["engine"]
    info: dict[str, Any]


class Controller(TypedDict):
    """With ``picklescope node --controller actor``, the ``TaskRunner`` actor that runs the training loop says
    who it is (``investigate/node/controller.py``, relayed by the driver process): the parent measures this
    process as ``driver`` from then on, and the process that started Ray as ``script``."""

    type: Literal["controller"]
    pid: int
    node_id: str


class TrainStepStart(TypedDict):
    """A node's driver begins training step ``index`` (``investigate/node.py``).

    The session opens a :class:`~picklescope.measure.session.TrainingStep`; the steps of every
    process that start after it are counted in that training step.
    """

    type: Literal["train_step_start"]
    index: int
    t_s: float


class TrainStepEnd(TypedDict):
    """A node's driver ends training step ``index``, with its own private resident bytes.

    The session closes the training step and records the driver's memory above its baseline
    (``private_bytes - private_baseline_bytes``).
    """

    type: Literal["train_step_end"]
    index: int
    t_s: float
    private_bytes: int | None
    private_baseline_bytes: int | None
    full_collections: NotRequired[int]  # the node's processes: full collections so far
    collections: NotRequired[list[int]]  # the driver's collections so far, of generation 0, 1 and 2
    allocations: NotRequired[int]  # the driver's container allocations so far, as its collector counts them
    # the driver's collections in the step: [generation, worker calls made, where the call in hand stood]
    runs: NotRequired[list[list[int | str | None]]]


class Error(TypedDict):
    """An exception in a measured process (or in a one-answer child), with its traceback.

    Sent by ``measure/child.error_event`` (sender, receiver, the Ray driver and actor, a node's
    driver), by the cell's child for the cell's own exception, and by ``verl/childcall`` as its one
    answer. ``phase`` "setup" means nothing was measured: a ``bad_input`` (problem, way out) is
    raised again in the parent as the same one-line error. The Ray driver reports an actor that died
    in its remote call as a receiver error with ``reported_by`` "driver". A childcall error has no
    side; it carries the :class:`~picklescope.errors.PicklescopeError`'s ``problem`` and ``hint``
    (``picklescope`` True) and a ``ModeMismatch``'s two modes, so the parent rebuilds the same error.
    The parent's fold keeps every error; the first sets the run's outcome and message.
    """

    type: Literal["error"]
    exc_type: str
    message: str
    traceback: str
    side: NotRequired[str]
    phase: NotRequired[Literal["setup", "measure"]]
    bad_input: NotRequired[list[str]]
    reported_by: NotRequired[str]
    problem: NotRequired[str | None]
    hint: NotRequired[str | None]
    picklescope: NotRequired[bool]
    written_by: NotRequired[str | None]
    read_by: NotRequired[str | None]


# -- 3. The end: what the side still holds, then the parent lets go ------------------------------------


class Received(TypedDict):
    """The Ray receiver actor's look at what it received (``ray/received.inspect``).

    Sent just before its :class:`Done`: where the received tensors live (object store or private
    copies) and whether an in-place write reaches other readers. The parent stores ``report`` in
    ``result.received``.
    """

    type: Literal["received"]
    side: str
    report: dict[str, Any]
    shm_end_bytes: int


class Done(TypedDict):
    """The side's measured phase is over: its peak, and what it still holds.

    Sent by every measured process once its meter finished. ``peak_bytes`` is the exact peak above
    the baseline; ``held_bytes`` what is still resident above it, ``cycle_held_bytes`` the part only
    ``gc.collect()`` frees. The sender adds its :class:`Handoff` (the parent then sends the receiver
    :class:`Go`); the receiver adds the ``mismatches`` against the sender's manifest (empty: the batch
    came back equal). Over Ray, ``shm_end_bytes`` is the shared-memory pages still mapped. A node's
    processes do not repeat their ``baseline_bytes``. The parent marks the side done.
    """

    type: Literal["done"]
    side: str
    peak_bytes: int
    held_bytes: int
    cycle_held_bytes: int
    t_s: float
    baseline_bytes: NotRequired[int]
    handoff: NotRequired[Handoff | None]
    mismatches: NotRequired[list[str]]
    shm_end_bytes: NotRequired[int]
    full_collections: NotRequired[int]  # the node's processes: full collections so far


class Finished(TypedDict):
    """A node's driver ran every training step and every worker reported :class:`Done`.

    The parent stops following the run and answers :class:`Release`, so the driver ends its Ray
    session, or :class:`Next` in a series.
    """

    type: Literal["finished"]


class Next(TypedDict):
    """Parent to a node's driver, after :class:`Finished`: replay the same node with the next codec of a
    series (``investigate/node.node_series``), on a clock that starts at ``t0`` (the parent's monotonic
    clock; ``t0_wall`` the same moment on the wall clock, for workers on another machine).

    The driver switches its codec and collector mode and every worker's, runs as many unmeasured training steps, takes
    new baselines and sends :class:`Ready` again.
    """

    type: Literal["next"]
    codec: str
    gc: str  # its collector mode (a series may compare the modes on the same processes)
    t0: float
    t0_wall: float


class Release(TypedDict):
    """Parent to child: the run is over, exit now.

    Every measured process stays alive (and sampled) after its :class:`Done` until it receives this,
    so what it holds is measured and the hand-off or object stays valid while the other side reads.
    """

    type: Literal["release"]


class Result(TypedDict):
    """The one answer of a function called in a child (``verl/childcall.call``): its JSON-able result.

    A failure is answered with :class:`Error` instead.
    """

    type: Literal["result"]
    result: Any


Event = Union[  # noqa: UP007 - a runtime union of TypedDicts, readable as a list
    Hello, Note, CodecInfo, RayInfo, StoreProcess, Waiting, Ready, Go,
    Tracer, Baseline, StepStart, StepEnd, Probe, Output, TrainStepStart, TrainStepEnd, Error,
    Received, Done, Finished, Next, Release, Result, Engine, Controller,
]
"""Any event of the protocol; tell them apart by ``ev["type"]``."""

EventHook = Callable[[Event], None]
"""What sees each event as it arrives: a live view, the watchdog, the tracers' collector."""


def chain(first: EventHook, then: "EventHook | None") -> EventHook:
    """One hook that hands each event to ``first``, then to ``then`` (if any): how the watchdog and the
    tracers' collector see every event before the caller's own hook does."""

    def both(ev: Event) -> None:
        first(ev)
        if then is not None:
            then(ev)

    return both


KINDS: dict[str, type] = {
    "hello": Hello, "note": Note, "codec_info": CodecInfo, "ray_info": RayInfo, "store_process": StoreProcess,
    "waiting": Waiting, "ready": Ready, "go": Go,
    "tracer": Tracer, "baseline": Baseline, "step_start": StepStart, "step_end": StepEnd, "probe": Probe,
    "output": Output, "train_step_start": TrainStepStart, "train_step_end": TrainStepEnd, "error": Error,
    "received": Received, "done": Done, "finished": Finished, "next": Next, "release": Release,
    "result": Result,
    "engine": Engine, "controller": Controller,
}
"""Each event's ``type`` to its :class:`~typing.TypedDict` (``__required_keys__``, ``__optional_keys__``)."""


def undeclared_keys(ev: dict[str, Any]) -> tuple[set[str], set[str]]:
    """(required keys ``ev`` lacks, keys ``ev`` has that its kind does not declare); raises KeyError for an
    unknown ``type``. For tests and for a consumer that wants to check what it was sent."""
    kind = KINDS[ev["type"]]
    required: frozenset[str] = kind.__required_keys__  # type: ignore[attr-defined]
    declared = required | kind.__optional_keys__  # type: ignore[attr-defined]
    return set(required) - set(ev), set(ev) - set(declared)
