"""How a run that cannot go on says so: the conditions of the machine (memory, a disk
full, read-only or pulled from under the run) in one line with the exit code the
README documents, and only a real bug with its traceback, which is its report."""

from __future__ import annotations

import errno
import os
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.exit_codes import ExitCode
from runner.keys import in_job_terms

Log = Callable[[str], None]


def exit_code_of(e: Exception, job: Any, run_dir: Path, bucket: bool, log: Log,
                 phase: str = "the run") -> ExitCode:
    """How a run that raised ``e`` during ``phase`` ended, said in one line, as its exit
    code: the one table of ``ten-runner run``'s failures (a stop is not one: ten.train.stop)."""
    for kinds, code, words in _failures():
        if isinstance(e, kinds):
            log(f"{words}: {in_job_terms(str(e))}")
            return code
    if isinstance(e, OSError):
        return disk_error(e, run_dir, bucket, log)
    return crash_or_memory(e, job, log, phase)


def _failures() -> tuple[tuple[tuple[type[Exception], ...], ExitCode, str], ...]:
    """(exceptions, exit code, the words the log line starts with), first match wins."""
    from runner.monitor.trackers import TrackerError
    from runner.storage import StorageError
    from runner.trained.init_from import InitFromError
    from ten.data import DataError
    from ten.kernels.fp8 import FP8Error
    from ten.kernels.scan import ScanBackendError
    from ten.train.checkpoint import CheckpointWriteError
    from ten.train.memory import DeviceMemoryError
    from ten.train.trainer import CompileError
    from ten.train.trainstate import DivergedError, ResumeError

    return (
        ((ResumeError,), ExitCode.CONFIG, "resume refused"),  # fix the job, not retry
        ((InitFromError, TrackerError), ExitCode.CONFIG, "config error"),
        # fused without CUDA, float8 without FP8 tensor cores, a job the GPU cannot hold, a
        # failed compile:
        ((ScanBackendError, FP8Error, DeviceMemoryError, CompileError), ExitCode.CONFIG,
         "config error"),
        ((DataError,), ExitCode.DATA, "data error"),
        ((DivergedError,), ExitCode.DIVERGED, "diverged"),
        ((CheckpointWriteError, StorageError), ExitCode.STORAGE, "storage error"),
    )


def crash_or_memory(e: Exception, job: Any, log: Log, phase: str = "the run") -> ExitCode:
    """A crash keeps its traceback. Two conditions are no bug: another rank gone (one
    line, exit 1: the launcher names the rank and what ended it), and memory running
    out, the job's size on this machine (one line, what was asked and the settings that
    lower it, exit 2)."""
    from ten.train.memory import exhausted, lowering

    peer = peer_lost(e)
    if peer is not None:  # another rank died; the launcher names it and how
        log(f"another rank went away ({peer}): stopping")
        return ExitCode.CRASH
    what = exhausted(e)
    if what is None:
        log("crash:\n" + traceback.format_exc())
        return ExitCode.CRASH
    try:
        knobs = in_job_terms(lowering(job.model_settings(), job.train.batch_size,
                                      job.data.seq_len))
    except Exception:  # noqa: BLE001 - memory may be short for this too
        knobs = "lower train.batch_size or data.seq_len"
    log(f"out of memory during {phase}: {what}; {knobs}")
    return ExitCode.CONFIG


def peer_lost(e: BaseException | None) -> str | None:
    """The collective library's words when ``e`` (or what it arose from) is a peer rank
    gone: a connection to it closed or reset; None otherwise."""
    seen = 0
    while e is not None and seen < 8:
        text = str(e)
        if "gloo" in text and ("closed by peer" in text or "reset by peer" in text):
            return "gloo: connection " + ("closed" if "closed by peer" in text else "reset")
        e, seen = e.__cause__ or e.__context__, seen + 1
    return None


def disk_error(e: OSError, run_dir: Path, bucket: bool, log: Log) -> ExitCode:
    """A full, read-only or forbidden disk under the run directory is the machine's
    state, not a bug: one line naming the path and the free space, exit 4; so is the run
    directory removed while the run writes to it."""
    from ten.fileio import ENVIRONMENT_ERRNOS, describe_os_error

    if vanished_from(e, run_dir):
        then = ("running the job again resumes from what the bucket still holds (nothing, "
                "after ten-runner rm)" if bucket else
                "nothing of it is left here, so running the job again starts it over")
        log(f"storage error: {os.fsdecode(e.filename)} vanished: the run directory was "
            f"removed while the run wrote to it (ten-runner rm --force does that); {then}")
        return ExitCode.STORAGE
    if e.errno not in ENVIRONMENT_ERRNOS:
        log("crash:\n" + traceback.format_exc())
        return ExitCode.CRASH
    log(f"storage error: {describe_os_error(e)}")
    return ExitCode.STORAGE


def vanished_from(e: BaseException, directory: Path) -> bool:
    """``e`` is a file under ``directory`` not being there (removed mid-run)."""
    if not isinstance(e, OSError) or e.errno != errno.ENOENT or not e.filename:
        return False
    path = os.path.abspath(os.fsdecode(e.filename))
    return path.startswith(str(Path(directory).absolute()) + os.sep)


class ThreadDiskErrors:
    """While installed, a background thread (tensorboard's event writer) that dies of
    the disk (full, read-only, its folder removed) says so in one line instead of a
    traceback; any other exception in a thread keeps Python's report."""

    def __init__(self, log: Log) -> None:
        self.log, self.previous = log, threading.excepthook

    def __enter__(self) -> ThreadDiskErrors:
        threading.excepthook = self._hook
        return self

    def __exit__(self, *exc: object) -> None:
        threading.excepthook = self.previous

    def _hook(self, args: Any) -> None:
        from ten.fileio import ENVIRONMENT_ERRNOS

        e = args.exc_value
        if isinstance(e, OSError) and (e.errno in ENVIRONMENT_ERRNOS or e.errno == errno.ENOENT):
            name = args.thread.name if args.thread is not None else "a thread"
            self.log(f"warning: {name} stopped: {e}")
            return
        self.previous(args)
