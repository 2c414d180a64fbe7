"""Hear the spot-preemption notice while there is still time to checkpoint.

Every cloud warns a spot VM before reclaiming it, but only through its metadata
service: AWS about 2 minutes ahead, GCP and Azure about 30 s. A SIGTERM, where one
reaches the container at all, can come at the very end of that window (AWS, Azure),
so a job that waits for the signal loses everything since its last periodic
checkpoint. A :class:`NoticeWatcher` polls the metadata service on a daemon thread
and calls ``on_notice`` once, at the start of the window.

Layout follows DESIGN.md rule 7: the response parsers and the deadline maths are
pure functions tested from tables; the HTTP calls are a thin layer on
``urllib.request`` that a test points at a local server through the base URLs.

A provider's metadata service is reachable only from inside its VMs, so nothing
here is exercised against the real thing in CI; the response shapes follow the
providers' documentation, summarised in each parser's docstring.
"""

from __future__ import annotations

import dataclasses
import http.client
import json
import threading
import time
import traceback
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

PROVIDERS = ("aws", "gcp", "azure")

DEFAULT_ENDPOINTS = {
    "aws": "http://169.254.169.254",
    "gcp": "http://metadata.google.internal",
    "azure": "http://169.254.169.254",
}

# The documented notice each provider gives: AWS "two minutes", GCP "30 seconds"
# (the preempted flag is set when the ACPI soft-off starts), Azure Spot "minimum of
# 30 seconds" before a Preempt event's NotBefore.
_WINDOW_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
_NAMES = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}

AWS_TOKEN_PATH = "/latest/api/token"
AWS_ACTION_PATH = "/latest/meta-data/spot/instance-action"
AWS_PROBE_PATH = "/latest/meta-data/instance-id"
GCP_PREEMPTED_PATH = "/computeMetadata/v1/instance/preempted"
AZURE_EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
AZURE_PROBE_PATH = "/metadata/instance?api-version=2021-02-01"

_AWS_TOKEN_TTL_S = 21600  # the maximum; the poller renews a minute before it lapses
# Azure enables Scheduled Events on the first request and documents that this
# first answer can take up to two minutes; later ones are immediate.
_AZURE_FIRST_CALL_TIMEOUT_S = 120.0
# Azure event types that mean "this VM is going away": Preempt is the spot
# eviction, Terminate a deletion (scale-in, user delete). Reboot, Redeploy and
# Freeze are maintenance the VM comes back from, so they trigger nothing here.
AZURE_NOTICE_EVENTS = frozenset({"Preempt", "Terminate"})
_MAX_BODY = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Notice:
    """A preemption notice: when it was seen, and when the VM goes away.

    ``deadline`` is epoch seconds (``time.time()`` scale). The parsers always
    estimate one; None is for callers that build a Notice from a bare signal.
    """

    provider: str
    received_at: float
    deadline: float | None
    detail: str


class MetadataError(Exception):
    """The metadata service answered something this module cannot read (one line)."""


# ---------------------------------------------------------------- pure policy


def notice_window_s(provider: str) -> float:
    """The provider's documented notice, in seconds (aws 120, gcp 30, azure 30)."""
    return _WINDOW_S[_check_provider(provider)]


def time_left_s(notice: Notice, now: float | None = None) -> float | None:
    """Seconds from ``now`` to the notice's deadline (negative once it has passed)."""
    if notice.deadline is None:
        return None
    return notice.deadline - (time.time() if now is None else now)


