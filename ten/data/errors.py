"""The one exception the data layer raises for anything a user can cause or fix.

``str(DataError(...))`` is a single line that says what is wrong and what to change
or re-run, so the runner can print it as-is (no traceback) and exit non-zero.
"""

from __future__ import annotations

import errno
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from ten.fileio import ENVIRONMENT_ERRNOS, describe_os_error


class DataError(Exception):
    """A data problem the user can fix: bad config, bad input, stale or corrupt shards,
    a full or read-only cache disk."""

    def __init__(self, message: str) -> None:
        # Keep it one line whatever the caller passed: multi-line messages get folded.
        super().__init__(" ".join(message.split()))


_FULL = frozenset({errno.ENOSPC, errno.EDQUOT})


def environment_cause(e: BaseException) -> OSError | None:
    """The environment OS error behind ``e``, itself or down its chain of causes:
    libraries wrap them (datasets raises DatasetGenerationError from an ENOSPC), and an
    error from a worker process arrives as the cause of the parent's."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        if isinstance(cur, OSError) and cur.errno in ENVIRONMENT_ERRNOS:
            return cur
        seen.add(id(cur))
        cur = cur.__cause__ or (None if cur.__suppress_context__ else cur.__context__)
    return None


def os_data_error(e: OSError, path: Path | str | None = None, what: str = "write") -> DataError:
    """The one-line DataError for an environment OS error: the file (the error's own
    name when it has one, as it does for open(); a write() error has none, so ``path``),
    why, the free space there, and what to change."""
    if e.errno in _FULL or e.errno == errno.EROFS:
        what = "write"  # only ever a write fails so, whatever the caller was doing
    line = describe_os_error(e, e.filename or path, what)
    if e.errno in _FULL:
        hint = "free space there, or point DataConfig.cache_dir (or TEN_CACHE_DIR) at a larger disk"
    elif e.errno == errno.EROFS:
        hint = "point DataConfig.cache_dir (or TEN_CACHE_DIR) at a writable disk"
    elif e.errno in (errno.EACCES, errno.EPERM):
        hint = "fix its permissions, or point DataConfig.cache_dir (or TEN_CACHE_DIR) elsewhere"
    else:
        hint = "check that disk, or point DataConfig.cache_dir (or TEN_CACHE_DIR) at another one"
    return DataError(f"{line}; {hint}")


@contextmanager
def disk_errors(path: Path | str, what: str = "write") -> Iterator[None]:
    """Turn environment OS errors (ENOSPC, EACCES, EROFS, ...) raised inside, or behind
    what was raised, into one-line DataErrors naming ``path``; anything else (a bug)
    keeps its traceback."""
    try:
        yield
    except DataError:
        raise  # already one line (an inner disk_errors may have named the file better)
    except Exception as e:
        cause = environment_cause(e)
        if cause is None:
            raise
        raise os_data_error(cause, path, what) from None
