"""Job files in the bucket, for the CLI: ``ten-runner run s3://bucket/runs/JOB/submitted/
ID.yaml`` is how ``submit --to aws`` hands an instance its job. Reading one needs the
storage layer, which loading a job does not import: the CLI passes :func:`fetch_job_file`
to ``runner.job.load_job`` (:func:`load_any` does both).
"""

from __future__ import annotations

import os
from typing import Any

from runner.job import Job, load_job


def fetch_job_file(url: str) -> bytes | None:
    """The bytes of ``s3://bucket/key.yaml`` (None: no such object); ValueError, one line,
    when the URL is malformed or the bucket cannot be read. The endpoint comes from
    AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL (a job's own endpoint_url is inside the file),
    credentials from the AWS chain."""
    from runner.storage import StorageError, StoreURL, open_store

    parent, _, key = url.rpartition("/")
    # StoreURL.parse raises its own line (a ValueError) for a malformed bucket or prefix
    if "/" not in url[len("s3://"):] or not key or not StoreURL.parse(parent).is_remote:
        raise ValueError("expected s3://bucket/path/job.yaml")
    try:
        return open_store(parent).get_bytes(key)
    except StorageError as e:
        raise ValueError(f"cannot fetch: {e}") from None


def load_any(source: str | os.PathLike[str], **kwargs: Any) -> Job:
    """``runner.job.load_job`` for a local path or an ``s3://`` URL."""
    return load_job(source, fetch=fetch_job_file, **kwargs)
