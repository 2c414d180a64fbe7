"""Stop signals outside the training loop: every phase of ``ten-runner run`` answers
SIGTERM/SIGINT/SIGHUP with exit 75 and one line, within seconds.

Inside the loop the trainer's own handler (ten.step.StopSignal) turns a signal into
"finish this step, commit a checkpoint, exit 75". Everywhere else — start-up, the
bucket restore, data preparation, the model build, the final evaluation and sample —
there is nothing new to save (every file written so far was written atomically), so
the handler installed here raises :class:`Interrupted` in the main thread and the run
ends with 75 at once.

A signal handler written in Python only runs when the main thread returns to the
interpreter; native code (tokenizer training, a long read) can hold it for minutes.
So the C-level handler also writes the signal to a wake-up pipe, and a watchdog thread
reading it ends the process with 75 after :data:`GRACE_S` unless the main thread has
handled the stop by then (:func:`handled`) or the trainer's handler is in charge.

:func:`exit_process` is the run's last act: once its outcome is decided, stop signals
are ignored and the exit code cannot turn into a death by signal.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

from runner.exit_codes import ExitCode

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # as ten.step.StopSignal's
GRACE_S = 5.0  # how long native code may keep the main thread from a stop


class Interrupted(BaseException):
    """A stop signal arrived outside the training loop. A BaseException, like
    KeyboardInterrupt, so that ``except Exception`` on the way up does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name


class _Guard:
    def __init__(self) -> None:
        self.pid: int | None = None
        self.phase = "start-up"
        self.log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)
        self.handled = threading.Event()
        self.received: int | None = None  # the first stop signal, once one arrived
        self.watchdog: threading.Thread | None = None


_guard = _Guard()


def _handler(signum: int, frame: object) -> None:
    if os.getpid() != _guard.pid:  # a forked worker (DataLoader, preparation pool)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _guard.received is None:
        _guard.received = signum
    raise Interrupted(signum)


def install(log: Callable[[str], None] | None = None) -> None:
    """Make the stop signals raise :class:`Interrupted` in this (main) thread from now on,
    and start the watchdog. Idempotent; a no-op outside the main thread."""
    if threading.current_thread() is not threading.main_thread():
        return
    if log is not None:
        _guard.log = log
    if _guard.pid != os.getpid():  # the watchdog first: a signal may come at any moment
        _guard.pid = os.getpid()
        _guard.handled.clear()
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        _guard.watchdog = threading.Thread(target=_watch, args=(read_fd,),
                                           name="stop-watchdog", daemon=True)
        _guard.watchdog.start()
    for sig in SIGNALS:
        signal.signal(sig, _handler)


def set_phase(phase: str, log: Callable[[str], None] | None = None) -> None:
    """Name what the run is doing now, for the line a stop prints."""
    _guard.phase = phase
    if log is not None:
        _guard.log = log


def phase() -> str:
    return _guard.phase


def raise_if_received() -> None:
    """Raise :class:`Interrupted` again if a stop signal arrived. For error handlers: a
    library that ran our handler inside its own code (sentencepiece pulling training
    text from a Python iterator) reports the stop as its own failure ("tokenizer
    training failed: Interrupted"), which must still end the run as a stop."""
    if _guard.received is not None and _guard.pid == os.getpid():
        raise Interrupted(_guard.received)


@contextlib.contextmanager
def deferred(log: Callable[[str], None], what: str):
    """While ``what`` (the final upload) runs, a stop signal is noted, not raised: the
    run is ending anyway, and abandoning the upload would leave committed steps only on
    a disk a reclaim takes away. More signals cannot cut it short; only SIGKILL can (a
    container runtime sends it once its stop timeout is over)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(signum: int, frame: object) -> None:  # no I/O here: it may land mid-write
        if _guard.received is None:
            _guard.received = signum
        noted.append(signum)

    previous = {sig: signal.signal(sig, note) for sig in SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if noted:
            names = ", ".join(sorted({signal.Signals(s).name for s in noted}))
            log(f"{len(noted)} stop signal(s) ({names}) during {what}: finishing it first, "
                "as it did")


def handled() -> None:
    """The main thread has taken the stop in hand: the watchdog stands down."""
    _guard.handled.set()


def _watch(read_fd: int) -> None:
    while True:
        try:
            data = os.read(read_fd, 16)
        except OSError:
            return
        if not data:
            return
        for signum in data:
            # The trainer's handler is installed over ours inside the loop: the step
            # finishes and a checkpoint is committed, which may take longer than the
            # grace period. Only a stop that is ours to handle is timed.
            with contextlib.suppress(ValueError):
                if signal.getsignal(signum) is not _handler:
                    continue
            if _guard.handled.wait(GRACE_S):
                return
            name = signal.Signals(signum).name if signum in signal.Signals._value2member_map_ \
                else str(signum)
            with contextlib.suppress(Exception):
                _guard.log(f"stopped by {name} during {_guard.phase}: the process did not "
                           f"answer within {GRACE_S:.0f} s, exiting now (nothing new to save)")
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            os._exit(int(ExitCode.PREEMPTED))


def exit_process(code: int) -> NoReturn:
    """End ``ten-runner run`` with ``code``. After a preemption everything that matters
    is committed, and the notice window is running out: background work still in flight
    (a prepared-data upload to the bucket, which is safe to abandon: nothing trusts it
    without its manifest) must not hold the exit, as Python's exit would by joining its
    thread pools. Other codes exit normally, with stop signals ignored from here on: the
    run's outcome is decided, so a SIGTERM during the interpreter's teardown must not
    turn it into a death by signal (Python resets its own handlers to the default during
    finalization, but leaves an ignored signal ignored)."""
    for sig in SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    if code == ExitCode.PREEMPTED:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # a console that is gone
                stream.flush()
        os._exit(int(code))
    raise SystemExit(int(code))


def _after_fork_in_child() -> None:
    # A forked child must not write its own signals into the parent's wake-up pipe.
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)


os.register_at_fork(after_in_child=_after_fork_in_child)
