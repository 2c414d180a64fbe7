"""Where a job's files live on this machine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.job import Job


def run_dir_of(job: Job) -> Path:
    """Where the run lives on this machine: under the store for a local store; for a
    bucket, a working copy under the cache directory (the bucket is the truth), one per
    store: two bucket jobs of the same name in different buckets, prefixes or endpoints
    never share one, so neither resumes from the other's checkpoints."""
    if job.storage.is_remote:
        return _data_config(job).cache_path / "runs" / job.storage.key() / job.name
    return job.storage.local_path() / job.name


def _data_config(job: Job):
    from runner.job.library import data_config

    return data_config(job)
