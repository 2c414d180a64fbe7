"""Where a run's files are read from: a run directory on this machine, or ``<job>/`` in
the job's store (a local directory or an S3-compatible bucket), so ``status``, ``logs``
and ``report`` work from a laptop while the job runs elsewhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode
from runner.storage.mirror import EVENTS_FILE, METRICS, STATUS

RUN_MARKERS = (STATUS, METRICS, EVENTS_FILE)


class RunFiles:
    """One run's files (status.json, metrics.jsonl, ...): the objects under ``<job>/`` in
    its store, or a run directory on this machine (a store rooted there, no prefix).
    Readers read them; :meth:`write` is for the one file a process other than the run
    writes there (:mod:`runner.monitor.cancel`)."""

    def __init__(self, label: str, store: Any, job: str | None = None) -> None:
        self.label, self.store, self.job = label, store, job

    @classmethod
    def in_dir(cls, run_dir: Path) -> RunFiles:
        """The run whose directory is ``run_dir`` (created by nothing but the run)."""
        from runner.storage.local import LocalStore

        return cls(str(run_dir), LocalStore(run_dir, create=False))

    @property
    def local_dir(self) -> Path | None:
        """The run's directory when it is on this machine's disk; None in a bucket."""
        root = getattr(self.store, "root", None)  # a LocalStore's
        if root is None:
            return None
        return Path(root) / self.job if self.job else Path(root)

    @classmethod
    def in_store(cls, store: Any, job: str) -> RunFiles:
        """The run ``job`` under the store's root."""
        return cls(f"{store.url.rstrip('/')}/{job}", store, job)

    @classmethod
    def of_job(cls, job: Any, store: Any = None) -> RunFiles:
        """Where ``job``'s run writes its files: ``<name>/`` in its bucket (``store``, or
        opened here), else its run directory."""
        if not job.storage.is_remote:
            from runner.job.layout import run_dir_of

            return cls.in_dir(run_dir_of(job))
        return cls.in_store(store if store is not None else job.storage.open(), job.name)

    @property
    def prefix(self) -> str:
        """The run's keys in its store start with this ("" in a run directory)."""
        return f"{self.job}/" if self.job else ""

    def read(self, name: str) -> bytes | None:
        return self.store.get_bytes(self.prefix + name)

    def write(self, name: str, data: bytes) -> None:
        self.store.put_bytes(self.prefix + name, data)

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
    from runner.storage import COMMAND_SETTINGS, open_store

    if "://" not in where and not Path(where).is_dir():
        raise UserError(f"{where}: no such directory; give a run directory, a local store "
                        "or an s3:// URL", exit_code=ExitCode.CONFIG)
    return open_store(where, endpoint_url or None, names=COMMAND_SETTINGS)


def open_run(where: str, job: str | None = None,
             endpoint_url: str | None = None) -> RunFiles:
    """One run: ``where`` is a run directory, a store and ``job``, a bucket run
    (``s3://bucket/prefix/JOB``), or a store holding exactly one run (``./runs`` by
    default in the CLI, as ``status`` does)."""
    if "://" not in where:
        path = Path(where)
        if job is None and is_run_dir(path):
            return RunFiles.in_dir(path)
        if job is not None and is_run_dir(path / job):
            return RunFiles.in_dir(path / job)
    if job is None:
        return _the_one_run(where, endpoint_url)
    return RunFiles.in_store(open_store_or_dir(where, endpoint_url), job)


def _the_one_run(where: str, endpoint_url: str | None) -> RunFiles:
    """No job named: ``where`` ends with the run (s3://bucket/prefix/JOB), or is a store
    with a single run in it; several runs are a one-line error that lists them."""
    if "://" in where:
        parent, _, name = where.rstrip("/").rpartition("/")
        if name and not parent.endswith(":/"):  # not s3://bucket itself
            store = open_store_or_dir(parent, endpoint_url)
            if any(store.head(f"{name}/{m}") is not None for m in RUN_MARKERS):
                return RunFiles.in_store(store, name)
    store = open_store_or_dir(where, endpoint_url)
    if "://" in where:
        names = sorted({k.split("/")[0] for k in store.list("")
                        if k.count("/") == 1 and k.split("/")[1] in RUN_MARKERS})
    else:
        names = sorted(d.name for d in Path(where).iterdir() if is_run_dir(d))
    if len(names) == 1:
        if "://" not in where:
            return RunFiles.in_dir(Path(where) / names[0])
        return RunFiles.in_store(store, names[0])
    if not names:
        raise UserError(f"no runs under {where} (no status.json or metrics.jsonl); give a "
                        "run directory, a store with runs, or s3://bucket/prefix/JOB",
                        exit_code=ExitCode.CONFIG)
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    raise UserError(f"{where} holds {len(names)} runs ({shown}); name one with --job",
                    exit_code=ExitCode.CONFIG)


def list_jobs(where: str, endpoint_url: str | None = None) -> list[str]:
    """Jobs with a heartbeat (``<job>/status.json``) in a store."""
    store = open_store_or_dir(where, endpoint_url)
    return sorted({key.split("/")[0] for key in store.list("")
                   if key.count("/") == 1 and key.endswith("/status.json")})
