"""Submitted jobs on this machine: ``$TEN_RUNNER_HOME/jobs/<job id>/`` (default
``~/.ten-runner``) holds ``record.json`` (what and where, the lifecycle state, the
current attempt) and whatever the provider keeps beside it (a copy of the job YAML,
the local attempt's log). ``ten-runner status|logs|cancel JOB_ID`` read it.

Records are written atomically (temporary file + rename) so a reader never sees half a
record, and never hold secrets.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode

RECORD = "record.json"
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{0,70}$")


def home() -> Path:
    return Path(os.environ.get("TEN_RUNNER_HOME") or Path.home() / ".ten-runner").expanduser()


def new_job_id(job_name: str) -> str:
    """``<job name>-<6 hex>``: readable, unique enough, safe in paths, tags and shells."""
    return f"{job_name[:56]}-{secrets.token_hex(3)}"


def is_job_id(text: str) -> bool:
    return bool(_ID.match(text)) and (home() / "jobs" / text / RECORD).is_file()


def job_dir(job_id: str) -> Path:
    if not _ID.match(job_id):
        raise UserError(f"invalid job id {job_id!r}", exit_code=ExitCode.CONFIG)
    return home() / "jobs" / job_id


@dataclass
class JobRecord:
    job_id: str
    job_name: str
    target: str  # "local", "aws", "ssh://user@host:port"
    state: str  # a runner.provision.policy.State value
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)
    attempt: int = 0  # launches so far
    restarts: int = 0  # relaunches charged to max_restarts (crashes, not preemptions)
    preemptions: int = 0
    instance: dict[str, Any] | None = None  # runner.provision.base.Instance.to_dict()
    blocked: list[str] = field(default_factory=list)  # hosts/zones a health gate failed on
    history: list[dict[str, Any]] = field(default_factory=list)  # {time, state, reason}
    details: dict[str, Any] = field(default_factory=dict)  # provider-specific, no secrets
    exit_code: int | None = None  # the job's final exit code once it ended

    @property
    def dir(self) -> Path:
        return job_dir(self.job_id)

    def transition(self, state: str, reason: str = "") -> None:
        if state != self.state or reason:
            self.history.append({"time": time.time(), "state": state, "reason": reason})
        self.state = state

    def save(self) -> None:
        self.updated = time.time()
        self.dir.mkdir(parents=True, exist_ok=True)
        tmp = self.dir / f".{RECORD}.{os.getpid()}.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=1, sort_keys=True))
        os.replace(tmp, self.dir / RECORD)


def load_record(job_id: str) -> JobRecord:
    path = job_dir(job_id) / RECORD
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise UserError(f"no submitted job {job_id!r} under {home()}/jobs; "
                        "`ten-runner jobs` lists them", exit_code=ExitCode.CONFIG) from None
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}", exit_code=ExitCode.CONFIG) from None
    return JobRecord(**data)


def list_records() -> list[JobRecord]:
    root = home() / "jobs"
    out = []
    for path in sorted(root.glob(f"*/{RECORD}")) if root.is_dir() else []:
        try:
            out.append(JobRecord(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            continue  # a damaged record is skipped in listings; load_record names it
    return sorted(out, key=lambda r: r.created)
