"""A run's files in its bucket, beside its checkpoints: what ``ten-runner status``,
``logs`` and ``report`` read from a laptop while the job runs elsewhere, and the history
a resumed job brings back to its new machine.

The heartbeat (:mod:`runner.monitor.heartbeat`) calls :meth:`RunMirror.beat` from its
thread: ``status.json`` every beat, ``events.jsonl`` when it changed, and every few
beats (and at the end) the run's log, its GPU samples, ``metrics.jsonl`` and the
TensorBoard event files that grew. Whole small files, not appends: a bucket has none.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

# The run's files, by name (the run directory's and the bucket copy's alike).
STATUS = "status.json"
EVENTS_FILE = "events.jsonl"  # runner.monitor.events: its records' kinds
GPU = "gpu.jsonl"
METRICS = "metrics.jsonl"
RUN_LOG = "run.log"
TENSORBOARD = "tensorboard"  # ten.train.metrics.MetricsWriter's event files, under the run dir


class RunMirror:
    """``run_dir``'s files under ``<job>/`` in ``store``. ``lock`` is the one the run's
    writers of events.jsonl and run.log hold while they write."""

    def __init__(self, store: Any, job: str, run_dir: Path, lock: threading.Lock,
                 files_every: int = 4) -> None:
        self.store, self.job, self.run_dir, self.lock = store, job.strip("/"), run_dir, lock
        self.files_every = max(1, files_every)
        self._beats = 0
        self._tb_sizes: dict[str, int] = {}  # tensorboard file -> size last uploaded

    def adopt_history(self) -> None:
        """Bring metrics.jsonl, events.jsonl and gpu.jsonl from the bucket when it holds
        more than this machine, and put the earlier sessions' log before this one's."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in (METRICS, EVENTS_FILE, GPU):
            data = self.store.get_bytes(self._key(name))
            local = self.run_dir / name
            if data and (not local.exists() or local.stat().st_size < len(data)):
                local.write_bytes(data)
        remote = self.store.get_bytes(self._key(RUN_LOG))
        if remote:  # this session has begun its log already: the earlier ones go first
            path = self.run_dir / RUN_LOG
            with self.lock:
                local = path.read_bytes() if path.exists() else b""
                merged = merged_log(local, remote)
                if merged != local:
                    path.write_bytes(merged)  # the same file: the log's appends follow

    def last_status(self) -> bytes | None:
        """The status the bucket holds: the previous session's, before this one beats."""
        return self.store.get_bytes(self._key(STATUS))

    def beat(self, status: bytes, events: bytes | None, every_file: bool = False) -> None:
        """Upload this beat's status (and events.jsonl, when given: it changed); the other
        files every ``files_every`` beats, or now with ``every_file``."""
        self.store.put_bytes(self._key(STATUS), status)
        if events is not None:
            self.store.put_bytes(self._key(EVENTS_FILE), events)
        self._beats += 1
        if every_file or self._beats % self.files_every == 0:
            for name in (RUN_LOG, GPU, METRICS):
                self._upload(name)
            self._upload_tensorboard()

    def _upload(self, name: str) -> None:
        path = self.run_dir / name
        if path.exists():
            with self.lock:
                data = path.read_bytes()
            self.store.put_bytes(self._key(name), data)

    def _upload_tensorboard(self) -> None:
        """The TensorBoard event files to ``<job>/tensorboard/<file>``: whole files, as
        metrics.jsonl (they are append-only and small), and only those that grew. A new
        machine writes new files (their names carry the host and time), so a resumed
        job's bucket keeps every life's curves."""
        root = self.run_dir / TENSORBOARD
        if not root.is_dir():
            return
        for path in sorted(root.rglob("*")):
            if not path.is_file():
                continue
            rel = path.relative_to(root).as_posix()
            data = path.read_bytes()  # bytes, not put_file: the writer may be appending
            if self._tb_sizes.get(rel) == len(data):
                continue
            self.store.put_bytes(self._key(f"{TENSORBOARD}/{rel}"), data)
            self._tb_sizes[rel] = len(data)

    def _key(self, name: str) -> str:
        return f"{self.job}/{name}" if self.job else name


def merged_log(local: bytes, remote: bytes) -> bytes:
    """The bucket's ``run.log`` (every earlier session's lines) followed by what this
    machine's has beyond the lines the two share: a new machine's first lines go after
    the history, a machine that ran the job before does not repeat what it shares."""
    shared = os.path.commonprefix([local, remote])
    shared = shared[:shared.rfind(b"\n") + 1]  # whole lines only
    return remote + (b"" if remote.endswith(b"\n") or not remote else b"\n") + \
        local[len(shared):]
