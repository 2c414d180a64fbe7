"""The job's bucket at the start of a run: open it, take the writer lease, and bring the
newest committed checkpoint to this machine (rank 0), or the step rank 0 chose (the
other machines of a multi-node run). :func:`open_bucket` gives rank 0 all it writes the
bucket with, as one :class:`Bucket`."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runner.job import Job
    from runner.run.datacache import BucketDataCache
    from runner.run.log import RunLog
    from runner.storage.sync import CheckpointSync


@dataclass(frozen=True)
class Bucket:
    """A run's bucket, on the process that writes it: the store, its writer lease, the
    uploader of committed checkpoints and the prepared-data cache shared through it."""

    store: Any
    lease: Any
    sync: CheckpointSync
    data: BucketDataCache
    # A checkpoint committed on this machine that the bucket lacks (newer than its newest
    # whole step): an earlier life's last uploads never arrived. The run uploads it before
    # anything else, or a relaunch could say "done" over a bucket steps behind.
    behind: Path | None = None

    def close(self) -> None:
        self.sync.close()


def open_bucket(job: Job, run_dir: Path, log: RunLog,
                on_lease_lost: Callable[[str], None]) -> Bucket:
    """The job's bucket, its newest committed checkpoint brought here
    (:func:`connect_store`), and its uploader started; ``on_lease_lost(reason)`` when
    another run takes the lease."""
    from runner.run.datacache import BucketDataCache
    from runner.storage.sync import CheckpointSync

    store, lease, behind = connect_store(job, run_dir, log)
    sync = CheckpointSync(store, job.name, job.checkpoint.keep_last,
                          job.checkpoint.milestone_every, lease, log,
                          on_lease_lost=on_lease_lost)
    return Bucket(store, lease, sync, BucketDataCache(store, log, job.scrub), behind)


def connect_store(job: Job, run_dir: Path, log: RunLog):
    """Open the job's bucket, claim the writer lease, and bring the newest committed
    checkpoint from the bucket when it is newer than what this machine has. Returns the
    store, the lease, and the local checkpoint the bucket lacks (None when it lacks none)."""
    import socket

    from runner.storage import StorageError
    from runner.storage.checkpoints import (
        Lease,
        NoWholeCheckpoint,
        latest_committed,
        restore_latest,
    )
    from ten.train import checkpoint as ckpt

    store = job.storage.open()
    lease = Lease.acquire(store, job.name, owner=f"{socket.gethostname()}:{os.getpid()}")
    log(f"store {store.url}: writer lease epoch {lease.epoch}")
    ckpt.cleanup(run_dir / "checkpoints", log)  # puts back a step a crash left aside
    local = ckpt.latest_valid(run_dir / "checkpoints", log)
    # With nothing here, the bucket decides: restore_latest refuses to start from scratch
    # when it holds committed steps of which none is whole, where a "nothing complete"
    # from latest_committed would have let the run start over and prune them.
    remote = None if local is None else latest_committed(store, job.name, log)
    if local is not None and (remote is None or remote < local.step):
        log(f"{local.path.name} is committed here but not in {store.url} (its newest: "
            f"{'none' if remote is None else f'step {remote}'}): uploading it first")
        return store, lease, local.path
    if local is None or remote > local.step:
        t0 = time.perf_counter()
        try:
            step = restore_latest(store, job.name, run_dir / "checkpoints", report=log,
                                  usable=ckpt.load_problem)
        except NoWholeCheckpoint as e:
            raise StorageError(f"{e}; refusing to start from scratch over an existing run "
                               "(delete that folder to start over)") from None
        if step is not None:
            log(f"restored step {step} from {store.url} in {time.perf_counter() - t0:.1f}s")
    return store, lease, None


def fetch_checkpoint(job: Job, root: Path, step: int, log: RunLog) -> None:
    """On a machine other than rank 0's: make ``step`` (-1: none) the newest checkpoint
    under ``root``, from the bucket. Newer local ones are stale copies from an earlier
    life; only rank 0's choice counts, and only rank 0 holds the writer lease."""
    from runner.storage.checkpoints import download_checkpoint
    from ten.train import checkpoint as ckpt

    for stale in [s for s in ckpt.committed_steps(root) if s > step]:
        log(f"removing {ckpt.step_name(stale)}: rank 0 resumes from step {step}")
        shutil.rmtree(root / ckpt.step_name(stale))
    if step < 0:
        return
    store = job.storage.open()
    t0 = time.perf_counter()
    download_checkpoint(store, job.name, step, root)  # nothing to do if it is here
    log(f"step {step} from {store.url} is here ({time.perf_counter() - t0:.1f}s)")

