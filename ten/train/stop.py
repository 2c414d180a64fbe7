"""Every stop request of a training process, in one object: :class:`Stop`.

A stop comes as a signal (SIGTERM from a supervisor or ``docker stop``, Ctrl-C's
SIGINT, SIGHUP when the terminal or ssh session closes) or as a request from another
thread (a spot notice, a lost writer lease). What it does depends on where the process
is, which is the Stop's *mode*:

* ``raise`` (the default, outside the training loop: start-up, data preparation, the
  final evaluation): nothing new to save — every file so far was written atomically —
  so the signal raises :class:`Interrupted` in the main thread, and the run ends at once.
* ``flag`` (inside the loop, :meth:`Stop.in_loop`): the signal only sets a flag; the
  loop finishes its step, commits a checkpoint and returns. A second SIGINT raises
  KeyboardInterrupt (the user insists).
* ``note`` (:meth:`Stop.deferred`, the final upload): the signal is noted, not raised:
  the run is ending anyway, and abandoning the upload would leave the committed steps
  only on a disk that a reclaim takes away.
* ``relay`` (:meth:`Stop.relaying`, the multi-GPU launcher): the signal is passed on to
  the processes that train, which stop as above.

A Python signal handler runs only when the main thread returns to the interpreter, and
native code (tokenizer training, a long read) can hold it for minutes. So the C-level
handler also writes each signal to a wake-up pipe, and a watchdog thread reading it ends
the process with ``exit_code`` after ``grace_s`` (:data:`GRACE_S`) — unless the main
thread has taken the stop in hand by then (:meth:`Stop.handled`) or the mode is not
``raise``.

:meth:`Stop.end_process` is the process's last act, and the one place it ends without
unwinding (``os._exit``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)
STOP_SIGNUMS = frozenset(int(sig) for sig in SIGNALS)
GRACE_S = 5.0  # how long native code may keep the main thread from a stop
PREEMPTED = 75  # EX_TEMPFAIL: stopped after committing; run again to resume

Log = Callable[[str], None]


class Interrupted(BaseException):
    """A stop signal arrived outside the training loop. A BaseException, like
    KeyboardInterrupt, so that ``except Exception`` on the way up does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.name = signal.Signals(signum).name


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Stop:
    """The stop requests of this process; see the module docstring for the modes.

    ``reason`` is why the loop stopped (a signal's name, or what :meth:`request` said);
    ``phase`` names what the process is doing, for the line a stop prints."""

    def __init__(self, exit_code: int = PREEMPTED, log: Log = _stderr,
                 grace_s: float = GRACE_S) -> None:
        self.exit_code, self.log, self.grace_s = exit_code, log, grace_s
        self.phase = "start-up"
        self.mode = "raise"
        self.received: int | None = None  # the first signal outside the loop
        self.signum: int | None = None  # the first signal inside the loop
        self.requested: str | None = None  # the first request from a thread
        self.then = "run again to resume"  # what the user does after this stop
        self._pid: int | None = None  # the process whose handlers are installed
        self._handled = threading.Event()
        self._noted: list[int] = []  # signals in mode "note"
        self._relay: Callable[[int], None] | None = None  # mode "relay"'s receiver
        # install's: the wake-up fd and handlers found, and its pipe's end (installed())
        self._before: tuple[int, dict[int, Any], int] | None = None

    # -- asking ---------------------------------------------------------------------------
    @property
    def reason(self) -> str | None:
        if self.signum is not None:
            return signal.Signals(self.signum).name
        return self.requested

    def request(self, reason: str, then: str | None = None) -> None:
        """Stop after the current step, from any thread (a notice, a lost lease); ``then``:
        what to do next, when it is not to run again (another writer holds the run)."""
        if self.requested is None:
            self.requested = reason
            if then is not None:
                self.then = then

    # -- the handlers ---------------------------------------------------------------------
    def install(self, log: Log | None = None) -> None:
        """From now on the stop signals are this Stop's (mode ``raise``), with the watchdog
        behind them. Idempotent; a no-op outside the main thread."""
        if threading.current_thread() is not threading.main_thread():
            return
        if log is not None:
            self.log = log
        if self._pid != os.getpid():  # the watchdog first: a signal may come at any moment
            self._pid = os.getpid()
            self._handled.clear()
            read_fd, write_fd = os.pipe()
            os.set_blocking(write_fd, False)
            self._before = (signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False),
                            {sig: signal.getsignal(sig) for sig in SIGNALS}, write_fd)
            threading.Thread(target=self._watch, args=(read_fd,), name="stop-watchdog",
                             daemon=True).start()
        for sig in SIGNALS:
            signal.signal(sig, self._handle)

    @contextlib.contextmanager
    def installed(self) -> Iterator[Stop]:
        """:meth:`install` for the block, then the handlers and wake-up pipe found before
        put back and the watchdog ended: for a command that is not the process's whole
        life (``export-model`` called in-process)."""
        self.install()
        try:
            yield self
        finally:
            before, self._before = self._before, None
            if before is not None and self._pid == os.getpid():
                wakeup, handlers, write_fd = before
                signal.set_wakeup_fd(wakeup)
                for sig, handler in handlers.items():
                    signal.signal(sig, handler)
                os.close(write_fd)  # the watchdog reads the end of its pipe and returns
                self._pid = None

    def _handle(self, signum: int, frame: object) -> None:
        if os.getpid() != self._pid:  # a forked worker (DataLoader, preparation pool)
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self.mode == "flag":
            if self.signum is not None and signum == signal.SIGINT:
                raise KeyboardInterrupt
            if self.signum is None:
                self.signum = signum
            return
        if self.mode == "relay":
            self._relay(signum)
            return
        if self.received is None:
            self.received = signum
        if self.mode == "raise":
            raise Interrupted(signum)
        self._noted.append(signum)  # mode "note": no I/O here, it may land mid-write

    # -- the modes ------------------------------------------------------------------------
    def set_phase(self, phase: str, log: Log | None = None) -> None:
        """Name what the process is doing now, for the line a stop prints."""
        self.phase = phase
        if log is not None:
            self.log = log

    def in_loop(self) -> contextlib.AbstractContextManager[None]:
        """Mode ``flag`` while the training loop runs."""
        return self._mode("flag")

    def deferred(self, what: str) -> contextlib.AbstractContextManager[None]:
        """Mode ``note`` while ``what`` (the final upload) runs: a stop signal is noted,
        not raised, and more signals cannot cut it short; only SIGKILL can (a container
        runtime sends it once its stop timeout is over)."""
        return self._mode("note", what=what)

    def relaying(self, relay: Callable[[int], None]) -> contextlib.AbstractContextManager[None]:
        """Mode ``relay`` while this process supervises others that do the stopping (the
        multi-GPU launcher over its ranks): each signal goes to ``relay(signum)``, and the
        watchdog stands down — the children decide when they are done."""
        return self._mode("relay", relay=relay)

    @contextlib.contextmanager
    def _mode(self, mode: str, what: str = "", relay: Callable[[int], None] | None = None,
              ) -> Iterator[None]:
        """``mode`` for the block, ``raise`` after it. A Stop nobody installed (the library
        used on its own) installs its handlers for the block only and puts back the ones
        it found. Outside the main thread signals are not ours: nothing changes."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = None
        if self._pid != os.getpid():
            previous = {sig: signal.signal(sig, self._handle) for sig in SIGNALS}
            self._pid = os.getpid()
        self.mode, self._noted, self._relay = mode, [], relay
        try:
            yield
        finally:
            self.mode, self._relay = "raise", None
            if previous is not None:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                self._pid = None
            if self._noted:
                names = ", ".join(sorted({signal.Signals(s).name for s in self._noted}))
                self.log(f"{len(self._noted)} stop signal(s) ({names}) during {what}: "
                         "finishing it first, as it did")

    # -- after a stop ---------------------------------------------------------------------
    def raise_if_received(self) -> None:
        """Raise :class:`Interrupted` again if a stop signal arrived outside the loop. For
        error handlers: a library that ran our handler inside its own code (sentencepiece
        pulling training text from a Python iterator) reports the stop as its own failure
        ("tokenizer training failed: Interrupted"), which must still end the run as a stop."""
        if self.received is not None and self._pid == os.getpid():
            raise Interrupted(self.received)

    def handled(self) -> None:
        """The main thread has taken the stop in hand: the watchdog stands down."""
        self._handled.set()

    def end_process(self, code: int, at_once: bool = False) -> NoReturn:
        """End the process with ``code``, stop signals ignored from here on: its outcome is
        decided, so a SIGTERM during the interpreter's teardown must not turn it into a
        death by signal (Python resets its own handlers during finalization, but leaves an
        ignored signal ignored). ``at_once`` (and every preemption) skips the teardown:
        after a preemption everything that matters is committed and the notice window is
        running out, so background work still in flight (a prepared-data upload, safe to
        abandon: nothing trusts it without its manifest) must not hold the exit, as
        Python's exit would by joining its thread pools."""
        for sig in SIGNALS:
            with contextlib.suppress(ValueError):  # not the main thread
                signal.signal(sig, signal.SIG_IGN)
        if at_once or code == PREEMPTED:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):  # a console that is gone
                    stream.flush()
            os._exit(int(code))
        raise SystemExit(int(code))

    def _watch(self, read_fd: int) -> None:
        while True:
            try:
                data = os.read(read_fd, 16)
            except OSError:
                return
            if not data:  # installed() closed the other end
                os.close(read_fd)
                return
            for signum in data:
                if signum not in STOP_SIGNUMS:  # any handled signal reaches the pipe:
                    continue  # torch's DataLoader handles SIGCHLD, for one
                # Inside the loop the step finishes and a checkpoint is committed, which may
                # take longer than the grace period; the final upload runs to its end; the
                # launcher's ranks commit theirs. Only a stop that is to raise is timed.
                if self.mode != "raise" or self._handled.wait(self.grace_s):
                    continue
                if self.mode != "raise":  # the loop began while native code held the thread
                    continue
                name = signal.Signals(signum).name
                with contextlib.suppress(Exception):
                    self.log(f"stopped by {name} during {self.phase}: the process did not "
                             f"answer within {self.grace_s:g} s, exiting now (nothing new to "
                             "save)")
                self.end_process(self.exit_code, at_once=True)


def _after_fork_in_child() -> None:
    # A forked child must not write its own signals into the parent's wake-up pipe.
    with contextlib.suppress(ValueError, OSError):
        signal.set_wakeup_fd(-1)


os.register_at_fork(after_in_child=_after_fork_in_child)
