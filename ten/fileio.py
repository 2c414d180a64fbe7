"""Durable-file helpers shared by the checkpoint, data and storage code. Standard
library only, so the runner's torch-free modules can use them too."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def sha256_file(path: Path, offset: int = 0, chunk: int = 1 << 22) -> str:
    """sha256 of a file's bytes from ``offset`` on, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        f.seek(offset)
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def fsync_dir(path: Path, strict: bool = True) -> None:
    """Make a rename or a new file in ``path`` durable. With ``strict=False`` a folder
    that cannot be opened (some network filesystems) is skipped."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        if strict:
            raise
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
