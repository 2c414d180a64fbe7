"""The kinds of record in a run's ``events.jsonl`` (``runner.storage.mirror.EVENTS_FILE``):
one enum, used by the heartbeat that writes them and by the readers (cost, report,
status). A str: an event's ``kind`` equals the member, and JSON holds its value."""

from __future__ import annotations

import enum


class EventKind(str, enum.Enum):
    START = "start"  # a process began the run: host, pid (a paid session starts)
    CHECKPOINT = "checkpoint"  # a checkpoint committed: step, seconds, path
    STALL = "stall"  # no training step for monitor.stall_after_s: the diagnosis
    RESUME = "resume"  # training resumed: from_step, reached_step, lost steps and tokens
    PREEMPTION_NOTICE = "preemption_notice"  # a spot notice: provider, detail
    STOP = "stop"  # the run ended: state, exit code, reason
