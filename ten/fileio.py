"""Durable-file helpers shared by the checkpoint, data and storage code. Standard
library only, so the runner's torch-free modules can use them too."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
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


# OS errors that are the machine's state (a full or read-only disk, a permission), not a
# bug: callers turn them into one line naming the path instead of a traceback.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EACCES, errno.EPERM,
                                errno.EROFS, errno.EIO, errno.ENAMETOOLONG, errno.EMFILE,
                                errno.ENFILE})


def describe_os_error(e: OSError, path: Path | str | None = None, what: str = "write") -> str:
    """One line for an OS error on ``path``: what failed, why, and the free space of the
    file system it is on, e.g. ``cannot write /x/y: No space left on device (12.0 MB free
    on /x)``."""
    where = path if path is not None else (e.filename or "?")
    why = e.strerror or str(e)
    return f"cannot {what} {where}: {why}{free_space_note(where)}"


def free_space_note(path: Path | str) -> str:
    """`` (N MB free on DIR)`` for the nearest existing folder of ``path``, or ``""``;
    `` (no inodes left on DIR, N MB free)`` when the file system ran out of files, not
    bytes (ENOSPC says "No space left on device" for both)."""
    p = Path(path).absolute()
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        free = shutil.disk_usage(p).free
        stats = os.statvfs(p)
    except OSError:
        return ""
    if stats.f_files and not stats.f_favail:  # f_files 0: a file system without inodes
        return f" (no inodes left on {p}: too many files, {_size(free)} free)"
    return f" ({_size(free)} free on {p})"


def _size(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000:
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} TB"


def atomic_copy(src: Path | str, dst: Path | str) -> None:
    """Copy ``src`` to ``dst`` through a temporary file in ``dst``'s folder, fsynced and
    renamed into place: a reader sees the old file or the whole new one."""
    with open(src, "rb") as s:
        _atomic(dst, lambda f: shutil.copyfileobj(s, f, 1 << 20))


def atomic_write(path: Path | str, data: bytes) -> None:
    """Write ``data`` to ``path`` through a fsynced temporary file renamed into place."""
    _atomic(path, lambda f: f.write(data))


def _atomic(path: Path | str, write) -> None:
    path = Path(path)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent, strict=False)
