"""Azure: IMDS Scheduled Events, a Preempt event at least 30 s ahead of the eviction."""

from __future__ import annotations

import json

from runner.preemption.http import request
from runner.preemption.notices import MetadataError, Notice, rfc1123, snippet, text_of
from runner.preemption.providers import SpotProvider

WINDOW_S = 30.0  # Azure Spot: "minimum of 30 seconds" before a Preempt event's NotBefore
EVENTS_PATH = "/metadata/scheduledevents?api-version=2020-07-01"
PROBE_PATH = "/metadata/instance?api-version=2021-02-01"
# Azure enables Scheduled Events on the first request and documents that this
# first answer can take up to two minutes; later ones are immediate.
_FIRST_CALL_TIMEOUT_S = 120.0

# Event types that mean "this VM is going away": Preempt is the spot eviction,
# Terminate a deletion (scale-in, user delete). Reboot, Redeploy and Freeze are
# maintenance the VM comes back from, so they trigger nothing here.
AZURE_NOTICE_EVENTS = frozenset({"Preempt", "Terminate"})


def parse_azure_scheduled_events(status: int, body: bytes | str, now: float) -> Notice | None:
    """Scheduled Events: the earliest Preempt/Terminate event, or None.

    ``{"DocumentIncarnation": n, "Events": [{"EventId", "EventType", "NotBefore":
    RFC 1123 date or "" once started, ...}]}``. Unlike AWS the document is always
    there, so one that cannot be read is an error (retried), not a notice.
    """
    if status != 200:
        raise MetadataError(f"Azure scheduledevents returned HTTP {status}")
    try:
        doc = json.loads(text_of(body))
    except ValueError:
        raise MetadataError(f"Azure scheduledevents returned {snippet(body)}") from None
    events = doc.get("Events") if isinstance(doc, dict) else None
    if not isinstance(events, list):
        raise MetadataError(f"Azure scheduledevents has no Events list: {snippet(body)}")
    notices = [_notice(e, now) for e in events
               if isinstance(e, dict) and e.get("EventType") in AZURE_NOTICE_EVENTS]
    if not notices:
        return None
    return min(notices, key=lambda n: n.deadline)


def _notice(event: dict, now: float) -> Notice:
    not_before = event.get("NotBefore") or ""
    deadline = rfc1123(not_before)
    detail = f"{event.get('EventType')} {event.get('EventId')} not before {not_before or '(now)'}"
    return Notice("azure", now, now + WINDOW_S if deadline is None else deadline, detail)


class AzurePoller:
    def __init__(self, base: str, timeout_s: float) -> None:
        self.url, self.timeout_s = base.rstrip("/") + EVENTS_PATH, timeout_s
        self._answered = False

    def poll(self, now: float) -> Notice | None:
        timeout = self.timeout_s if self._answered else max(self.timeout_s,
                                                             _FIRST_CALL_TIMEOUT_S)
        status, body, _ = request("GET", self.url, {"Metadata": "true"}, timeout)
        self._answered = True
        return parse_azure_scheduled_events(status, body, now)


def probe(base: str, timeout_s: float) -> bool:
    """Azure IMDS answers ``/metadata/instance`` with a JSON document holding ``compute``."""
    status, body, _ = request("GET", base + PROBE_PATH, {"Metadata": "true"}, timeout_s)
    if status != 200:
        return False
    try:
        doc = json.loads(text_of(body))
    except ValueError:
        return False
    return isinstance(doc, dict) and "compute" in doc


PROVIDER = SpotProvider("azure", title="Azure", window_s=WINDOW_S,
                        endpoint="http://169.254.169.254", probe=probe, poller=AzurePoller,
                        order=3)
