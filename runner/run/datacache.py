"""Prepared data through the bucket: ten.data's PreparedCache over the job's store."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from runner.job import Job
from runner.job.library import data_config
from runner.run.log import RunLog


class BucketDataCache:
    """ten.data's PreparedCache over the job's store: ``datasets/<key>/`` (a COMMITTED
    marker written last, so two jobs preparing the same data never corrupt it).
    Publishing runs in the background: training does not wait for it, and a copy cut
    short by the end of the process is simply never committed. ten.data publishes
    whatever it did not fetch, prepared here or found in the local cache; the upload
    first checks for the marker (one HEAD), so a copy already there costs nothing more."""

    def __init__(self, store: Any, log: RunLog, scrub: Any = None) -> None:
        self.store, self.log, self.scrub = store, log, scrub  # scrub: the job's
        self.threads: list[threading.Thread] = []

    def fetch(self, key: str, directory: Path) -> bool:
        from runner.storage import StorageError
        from runner.storage.datasets import download_dataset

        t0 = time.perf_counter()
        try:
            found = download_dataset(self.store, key, directory, report=self.log)
        except StorageError as e:
            self.log(f"prepared-data cache unavailable ({e}); preparing locally")
            return False
        if found:
            self.log(f"{key} downloaded from {self.store.url} in "
                     f"{time.perf_counter() - t0:.1f}s")
        return found

    def publish(self, key: str, directory: Path) -> None:
        def upload() -> None:
            from runner.storage import StorageError
            from runner.storage.datasets import upload_dataset

            try:
                if upload_dataset(self.store, key, directory, scrub=self.scrub):
                    self.log(f"{key} shared in {self.store.url}")
            except (StorageError, OSError) as e:
                self.log(f"could not share {key}: {e}")

        thread = threading.Thread(target=upload, name=f"publish-{key[:20]}", daemon=True)
        thread.start()
        self.threads.append(thread)


def open_data(job: Job, log: RunLog, cache: BucketDataCache | None,
              tokenizer: Path | None = None):
    """The job's data, prepared or streamed; ``tokenizer``: a tokenizer.model to use in
    place of the job's (a run started from a trained model's: train.init_from)."""
    import dataclasses

    from ten.data import open_data

    t0 = time.perf_counter()
    cfg = data_config(job)
    if tokenizer is not None:
        cfg = cfg.replace(tokenizer=dataclasses.replace(cfg.tokenizer, path=str(tokenizer)))
    data = open_data(cfg, cache=cache)
    if data.prepared_dir is not None:  # the cache's own folder (never a user's)
        scrub_json_files(Path(data.prepared_dir), job.scrub)
    where = f", {data.prepared_dir}" if data.prepared_dir is not None else ""
    log(f"data ready in {time.perf_counter() - t0:.1f}s: {data.describe()}; vocab "
        f"{data.tokenizer.vocab_size}{where}")
    return data


def scrub_json_files(folder: Path, scrub: Any) -> None:
    """ten.data's manifests name the dataset as the job resolved it (its prepare command,
    the source's name): rewritten with the job's ``${VAR}`` references back in place of
    secret values, so the cache on this disk keeps none (the bucket's copy is scrubbed
    on upload too). The readers use fingerprints, never these names."""
    from ten.fileio import atomic_write

    for path in folder.glob("*.json"):
        text = path.read_text(encoding="utf-8")
        clean = scrub(text)
        if clean != text:
            atomic_write(path, clean.encode())
