"""One line for a disk that is full: of bytes, or of files (inodes)."""

import errno
import os

from ten import fileio
from ten.fileio import describe_os_error


def test_a_full_disk_says_how_much_is_free(tmp_path):
    e = OSError(errno.ENOSPC, "No space left on device")
    line = describe_os_error(e, tmp_path / "run" / "x.pt")
    assert line.startswith(f"cannot write {tmp_path / 'run' / 'x.pt'}: No space left on device (")
    assert f"free on {tmp_path})" in line


def test_a_disk_out_of_inodes_says_inodes_not_bytes(tmp_path, monkeypatch):
    """Issue 23's eleventh fault: with every inode used, ENOSPC read "No space left on
    device (209 MB free)", which sent the user looking for bytes. The file system's
    counts are what statvfs reports on such a disk (no tmpfs can be mounted here)."""
    real = os.statvfs(tmp_path)
    fields = {name: getattr(real, name) for name in dir(real) if name.startswith("f_")}
    full = type("Statvfs", (), {**fields, "f_files": 1000, "f_ffree": 0, "f_favail": 0})
    monkeypatch.setattr(fileio.os, "statvfs", lambda p: full)
    line = describe_os_error(OSError(errno.ENOSPC, "No space left on device"), tmp_path / "x")
    assert f"(no inodes left on {tmp_path}: too many files, " in line and " free)" in line
