"""Mirror a run's committed checkpoints to its object store, off the training thread.

The trainer commits a checkpoint locally (ten.train.checkpoint) and hands the folder to
:class:`CheckpointSync`; a background thread uploads it with the bucket's commit
protocol (runner.storage.checkpoints: files, verify, manifest last, then LATEST). So
training never waits on the network, except for the last checkpoint of a run and the
emergency one after a preemption notice or signal, which :meth:`flush` waits for.

If uploads fall behind, only the newest pending checkpoint is kept in the queue: an
older one that was never started is superseded (and logged), never uploaded late. A
failed upload is tried again after ``retry_delays`` (unless a newer checkpoint
supersedes it first): a bucket hiccup must not leave committed work only on a disk a
spot reclaim takes away until the next checkpoint, maybe hundreds of steps later.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from runner.storage import StorageError, Store
from runner.storage.checkpoints import Lease, LeaseLost, prune_remote, upload_checkpoint


class CheckpointSync:
    def __init__(self, store: Store, job_prefix: str, keep_last: int,
                 milestone_every: int | None, lease: Lease | None,
                 log: Callable[[str], None] = print,
                 on_lease_lost: Callable[[str], None] | None = None,
                 retry_delays: tuple[float, ...] = (5.0, 20.0, 60.0)) -> None:
        self.store, self.job_prefix = store, job_prefix
        self.retry_delays = retry_delays
        self.keep_last, self.milestone_every = keep_last, milestone_every
        self.lease, self.log, self.on_lease_lost = lease, log, on_lease_lost
        self._pending: Path | None = None
        self._busy = False
        self._cond = threading.Condition()
        self._closed = False
        self.error: str | None = None  # the last upload failure, if any
        self.lease_lost: str | None = None
        self.last_upload_s: float | None = None
        self.uploaded: list[str] = []
        self._thread = threading.Thread(target=self._worker, name="checkpoint-sync",
                                        daemon=True)
        self._thread.start()

    def submit(self, path: Path) -> None:
        """Queue a committed local checkpoint folder; returns at once."""
        with self._cond:
            if self._pending is not None:
                self.log(f"upload of {self._pending.name} skipped: superseded by {path.name}")
            self._pending = path
            self._cond.notify_all()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing is queued or uploading; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._pending is not None or self._busy:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def commit_now(self, path: Path, attempts: int = 3) -> bool:
        """The last or emergency checkpoint: wait for the queue, then make sure ``path``
        itself is in the bucket, retrying; True when it is."""
        self.flush()
        for attempt in range(attempts):
            if path.name in self.uploaded:
                return True
            if self.lease_lost:
                return False
            if attempt:
                time.sleep(min(2.0 ** attempt, 10.0))
            self._upload(path)
        return path.name in self.uploaded

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _worker(self) -> None:
        retries, last = 0, None
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                path, self._pending, self._busy = self._pending, None, True
            try:
                self._upload(path)
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
            failed = path.name not in self.uploaded and not self.lease_lost and \
                (path / "manifest.json").is_file()
            retries = retries + 1 if failed and path == last else int(failed)
            last = path
            if failed and retries <= len(self.retry_delays):
                self._retry_later(path, retries)

    def _retry_later(self, path: Path, retry: int) -> None:
        """Queue ``path`` again after its delay, unless a newer checkpoint (or close)
        comes first."""
        with self._cond:
            self._cond.wait_for(lambda: self._pending is not None or self._closed,
                                timeout=self.retry_delays[retry - 1])
            if self._pending is None and not self._closed:
                self.log(f"retrying the upload of {path.name} "
                         f"({retry}/{len(self.retry_delays)})")
                self._pending = path

    def _upload(self, path: Path) -> None:
        if self.lease_lost:
            return
        t0 = time.perf_counter()
        try:
            if not (path / "manifest.json").is_file():
                self.log(f"upload of {path.name} skipped: pruned locally before its turn")
                return
            remote = upload_checkpoint(self.store, self.job_prefix, path, lease=self.lease)
            self.last_upload_s = time.perf_counter() - t0
            self.uploaded.append(path.name)
            self.error = None
            self.log(f"checkpoint {path.name} committed to {self.store.url}/{remote} "
                     f"in {self.last_upload_s:.1f}s")
            dropped = prune_remote(self.store, self.job_prefix, self.keep_last,
                                   self.milestone_every, report=self.log, lease=self.lease)
            if dropped:
                self.log(f"pruned {len(dropped)} old checkpoint(s) from the bucket")
        except LeaseLost as e:
            self.lease_lost = str(e)
            self.log(f"lease lost: {e}")
            if self.on_lease_lost is not None:
                self.on_lease_lost(str(e))
        except (StorageError, OSError) as e:
            if not (path / "manifest.json").is_file():  # the pruner's first removal
                self.log(f"upload of {path.name} stopped: pruned here meanwhile (a newer "
                         "checkpoint supersedes it)")
                return
            self.error = str(e)
            self.log(f"upload of {path.name} failed: {e}; it will be tried again")
        except Exception as e:  # noqa: BLE001 - a bug, but a dead worker would hang flush()
            self.error = f"{type(e).__name__}: {e}"
            self.log(f"upload of {path.name} failed unexpectedly ({self.error}); it will be "
                     "tried again")
