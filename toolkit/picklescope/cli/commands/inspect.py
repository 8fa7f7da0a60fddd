"""``picklescope inspect BLOB``: which codec wrote a blob (without unpickling it), and optionally load it."""

from __future__ import annotations

import argparse
import os
from typing import Any

from picklescope.cli.commands.common import print_json
from picklescope.core.safefile import blob_limit, check_file, describe_limit
from picklescope.errors import PicklescopeError, safe_text
from picklescope.verl.blobs import load_blob, manifest_entry
from picklescope.workloads.blobinfo import describe_blob, mode_hint, require_pickle

ORDER = 60


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="tell which codec wrote a blob; --as CODEC also loads it in a child")
    p.add_argument("blob", help="a pickled DataProto / Batch (e.g. data/blobs/verl-0.9.0-numpy.pkl)")
    p.add_argument("--as", dest="codec", default=None,
                   help="load it with this codec in a child process (e.g. verl-0.9.1:torch)")
    p.add_argument("--trust", action="store_true",
                   help="allow loading a blob from outside data/ and picklescope's own output (it is a pickle)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    if os.path.isdir(args.blob):
        raise PicklescopeError(f"{args.blob} is a directory, not a blob", "give the path of a file inside it")
    # a FIFO, /dev/zero or a sparse giant is named, never read; a blob to load in a child has the tighter limit
    check_file(args.blob, "blob", blob_limit() if args.codec else describe_limit())
    info = describe_blob(args.blob)  # streamed, never held; nothing is written next to the blob
    if info.kind != "torch-zip":  # a bare torch.save archive is identified, but is no pickle to load
        require_pickle(info)
    elif args.codec:
        raise PicklescopeError(f"{args.blob} is a bare torch.save archive, not a pickled DataProto or Batch, so "
                               "--as cannot load it", "drop --as to identify it; load it with "
                               "torch.load(path, weights_only=True)")
    entry = manifest_entry(args.blob, info.sha256) if info.kind == "pickle" else None
    if args.json:
        loaded = load_blob(args.blob, args.codec, trust=args.trust) if args.codec else None
        print_json({"blob": info.to_dict(), "manifest": entry and {k: v for k, v in entry.items() if k != "expected"},
                    "load": loaded})
        return 0
    print(f"{safe_text(info.path)}: {info.bytes} bytes, {info.kind}"
          + (f" (pickle protocol {info.pickle_protocol})" if info.pickle_protocol else ""))
    print(f"written by: {safe_text(info.writer)}")
    if info.mode:
        print(f"mode: {info.mode} -> {mode_hint(info.mode)}")
    if entry:
        print(f"manifest: {safe_text(entry['file'])} listed with this checksum ({entry['mode']} mode)")
    print(f"classes named: {safe_text(', '.join(info.globals)) or '(none)'}", flush=True)
    if args.codec:  # identified first, so a failed load still leaves the identification on screen
        loaded = load_blob(args.blob, args.codec, trust=args.trust)
        ci = loaded.get("codec_info") or {}
        where = f" (verl {ci['verl_version']} from {ci['verl_file']})" if ci.get("verl_file") else ""
        problems = loaded["problems"]
        if problems is None:
            verdict = "no manifest to compare with"
        else:
            verdict = "contents differ: " + "; ".join(problems) if problems else "contents match the manifest"
        print(f"loaded with {args.codec}{where}: a {loaded['type']} with {loaded['leaves']} tensor leaves; {verdict}")
    return 0
