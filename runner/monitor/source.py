"""Where a run's files are read from: a run directory on this machine, or ``<job>/`` in
the job's store (a local directory or an S3-compatible bucket), so ``status``, ``logs``
and ``report`` work from a laptop while the job runs elsewhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode

RUN_MARKERS = ("status.json", "metrics.jsonl", "events.jsonl")


class RunFiles:
    """Read-only access to one run's files (status.json, metrics.jsonl, ...)."""

    def __init__(self, label: str, run_dir: Path | None = None, store: Any = None,
                 job: str | None = None) -> None:
        self.label, self.run_dir, self.store, self.job = label, run_dir, store, job

    def read(self, name: str) -> bytes | None:
        if self.run_dir is not None:
            path = self.run_dir / name
            try:
                return path.read_bytes()
            except OSError:
                return None
        return self.store.get_bytes(f"{self.job}/{name}" if self.job else name)

    def read_text(self, name: str) -> str | None:
        data = self.read(name)
        return None if data is None else data.decode("utf-8", "replace")

    def read_json(self, name: str) -> dict[str, Any] | None:
        text = self.read_text(name)
        if not text:
            return None
        try:
            value = json.loads(text)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None

    def read_jsonl(self, name: str) -> list[dict[str, Any]]:
        from runner.monitor.heartbeat import parse_jsonl

        return parse_jsonl(self.read_text(name) or "")


def is_run_dir(path: Path) -> bool:
    return path.is_dir() and any((path / m).is_file() for m in RUN_MARKERS)


def open_store_or_dir(where: str, endpoint_url: str | None = None) -> Any:
    """A Store for ``where`` (path, file:// or s3://); a missing local path is an error
    (not an empty store to create)."""
    from runner.storage import open_store

    if "://" not in where and not Path(where).is_dir():
        raise UserError(f"{where}: no such directory; give a run directory, a local store "
                        "or an s3:// URL", exit_code=ExitCode.CONFIG)
    return open_store(where, endpoint_url or None)


def open_run(where: str, job: str | None = None,
             endpoint_url: str | None = None) -> RunFiles:
    """One run: ``where`` is a run directory, or a store holding ``<job>/``."""
    if "://" not in where:
        path = Path(where)
        if job is None and is_run_dir(path):
            return RunFiles(str(path), run_dir=path)
        if job is not None and is_run_dir(path / job):
            return RunFiles(str(path / job), run_dir=path / job)
        if job is None:
            raise UserError(f"{where} is not a run directory (no status.json or "
                            "metrics.jsonl); name the job too", exit_code=ExitCode.CONFIG)
    if job is None:
        raise UserError(f"{where}: name the job to read", exit_code=ExitCode.CONFIG)
    store = open_store_or_dir(where, endpoint_url)
    return RunFiles(f"{store.url.rstrip('/')}/{job}", store=store, job=job)


def list_jobs(where: str, endpoint_url: str | None = None) -> list[str]:
    """Jobs with a heartbeat (``<job>/status.json``) in a store."""
    store = open_store_or_dir(where, endpoint_url)
    return sorted({key.split("/")[0] for key in store.list("")
                   if key.count("/") == 1 and key.endswith("/status.json")})
