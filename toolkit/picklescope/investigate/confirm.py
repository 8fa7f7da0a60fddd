"""``picklescope confirm``: a candidate fix against the real verl it would replace, side by side.

The baseline is a real codec (``verl-0.9.0:numpy``). The candidate is the same verl with a patch
file's ``__getstate__`` / ``__setstate__`` put on ``DataProto`` in the children, or a checkout with
the change applied (registered as environment ``candidate``). Both run on the same workload, scale
and transport, each in fresh sender and receiver processes; the report puts side by side what an
engineer needs before merging: exact peaks, what stays held and what only ``gc.collect()`` frees,
the smallest budget each survives (headroom), serialize/deserialize time, whether the round trip is
exact, where ``consolidate`` ran (the step-through) and whether the candidate's ``__setstate__``
still loads the reference blobs old verl wrote. The verdict is computed from those numbers only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from picklescope.core.result import RunResult
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError
from picklescope.investigate.headroom import find_headroom
from picklescope.measure import verdicts
from picklescope.measure.runner import run
from picklescope.verl import blobs, callsites, envs
from picklescope.verl.codec import PATCH_ENV, register_candidate, split_name

NOISE = 0.05  # of the payload: differences smaller than this are "no change"


@dataclass
class Role:
    """One side of the comparison: which codec, which verl, which patch, and its run."""

    name: str  # baseline | candidate
    codec: str
    label: str
    patch: str | None
    result: RunResult
    call_sites: list[dict[str, Any]] = field(default_factory=list)
    sources: dict[str, list[str]] = field(default_factory=dict)
    trace: dict[str, Any] = field(default_factory=dict)
    headroom: dict[str, Any] = field(default_factory=dict)

    @property
    def verl_info(self) -> dict[str, Any]:
        return (self.result.codec_info or {}).get("sender") or {}


@dataclass
class ConfirmReport:
    baseline: Role
    candidate: Role
    workload: str
    scale: float
    transport: str
    payload_bytes: int
    blobs: list[dict[str, Any]] = field(default_factory=list)
    blob_error: str | None = None
    removed_bytes: int | None = None
    verdict: str = ""
    ok: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` document: each role's run in its own schema (:meth:`RunResult.to_dict`)."""
        d = asdict(self)
        for name, role in (("baseline", self.baseline), ("candidate", self.candidate)):
            d[name]["result"] = role.result.to_dict()
        return d

    @property
    def removed_fraction(self) -> float | None:
        return None if self.removed_bytes is None else self.removed_bytes / self.payload_bytes


def _candidate(baseline: str, candidate: str) -> tuple[str, str, str | None]:
    """(codec name, environment label, patch path) of the candidate.

    The user's own file is checked before the baseline's environment: a patch that does not exist or does
    not parse is the first thing to fix, whichever verl is installed."""
    label, mode, bpatch = split_name(baseline)
    if bpatch:
        raise PicklescopeError(f"baseline {baseline!r} is already patched", "give an unpatched baseline")
    path = Path(candidate).expanduser()
    if path.is_dir():
        envs.get_env(label)
        env = envs.install_source(path, "candidate")
        return f"{env.codec_prefix}:{mode}", env.label, None
    if not path.is_file():
        raise PicklescopeError(f"candidate {candidate} does not exist",
                               "give a .py patch file or a verl checkout folder")
    patch = register_candidate(path)
    envs.get_env(label)
    return f"verl-{label}:{mode}+{Path(patch).stem}", label, patch


def _run_role(role: str, codec: str, label: str, patch: str | None, workload: str, scale: float,
              transport: str, run_kw: dict[str, Any]) -> Role:
    env = {envs.CACHE_ENV: str(envs.cache_root())}
    if patch:
        env[PATCH_ENV] = patch
    events: list[dict[str, Any]] = []
    r = run(codec, transport, workload, scale, env={"sender": env, "receiver": env}, on_event=events.append, **run_kw)
    out = Role(role, codec, label, patch, r, callsites.call_sites(events))
    info = out.verl_info
    if info.get("verl_file"):
        srcs = callsites.sources_for(info["verl_file"], patch, info.get("patched") or [])
        out.sources = {name: callsites.listing(src, out.call_sites) for name, src in srcs.items()}
    return out


def _env(role: Role) -> dict[str, str]:
    env = {envs.CACHE_ENV: str(envs.cache_root())}
    if role.patch:
        env[PATCH_ENV] = role.patch
    return env


def _workload_arg(workload: str) -> str:
    """What the children get: a preset name as is, a workload file as an absolute path.

    A run's result carries only the workload's ``name`` (from inside the file), which no child can
    load when the workload came from a file, so the step-through and the headroom runs get this.
    """
    path = Path(str(workload)).expanduser()
    if str(workload).endswith((".yaml", ".yml")) or path.is_file():
        return str(path.resolve())
    return str(workload)


def _trace(role: Role, transport: str, workload: str) -> dict[str, Any]:
    r = role.result
    files = [f for f in (role.verl_info.get("verl_file"), role.patch) if f]
    return callsites.trace(role.codec, workload, r.scale, transport, _env(role), files)


def _headroom(role: Role, transport: str, workload: str, run_kw: dict[str, Any]) -> dict[str, Any]:
    r = role.result
    if r.outcome != "ok" or r.sender.peak_bytes is None:
        return {"available": False, "reason": f"the run ended {r.outcome}"}
    env = _env(role)
    h = find_headroom(role.codec, transport, workload, r.scale, peak_bytes=r.sender.peak_bytes,
                      env={"sender": env, "receiver": env}, **run_kw)
    return {"available": h.headroom_bytes is not None, "reason": h.error, **h.to_dict()}


