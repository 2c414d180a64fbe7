"""``ten-runner run``: turn a validated job into a training run and an exit code.

Resolves the job into the library's configs, prepares or streams the data, trains
(resuming from the newest valid checkpoint under ``<storage>/<name>/``), evaluates,
and prints the held-out perplexity and a short sample. Every way it can end maps to
one exit code (runner.exit_codes) so a supervisor knows whether to retry.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from runner.exit_codes import ExitCode
from runner.job import Job


class RunLog:
    """Lines to stderr and to ``<run>/run.log`` (structured figures go to metrics.jsonl)."""

    def __init__(self, run_dir: Path) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(run_dir / "run.log", "a", encoding="utf-8")  # noqa: SIM115

    def __call__(self, line: str) -> None:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(line, file=sys.stderr, flush=True)
        self._file.write(f"{stamp} {line}\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def data_config(job: Job):
    from ten.data import DataConfig

    d = job.data
    return DataConfig(
        dataset=d.dataset, mode=d.mode, seq_len=d.seq_len, text_field=d.text_field,
        data_files=d.data_files, vocab_size=d.tokenizer.vocab_size,
        tokenizer_type=d.tokenizer.type, tokenizer_path=d.tokenizer.path,
        byte_fallback=d.tokenizer.byte_fallback, tokenizer_sample_chars=d.tokenizer.sample_chars,
        num_proc=d.num_proc, val_fraction=d.val_fraction, shuffle=d.shuffle,
        seed=job.train.seed, cache_dir=d.cache_dir, max_documents=d.max_documents)


def train_config(job: Job):
    from ten.trainer import TrainConfig

    t = job.train
    return TrainConfig(
        max_steps=t.max_steps, max_tokens=t.max_tokens, batch_size=t.batch_size,
        grad_accum=t.grad_accum, lr=t.lr, min_lr_ratio=t.min_lr_ratio,
        warmup_steps=t.warmup_steps, schedule=t.schedule, weight_decay=t.weight_decay,
        betas=tuple(t.betas), precision=t.precision, optimizer=t.optimizer, compile=t.compile,
        grad_clip=t.grad_clip, eval_every=t.eval_every, eval_batches=t.eval_batches,
        log_every=t.log_every, seed=t.seed, device=t.device, num_workers=job.data.num_workers,
        checkpoint_every=job.checkpoint.every_steps, keep_last=job.checkpoint.keep_last)


def run_dir_of(job: Job) -> Path:
    """Where the run lives on this machine: under the store for a local store; for a
    bucket, a working copy under the cache directory (the bucket is the truth)."""
    if job.storage.is_remote:
        return data_config(job).cache_path / "runs" / job.name
    return job.storage.local_path() / job.name


def connect_store(job: Job, run_dir: Path, log: RunLog):
    """Open the job's bucket, claim the writer lease, and bring the newest committed
    checkpoint from the bucket when it is newer than what this machine has."""
    import os
    import socket

    from runner.storage import open_store
    from runner.storage.checkpoints import Lease, latest_committed, restore_latest
    from ten import checkpoint as ckpt

    store = open_store(job.storage.url, job.storage.endpoint_url or None,
                       job.storage.region or None)
    lease = Lease.acquire(store, job.name, owner=f"{socket.gethostname()}:{os.getpid()}")
    log(f"store {store.url}: writer lease epoch {lease.epoch}")
    local = ckpt.latest_valid(run_dir / "checkpoints", log)
    remote = latest_committed(store, job.name, log)
    if remote is not None and (local is None or local.step < remote):
        t0 = time.perf_counter()
        step = restore_latest(store, job.name, run_dir / "checkpoints", report=log)
        log(f"restored step {step} from {store.url} in {time.perf_counter() - t0:.1f}s")
    return store, lease


def run_job(job: Job, sample_prompt: str | None = "The") -> ExitCode:
    """Run a job to its end; returns the process exit code."""
    from runner.storage import StorageError
    from ten.data import DataError
    from ten.presets import model_config
    from ten.trainer import Outcome, ResumeError, Trainer

    run_dir = run_dir_of(job)
    log = RunLog(run_dir)
    sync = None
    try:
        log(f"job {job.name}: {job.model.arch}/{job.model.preset}, data {job.data.dataset} "
            f"({job.data.mode}), run dir {run_dir}")
        store = lease = None
        if job.storage.is_remote:
            try:
                store, lease = connect_store(job, run_dir, log)
            except StorageError as e:
                log(f"storage error: {e}")
                return ExitCode.STORAGE
        try:
            cache = BucketDataCache(store, log) if store is not None else None
            data = _open_data(job, log, cache)
            mcfg = model_config(job.model.arch, job.model.preset, **{
                **job.model.overrides, "vocab_size": data.tokenizer.vocab_size,
                "seq_len": job.data.seq_len})
        except DataError as e:
            log(f"data error: {e}")
            return ExitCode.DATA
        shutil.copyfile(data.tokenizer.path, run_dir / "tokenizer.model")
        resolved = job.redacted_dict()
        (run_dir / "job.json").write_text(json.dumps(resolved, indent=1, default=str))
        identity = {
            "arch": job.model.arch,
            "model": dataclasses.asdict(mcfg),
            "data": {"fingerprint": data.fingerprint, "seq_len": job.data.seq_len,
                     "tokenizer": data.tokenizer.fingerprint, "mode": job.data.mode},
            "batch_size": job.train.batch_size,
        }
        trainer = Trainer(mcfg, data, train_config(job), run_dir, identity, resolved, log=log)
        if store is not None:
            from runner.sync import CheckpointSync

            store.put_bytes(f"{job.name}/job.json", json.dumps(resolved, indent=1,
                                                               default=str).encode())
            sync = CheckpointSync(store, job.name, job.checkpoint.keep_last,
                                  job.checkpoint.milestone_every, lease, log,
                                  on_lease_lost=trainer.stop.request,
                                  sidecars=(run_dir / "metrics.jsonl", run_dir / "run.log"))
        watcher = start_notice_watcher(job, trainer, log)
        commits: list[tuple[Path, float, float]] = []  # (path, seconds to save, when)

        warned: list[bool] = []

        def on_commit(path: Path, seconds: float) -> None:
            commits.append((path, seconds, time.time()))
            if sync is not None:
                sync.submit(path)
            # Once a save (and, with a bucket, an upload) has been measured: would an
            # emergency checkpoint fit the notice window?
            upload_s = 0.0 if sync is None else sync.last_upload_s
            if watcher is not None and upload_s is not None and not warned:
                from runner.preemption import startup_warning

                warned.append(True)
                warning = startup_warning(watcher.provider, seconds + upload_s,
                                          job.resources.notice_poll_s)
                if warning:
                    log(f"warning: {warning}")

        trainer.on_commit = on_commit
        try:
            outcome = trainer.run()
        except ResumeError as e:
            log(f"config error: {e}")
            return ExitCode.CONFIG
        except DataError as e:
            log(f"data error: {e}")
            return ExitCode.DATA
        finally:
            if watcher is not None:
                watcher.stop()
        committed_at = commits[-1][2] if commits else None
        if sync is not None:
            if not finish_uploads(sync, store, commits[-1][0] if commits else None, run_dir,
                                  log):
                return ExitCode.STORAGE
            committed_at = time.time()  # in the bucket: what survives the machine
        if watcher is not None and watcher.notice is not None and committed_at is not None:
            from runner.preemption import emergency_report

            log(emergency_report(watcher.notice, committed_at))
        if outcome is Outcome.PREEMPTED:
            return ExitCode.PREEMPTED
        if cache is not None:  # done: let the prepared data finish sharing
            for thread in cache.threads:
                thread.join(timeout=300)
        if trainer.dist.is_main:
            log(f"done: {trainer.total_steps} steps, held-out loss {trainer.final_loss:.4f}, "
                f"perplexity {_ppl(trainer.final_loss):.2f}")
            if sample_prompt:
                text = generate_text(trainer.raw_model, data.tokenizer, sample_prompt, 48,
                                     temperature=0.8, top_k=40, seed=job.train.seed)
                log(f"sample: {text!r}")
        return ExitCode.OK
    except KeyboardInterrupt:
        log("interrupted before a checkpoint could be committed")
        return ExitCode.PREEMPTED
    except StorageError as e:
        log(f"storage error: {e}")
        return ExitCode.STORAGE
    except Exception:  # noqa: BLE001 - a crash: keep the traceback, it is a bug report
        log("crash:\n" + traceback.format_exc())
        return ExitCode.CRASH
    finally:
        if sync is not None:
            sync.close()
        log.close()


def finish_uploads(sync: Any, store: Any, last: Path | None, run_dir: Path,
                   log: RunLog) -> bool:
    """Before exiting: the newest checkpoint must be committed in the bucket (waiting
    for it is the only time training waits on the network), then logs and metrics go
    along. False when the bucket does not have the newest checkpoint."""
    if last is not None and not sync.commit_now(last):
        why = sync.lease_lost or sync.error or "upload failed"
        log(f"storage error: {last.name} is committed in {run_dir} but not in {store.url}: "
            f"{why}")
        return False
    sync.upload_sidecars()
    return True


def start_notice_watcher(job: Job, trainer: Any, log: RunLog):
    """Poll the cloud's preemption notice (resources.spot_notice) and turn a notice into
    the same stop as SIGTERM: finish the step, commit a checkpoint, exit preempted —
    before the SIGTERM that follows the notice."""
    from runner.preemption import PROVIDERS, NoticeWatcher, notice_window_s, resolve_provider

    res = job.resources
    if res.spot_notice == "none" or (res.spot_notice == "auto" and not res.spot):
        return None
    endpoints = ({p: res.metadata_endpoint for p in PROVIDERS}
                 if res.metadata_endpoint else None)
    provider = resolve_provider(res.spot_notice, endpoints)
    if provider is None:
        log("no cloud metadata service answered: preemption notices are not watched")
        return None

    def on_notice(notice: Any) -> None:
        log(f"preemption notice from {provider}: {notice.detail}")
        trainer.stop.request(f"{provider} preemption notice")

    watcher = NoticeWatcher(provider, on_notice, interval_s=res.notice_poll_s,
                            endpoint=res.metadata_endpoint, log=log)
    watcher.start()
    log(f"watching for {provider} preemption notices every {res.notice_poll_s:g} s "
        f"(notice window {notice_window_s(provider):.0f} s)")
    return watcher


class BucketDataCache:
    """ten.data's PreparedCache over the job's store: ``datasets/<key>/`` (a COMMITTED
    marker written last, so two jobs preparing the same data never corrupt it).
    Publishing runs in the background: training does not wait for it, and a copy cut
    short by the end of the process is simply never committed."""

    def __init__(self, store: Any, log: RunLog) -> None:
        self.store, self.log = store, log
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
                won = upload_dataset(self.store, key, directory)
                self.log(f"{key} {'shared in' if won else 'was already in'} {self.store.url}")
            except (StorageError, OSError) as e:
                self.log(f"could not share {key}: {e}")

        thread = threading.Thread(target=upload, name=f"publish-{key[:20]}", daemon=True)
        thread.start()
        self.threads.append(thread)


def _open_data(job: Job, log: RunLog, cache: BucketDataCache | None):
    from ten.data import open_data

    t0 = time.perf_counter()
    data = open_data(data_config(job), cache=cache)
    where = data.prepared_dir or "streaming"
    log(f"data ready in {time.perf_counter() - t0:.1f}s: vocab {data.tokenizer.vocab_size}, "
        f"{where}")
    return data


def _ppl(loss: float) -> float:
    import math

    return math.exp(min(loss, 50.0))


def generate_text(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int,
                  temperature: float, top_k: int | None, seed: int) -> str:
    import torch

    device = next(model.parameters()).device
    ids = tokenizer.encode(prompt) or [tokenizer.eos_id]
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(torch.tensor([ids], device=device), max_new_tokens,
                         temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0].tolist())


def sample_run(run_dir: str | Path, prompt: str, max_new_tokens: int, temperature: float,
               top_k: int, seed: int) -> str:
    """Text generated from the newest valid checkpoint of a run directory."""
    from runner.errors import UserError
    from ten import checkpoint as ckpt
    from ten.data import Tokenizer
    from ten.trainer import load_model

    run_dir = Path(run_dir)
    found = ckpt.latest_valid(run_dir / "checkpoints", report=lambda s: print(s, file=sys.stderr))
    if found is None:
        raise UserError(f"no committed checkpoint under {run_dir / 'checkpoints'}; "
                        "run the job first (ten-runner run JOB.yaml)")
    tok_path = run_dir / "tokenizer.model"
    if not tok_path.is_file():
        raise UserError(f"{tok_path} is missing; it is written when the job starts")
    model = load_model(found.path)
    text = generate_text(model, Tokenizer(tok_path), prompt, max_new_tokens, temperature,
                         top_k, seed)
    return f"[{run_dir.name} step {found.step}] {text}"
