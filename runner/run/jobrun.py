"""``ten-runner run``: turn a validated job into a training run and an exit code.

Resolves the job into the library's configs, prepares or streams the data, trains
(resuming from the newest valid checkpoint under ``<storage>/<name>/``), evaluates,
and prints the held-out perplexity and a short sample. Every way it can end maps to
one exit code (runner.exit_codes) so a supervisor knows whether to retry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from runner.exit_codes import ExitCode
from runner.job import Job
from runner.job.layout import run_dir_of
from runner.job.library import train_config
from runner.keys import in_job_terms
from runner.run.datacache import open_data
from runner.run.failures import ThreadDiskErrors, exit_code_of
from runner.run.log import RunLog, ScrubbedStream
from runner.run.restore import Bucket, fetch_checkpoint, open_bucket
from runner.run.spot import SpotWatch
from runner.trained.sample import generate_text, ppl, shown_text
from ten.fileio import atomic_copy, atomic_write
from ten.train.stop import Interrupted, Stop


def run_job(job: Job, stop: Stop, sample_prompt: str | None = "The") -> ExitCode:
    """Run a job to its end; returns the process exit code. ``stop``: the process's one
    :class:`ten.train.stop.Stop`, installed. Under torchrun every rank runs this, and a rank's
    code is rank 0's once it ended in order (runner.launch.ranks)."""
    from runner.launch.ranks import RankGroup

    ranks = RankGroup.from_env()
    if ranks is None:
        return JobRun(job, stop, sample_prompt).run()
    ranks.started()
    return ranks.finish(JobRun(job, stop, sample_prompt, ranks).run())


def identity_of(job: Job, data: Any = None) -> dict[str, Any]:
    """What the job's checkpoints are made of: a resume with another value of any of it
    is refused (ten.train.trainstate). Without ``data``, the part known before the data is
    prepared (the model's vocabulary too, unless a given tokenizer decides it)."""
    if data is not None:
        model = dataclasses.asdict(job.model_settings(data.tokenizer.vocab_size))
    else:
        model = dataclasses.asdict(job.model_settings(job.data.tokenizer.vocab_size))
        if job.vocabulary_from is not None:
            del model["vocab_size"]  # a given tokenizer's (init_from: the source's)
    identity = {"arch": job.model.arch, "model": model,
                "data": {"seq_len": job.data.seq_len, "mode": job.data.mode},
                "batch_size": job.train.batch_size}
    if data is not None:
        identity["data"].update(fingerprint=data.fingerprint,
                                tokenizer=data.tokenizer.fingerprint)
    return identity


