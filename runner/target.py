"""What a command's RUN or TARGET names: a run directory, a store (a path or an s3://
URL), a job file, or a submitted job's id -> where the run's files are, which job, which
endpoint.

A job file (or a submitted job's copy of one) has its ``${VAR}``\\ s resolved to find the
run. From then on this process prints through the job's scrub, as a run does, and
:attr:`Target.scrub` is there for what a command writes (the report's page): the
resolved values stay out of both.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass

from runner.errors import UserError
from runner.exit_codes import ExitCode


def _unchanged(text: str) -> str:
    return text


@dataclass(frozen=True)
class Target:
    where: str  # a run directory, or a store holding ``job``
    job: str | None
    endpoint_url: str | None
    scrub: Callable[[str], str] = _unchanged

    def located(self) -> tuple[str, str | None, str | None]:
        return self.where, self.job, self.endpoint_url


def resolve_target(target: str, job: str | None, endpoint_url: str | None) -> Target:
    record = submitted_record(target)
    if record is not None:
        from runner.provision.jobs import load_job_copy

        spec = load_job_copy(record)
        job = spec.name
    elif target.endswith((".yaml", ".yml")):
        from runner.job import JobError
        from runner.job.jobfile import load_any

        try:
            spec = load_any(target, check_model=False)
        except JobError as err:
            raise UserError("\n".join(err.errors), exit_code=ExitCode.CONFIG) from None
        job = job or spec.name
    else:
        return Target(_run_named(target), job, endpoint_url)
    _print_through(spec.scrub)
    where = spec.storage.url if spec.storage.is_remote else str(spec.storage.local_path())
    return Target(where, job, endpoint_url or spec.storage.endpoint_url or None, spec.scrub)


def _run_named(target: str) -> str:
    """``target`` itself, or for a bare name that is no path here (``pydocs-txt``) the
    run of that name in the default store (``./runs/pydocs-txt``)."""
    from pathlib import Path

    from runner.storage import DEFAULT_STORE, run_by_name

    if "/" in target or ":" in target or Path(target).exists():
        return target
    found = run_by_name(target)
    if found is not None:
        return str(found)
    store = Path(DEFAULT_STORE)
    there = sorted(d.name for d in store.iterdir() if d.is_dir()) if store.is_dir() else []
    runs = f"runs there: {', '.join(there[:8])}" if there else "none there"
    raise UserError(f"{target}: no such directory, and no run named {target} in "
                    f"{DEFAULT_STORE} ({runs}); give a run directory, a store, an s3:// URL, "
                    "a job file or a job id", exit_code=ExitCode.CONFIG)


def submitted_record(target: str):
    """The record of a submitted job when ``target`` is a job id, else None."""
    from runner.provision.registry import is_job_id, load_record

    return load_record(target) if is_job_id(target) else None


def _print_through(scrub: Callable[[str], str]) -> None:
    from runner.run.log import ScrubbedStream

    sys.stdout, sys.stderr = (s if isinstance(s, ScrubbedStream) else ScrubbedStream(s, scrub)
                              for s in (sys.stdout, sys.stderr))
