"""The job's sections as the library's config objects (ten.data.DataConfig,
ten.trainer.TrainConfig). Imports torch when called."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.job import Job


def data_config(job: Job):
    """The data layer's DataConfig for this job (one mapping: :meth:`Job.data_config`)."""
    return job.data_config()


def train_config(job: Job):
    from ten.trainer import TrainConfig

    t = job.train
    return TrainConfig(
        max_steps=t.max_steps, max_tokens=t.max_tokens, batch_size=t.batch_size,
        grad_accum=t.grad_accum, lr=t.lr, min_lr_ratio=t.min_lr_ratio,
        warmup_steps=t.warmup_steps, schedule=t.schedule, weight_decay=t.weight_decay,
        betas=tuple(t.betas), precision=t.precision, optimizer=t.optimizer, compile=t.compile,
        grad_clip=t.grad_clip, max_nonfinite_steps=t.max_nonfinite_steps, loss=t.loss,
        eval_every=t.eval_every, eval_batches=t.eval_batches,
        log_every=t.log_every, seed=t.seed, device=t.device, num_workers=job.data.num_workers,
        checkpoint_every=job.checkpoint.every_steps, keep_last=job.checkpoint.keep_last)
