#!/usr/bin/env python3
"""Write data/blobs/: reference blobs saved by REAL verl (default 0.9.0) in both serialization modes.

    python scripts/make_reference_blobs.py [--verl 0.9.0] [--out data/blobs]

Installs the verl version into picklescope's cache if needed (``picklescope verl install``), then in a
child process imports it, builds the batch described by ``data/blobs/reference.yaml`` and calls the
real ``DataProto.save_to_disk`` once with ``VERL_DATAPROTO_SERIALIZATION_METHOD=numpy`` and once with
``torch``. The manifest records the versions that wrote the blobs, their checksums and the contents
expected back, so ``picklescope confirm`` can prove a candidate ``__setstate__`` still reads them.
"""

from __future__ import annotations

import argparse
import json
import sys

from picklescope.verl import blobs, envs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--verl", default="0.9.0", help="verl version that writes the blobs (default 0.9.0)")
    p.add_argument("--out", default=str(blobs.BLOB_DIR), help="output folder (default data/blobs)")
    args = p.parse_args(argv)
    envs.install_version(args.verl)
    manifest = blobs.write_reference_blobs(args.verl, args.out)
    m = json.loads(manifest.read_text())
    for b in m["blobs"]:
        print(f"{b['file']}: {b['mode']} mode, {b['bytes']} bytes, sha256 {b['sha256'][:16]}...")
    print(f"wrote {manifest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
