"""Object storage for runs: one small interface (:class:`Store`), two implementations
(a local directory, an S3-compatible bucket), and on top of it the bucket layout::

    <url>/<job>/checkpoints/step-NNNNNNNN/{model.pt,...,manifest.json}
    <url>/<job>/LATEST                       "step-NNNNNNNN" (a hint)
    <url>/<job>/lease/epoch-NNNNNNNN          one per writer start (runner.storage.lease)
    <url>/<job>/{status.json,run.log,...}     the run's files (runner.storage.mirror)
    <url>/datasets/<fingerprint>/...          prepared data cache (runner.storage.datasets)

The package holds everything that touches a bucket: the interface (:mod:`.base`,
:mod:`.local`, :mod:`.s3`), the commit protocol (:mod:`.checkpoints`), the writer lease
(:mod:`.lease`), retention, the restore at a run's start (:mod:`.restore`), background
uploads (:mod:`.sync`), the run's files beside its checkpoints (:mod:`.mirror`),
prepared data shared through the bucket (:mod:`.datasets`, :mod:`.datacache`), job files
in it (:mod:`.jobfile`) and removing a run (:mod:`.remove`).

A run uploads in three lanes, each off the training thread and none waiting behind
another: checkpoints (:mod:`.sync`: the newest only, retried, and the one upload a run
waits for before it exits), the run's files (:mod:`.mirror`, from the heartbeat's thread:
a status every beat, which a multi-gigabyte checkpoint in the same queue would hold back
until the run looked dead) and prepared data (:mod:`.datacache`: best effort, cut short
by the end of the process and then simply never committed).

Importing this package does not import boto3 (the CLI stays fast); :func:`open_store`
does when given an ``s3://`` URL.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from runner.storage.base import (
    COMMAND_SETTINGS,
    JOB_SETTINGS,
    ObjectInfo,
    SettingNames,
    StorageError,
    Store,
)
from runner.storage.url import StoreURL, StoreURLError

__all__ = ["COMMAND_SETTINGS", "DEFAULT_STORE", "ObjectInfo", "SettingNames", "StorageError",
           "Store", "StoreURL", "open_store", "run_by_name"]

DEFAULT_STORE = "./runs"  # a job's storage.url when it names none; the CLI's default TARGET


def run_by_name(name: str) -> Path | None:
    """The run called ``name`` in :data:`DEFAULT_STORE` (``pydocs-txt`` ->
    ``./runs/pydocs-txt``), when there is one: how commands read a bare run name."""
    folder = Path(DEFAULT_STORE) / name
    return folder if folder.is_dir() else None


def open_store(url: str, endpoint_url: str | None = None, region: str | None = None, *,
               names: SettingNames = JOB_SETTINGS, **options: Any) -> Store:
    """A store for ``url``: ``./runs``, ``/abs/path``, ``file:///abs`` or
    ``s3://bucket/prefix``. ``options`` go to :class:`runner.storage.s3.S3Store`
    (addressing_style, max_attempts, timeouts, part_size, conditional_writes, check).
    ``names``: what errors call the settings to fix (a job's keys by default).

    For S3 the bucket is checked once (a one-key listing) so wrong credentials, a missing
    bucket or an unreachable endpoint fail here with a one-line :class:`StorageError`.
    """
    try:
        where = StoreURL.parse(url)
    except StoreURLError as e:
        raise StorageError(f"{names.url}: {e}") from None
    if where.is_remote:
        from runner.storage.s3 import S3Store  # boto3 only when needed

        return S3Store(where.bucket, where.prefix, endpoint_url=endpoint_url, region=region,
                       names=names, **options)
    if endpoint_url:
        raise StorageError(f"{names.endpoint_url} applies to s3:// URLs, not {url!r}")
    from runner.storage.local import LocalStore

    return LocalStore(where.path, url=url if url.lower().startswith("file://") else None)
