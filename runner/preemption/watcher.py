"""The watcher thread: polls one provider's metadata service and turns a notice into
one ``on_notice`` call, at the start of the window."""

from __future__ import annotations

import threading
import time
import traceback
from collections.abc import Callable

from runner.preemption.http import describe
from runner.preemption.notices import MetadataError, Notice, time_left_s
from runner.preemption.providers import spot_provider


class _ErrorThrottle:
    """Log the first failure at once, then at most one line per ``every_s``.

    A metadata service that is down answers every poll with the same error;
    one line a minute (with a count of the ones skipped) keeps the log readable.
    """

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._last: float | None = None
        self.suppressed = 0
        self.failing = 0

    def on_error(self, now: float) -> int | None:
        """How many were skipped since the last line, or None to stay quiet now."""
        self.failing += 1
        if self._last is not None and now - self._last < self.every_s:
            self.suppressed += 1
            return None
        skipped, self.suppressed, self._last = self.suppressed, 0, now
        return skipped

    def on_success(self) -> int:
        """How many polls had failed in a row (0: nothing to report), and reset."""
        failed, self.failing, self.suppressed, self._last = self.failing, 0, 0, None
        return failed


class NoticeWatcher:
    """Poll one provider's metadata service on a daemon thread; call ``on_notice`` once.

    ``on_notice`` runs on the watcher thread. Keep it short and thread-safe:
    typically it sets a flag (``threading.Event``) that the train loop checks
    after every step, so the emergency checkpoint is taken between steps on the
    training thread. Nothing here raises into training: request failures are
    logged (throttled) and retried, a failing callback is logged.

    ``endpoint`` is the service's base URL (tests point it at a local server);
    ``timeout_s`` bounds each request and so how long ``stop()`` can wait.
    """

    def __init__(
        self,
        provider: str,
        on_notice: Callable[[Notice], None],
        interval_s: float = 5.0,
        endpoint: str | None = None,
        log: Callable[[str], object] = print,
        *,
        timeout_s: float = 1.0,
        error_log_every_s: float = 60.0,
    ) -> None:
        declared = spot_provider(provider)
        self.provider, self._title = declared.name, declared.title
        self.endpoint = (endpoint or declared.endpoint).rstrip("/")
        self.interval_s = interval_s
        self.notice: Notice | None = None
        self._on_notice = on_notice
        self._log = log
        self._poller = declared.poller(self.endpoint, timeout_s)
        self._join_s = timeout_s + 1.0
        self._throttle = _ErrorThrottle(error_log_every_s)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> NoticeWatcher:
        if self._thread is not None:
            raise RuntimeError("NoticeWatcher.start() called twice")
        self._thread = threading.Thread(target=self._run, name="preemption-watcher", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Wake the thread and join it; a request in flight bounds the wait (timeout_s)."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(self._join_s)

    def __enter__(self) -> NoticeWatcher:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _run(self) -> None:
        self._log(f"preemption: watching {self._title} spot notices at {self.endpoint} "
                  f"every {self.interval_s:g} s")
        while not self._stop.is_set():
            notice = self._poll_once()
            if notice is not None and not self._stop.is_set():
                self._fire(notice)
                return
            self._stop.wait(self.interval_s)

    def _poll_once(self) -> Notice | None:
        try:
            notice = self._poller.poll(time.time())
        except Exception as err:  # noqa: BLE001 — a poll must never end the watcher
            self._report_error(err)
            return None
        failed = self._throttle.on_success()
        if failed:
            self._log(f"preemption: {self._title} metadata service answers again "
                      f"after {failed} failed poll(s)")
        return notice

    def _report_error(self, err: Exception) -> None:
        skipped = self._throttle.on_error(time.monotonic())
        if skipped is None:
            return
        more = f" ({skipped} more since the last report)" if skipped else ""
        reason = str(err) if isinstance(err, MetadataError) else describe(err)
        self._log(f"preemption: cannot read the {self._title} spot notice from "
                  f"{self.endpoint}: {reason}; retrying every {self.interval_s:g} s{more}")

    def _fire(self, notice: Notice) -> None:
        self.notice = notice
        left = time_left_s(notice, notice.received_at)
        until = "deadline unknown" if left is None else f"{left:.0f} s until the deadline"
        self._log(f"preemption: {self._title} notice ({notice.detail}): {until}")
        try:
            self._on_notice(notice)
        except Exception as err:  # noqa: BLE001 — the watcher thread must not die loudly
            self._log(f"preemption: on_notice failed: {type(err).__name__}: {err}")
            self._log(traceback.format_exc().rstrip())
