"""memray inside the measured process: every allocation with its stack, in a file that survives SIGKILL.

The capture uses memray's default format (every allocation as it happens); the aggregated format
writes its summary only when the tracker stops, so a process killed for using too much memory
would leave an empty file. After the run the parent reads the file and reports:

- heap over time (memray's snapshots, every 1 ms, of the bytes its hooks see live),
- the allocations live at memray's high-water mark, grouped by stack, largest first, each mapped to
  the step it happened in. The mapping uses the stack itself: a step is the block of a
  ``with step(...)`` statement, so an allocation whose Python stack passes through that block
  happened inside that step (the innermost such block wins). No clock is involved.

``memray-native`` adds native (C/C++) frames to the stacks, at a higher cost.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from picklescope.tracers.base import ChildContext, ParentContext, SideData, Tracer

MAX_ROWS = 40  # attribution rows per side; the rest is reported as one unlisted total
MAX_FRAMES = 40


def short_path(filename: str) -> str:
    """A path short enough to read in a stack: from the package folder on."""
    for marker in ("site-packages/", "dist-packages/", "/toolkit/"):
        if marker in filename:
            return filename.split(marker, 1)[1]
    parts = filename.replace("\\", "/").split("/")
    return "/".join(parts[-2:])


def format_frame(function: str, filename: str, line: int) -> str:
    return f"{function} ({short_path(filename)}:{line})"


def step_of(frames: list[tuple[str, str, int]], blocks: list[dict[str, Any]]) -> str | None:
    """The innermost step whose ``with`` block one of the frames (innermost first) is executing."""
    for function, filename, line in frames:
        inside = [b for b in blocks if b["file"] == filename and b["function"] == function
                  and b["first"] <= line <= b["last"]]
        if inside:
            best = max(inside, key=lambda b: b["first"])
            return "|".join(best["names"])
    return None


class MemrayTracer(Tracer):
    name = "memray"
    description = "memray capture inside the process: allocations live at the peak with Python stacks, heap over time"
    sees = "every allocation (Python, numpy, torch), with the stack that made it"
    needs_blocks = True
    native = False

    @classmethod
    def availability(cls) -> tuple[bool, str | None]:
        if not sys.platform.startswith(("linux", "darwin")):
            return False, f"memray does not run on {sys.platform}"
        if importlib.util.find_spec("memray") is None:
            return False, "memray is not installed (pip install 'picklescope[tracers]' or pip install memray)"
        return True, None

    @staticmethod
    def capture_path(run_dir: str, side: str) -> str:
        return os.path.join(run_dir, f"{side}.memray")

    def start(self, ctx: ChildContext) -> None:
        import memray

        path = self.capture_path(ctx.run_dir, ctx.side)
        if os.path.exists(path):
            os.remove(path)
        self.path = path
        self.tracker = memray.Tracker(path, native_traces=self.native, memory_interval_ms=1,
                                      file_format=memray.FileFormat.ALL_ALLOCATIONS, follow_fork=False)
        self.tracker.__enter__()

    def stop(self) -> dict[str, Any]:
        self.tracker.__exit__(None, None, None)
        del self.tracker
        return {"file": os.path.basename(self.path)}

    # -- parent half ----------------------------------------------------------------------------
    def collect(self, ctx: ParentContext, side: str, data: SideData) -> dict[str, Any]:
        import memray

        path = self.capture_path(ctx.run_dir, side)
        if not os.path.exists(path) or os.path.getsize(path) == 0:
            return {"reason": f"no memray capture was written for the {side}"}
        reader = memray.FileReader(path)
        try:
            t_s, heap = [], []
            for snap in reader.get_memory_snapshots():
                t_s.append(round(ctx.run_time_from_epoch(snap.time / 1000.0), 6))
                heap.append(int(snap.heap))
            rows, unlisted, n_unlisted = self._rows(reader, side, ctx.blocks.get(side, []))
            view: dict[str, Any] = {"series": {"t_s": t_s, "bytes": heap},
                                    "peak_bytes": int(reader.metadata.peak_memory),
                                    "allocations": int(reader.metadata.total_allocations),
                                    "native_stacks": bool(reader.metadata.has_native_traces),
                                    "attribution": rows, "unlisted_bytes": unlisted,
                                    "unlisted_sites": n_unlisted}
        finally:
            reader.close()
        if data.final is None:
            view["partial"] = "the process ended before memray stopped; this is what its file holds"
        return view

    def _rows(self, reader: Any, side: str, blocks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int, int]:
        """Allocation sites live at the high-water mark, largest first, each with its step."""
        import memray

        records = sorted(reader.get_high_watermark_allocation_records(merge_threads=True),
                         key=lambda r: r.size, reverse=True)
        rows = []
        for rec in records[:MAX_ROWS]:
            python = list(rec.stack_trace(max_stacks=MAX_FRAMES))
            shown = rec.hybrid_stack_trace(max_stacks=MAX_FRAMES) if self.native else python
            rows.append({
                "bytes": int(rec.size), "step": step_of(python, blocks), "side": side,
                "stack": [format_frame(f, fn, ln) for f, fn, ln in shown],
                "n_allocations": int(rec.n_allocations),
                "allocator": memray.AllocatorType(rec.allocator).name.lower(), "tracer": self.name,
            })
        rest = records[MAX_ROWS:]
        return rows, int(sum(r.size for r in rest)), len(rest)


class MemrayNativeTracer(MemrayTracer):
    name = "memray-native"
    description = "memray capture with native (C/C++) frames in every stack; slower than memray"
    native = True
