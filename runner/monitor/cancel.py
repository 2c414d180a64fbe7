"""A cancel that the run can tell from a preemption.

``ten-runner cancel`` stops an attempt the way a preemption does (SIGTERM, or its machine
terminated), so just before it tears the attempt down the controller writes
``cancel.json`` beside the run's status. The run, ending on that signal, finds it and
says "cancelled", not "preempted": in its last heartbeat and its stop event, and so in
``status``, the report and the cost summary (a cancel is the user's stop, not an
interruption). A mark older than the run's session belongs to an earlier submission of
the same job and is not this session's.
"""

from __future__ import annotations

import json
import time
from typing import Any

MARK = "cancel.json"


def announce(files: Any, job_id: str, now: float | None = None) -> None:
    """Mark the run in ``files`` (a :class:`runner.monitor.source.RunFiles`) cancelled by
    submitted job ``job_id``: call before the attempt gets its stop."""
    mark = {"job_id": job_id, "time": time.time() if now is None else now}
    files.write(MARK, json.dumps(mark).encode())


def cancelled_since(files: Any, started: float) -> bool:
    """Whether the run was marked cancelled at or after ``started`` (this session's start,
    on the run's clock; the controller's may differ by the machines' skew)."""
    mark = files.read_json(MARK)
    when = mark.get("time") if mark else None
    return isinstance(when, int | float) and not isinstance(when, bool) and when >= started
