"""Where a job's files live on this machine."""

from __future__ import annotations

import hashlib
import re
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
        key = store_key(job.storage.url, job.storage.endpoint_url or None)
        return _data_config(job).cache_path / "runs" / key / job.name
    return job.storage.local_path() / job.name


def store_key(url: str, endpoint_url: str | None = None) -> str:
    """A folder name for a store: its URL made path-safe (readable), and a digest of the
    URL and endpoint (distinct however the readable part collides or is cut)."""
    readable = re.sub(r"[^A-Za-z0-9._-]+", "_", url.split("://", 1)[-1]).strip("_.")[:80]
    digest = hashlib.sha256(f"{endpoint_url or ''}\n{url}".encode()).hexdigest()[:8]
    return f"{readable or 'store'}-{digest}"


def _data_config(job: Job):
    from runner.job.library import data_config

    return data_config(job)
