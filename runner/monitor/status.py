"""``ten-runner status``: the heartbeats of one job or of every job in a store, as a table
that says "stale" when a heartbeat is old (the machine is gone or the runner hung)."""

from __future__ import annotations

import time
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode
from runner.monitor.source import RunFiles, list_jobs, open_run
from runner.storage.mirror import EVENTS_FILE, METRICS, STATUS
from ten.text import clock, duration, table

STALE_MIN_S = 120.0  # a heartbeat is stale past max(3 x its period, this)


def read_status(run: RunFiles) -> dict[str, Any] | None:
    """A run's status.json; for a run without one (no heartbeat ran), a status rebuilt
    from its metrics, marked state "unknown"; None when there is neither."""
    status = run.read_json(STATUS)
    if status is not None:
        return status
    records = run.read_jsonl(METRICS)
    if not records:
        return None
    from runner.monitor.heartbeat import build_status

    return build_status(run.job or run.label, records, run.read_jsonl(EVENTS_FILE), [],
                        records[-1].get("time", 0.0), state="unknown")


def read_statuses(store_or_path: str, job: str | None = None,
                  endpoint_url: str | None = None) -> list[dict[str, Any]]:
    """Statuses of ``job``, of the run directory ``store_or_path``, or of every job with
    a heartbeat in the store. A named job without any status is a one-line UserError."""
    from runner.monitor.source import is_run_dir

    if job is not None or ("://" not in store_or_path and is_run_dir(_path(store_or_path))):
        run = open_run(store_or_path, job, endpoint_url)
        status = read_status(run)
        if status is None:
            raise UserError(f"no status for {run.label}: the job has not started yet or "
                            "ran without a heartbeat", exit_code=ExitCode.CONFIG)
        status.setdefault("job", job or run.label)
        return [status]
    out = []
    for name in list_jobs(store_or_path, endpoint_url):
        status = read_status(open_run(store_or_path, name, endpoint_url))
        if status is not None:
            status.setdefault("job", name)
            out.append(status)
    return out


def is_stale(status: dict[str, Any], now: float) -> bool:
    """A running job whose heartbeat is older than 3 periods (at least 120 s)."""
    if status.get("state") != "running":
        return False
    period = float(status.get("period_s") or 30.0)
    return now - float(status.get("time") or 0.0) > max(3 * period, STALE_MIN_S)


def status_records(statuses: list[dict[str, Any]], now: float | None = None
                   ) -> list[dict[str, Any]]:
    """``status --json``: each status as read, plus ``stale`` (:func:`is_stale`), the one
    judgement the table adds."""
    now = time.time() if now is None else now
    return [{**s, "stale": is_stale(s, now)} for s in statuses]


def format_status_table(statuses: list[dict[str, Any]], now: float | None = None) -> str:
    """A fixed-width table, one row per run, then each run's diagnoses."""
    now = time.time() if now is None else now
    if not statuses:
        return "no jobs with a heartbeat"
    header = ("JOB", "STATE", "STEP", "LOSS", "TOK/S", "MFU", "ETA", "COST", "AGE", "GPU")
    rows = []
    notes = []
    for s in statuses:
        state = "stale" if is_stale(s, now) else str(s.get("state", "?"))
        total = s.get("total_steps")
        step = f"{s.get('step', 0)}/{total}" if total else str(s.get("step", 0))
        cost = (s.get("cost") or {}).get("cost_usd")
        rows.append((
            str(s.get("job", "?")), state, step, _num(s.get("loss"), "{:.4f}"),
            _num(s.get("tokens_per_s"), "{:,.0f}"),
            _num(None if s.get("mfu") is None else 100 * s["mfu"], "{:.1f}%"),
            "-" if s.get("eta_s") is None or state != "running" else clock(s["eta_s"]),
            _num(cost, "${:,.2f}"), duration(now - float(s.get("time") or now)),
            s.get("gpu_summary") or "-"))
        if state == "stale":
            notes.append(f"{s.get('job')}: stale — last heartbeat {duration(now - s['time'])} "
                         "ago; the machine may be gone or the runner hung")
        for d in s.get("diagnoses") or ():
            notes.append(f"{s.get('job')}: [{d.get('severity')}] {d.get('message')}")
    return "\n".join([table(header, rows)] + ([""] + notes if notes else []))


def _path(where: str):
    from pathlib import Path

    return Path(where)


def _num(value: Any, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)




