"""Spot-preemption notices as data: the parsers of the three metadata services'
answers and the deadline maths. Pure functions, tested from tables; the HTTP calls are
in :mod:`runner.preemption.metadata`."""

from __future__ import annotations

import dataclasses
import json
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

PROVIDERS = ("aws", "gcp", "azure")

# The documented notice each provider gives: AWS "two minutes", GCP "30 seconds"
# (the preempted flag is set when the ACPI soft-off starts), Azure Spot "minimum of
# 30 seconds" before a Preempt event's NotBefore.
_WINDOW_S = {"aws": 120.0, "gcp": 30.0, "azure": 30.0}
_NAMES = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}

# Azure event types that mean "this VM is going away": Preempt is the spot
# eviction, Terminate a deletion (scale-in, user delete). Reboot, Redeploy and
# Freeze are maintenance the VM comes back from, so they trigger nothing here.
AZURE_NOTICE_EVENTS = frozenset({"Preempt", "Terminate"})


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


_AWS_ACTIONS = ("terminate", "stop", "hibernate")


def parse_aws_instance_action(status: int, body: bytes | str, now: float) -> Notice | None:
    """IMDS ``spot/instance-action``: 404 while nothing is scheduled, 200 once it is.

    The body is ``{"action": "terminate"|"stop"|"hibernate", "time": ISO-8601 UTC}``.
    Any of the three actions ends the process, so all are notices; an unreadable time
    gets the documented two minutes as deadline. A 200 with anything else (a captive
    portal's or proxy's page, bad JSON) is not a notice but a MetadataError, which the
    watcher reports and polls past: taken as a notice, it stopped every attempt of a
    job after one step, forever.
    """
    if status == 404:
        return None
    if status != 200:
        raise MetadataError(f"AWS spot/instance-action returned HTTP {status}")
    try:
        doc = json.loads(_text(body))
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or doc.get("action") not in _AWS_ACTIONS:
        raise MetadataError(f"AWS spot/instance-action answered HTTP 200 with something "
                            f"that is not an instance-action ({_snippet(body)}); is a proxy "
                            "answering for the metadata service?")
    fallback = now + _WINDOW_S["aws"]
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