class JobRun:
    """One execution of a job on this machine. Every resource it opens (log, bucket,
    uploader, notice watcher, GPU sampler, heartbeat) is closed in :meth:`_close`, and
    every way it can end is one exit code."""

    def __init__(self, job: Job, stop: Stop, sample_prompt: str | None,
                 ranks: Any = None) -> None:
        self.job, self.stop, self.sample_prompt, self.ranks = job, stop, sample_prompt, ranks
        self.run_dir = run_dir_of(job)
        # Only one process of a torchrun group talks to the bucket and writes telemetry.
        rank = int(os.environ.get("RANK", "0"))
        self.is_main = rank == 0
        self.tag = "" if self.is_main else f"[rank {rank}] "
        self.log: Any = self._stderr  # until the run directory is ours (see run)
        self.bucket: Bucket | None = None  # a remote job's, on the rank that writes it
        self.sampler = self.heartbeat = None  # the main rank's monitor, from _start
        self.spot = SpotWatch()  # watching from the start of training (_trainer)
        self.on_gpu = False  # a GPU job (gated, monitored)? decided by _start
        self.commits: list[tuple[Path, float, float]] = []  # (path, save seconds, when)
        self.stop_reason: str | None = None  # SIGINT (a user's Ctrl-C), SIGTERM, a notice
        # Every resource the run opens registers its closing here as it opens, so they
        # close in reverse order, each once, however the run ends (see _close).
        self.resources = contextlib.ExitStack()
        self.exit_code = ExitCode.CRASH  # what the heartbeat's last beat reports

    def run(self) -> ExitCode:
        from runner.run.lock import RunLock

        self.stop.install()
        streams = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = (ScrubbedStream(s, self.job.scrub) for s in streams)
        code = ExitCode.CRASH
        try:
            try:
                if self.is_main:  # before anything is written: one writer per run directory
                    self.resources.callback(RunLock.acquire(self.run_dir).release)
                self.log = RunLog(self.run_dir, self.tag, scrub=self.job.scrub)
                self.resources.callback(self.log.close)
                self.resources.enter_context(ThreadDiskErrors(self.log))
                self.stop.set_phase("start-up", self.log)
                if self.is_main:
                    self._point_healthcheck()
                code = self._run()
            except Exception:
                # A library that ran our stop handler inside its own code may report the
                # stop as its own failure (sentencepiece: "tokenizer training failed:
                # Interrupted"): once a stop arrived, it is the stop that ends the run.
                self.stop.raise_if_received()
                raise
        except Interrupted as stopped:
            self.stop.handled()
            self.stop_reason = stopped.name
            code = self._interrupted(stopped)
        except KeyboardInterrupt:
            self.stop_reason = "SIGINT"
            self.log("interrupted before a checkpoint could be committed")
            code = ExitCode.PREEMPTED
        except Exception as e:  # noqa: BLE001 - every failure has its exit code
            code = exit_code_of(e, self.job, self.run_dir, self.bucket is not None, self.log,
                                self.stop.phase)
        finally:
            self._close(code)
            sys.stdout, sys.stderr = streams
        return code

    def _stderr(self, line: str) -> None:
        print(self.job.scrub(self.tag + line), file=sys.stderr, flush=True)

    def _interrupted(self, stopped: Interrupted) -> ExitCode:
        """A stop signal outside the training loop: nothing new to save; after the loop
        the committed checkpoint must still reach the bucket before the exit."""
        during = self.stop.phase
        if not self.commits:
            self.log(f"stopped by {stopped.name} during {during}: nothing to save yet; run "
                     "again to resume")
            return ExitCode.PREEMPTED
        last = self.commits[-1][0].name
        self.log(f"stopped by {stopped.name} during {during}: {last} is committed; run again "
                 "to finish")
        try:
            if not self._finish_uploads():
                return ExitCode.STORAGE
        except Interrupted:
            self.log(f"stopped again: {last} may not be in the bucket yet")
        return ExitCode.PREEMPTED

    def _lease_lost(self, why: str) -> None:
        """Another writer took the run over (the uploader has said how): this one stops
        after its step, and is not the one to run again."""
        self.stop.request("a lost writer lease", then="not in the bucket: another writer "
                          "holds this run now (see the lease line above), so this one ends")

    def _point_healthcheck(self) -> None:
        """Tell the container's healthcheck (``ten-runner healthcheck``) where this run's
        heartbeat is, first thing: the pointer's age marks this process's start, so a
        previous container's final status is not judged as this one's."""
        from runner.monitor.liveness import write_pointer
        from runner.storage.mirror import STATUS

        try:
            write_pointer(self.run_dir / STATUS)
        except OSError as e:  # a healthcheck that cannot find us is no reason not to train
            self.log(f"warning: cannot write the healthcheck pointer: {e}")

    def _run(self) -> ExitCode:
        unfit = self._start()
        if unfit is not None:
            return unfit
        if self.bucket is not None and self.bucket.behind is not None:
            self.stop.set_phase("the upload the bucket lacks")  # this job's: _start checked
            if not self._in_bucket(self.bucket.behind):
                return ExitCode.STORAGE
        source = None
        if self.job.train.init_from is not None:
            self.stop.set_phase("loading train.init_from")
            source = self._init_from(self.job.train.init_from)
        self.stop.set_phase("data preparation")
        data, mcfg = self._open_data(source)
        self.stop.set_phase("the model build")
        trainer = self._trainer(data, mcfg, source)
        self.stop.set_phase("training")  # the trainer's own handler takes over inside its loop
        try:
            result = trainer.run()
        finally:
            self.spot.close()  # notices after the loop change nothing
        return self._finish(trainer, result, data.tokenizer)

    def _start(self) -> ExitCode | None:
        """Everything before the data: the health gate (its exit code when the host is
        unfit), the bucket restore, the ranks' agreement on a checkpoint, the check that
        the job may resume what is there, the monitor."""
        job, log = self.job, self.log
        log(f"job {job.name}: {job.model.arch}/{job.model.preset}, data {job.data.dataset} "
            f"({job.data.mode}), run dir {self.run_dir}")
        log(job.model_text())
        from runner.monitor.trackers import check_trackers

        check_trackers(job)  # a tracker asked for and not installed: before anything is spent
        if job.train.deterministic:  # before the gate's matmul makes the first cuBLAS handle
            from ten.train.trainer import make_deterministic

            make_deterministic()
        from runner.monitor.health import gpu_expected

        self.on_gpu = gpu_expected(job.train.device)
        if not self.on_gpu:  # one line of GPU talk on a CPU machine
            log("no GPU: training on the CPU, no GPU health gate or monitoring")
        elif job.monitor.health_gate:
            self.stop.set_phase("the GPU health check")
            unfit = self._unfit_host()
            if unfit is not None:
                self._report_unfit()
                return unfit
        if job.storage.is_remote and self.is_main:
            self.stop.set_phase("the bucket restore")
            self.bucket = open_bucket(job, self.run_dir, log, on_lease_lost=self._lease_lost)
        if job.storage.is_remote and self.ranks is not None:
            self._agree_on_checkpoint()
        from ten.train.trainstate import refuse_unsafe_resume

        # Before any tokenizing, and before the heartbeat: a refused job leaves the run's
        # status (and its last beat) as the run it refused to resume left them.
        refuse_unsafe_resume(self.run_dir, identity_of(job))
        if self.is_main:
            self._start_monitor(self.bucket.store if self.bucket is not None else None)
        if self.bucket is not None:  # after the heartbeat: closed before its last beat, so
            self.resources.callback(self.bucket.close)  # uploads end before the status does
        return None

    def _finish(self, trainer: Any, result: Any, tokenizer: Any) -> ExitCode:
        """After the loop: the final upload, then (a finished run) the prepared data's
        sharing, the last line and the sample."""
        from ten.train.trainer import Outcome

        self.stop.set_phase("the final upload")
        if not self._finish_uploads():
            return ExitCode.STORAGE
        if result.outcome is Outcome.PREEMPTED:
            return ExitCode.PREEMPTED
        if self.bucket is not None:  # done: let the prepared data finish sharing
            self.stop.set_phase("sharing the prepared data")
            for thread in self.bucket.data.threads:
                thread.join(timeout=300)
        if trainer.dist.is_main:
            self.log(f"done: {result.step} steps, held-out loss {result.final_loss:.4f}, "
                     f"perplexity {ppl(result.final_loss):.2f}")
            if self.sample_prompt:
                self.stop.set_phase("the final sample")
                self._sample(result.model, tokenizer)
        return ExitCode.OK

    def _sample(self, model: Any, tokenizer: Any) -> None:
        """The end-of-run sample is a courtesy: whatever goes wrong in it, the finished
        run stays finished (exit 0)."""
        try:
            text = generate_text(model, tokenizer, self.sample_prompt, 48, temperature=0.8,
                                 top_k=40, seed=self.job.train.seed)
        except Exception as e:  # noqa: BLE001 - reported, never a crash after "done:"
            self.log(f"no sample: {type(e).__name__}: {e}")
            return
        self.log(f"sample: {shown_text(text)}")

    # -- the steps -------------------------------------------------------------------------
    def _agree_on_checkpoint(self) -> None:
        """Under torchrun with a bucket: every rank loads the checkpoint rank 0 resumes
        from. Rank 0 has just brought it from the bucket to this machine; on another
        machine the first rank fetches the same step. The trainer's process group forms
        only once rank 0 gets this far too, but it times out sooner than a big
        checkpoint downloads, hence the wait here."""
        from ten.train import checkpoint as ckpt

        ranks, root = self.ranks, self.run_dir / "checkpoints"
        if ranks.is_main:
            found = ckpt.latest_valid(root, self.log) if ranks.multi_node else None
            ranks.publish("resume-step", str(found.step if found else -1))
            return
        step = int(ranks.wait_for("resume-step"))
        if ranks.node_rank == 0:  # rank 0's disk
            return
        if ranks.local_rank == 0:
            fetch_checkpoint(self.job, root, step, self.log)
            ranks.publish(f"fetched-{ranks.node_rank}", "1")
        else:
            ranks.wait_for(f"fetched-{ranks.node_rank}")

    def _unfit_host(self) -> ExitCode | None:
        """The pre-flight GPU check: the exit code of a host not to train on, or None."""
        from runner.monitor.health import preflight

        health = preflight(self.job.train.device)
        for line in health.lines:
            self.log(line)
        if not health.ok:
            self.log(f"unfit host: {health.reason}")
        return None if health.ok else health.exit_code

    def _report_unfit(self) -> None:
        """A host that fails the gate claims no writer lease, but a managed job learns how
        a remote attempt ended only from status.json in the bucket: the store is opened
        for the heartbeat alone, whose last beat (as the run closes) holds the code."""
        from runner.storage import StorageError

        if not self.is_main:
            return
        store = None
        try:
            if self.job.storage.is_remote:
                store = self.job.storage.open()
        except StorageError as e:  # the verdict stands; only its report is lost
            self.log(f"warning: cannot report this to the bucket: {e}")
        self._start_monitor(store)

    def _start_monitor(self, store: Any) -> None:
        """GPU sampler and heartbeat (mirrored to ``store`` when there is one), started
        before data preparation so the paid time they account for includes it."""
        from runner.monitor.heartbeat import Heartbeat
        from runner.monitor.nvml import GpuSampler

        mon, log = self.job.monitor, self.log
        if self.on_gpu:
            self.sampler = GpuSampler(period_s=mon.gpu_sample_s, log=log)
            self.sampler.start()
            self.resources.callback(self.sampler.stop)

        def on_stall(diagnosis: Any) -> None:
            if mon.exit_on_stall:
                log(f"exiting: {diagnosis.message}")
                self.heartbeat.stop("stalled")
                # a hung loader cannot checkpoint: out at once, for a supervisor to relaunch
                self.stop.end_process(ExitCode.CRASH, at_once=True)

        self.heartbeat = Heartbeat(
            self.run_dir, store, self.job.name, period_s=mon.heartbeat_s,
            price_per_hour=self.job.resources.price_per_hour, sampler=self.sampler, log=log,
            gpus=max(self.job.resources.gpus, 1), stall_after_s=mon.stall_after_s,
            on_stall=on_stall)
        self.heartbeat.start()
        self.resources.callback(self._last_beat)

    def _init_from(self, where: str) -> Any:
        """The trained model this run starts from (runner.trained.init_from), checked to
        fit the job's model; None when the run has a checkpoint of its own to resume.
        Under torchrun the first rank on each machine loads it (bringing a bucket run
        here) and names the folder to the others, which read it from there."""
        from runner.trained.init_from import check_fits, check_tokenizer, load_source
        from ten.train import checkpoint as ckpt

        if ckpt.committed_steps(self.run_dir / "checkpoints"):
            self.log(f"train.init_from {where}: not loaded, this run resumes its own "
                     "checkpoint")
            return None
        ranks = self.ranks
        if ranks is None or ranks.local_rank == 0:
            source = load_source(where, self.job.storage.endpoint_url)
            if ranks is not None:
                ranks.publish(f"init-from-{ranks.node_rank}", str(source.folder))
        else:
            source = load_source(ranks.wait_for(f"init-from-{ranks.node_rank}"))
        path = self.job.data.tokenizer.path
        check_tokenizer(where, source, Path(path) if path is not None else None)
        check_fits(where, source, self.job.model_settings(source.tokenizer.vocab_size))
        self.log(f"train.init_from: {source.label}; its tokenizer (vocabulary "
                 f"{source.tokenizer.vocab_size:,}) is used in place of data.tokenizer")
        return source

    def _open_data(self, source: Any = None):
        data = open_data(self.job, self.log, self.bucket.data if self.bucket else None,
                         tokenizer=source.tokenizer.path if source is not None else None)
        return data, self.job.model_settings(data.tokenizer.vocab_size)

    def _trainer(self, data: Any, mcfg: Any, source: Any = None):
        from ten.train.trainer import Trainer
        from ten.train.trainstate import Pretrained

        job, run_dir = self.job, self.run_dir
        atomic_copy(data.tokenizer.path, run_dir / "tokenizer.model")
        resolved = job.redacted_dict()
        atomic_write(run_dir / "job.json",
                     job.scrub(json.dumps(resolved, indent=1, default=str)).encode())
        self.spot = SpotWatch.start(job, self.stop, self.log, self.heartbeat)
        self.resources.callback(self.spot.close)
        trainer = Trainer(mcfg, data, train_config(job), run_dir, identity_of(job, data),
                          resolved,
                          log=lambda line: self.log(in_job_terms(line)),
                          on_commit=self._on_commit,
                          on_log=lambda rec: self.spot.first_step(rec["step_time_s"]),
                          on_step=self.heartbeat.step if self.heartbeat is not None else None,
                          stop=self.stop,
                          pretrained=None if source is None else Pretrained(
                              source.model.state_dict(), source.label),
                          sinks=self._trackers())
        if self.bucket is not None:
            store = self.bucket.store
            store.put_bytes(f"{job.name}/job.json", (run_dir / "job.json").read_bytes())
            # Beside the checkpoints, so `ten-runner sample s3://...` needs nothing else.
            store.put_file(f"{job.name}/tokenizer.model", run_dir / "tokenizer.model")
        return trainer

    def _trackers(self) -> list[Any]:
        """The main rank's experiment trackers (monitor.report_to), each closed with the
        run however it ends (the trainer closes them first when it finishes)."""
        from runner.monitor.trackers import open_trackers

        if not self.is_main:
            return []
        sinks = open_trackers(self.job, self.run_dir, self.log)
        for sink in sinks:
            self.resources.callback(sink.close)
        return sinks

    def _on_commit(self, path: Path, seconds: float) -> None:
        self.commits.append((path, seconds, time.time()))
        if self.bucket is not None:
            self.bucket.sync.submit(path)
        if self.heartbeat is not None:
            self.heartbeat.checkpoint_committed(path, seconds)
        self.spot.first_commit(seconds, 0.0 if self.bucket is None
                               else self.bucket.sync.last_upload_s)

    def _finish_uploads(self) -> bool:
        """Before exiting: the newest checkpoint must be committed in the bucket (waiting
        for it is the only time training waits on the network). Then, after a notice,
        how long that took against its deadline. False when the bucket lacks it."""
        committed_at = self.commits[-1][2] if self.commits else None
        if self.bucket is not None and self.commits:
            if not self._in_bucket(self.commits[-1][0]):
                return False
            committed_at = time.time()  # in the bucket: what survives the machine
        self.spot.report_deadline(committed_at)
        return True

    def _in_bucket(self, checkpoint: Path) -> bool:
        """Upload a committed local checkpoint now (a stop waits for it), retrying; False,
        with the line that says why, when the bucket still lacks it."""
        sync = self.bucket.sync
        with self.stop.deferred(f"the upload of {checkpoint.name}"):
            uploaded = sync.commit_now(checkpoint)
        if not uploaded:
            why = sync.lease_lost or sync.error or "upload failed"
            self.log(f"storage error: {checkpoint.name} is committed in {self.run_dir} but "
                     f"not in {self.bucket.store.url}: {why}")
        return uploaded

    def _close(self, code: ExitCode) -> None:
        """Close what the run opened, newest first: uploads finish, the heartbeat's last
        beat says how it ended, the sampler stops, the log closes, the lock goes."""
        self.exit_code = code
        self.resources.close()

    def _cancelled(self) -> bool:
        """This session's stop was ``ten-runner cancel`` (runner.monitor.cancel)."""
        from runner.monitor.cancel import cancelled_since
        from runner.monitor.source import RunFiles

        try:
            store = self.bucket.store if self.bucket is not None else None
            return cancelled_since(RunFiles.of_job(self.job, store), self.heartbeat.started)
        except Exception as e:  # noqa: BLE001 - the last beat must go out regardless
            self.log(f"warning: cannot read the cancel mark: {e}")
            return False

    def _last_beat(self) -> None:
        code = self.exit_code
        state = {ExitCode.OK: "done", ExitCode.PREEMPTED: "preempted"}.get(code, "failed")
        if state == "preempted" and self._cancelled():
            state = "cancelled"
        reason = self.stop_reason or self.stop.reason
        self.heartbeat.stop(state, exit_code=int(code), reason=reason)
