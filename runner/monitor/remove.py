"""Removing a run: every file of one run, in its run directory or under ``<job>/`` in
its store (checkpoints, metrics, logs, status, the job's copy), and nothing else (the
prepared-data cache and other runs stay). A run whose heartbeat says it is training is
refused: removing the files under a live run would leave it writing into nothing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode


@dataclass(frozen=True)
class Contents:
    where: str
    files: int
    size: int  # bytes


def contents(run: Any) -> Contents:
    """What removing ``run`` (a :class:`runner.monitor.source.RunFiles`) would remove."""
    keys = run.store.list(run.prefix)
    size = sum(info.size for info in map(run.store.head, keys) if info is not None)
    return Contents(run.label, len(keys), size)


def refuse_if_live(run: Any, now: float | None = None) -> None:
    """A one-line UserError when ``run``'s heartbeat says it is training now (a running
    state whose last beat is not stale)."""
    from runner.monitor.status import is_stale, read_status

    status = read_status(run)
    now = time.time() if now is None else now
    if status and status.get("state") == "running" and not is_stale(status, now):
        age = max(0, int(now - float(status.get("time") or now)))
        raise UserError(f"{run.label} is training (its heartbeat is {age} s old, step "
                        f"{status.get('step', '?')}): cancel or stop it first, or remove "
                        "it with --force", exit_code=ExitCode.CONFIG)


def remove(run: Any) -> None:
    """Remove every file of ``run`` (what :func:`contents` counted)."""
    run.store.delete_folder(run.prefix)
