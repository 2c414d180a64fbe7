"""Experiment trackers a job reports to (``monitor.report_to``) besides metrics.jsonl and
TensorBoard, as :class:`ten.train.metrics.Sink`\\ s the trainer writes each record to.

Weights & Biases (``wandb``): the W&B run is named after the job and keeps one id for
the job's whole life (from its store and name), so a resumed or relaunched run goes on
in the same W&B run. Without ``WANDB_API_KEY`` (and ``WANDB_MODE`` unset) it is written
offline under ``<run>/wandb`` for a later ``wandb sync``: a tracker never needs a
network or an account to train. The project is ``WANDB_PROJECT``, else ``ten-runner``;
the config it gets is the job as ``job.json`` holds it (secret values replaced by their
``${VAR}`` references), and no command line, environment or code is sent.

Off by default and never in the way: a tracker that fails while the run goes on (its
server unreachable) is reported in one line and dropped; training neither waits for nor
ends because of it (one that cannot start is left out the same way). A package the job
asks for that is not installed stops the run at its start (exit 2), before anything is
spent.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode

Log = Callable[[str], None]

# What each tracker reads from the environment: a job submitted elsewhere takes these
# along when it reports to that tracker (runner.provision). The first is a secret.
ENVIRONMENT = {"wandb": ("WANDB_API_KEY", "WANDB_PROJECT", "WANDB_ENTITY", "WANDB_MODE",
                         "WANDB_BASE_URL")}


def tracker_variables(job: Any) -> list[str]:
    """The environment variables the job's trackers read, the secret first of each."""
    return [name for tracker in job.monitor.report_to for name in ENVIRONMENT[tracker]]


class TrackerError(UserError):
    """A tracker the job asks for is not installed: the job's fix (exit 2)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_code=ExitCode.CONFIG)


def check_trackers(job: Any) -> None:
    """TrackerError now, at the run's start, for a tracker whose package is missing."""
    import importlib

    for name in job.monitor.report_to:
        try:
            importlib.import_module(name)
        except ImportError:
            raise TrackerError(f"monitor.report_to lists {name}, which is not installed "
                               f"here: pip install {name} (or remove it from "
                               "monitor.report_to)") from None


def open_trackers(job: Any, run_dir: Path, log: Log) -> list[Any]:
    """One sink per tracker in ``job.monitor.report_to``, started; one that cannot start
    (its server unreachable, a key refused) is reported and left out."""
    sinks = []
    for name in job.monitor.report_to:
        try:
            sinks.append(SINKS[name](job, run_dir, log))
        except Exception as e:  # noqa: BLE001 - a tracker never stops a run
            log(f"warning: {name} did not start ({type(e).__name__}: {e}); training goes on "
                "without it (metrics.jsonl and TensorBoard have every figure)")
    return sinks


def tracker_run_id(job: Any) -> str:
    """The id a tracker knows this job by: the same on every restart and machine, and
    different for a job of the same name in another store."""
    where = f"{job.storage.url}\n{job.storage.endpoint_url or ''}\n{job.name}"
    return f"{job.name[:40]}-{hashlib.sha256(where.encode()).hexdigest()[:12]}"


class WandB:
    """A W&B run fed the trainer's figures (a :class:`ten.train.metrics.Sink`)."""

    def __init__(self, job: Any, run_dir: Path, log: Log) -> None:
        import wandb

        self.log = log
        offline = not os.environ.get("WANDB_API_KEY") and not os.environ.get("WANDB_MODE")
        run_id = tracker_run_id(job)
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT") or "ten-runner", name=job.name,
            id=run_id, resume="allow", dir=str(run_dir), config=job.redacted_dict(),
            mode="offline" if offline else None,
            settings=wandb.Settings(silent=True, console="off", save_code=False,
                                    disable_git=True, x_disable_meta=True,
                                    x_save_requirements=False))
        where = (f"offline in {run_dir / 'wandb'} (to upload: wandb sync "
                 f"{run_dir / 'wandb'}/offline-run-*)" if offline else self.run.url)
        log(f"wandb: run {run_id}, {where}")

    def write(self, step: int, scalars: dict[str, float]) -> None:
        if self.run is None:
            return
        try:
            self.run.log(scalars, step=step)
        except Exception as e:  # noqa: BLE001 - a tracker never ends a run
            self.log(f"warning: wandb stopped taking the figures ({type(e).__name__}: "
                     f"{e}); metrics.jsonl and TensorBoard still have them")
            self.run = None

    def close(self) -> None:
        run, self.run = self.run, None
        if run is not None:
            try:
                run.finish()
            except Exception as e:  # noqa: BLE001
                self.log(f"warning: wandb did not finish cleanly: {type(e).__name__}: {e}")


# monitor.report_to's names (runner.job.schema.TRACKERS) -> their sinks
SINKS = {"wandb": WandB}
