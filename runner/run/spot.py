"""The run's side of spot preemption: the cloud's notice wired to the trainer's stop (the
same stop as SIGTERM: finish the step, commit, exit preempted), and the warning when
one step outlasts the notice window. The notices themselves: runner.preemption."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.monitor.events import EventKind

if TYPE_CHECKING:
    from runner.job import Job
    from runner.run.log import RunLog


def step_warning(step_s: float, window_s: float) -> str | None:
    """What to say when one optimizer step outlasts the preemption notice: a stop is
    taken after the step in flight, so such a step can never be committed in time."""
    if step_s <= window_s:
        return None
    return (f"one optimizer step takes {step_s:.0f} s, longer than the {window_s:.0f} s "
            "preemption notice: a stop cannot commit the step in progress; lower "
            "train.batch_size or train.grad_accum")


def start_notice_watcher(job: Job, trainer: Any, log: RunLog, heartbeat: Any = None):
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
        if heartbeat is not None:
            heartbeat.event(EventKind.PREEMPTION_NOTICE, provider=provider, detail=notice.detail)

    watcher = NoticeWatcher(provider, on_notice, interval_s=res.notice_poll_s,
                            endpoint=res.metadata_endpoint, log=log)
    watcher.start()
    log(f"watching for {provider} preemption notices every {res.notice_poll_s:g} s "
        f"(notice window {notice_window_s(provider):.0f} s)")
    return watcher

