"""One writer per run directory: a second ``ten-runner run`` of the same job on the same
directory stops at once (exit 4) and names the first, instead of both training from the
same checkpoint and interleaving their metrics.

The lock is a POSIX record lock (``fcntl.lockf``) on ``<run>/.lock``. The kernel drops
it when the holding process dies, however it dies — a ``kill -9`` leaves nothing that
blocks the relaunch — and, unlike ``flock``, it is not shared with forked children
(DataLoader workers, preparation pools), so a worker outliving a killed parent for a
moment does not hold it either. The file's text (pid, host, start time) is only there
to name the holder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from pathlib import Path

from runner.storage import StorageError
from ten.fileio import describe_os_error

LOCK_NAME = ".lock"


class RunLocked(StorageError):
    """Another process holds the run directory (one line naming it)."""


class RunLock:
    def __init__(self, fd: int, path: Path) -> None:
        self._fd, self.path = fd, path

    @classmethod
    def acquire(cls, run_dir: Path) -> RunLock:
        path = Path(run_dir) / LOCK_NAME
        check_run_dir(Path(run_dir))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise StorageError(describe_os_error(e, path, "open")) from None
        try:
            fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read(fd)
            os.close(fd)
            if e.errno not in (errno.EACCES, errno.EAGAIN):
                raise StorageError(describe_os_error(e, path, "lock")) from None
            raise RunLocked(f"{run_dir} is in use by another ten-runner run"
                            f"{f' ({holder})' if holder else ''}; wait for it to end or "
                            "stop it (it checkpoints on SIGTERM) before running this job "
                            "again") from None
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        with contextlib.suppress(OSError):  # the text is informative only
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n"
                      .encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing drops the record lock
            self._fd = -1


def check_run_dir(run_dir: Path) -> None:
    """A run directory that is there must be a folder: a link to nothing, or to a file or
    a device (``/dev/null``), is one line naming what it is (mkdir said "File exists")."""
    if run_dir.is_symlink() and not run_dir.exists():
        target = os.readlink(run_dir)
        try:
            os.stat(run_dir)
        except OSError as e:
            if e.errno == errno.ELOOP:  # a link to itself, or round a circle of links
                raise StorageError(f"run directory {run_dir} is a link to {target} that "
                                   "leads back to itself: remove the link") from None
        raise StorageError(f"run directory {run_dir} is a link to {target}, which does not "
                           "exist: remove the link or create its folder")
    if run_dir.exists() and not run_dir.is_dir():
        what = "a link to " + str(run_dir.resolve()) if run_dir.is_symlink() else "a file"
        raise StorageError(f"run directory {run_dir} is {what}, not a folder: remove it or "
                           "choose another storage.url or job name")


def _read(fd: int) -> str:
    try:
        return os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        return ""
