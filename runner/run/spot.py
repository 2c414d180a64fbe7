"""The run's side of spot preemption: the cloud's notice wired to the process's stop (the
same stop as SIGTERM: finish the step, commit, exit preempted), and what the run says
about the notice window: when one step or one emergency checkpoint cannot fit in it, and
after a notice, how the commit went against its deadline. The notices themselves:
runner.preemption."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from runner.monitor.events import EventKind

if TYPE_CHECKING:
    from runner.job import Job
    from runner.run.log import RunLog
    from ten.train.stop import Stop


def step_warning(step_s: float, window_s: float) -> str | None:
    """What to say when one optimizer step outlasts the preemption notice: a stop is
    taken after the step in flight, so such a step can never be committed in time."""
    if step_s <= window_s:
        return None
    return (f"one optimizer step takes {step_s:.0f} s, longer than the {window_s:.0f} s "
            "preemption notice: a stop cannot commit the step in progress; lower "
            "train.batch_size or train.grad_accum")


class SpotWatch:
    """A run's notice watcher and what it says. Without one (not a spot job,
    ``resources.spot_notice: none``, no metadata service answered) every method does
    nothing, so the run asks no question about it."""

    def __init__(self, watcher: Any = None, log: Any = None, poll_s: float = 0.0) -> None:
        self.watcher, self.log, self.poll_s = watcher, log, poll_s
        self._said_commit = self._said_step = False

    @classmethod
    def start(cls, job: Job, stop: Stop, log: RunLog, heartbeat: Any = None) -> SpotWatch:
        """Poll the cloud's preemption notice (resources.spot_notice) and turn a notice
        into ``stop.request``: the loop finishes its step, commits and exits preempted,
        before the SIGTERM that follows the notice."""
        from runner.preemption import PROVIDERS, NoticeWatcher, notice_window_s, resolve_provider

        res = job.resources
        if res.spot_notice == "none" or (res.spot_notice == "auto" and not res.spot):
            return cls()
        endpoints = ({p: res.metadata_endpoint for p in PROVIDERS}
                     if res.metadata_endpoint else None)
        provider = resolve_provider(res.spot_notice, endpoints)
        if provider is None:
            log("no cloud metadata service answered: preemption notices are not watched")
            return cls()

        def on_notice(notice: Any) -> None:
            log(f"preemption notice from {provider}: {notice.detail}")
            stop.request(f"{provider} preemption notice")
            if heartbeat is not None:
                heartbeat.event(EventKind.PREEMPTION_NOTICE, provider=provider,
                                detail=notice.detail)

        watcher = NoticeWatcher(provider, on_notice, interval_s=res.notice_poll_s,
                                endpoint=res.metadata_endpoint, log=log)
        watcher.start()
        log(f"watching for {provider} preemption notices every {res.notice_poll_s:g} s "
            f"(notice window {notice_window_s(provider):.0f} s)")
        return cls(watcher, log, res.notice_poll_s)

    def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()

    def first_commit(self, save_s: float, upload_s: float | None) -> None:
        """Once a save (and, with a bucket, its upload: ``upload_s``, None until one is
        measured) has been timed: would an emergency checkpoint fit the notice window?"""
        if self.watcher is None or upload_s is None or self._said_commit:
            return
        from runner.preemption import startup_warning

        self._said_commit = True
        warning = startup_warning(self.watcher.provider, save_s + upload_s, self.poll_s)
        if warning:
            self.log(f"warning: {warning}")

    def first_step(self, step_s: float) -> None:
        """Once, on the first logged step: a stop must finish the current step before it
        can commit, so a step longer than the notice window loses it every time."""
        if self.watcher is None or self._said_step:
            return
        from runner.preemption import notice_window_s

        self._said_step = True
        warning = step_warning(step_s, notice_window_s(self.watcher.provider))
        if warning:
            self.log(f"warning: {warning}")

    def report_deadline(self, committed_at: float | None) -> None:
        """After a notice: when the last checkpoint was safe, against the deadline."""
        notice = self.watcher.notice if self.watcher is not None else None
        if notice is None or committed_at is None:
            return
        from runner.preemption import emergency_report

        self.log(emergency_report(notice, committed_at))
