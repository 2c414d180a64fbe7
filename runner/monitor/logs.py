"""``ten-runner logs JOB [-f]``: the run log from the run directory or the job's store
(the heartbeat uploads it every few beats), optionally followed."""

from __future__ import annotations

import time
from collections.abc import Callable

from runner.errors import UserError
from runner.exit_codes import ExitCode
from runner.monitor.source import RunFiles, open_run
from runner.storage.mirror import RUN_LOG


def read_log(store_or_path: str, job: str | None = None,
             endpoint_url: str | None = None) -> str:
    """The whole run.log; a one-line UserError when there is none yet."""
    run = open_run(store_or_path, job, endpoint_url)
    text = run.read_text(RUN_LOG)
    if text is None:
        raise UserError(f"no run.log for {run.label} yet", exit_code=ExitCode.CONFIG)
    return text


def follow_log(run: RunFiles, emit: Callable[[str], None], interval_s: float = 10.0,
               stop: Callable[[], bool] | None = None, sleep=time.sleep) -> None:
    """Emit run.log, then whatever is appended, polling every ``interval_s`` until
    ``stop()`` is true (Ctrl-C in the CLI). A log that shrank (a new machine
    started a fresh one) is emitted again from its start."""
    seen = 0
    while True:
        text = run.read_text(RUN_LOG) or ""
        if len(text) < seen:
            seen = 0
        if len(text) > seen:
            emit(text[seen:])
            seen = len(text)
        if stop is not None and stop():
            return
        sleep(interval_s)