def confirm(baseline: str, candidate: str, *, workload: str = "flowgrpo", scale: float = 0.25,
            transport: str = "pickle5-oob", headroom: bool = True, check_blobs: bool = True,
            line_trace: bool = True, **run_kw: Any) -> ConfirmReport:
    """Run ``baseline`` and ``candidate`` on the same case and judge the candidate."""
    label, _mode, _ = split_name(baseline)
    cand_codec, cand_label, patch = _candidate(baseline, candidate)
    workload = _workload_arg(workload)  # the same file for every child: both runs, trace, headroom
    base = _run_role("baseline", baseline, label, None, workload, scale, transport, run_kw)
    cand = _run_role("candidate", cand_codec, cand_label, patch, workload, scale, transport, run_kw)
    rep = ConfirmReport(base, cand, base.result.workload, scale, transport, base.result.payload_bytes)
    for role in (base, cand):
        role.trace = (_trace(role, transport, workload) if line_trace
                      else {"available": False, "reason": "not requested"})
        role.headroom = _headroom(role, transport, workload, run_kw) if headroom else {"available": False,
                                                                             "reason": "not requested"}
    if check_blobs:
        try:
            rep.blobs = blobs.check_reference_blobs(cand_label, patch)
        except PicklescopeError as exc:
            rep.blob_error = str(exc)
    judge(rep)
    return rep


def judge(rep: ConfirmReport) -> None:
    """The one-line verdict, from the measured numbers only."""
    b, c, p = rep.baseline.result, rep.candidate.result, rep.payload_bytes
    for role, r in (("baseline", b), ("candidate", c)):
        if r.outcome != "ok":
            rep.verdict = f"cannot judge: {verdicts.verdict(r).sentence(f'the {role} run')}"
            return
    rep.removed_bytes = b.sender.peak_bytes - c.sender.peak_bytes
    frac = rep.removed_bytes / p
    exact = bool(c.roundtrip.get("ok"))
    loaded = sum(1 for x in rep.blobs if x["ok"])
    blobs_ok = rep.blob_error is None and bool(rep.blobs) and loaded == len(rep.blobs)
    if frac > NOISE:
        gain = (f"the candidate removes {frac:.2f}x payload of sender peak "
                f"({fmt_bytes(b.sender.peak_bytes)} -> {fmt_bytes(c.sender.peak_bytes)})")
    elif frac < -NOISE:
        gain = f"the candidate ADDS {-frac:.2f}x payload of sender peak"
    else:
        gain = f"no sender peak change beyond {NOISE:.0%} of payload ({frac:+.2f}x)"
    trip = "round trip exact" if exact else f"round trip DIFFERS ({'; '.join(c.roundtrip.get('mismatches', []))})"
    if rep.blob_error:
        old = f"reference blobs not checked ({rep.blob_error})"
    else:
        old = f"{loaded}/{len(rep.blobs)} reference blobs (written by verl " \
              f"{rep.blobs[0]['written_by'] if rep.blobs else '?'}) still load" if rep.blobs else "no reference blobs"
    rep.ok = frac > NOISE and exact and blobs_ok
    word = "CONFIRMED" if rep.ok else ("REJECTED" if not exact or (rep.blobs and not blobs_ok) or frac < -NOISE
                                       else "NOT CONFIRMED")
    rep.verdict = f"{word}: {gain}; {trip}; {old}"


def side_by_side(rep: ConfirmReport) -> list[dict[str, Any]]:
    """The comparison table: one row per quantity, baseline and candidate next to each other."""
    p = rep.payload_bytes

    def mult(n: int | None) -> str:
        return "-" if n is None else f"{fmt_bytes(n)} ({n / p:.2f}x)"

    def secs(s: float | None) -> str:
        return "-" if s is None else f"{s:.3f} s"

    def head(role: Role) -> str:
        h = role.headroom
        if not h.get("available"):
            return f"not available ({h.get('reason')})"
        return f"{fmt_bytes(h['headroom_bytes'])} ({h['multiple']:.2f}x)"

    def sites(role: Role) -> str:
        snd = [s for s in role.call_sites if s["side"] == "sender"]
        if not snd:
            return "not called"
        return ", ".join(f"{Path(s['file']).name}:{s['line']} +{fmt_bytes(s['added_bytes'])}" for s in snd)

    b, c = rep.baseline, rep.candidate
    rows = [
        ("verl", lambda r: f"{r.verl_info.get('verl_version')} ({r.verl_info.get('verl_file')})"),
        ("patched", lambda r: ", ".join(r.verl_info.get("patched") or []) or "-"),
        ("sender peak", lambda r: mult(r.result.sender.peak_bytes)),
        ("sender held", lambda r: mult(r.result.sender.held_bytes)),
        ("sender cycle-held", lambda r: mult(r.result.sender.cycle_held_bytes)),
        ("receiver peak", lambda r: mult(r.result.receiver.peak_bytes)),
        ("receiver held", lambda r: mult(r.result.receiver.held_bytes)),
        ("sender headroom", head),
        ("serialize", lambda r: secs(r.result.serialize_s)),
        ("deserialize", lambda r: secs(r.result.deserialize_s)),
        ("round trip", lambda r: "exact" if r.result.roundtrip.get("ok") else
         f"{r.result.outcome}: {r.result.error or r.result.roundtrip.get('mismatches')}"),
        ("consolidate (sender)", sites),
    ]
    return [{"": label, "baseline": f(b), "candidate": f(c)} for label, f in rows]
