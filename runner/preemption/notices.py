"""A preemption notice as data, and the reading of the services' answers every
provider shares (text, dates). The providers' parsers are in
:mod:`runner.preemption.providers`, the HTTP in :mod:`runner.preemption.http`."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime


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
    """The metadata service answered something this package cannot read (one line)."""


def time_left_s(notice: Notice, now: float | None = None) -> float | None:
    """Seconds from ``now`` to the notice's deadline (negative once it has passed)."""
    if notice.deadline is None:
        return None
    return notice.deadline - (time.time() if now is None else now)


def iso_utc(value: object) -> float | None:
    """Epoch seconds of an ISO-8601 time (UTC when it names no zone); None if unreadable."""
    if not isinstance(value, str):
        return None
    try:
        when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def rfc1123(value: str) -> float | None:
    """Epoch seconds of an RFC 1123 date (``Fri, 15 Jan 2027 08:00:25 GMT``); None if
    unreadable."""
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp()


def text_of(body: bytes | str) -> str:
    return body.decode("utf-8", "replace") if isinstance(body, bytes) else body


def snippet(body: bytes | str, limit: int = 60) -> str:
    """The start of an answer, on one line, quoted: for an error message."""
    text = " ".join(text_of(body).split())
    return repr(text if len(text) <= limit else text[:limit] + "…")
