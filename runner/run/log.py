"""RunLog: a run's progress lines, to stderr and to ``<run>/run.log``."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runner.storage.mirror import RUN_LOG


class RunLog:
    """Lines to stderr and to ``<run>/run.log`` (structured figures go to metrics.jsonl).

    Every line passes through ``scrub`` first (the job's: resolved ``${VAR}`` values
    become ``***``), so nothing a secret was substituted into reaches the console, the
    file or the bucket copy of it. A log that cannot be written (a full disk) never
    turns into a second failure: the line still reaches stderr.

    The heartbeat's thread logs too: a line goes out in one write, under a lock, so two
    threads' lines are never glued together (``print`` writes the newline separately)."""

    def __init__(self, run_dir: Path, tag: str = "",
                 scrub: Callable[[str], str] | None = None) -> None:
        self.tag = tag  # "[rank 1] ": which torchrun rank said it
        self.scrub = scrub or (lambda text: text)
        self.path = Path(run_dir) / RUN_LOG
        self._file = None
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115
        except OSError as e:
            self._file_failed(e)

    def __call__(self, line: str) -> None:
        line = self.scrub(self.tag + line)
        with self._lock:
            sys.stderr.write(line + "\n")
            sys.stderr.flush()
            if self._file is None:
                return
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            try:
                self._file.write(f"{stamp} {line}\n")
                self._file.flush()
            except OSError as e:
                self._file_failed(e)

    def _file_failed(self, e: OSError) -> None:
        from ten.fileio import describe_os_error

        self.close()
        sys.stderr.write(self.scrub(f"warning: {describe_os_error(e, self.path)}; this run's "
                                    "lines go to stderr only") + "\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file = None


class ScrubbedStream:
    """A text stream that passes everything through ``scrub`` before ``stream``: installed
    as sys.stderr/sys.stdout for the length of a run, so what the libraries print on
    their own (progress bars naming a dataset path, warnings, tracebacks) cannot show a
    resolved secret either.

    And a run must not depend on its console: once a write or flush fails (the pipe's
    reader exited, the terminal hung up, the descriptor was closed), the console is gone
    for good. Writes are dropped (run.log keeps every line) and the descriptor is pointed
    at /dev/null, so that native code writing to it and the interpreter's last flush
    cannot fail either."""

    def __init__(self, stream, scrub: Callable[[str], str]) -> None:
        self._stream, self._scrub = stream, scrub
        self._gone = False

    def write(self, text: str) -> int:
        if not self._gone:
            try:
                self._stream.write(self._scrub(text))
            except (OSError, ValueError):  # EPIPE, EIO, a closed file
                self._lose()
        return len(text)

    def flush(self) -> None:
        if not self._gone:
            try:
                self._stream.flush()
            except (OSError, ValueError):
                self._lose()

    def _lose(self) -> None:
        self._gone = True
        with contextlib.suppress(OSError, ValueError, AttributeError):
            _to_devnull(self._stream.fileno())

    def __getattr__(self, name: str):  # fileno, isatty, encoding, ...
        return getattr(self._stream, name)


def _to_devnull(fd: int) -> None:
    null = os.open(os.devnull, os.O_RDWR)  # fd itself when fd is the lowest closed one
    if null != fd:
        os.dup2(null, fd)
        os.close(null)


def keep_standard_streams() -> None:
    """Before anything else opens a file: descriptors 0-2 closed at start (``1>&- 2>&-``)
    are opened on /dev/null, or the next file opened (the run's lock, run.log) would take
    their number and receive whatever is written to stdout; and a stream Python left as
    None for them gets one."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            _to_devnull(fd)
    for name, mode in (("stdin", "r"), ("stdout", "w"), ("stderr", "w")):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, mode, encoding="utf-8"))  # noqa: SIM115
