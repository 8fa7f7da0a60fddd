"""``picklescope workload from FILE``: a workload file describing a saved batch, read without running it."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from picklescope.cli.commands.common import print_json
from picklescope.core.units import fmt_bytes
from picklescope.errors import PicklescopeError, safe_text
from picklescope.workloads.schema import workload_name, write_workload
from picklescope.workloads.spec import check_name, load_workload

ORDER = 50


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise PicklescopeError(f"--batch-dim {text!r} is not a whole number", "use e.g. --batch-dim 128") from None
    if value <= 0:
        raise PicklescopeError(f"--batch-dim {text!r} must be a positive integer (the batch size)",
                               "use e.g. --batch-dim 128")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser("workload", help="make a workload file from your own saved batch (workload from FILE)")
    wsub = p.add_subparsers(dest="workload_command", metavar="ACTION", parser_class=type(p))
    f = wsub.add_parser("from", help="describe a DataProto.save_to_disk pickle, a torch.save file or an .npz "
                                     "as a workload file (reads structure only, runs nothing in the file)")
    f.add_argument("file", help="the saved batch")
    f.add_argument("--out", default=None, metavar="W.yaml",
                   help="where to write the workload (default: FILE's name with .yaml, in the current folder)")
    f.add_argument("--batch-dim", type=_positive_int, default=None, metavar="N",
                   help="the batch size, for files that do not record it (a dict of tensors, an .npz)")
    f.add_argument("--name", default=None, help="the workload's name (default: FILE's name)")
    f.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    f.add_argument("--trust", action="store_true",
                   help="load FILE in a child process, only if reading cannot describe it because its batch is "
                        "built by code (docs/safe_loading.md)")
    f.add_argument("--json", action="store_true", help="print the description as one JSON object")
    f.set_defaults(func=main)
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])


def main(args: argparse.Namespace) -> int:
    # deferred: the trusted load's allow-list (picklescope.codecs) imports torch, which --help need not wait for
    from picklescope.investigate.workload_from import describe_file

    if args.name is not None:  # before reading FILE: a name no workload may have is refused at once
        check_name(args.name, "--name", "choose another with --name (1 to 200 printable characters)")
    d = describe_file(args.file, batch_dim=args.batch_dim, trust=args.trust)
    stem = Path(args.file).stem
    if args.name is None and workload_name(stem) != stem:
        d.notes.append(f"the file's name {safe_text(stem, 80)!r} holds characters a workload name may not have: "
                       f"the workload is named {workload_name(stem)!r}; choose another with --name")
    out = Path(args.out) if args.out else Path(workload_name(stem) + ".yaml")
    if out.exists() and not args.force:
        raise PicklescopeError(f"--out {safe_text(out)} exists already",
                               "pass --force to overwrite it, or another --out")
    # written under a temporary name and checked the way every command will load it, then renamed: a
    # description the workload loader refuses (a declared shape no machine holds) leaves no file behind
    tmp = out.with_name(f".{out.stem}.{os.getpid()}.tmp.yaml") if out.suffix in (".yaml", ".yml") else out
    try:
        written = write_workload(d, tmp, args.name if args.name is not None else workload_name(stem))
        w = load_workload(str(written))
    except BaseException:
        if tmp != out:
            tmp.unlink(missing_ok=True)
        raise
    if tmp != out:
        os.replace(tmp, out)
    path = out
    try:
        predicted: int | None = w.payload_bytes(1.0)
    except PicklescopeError as exc:  # a real batch larger than this machine: the file is right, scale 1 is not
        predicted = None
        d.notes.append(f"{exc.problem}: run it with a smaller --scale")
    if args.json:
        print_json({"workload": str(path), "format": d.format, "batch_size": d.batch_size,
                    "tensors": d.tensors, "non_tensor": d.non_tensor, "meta_info": d.meta_info,
                    "file_payload_bytes": d.file_payload_bytes, "workload_payload_bytes": predicted,
                    "loaded": d.loaded, "notes": d.notes, "summary": d.summary()})
        return 0
    how = "loaded in a child process (--trust)" if d.loaded else "read without running anything in it"
    print(f"{safe_text(args.file)}: {d.format}, {how}")
    print(d.summary())
    if predicted is not None:
        print(f"payload: {fmt_bytes(d.file_payload_bytes)} in the file; the workload regenerates "
              f"{fmt_bytes(predicted)} at scale 1"
              + ("" if predicted == d.file_payload_bytes else " (nested lengths are redrawn from the seed)"))
    for note in d.notes:
        print(f"note: {note}")
    print(f"wrote {safe_text(path)}")
    print(f"next: picklescope run --workload {safe_text(path)} --scale 1")
    return 0