def startup_warning(
    provider: str, last_checkpoint_s: float | None, detect_latency_s: float = 0.0
) -> str | None:
    """Say at startup, not after the loss, that an emergency checkpoint cannot fit.

    ``last_checkpoint_s`` is the last measured save+upload time (None: nothing
    measured yet, so nothing to say). ``detect_latency_s`` is how late the notice
    may be seen (the poll interval); it eats into the window too.
    """
    if last_checkpoint_s is None:
        return None
    window = notice_window_s(provider)
    if last_checkpoint_s + detect_latency_s <= window:
        return None
    name = _NAMES[provider]
    took = f"last checkpoint upload took {_secs(last_checkpoint_s)} s"
    fix = "checkpoint more often or make checkpoints smaller"
    if last_checkpoint_s > window:
        return (
            f"{took}; the {name} notice window is {_secs(window)} s: a preemption will lose "
            f"work since the last periodic checkpoint — {fix}"
        )
    return (
        f"{took}; the {name} notice window is {_secs(window)} s and the notice may be seen "
        f"{_secs(detect_latency_s)} s late: an emergency checkpoint may not finish in time — "
        f"{fix}, or poll more often"
    )


def emergency_report(notice: Notice, committed_at: float) -> str:
    """One line for the log after the emergency checkpoint: how close it was."""
    after = committed_at - notice.received_at
    head = f"emergency checkpoint committed {after:.1f} s after the notice"
    if notice.deadline is None:
        return f"{head} (the {_NAMES.get(notice.provider, notice.provider)} deadline is unknown)"
    margin = notice.deadline - committed_at
    if margin >= 0:
        return f"{head}, {margin:.1f} s before the deadline"
    return f"{head}, {-margin:.1f} s AFTER the deadline"


def parse_aws_instance_action(status: int, body: bytes | str, now: float) -> Notice | None:
    """IMDS ``spot/instance-action``: 404 while nothing is scheduled, 200 once it is.

    The body is ``{"action": "terminate"|"stop"|"hibernate", "time": ISO-8601 UTC}``.
    Any of the three actions ends the process, so all are notices. The item exists
    only when an interruption is scheduled, so a 200 whose body cannot be read is
    still a notice, with the documented two minutes as deadline: a false alarm
    costs one checkpoint, a missed notice costs everything since the last one.
    """
    if status == 404:
        return None
    if status != 200:
        raise MetadataError(f"AWS spot/instance-action returned HTTP {status}")
    fallback = now + _WINDOW_S["aws"]
    try:
        doc = json.loads(_text(body))
    except ValueError:
        return Notice("aws", now, fallback, f"unreadable instance-action {_snippet(body)}")
    if not isinstance(doc, dict):
        return Notice("aws", now, fallback, f"unreadable instance-action {_snippet(body)}")
    action, when = doc.get("action"), doc.get("time")
    deadline = _parse_iso_utc(when)
    return Notice("aws", now, fallback if deadline is None else deadline,
                  f"spot {action} at {when}")


def parse_gcp_preempted(status: int, body: bytes | str, now: float) -> Notice | None:
    """``instance/preempted`` is ``TRUE`` from the start of the ~30 s notice, else ``FALSE``.

    GCP gives no timestamp, so the deadline is ``now`` + 30 s; the flag may have
    been set up to one poll interval earlier, which startup_warning accounts for.
    """
    if status != 200:
        raise MetadataError(f"GCP instance/preempted returned HTTP {status}")
    value = _text(body).strip().upper()
    if value == "FALSE":
        return None
    if value == "TRUE":
        return Notice("gcp", now, now + _WINDOW_S["gcp"], "instance/preempted is TRUE")
    raise MetadataError(f"GCP instance/preempted returned {_snippet(body)}, not TRUE/FALSE")


def parse_azure_scheduled_events(status: int, body: bytes | str, now: float) -> Notice | None:
    """Scheduled Events: the earliest Preempt/Terminate event, or None.

    ``{"DocumentIncarnation": n, "Events": [{"EventId", "EventType", "NotBefore":
    RFC 1123 date or "" once started, ...}]}``. Unlike AWS the document is always
    there, so one that cannot be read is an error (retried), not a notice.
    """
    if status != 200:
        raise MetadataError(f"Azure scheduledevents returned HTTP {status}")
    try:
        doc = json.loads(_text(body))
    except ValueError:
        raise MetadataError(f"Azure scheduledevents returned {_snippet(body)}") from None
    events = doc.get("Events") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise MetadataError(f"Azure scheduledevents has no Events list: {_snippet(body)}")
    notices = [_azure_notice(e, now) for e in events if _is_azure_notice(e)]
    if not notices:
        return None
    return min(notices, key=lambda n: n.deadline)


