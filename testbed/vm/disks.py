"""The extra disks' raw files on the host: sizes, and sha256 of byte ranges read from the host side."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

MiB = 1024**2
GiB = 1024**3


def checksum_regions(
    path: str | os.PathLike[str],
    regions: Iterable[tuple[int, int]] = ((0, MiB), (-MiB, MiB)),
) -> dict[tuple[int, int], str]:
    """sha256 of byte ranges of a (raw disk) file, keyed by the ``(offset, length)`` given.

    A negative offset counts from the end of the file, so the default
    ``((0, MiB), (-MiB, MiB))`` hashes the first and the last MiB.
    Reads past the end are an error. Hash a disk only after the guest has
    flushed it (``sync``/``blockdev --flushbufs``) or with the VM stopped.
    """
    path = Path(path)
    size = path.stat().st_size
    out: dict[tuple[int, int], str] = {}
    with open(path, "rb") as f:
        for region in regions:
            offset, length = region
            start = offset + size if offset < 0 else offset
            if start < 0 or length < 0 or start + length > size:
                raise ValueError(f"region {region} outside {path} ({size} bytes)")
            f.seek(start)
            h = hashlib.sha256()
            left = length
            while left:
                chunk = f.read(min(left, 4 * MiB))
                if not chunk:
                    raise ValueError(f"short read in {path} at region {region}")
                h.update(chunk)
                left -= len(chunk)
            out[(offset, length)] = h.hexdigest()
    return out
