"""File checksums: the one sha256 of a file that the trust ledger, the blob manifests and the verl loader share."""

from __future__ import annotations

import hashlib
import os


def file_sha256(path: str | os.PathLike) -> str:
    """The file's sha256, read in 1 MiB chunks (blobs may be large); every file checksum in the toolkit."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