def _is_azure_notice(event: object) -> bool:
    return isinstance(event, dict) and event.get("EventType") in AZURE_NOTICE_EVENTS


def _azure_notice(event: dict, now: float) -> Notice:
    not_before = event.get("NotBefore") or ""
    deadline = _parse_rfc1123(not_before)
    detail = f"{event.get('EventType')} {event.get('EventId')} not before {not_before or '(now)'}"
    return Notice("azure", now, now + _WINDOW_S["azure"] if deadline is None else deadline,
                  detail)


def resolve_provider(setting: str, endpoints: Mapping[str, str] | None = None) -> str | None:
    """Map a config value ("auto", "none", or a provider) to the provider to watch."""
    if setting == "none":
        return None
    if setting == "auto":
        return detect_provider(dict(endpoints) if endpoints else None)
    return _check_provider(setting)


def _check_provider(provider: str) -> str:
    if provider not in PROVIDERS:
        choices = ", ".join(PROVIDERS)
        raise ValueError(f"unknown cloud provider {provider!r}: expected one of {choices}")
    return provider


def _parse_iso_utc(value: object) -> float | None:
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _parse_rfc1123(value: str) -> float | None:
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def _secs(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"


def _text(body: bytes | str) -> str:
    return body.decode("utf-8", "replace") if isinstance(body, bytes) else body


def _snippet(body: bytes | str, limit: int = 60) -> str:
    text = " ".join(_text(body).split())
    return repr(text if len(text) <= limit else text[:limit] + "…")


# ---------------------------------------------------------------- HTTP


# Metadata services are link-local: never route them through an HTTP(S)_PROXY
# from the environment, which would send the request (and a token) elsewhere.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _request(method: str, url: str, headers: Mapping[str, str], timeout_s: float):
    """(status, body, headers) for any HTTP answer; raises OSError when there is none."""
    data = b"" if method == "PUT" else None
    req = urllib.request.Request(url, data=data, headers=dict(headers), method=method)
    try:
        with _OPENER.open(req, timeout=timeout_s) as resp:
            return resp.status, resp.read(_MAX_BODY), resp.headers
    except urllib.error.HTTPError as err:
        with err:
            return err.code, err.read(_MAX_BODY), err.headers


def _describe(err: BaseException) -> str:
    """One line for a failed request, without the traceback."""
    if isinstance(err, urllib.error.URLError) and not isinstance(err, urllib.error.HTTPError):
        err = err.reason if isinstance(err.reason, BaseException) else err
    if isinstance(err, TimeoutError):
        return "timed out"
    return str(err) or type(err).__name__


class _AwsPoller:
    """IMDSv2: a session token from a PUT, then GETs that carry it (renewed on 401).

    When no token can be had (in Docker with the default hop limit of 1 the PUT's
    answer never arrives) a tokenless IMDSv1 GET is tried; if the instance still
    allows v1 the poller keeps using it rather than paying a PUT timeout per poll.
    """

    def __init__(self, base: str, timeout_s: float) -> None:
        self.base, self.timeout_s = base.rstrip("/"), timeout_s
        self._token: str | None = None
        self._token_expires = 0.0
        self._tokenless = False

    def poll(self, now: float) -> Notice | None:
        status, body = self._get_action()
        if status == 401:  # the token lapsed, IMDS restarted, or v1 was turned off: retry once
            self._token, self._tokenless = None, False
            status, body = self._get_action()
        return parse_aws_instance_action(status, body, now)

    def _get_action(self) -> tuple[int, bytes]:
        url = self.base + AWS_ACTION_PATH
        if self._tokenless:
            return _request("GET", url, {}, self.timeout_s)[:2]
        try:
            headers = {"X-aws-ec2-metadata-token": self._session_token()}
        except MetadataError as token_error:
            status, body, _ = _request("GET", url, {}, self.timeout_s)
            if status == 401:  # IMDSv2 only: the token problem is the one to report
                raise token_error from None
            self._tokenless = True
            return status, body
        return _request("GET", url, headers, self.timeout_s)[:2]

    def _session_token(self) -> str:
        if self._token is not None and time.monotonic() < self._token_expires:
            return self._token
        headers = {"X-aws-ec2-metadata-token-ttl-seconds": str(_AWS_TOKEN_TTL_S)}
        try:
            status, body, _ = _request("PUT", self.base + AWS_TOKEN_PATH, headers, self.timeout_s)
        except OSError as err:
            hint = ""
            if "timed out" in _describe(err):
                hint = ("; inside a container the token needs a metadata hop limit of 2 "
                        "(aws ec2 modify-instance-metadata-options "
                        "--http-put-response-hop-limit 2) or host networking")
            raise MetadataError(f"IMDSv2 token request failed: {_describe(err)}{hint}") from None
        if status != 200 or not body:
            raise MetadataError(f"IMDSv2 token request returned HTTP {status}")
        self._token = _text(body).strip()
        self._token_expires = time.monotonic() + _AWS_TOKEN_TTL_S - 60
        return self._token


class _GcpPoller:
    def __init__(self, base: str, timeout_s: float) -> None:
        self.url, self.timeout_s = base.rstrip("/") + GCP_PREEMPTED_PATH, timeout_s

    def poll(self, now: float) -> Notice | None:
        status, body, _ = _request("GET", self.url, {"Metadata-Flavor": "Google"}, self.timeout_s)
        return parse_gcp_preempted(status, body, now)


class _AzurePoller:
    def __init__(self, base: str, timeout_s: float) -> None:
        self.url, self.timeout_s = base.rstrip("/") + AZURE_EVENTS_PATH, timeout_s
        self._answered = False

    def poll(self, now: float) -> Notice | None:
        timeout = self.timeout_s if self._answered else max(self.timeout_s,
                                                             _AZURE_FIRST_CALL_TIMEOUT_S)
        status, body, _ = _request("GET", self.url, {"Metadata": "true"}, timeout)
        self._answered = True
        return parse_azure_scheduled_events(status, body, now)


_POLLERS = {"aws": _AwsPoller, "gcp": _GcpPoller, "azure": _AzurePoller}


# ---------------------------------------------------------------- detection


def detect_provider(endpoints: dict[str, str] | None = None, timeout_s: float = 0.3) -> str | None:
    """Which cloud's metadata service answers here; None on a laptop.

    ``endpoints`` maps provider → base URL and limits the probe to those
    providers (None: all of them at their real addresses). The probes run in
    parallel and the whole call is bounded by about twice ``timeout_s``, DNS
    included (``metadata.google.internal`` can stall in the resolver, which no
    socket timeout covers), so a laptop pays well under a second.
    """
    targets = dict(DEFAULT_ENDPOINTS) if endpoints is None else dict(endpoints)
    for provider in targets:
        _check_provider(provider)
    answers: dict[str, bool] = {}
    threads = {
        p: threading.Thread(target=_probe_into, args=(p, url.rstrip("/"), timeout_s, answers),
                            name=f"probe-{p}", daemon=True)  # daemon: a DNS stall holds no one
        for p, url in targets.items()
    }
    for thread in threads.values():
        thread.start()
    budget_end = time.monotonic() + 2 * timeout_s + 0.1
    for provider in PROVIDERS:  # a fixed order, so the answer is deterministic
        if provider in threads:
            threads[provider].join(max(0.0, budget_end - time.monotonic()))
            if answers.get(provider):
                return provider
    return None


def _probe_into(provider: str, base: str, timeout_s: float, answers: dict[str, bool]) -> None:
    try:
        answers[provider] = _PROBES[provider](base, timeout_s)
    except Exception:  # noqa: BLE001 — refused, timed out, unresolvable: not this cloud
        answers[provider] = False


def _probe_aws(base: str, timeout_s: float) -> bool:
    """An instance id (``i-…``) read with an IMDSv2 token, or the 401 of IMDSv2-only.

    The 401 fallback matters in Docker: with the default hop limit of 1 the token
    PUT's answer never reaches the container, but a bare GET's does. Checking the
    id's shape keeps a server that answers 200 to everything from passing as AWS.
    """
    headers = {}
    try:
        status, body, _ = _request("PUT", base + AWS_TOKEN_PATH,
                                   {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, timeout_s)
        if status == 200 and body.strip():
            headers["X-aws-ec2-metadata-token"] = _text(body).strip()
    except (OSError, http.client.HTTPException):
        pass
    status, body, _ = _request("GET", base + AWS_PROBE_PATH, headers, timeout_s)
    return status == 401 or (status == 200 and _text(body).startswith("i-"))


def _probe_gcp(base: str, timeout_s: float) -> bool:
    """GCP stamps every metadata answer with ``Metadata-Flavor: Google``; a captive
    portal that resolves every name does not."""
    status, _, headers = _request("GET", base + "/computeMetadata/v1/",
                                  {"Metadata-Flavor": "Google"}, timeout_s)
    return status == 200 and headers.get("Metadata-Flavor", "") == "Google"


def _probe_azure(base: str, timeout_s: float) -> bool:
    """Azure IMDS answers ``/metadata/instance`` with a JSON document holding ``compute``."""
    status, body, _ = _request("GET", base + AZURE_PROBE_PATH, {"Metadata": "true"}, timeout_s)
    if status != 200:
        return False
    try:
        doc = json.loads(_text(body))
    except ValueError:
        return False
    return isinstance(doc, dict) and "compute" in doc


_PROBES = {"aws": _probe_aws, "gcp": _probe_gcp, "azure": _probe_azure}


# ---------------------------------------------------------------- the watcher


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
        self.provider = _check_provider(provider)
        self.endpoint = (endpoint or DEFAULT_ENDPOINTS[provider]).rstrip("/")
        self.interval_s = interval_s
        self.notice: Notice | None = None
        self._on_notice = on_notice
        self._log = log
        self._poller = _POLLERS[provider](self.endpoint, timeout_s)
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
        name = _NAMES[self.provider]
        self._log(f"preemption: watching {name} spot notices at {self.endpoint} "
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
            self._log(f"preemption: {_NAMES[self.provider]} metadata service answers again "
                      f"after {failed} failed poll(s)")
        return notice

    def _report_error(self, err: Exception) -> None:
        skipped = self._throttle.on_error(time.monotonic())
        if skipped is None:
            return
        more = f" ({skipped} more since the last report)" if skipped else ""
        reason = str(err) if isinstance(err, MetadataError) else _describe(err)
        self._log(f"preemption: cannot read the {_NAMES[self.provider]} spot notice from "
                  f"{self.endpoint}: {reason}; retrying every {self.interval_s:g} s{more}")

    def _fire(self, notice: Notice) -> None:
        self.notice = notice
        left = time_left_s(notice, notice.received_at)
        until = "deadline unknown" if left is None else f"{left:.0f} s until the deadline"
        self._log(f"preemption: {_NAMES[self.provider]} notice ({notice.detail}): {until}")
        try:
            self._on_notice(notice)
        except Exception as err:  # noqa: BLE001 — the watcher thread must not die loudly
            self._log(f"preemption: on_notice failed: {type(err).__name__}: {err}")
            self._log(traceback.format_exc().rstrip())
