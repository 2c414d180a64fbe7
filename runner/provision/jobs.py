"""Managed jobs as the CLI sees them: submit one, start (or restart) its background
controller, cancel it, describe it. The loop itself is :class:`ManagedJob`
(:mod:`runner.provision.managed`); this module builds it from a job's record and runs
it here or in the background process ``python -m runner.provision.jobs JOB_ID``.

Signals: Ctrl-C on a foreground controller does not stop the training; the controller
hands the job to a background one and returns. SIGTERM/SIGINT/SIGHUP to a background
controller make it stop supervising and exit, leaving the attempt running (a laptop
going to sleep must not kill a multi-day run); :func:`start_detached` adopts it again.
Only :func:`request_cancel` (``ten-runner cancel``) stops a job.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from runner.exit_codes import ExitCode
from runner.monitor.source import RunFiles
from runner.provision.base import Instance, LaunchSpec, Provider, ProvisionError
from runner.provision.destinations import destination
from runner.provision.managed import (
    CANCEL,
    ManagedJob,
    controller_lock,
    controller_pid,
    sweep_leftovers,
)
from runner.provision.policy import Limits, State
from runner.provision.registry import JobRecord, job_dir, load_record, new_job_id
from ten.text import duration

CONTROLLER_LOG = "controller.log"
JOB_COPY = "job.yaml"


# -- building a controller from a record ---------------------------------------------------
def make_provider(record: JobRecord, job: Any = None,
                  log: Callable[[str], None] = print) -> Provider:
    """The provider of ``record.target``, from its destination
    (runner.provision.destinations); ``job`` is loaded from the record's copy when the
    provider needs it and it is not given."""
    # once, and only if the provider needs it
    load = functools.cache(lambda: job if job is not None else load_job_copy(record))
    return destination(record.target).provider(record, load, log)


def load_job_copy(record: JobRecord) -> Any:
    """The job as submitted (the copy beside the record, for every target), validated
    again."""
    from runner.errors import UserError
    from runner.job import JobError, load_job

    try:
        return load_job(record.details.get("job_file") or record.dir / JOB_COPY,
                        check_model=False)
    except JobError as err:
        raise UserError("\n".join(err.errors), exit_code=ExitCode.CONFIG) from None


def spec_factory(record: JobRecord, job: Any) -> Callable[[int], LaunchSpec]:
    def make(attempt: int) -> LaunchSpec:
        return LaunchSpec(
            job_id=record.job_id, job_name=job.name, job_file=Path(record.details["job_file"]),
            job_url=record.details.get("job_url"), image=job.resources.image, attempt=attempt,
            spot=job.resources.spot,
            env={"TEN_RUNNER_JOB_ID": record.job_id, "TEN_RUNNER_ATTEMPT": str(attempt)})
    return make


def status_reader(job: Any) -> Callable[[], dict[str, Any] | None]:
    """A reader of the job's latest heartbeat (``<name>/status.json`` in its store, or
    its local run directory) that opens the store once: the status in any state, None
    when there is none; store errors propagate (the loop logs them and reads again)."""
    from runner.monitor.status import read_status

    files: list[Any] = []

    def read() -> dict[str, Any] | None:
        if not files:
            files.append(RunFiles.of_job(job))
        return read_status(files[0])
    return read


def cancel_announcer(record: JobRecord, job: Any) -> Callable[[], None]:
    """What the controller calls before a cancel tears the attempt down: the run's mark
    (:mod:`runner.monitor.cancel`), so it says "cancelled", not "preempted"."""
    from runner.monitor.cancel import announce

    return lambda: announce(RunFiles.of_job(job), record.job_id)


def read_heartbeat(record: JobRecord) -> dict[str, Any] | None:
    """The job's latest heartbeat status, whatever its state (for ``describe``); None
    when there is none yet or the store cannot be read."""
    from runner.errors import UserError
    from runner.monitor.status import read_status

    try:
        return read_status(RunFiles.of_job(load_job_copy(record)))
    except (UserError, OSError, KeyError):
        return None


def controller_for(record: JobRecord, provider: Provider | None = None, *,
                   log: Callable[[str], None] = print, **kw: Any) -> ManagedJob:
    job = load_job_copy(record)
    return ManagedJob(record, provider or make_provider(record, job),
                      spec_factory(record, job), status_reader(job),
                      poll_s=float(record.details.get("poll_s", 5.0)), log=log,
                      announce_cancel=cancel_announcer(record, job), **kw)


# -- what the CLI calls ---------------------------------------------------------------------
def submit_managed(job: Any, job_file: Path | str, target: str, *,
                   provider: Provider | None = None, detach: bool = True,
                   poll_s: float = 5.0, limits: Limits | None = None,
                   sets: Sequence[str] = (),
                   log: Callable[[str], None] = print) -> JobRecord:
    """Create the job's record (state PENDING, a copy of the job YAML beside it; for
    ``aws`` the YAML also goes to the job's bucket, where the instance reads it) and
    supervise it: in a background controller (``detach``, the default; returns at once)
    or here until it ends. ``target``: ``local``, ``aws`` or ``ssh://user@host[:port]``
    (the host is checked first). A Ctrl-C in the foreground hands the job over to a
    background controller instead of stopping it. ``sets``: the ``--set`` overrides ``job``
    was loaded with, written into the record's copy of the YAML (the file that runs)."""
    from runner.job.load import with_sets

    where = destination(target)
    target = where.preflight(job, Path(job_file), target, check=provider is None, log=log)
    if limits is None and job.resources.max_preemptions is not None:
        limits = Limits(max_preemptions=job.resources.max_preemptions)
    job_id = new_job_id(job.name)
    directory = job_dir(job_id)
    directory.mkdir(parents=True, exist_ok=False)
    copy = directory / JOB_COPY
    try:
        copy.touch(mode=0o600)  # the YAML may name secrets
        text = Path(job_file).read_text(encoding="utf-8-sig")
        copy.write_text(with_sets(text, sets, str(job_file)), encoding="utf-8")
        extra = where.stage(job, copy, job_id, check=provider is None)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)  # no half-submitted job is listed
        raise
    record = JobRecord(job_id=job_id, job_name=job.name, target=target,
                       state=State.PENDING.value, details={
                           "job_file": str(copy), "source": str(Path(job_file).resolve()),
                           "cwd": os.getcwd(),  # as written: ${VAR}s unresolved
                           "storage": job.redacted_dict()["storage"]["url"],
                           "max_restarts": job.resources.max_restarts, "poll_s": poll_s,
                           **({"limits": dict(vars(limits))} if limits else {}), **extra})
    record.transition(State.PENDING.value, f"submitted --to {target}")
    record.save()
    if detach:
        pid = start_detached(job_id)
        log(f"{job_id}: submitted --to {target}; controller pid {pid} "
            f"(log {directory / CONTROLLER_LOG})")
        return record
    controller = ManagedJob(record, provider or make_provider(record, job),
                            spec_factory(record, job), status_reader(job),
                            poll_s=poll_s, log=log, limits=limits,
                            announce_cancel=cancel_announcer(record, job))
    with _detach_on(controller, (signal.SIGINT,)):
        record = controller.run()
    if not State(record.state).terminal:  # Ctrl-C: hand over, do not stop the training
        pid = start_detached(job_id)
        log(f"{job_id}: still {record.state}; now supervised in the background (pid {pid}). "
            f"`ten-runner cancel {job_id}` stops it")
    return record


def start_detached(job_id: str) -> int:
    """Start ``python -m runner.provision.jobs JOB_ID`` as a background controller
    (own session, output appended to ``<job dir>/controller.log``); returns its pid.
    Also adopts a job whose controller died."""
    record = load_record(job_id)
    if State(record.state).terminal:
        raise ProvisionError(f"job {job_id} already ended ({record.state})")
    pid = controller_pid(job_id)
    if pid is not None:
        raise ProvisionError(f"job {job_id} already has a controller (pid {pid})")
    with open(record.dir / CONTROLLER_LOG, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "runner.provision.jobs", job_id],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                cwd=record.details.get("cwd"), start_new_session=True)
    return proc.pid


def request_cancel(job_id: str, *, wait_s: float = 60.0,
                   provider: Provider | None = None) -> JobRecord:
    """Ask the job to stop: its controller sees ``<job dir>/cancel``, tears the attempt
    down and records CANCELLED. With no live controller (it died, or was stopped and
    left the attempt unsupervised) the teardown happens here, as it does for an attempt
    whose teardown failed when the job ended. Waits up to ``wait_s`` for the record to
    say CANCELLED (0: do not wait); returns the record as it then stands."""
    record = load_record(job_id)
    if State(record.state).terminal and not record.instance:
        return record
    if not State(record.state).terminal:
        (record.dir / CANCEL).write_text(f"{time.time()}\n")
    if controller_pid(job_id) is None:
        try:
            return _cancel_here(job_id, provider)
        except ProvisionError as e:
            if "already has a controller" not in str(e):
                raise  # else: one started meanwhile; it will see the file
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        record = load_record(job_id)
        if State(record.state).terminal:
            break
        time.sleep(0.2)
    return record


def _cancel_here(job_id: str, provider: Provider | None) -> JobRecord:
    """Cancel without a controller, holding the controller lock so none starts."""
    with controller_lock(job_id):
        record = load_record(job_id)
        provider = provider or make_provider(record)
        if record.instance:
            provider.terminate(Instance.from_dict(record.instance))
            record.instance = None
        swept = "".join(f"; {line}" for line in sweep_leftovers(provider, job_id))
        if State(record.state).terminal:
            record.transition(record.state, "leftover attempt torn down by cancel" + swept)
        else:
            record.exit_code = None
            record.transition(State.CANCELLED.value,
                              "cancelled by the user (no controller was running)" + swept)
        record.save()
        return record


def describe(record: JobRecord, heartbeat: dict[str, Any] | None = None,
             now: float | None = None) -> str:
    """What ``ten-runner status JOB_ID`` prints: state, attempts, the current instance,
    the controller, the job's progress from its ``heartbeat`` (:func:`read_heartbeat`)
    when given, and the recent history."""
    now = time.time() if now is None else now
    pid = controller_pid(record.job_id)
    lines = [
        f"job        {record.job_id} ({record.job_name}) --to {record.target}",
        f"state      {record.state}" + (f", exit code {record.exit_code}"
                                        if record.exit_code is not None else ""),
        f"attempts   {record.attempt} launched, {record.restarts}/"
        f"{record.details.get('max_restarts', '?')} restarts used, "
        f"{record.preemptions} preemptions",
    ]
    inst = record.instance
    if inst:
        zone = f" in {inst.get('zone')}" if inst.get("zone") else ""
        lines.append(f"instance   {inst.get('provider')} {inst.get('id')}{zone}, up "
                     f"{duration(now - float(inst.get('launched_at') or now))}")
    if record.blocked:
        lines.append(f"blocked    {', '.join(record.blocked)}")
    if State(record.state).terminal and inst:
        lines.append("warning    this attempt could not be terminated and may still run "
                     "(and bill): `ten-runner cancel` tries again")
    elif not State(record.state).terminal:
        lines.append(f"controller pid {pid}" if pid else
                     "controller none: no controller is running, so nothing relaunches "
                     "the job (its attempt may still run); starting one adopts it")
    if heartbeat:
        total = heartbeat.get("total_steps")
        step = f"{heartbeat.get('step', 0)}" + (f"/{total}" if total else "")
        loss = heartbeat.get("loss")
        lines.append(f"progress   step {step}" + (f", loss {loss:.4f}" if loss else "") +
                     f" (heartbeat {heartbeat.get('state', '?')}, "
                     f"{duration(now - float(heartbeat.get('time') or now))} ago)")
    lines.append(f"files      {record.dir}")
    lines.append("history")
    for h in record.history[-10:]:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("time", 0)))
        reason = f"  {h['reason']}" if h.get("reason") else ""
        lines.append(f"  {stamp}  {h.get('state', '?'):<10}{reason}")
    return "\n".join(lines)


def describe_data(record: JobRecord, heartbeat: dict[str, Any] | None = None
                  ) -> dict[str, Any]:
    """``status JOB_ID --json``: the record as saved (no secrets by design), the pid of
    its controller (null: none running) and its latest ``heartbeat`` (null: none)."""
    from dataclasses import asdict

    return {**asdict(record), "controller_pid": controller_pid(record.job_id),
            "heartbeat": heartbeat}




@contextlib.contextmanager
def _detach_on(controller: ManagedJob, signals: tuple[int, ...]) -> Iterator[None]:
    """Turn ``signals`` into a detach while the controller runs (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = {s: signal.signal(s, lambda *_: controller.request_detach()) for s in signals}
    try:
        yield
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def main(argv: list[str] | None = None) -> int:
    """``python -m runner.provision.jobs JOB_ID``: the background controller."""
    from runner.errors import UserError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m runner.provision.jobs JOB_ID", file=sys.stderr)
        return int(ExitCode.CONFIG)

    def log(line: str) -> None:
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} {line}", flush=True)

    try:
        record = load_record(args[0])
        if State(record.state).terminal:
            log(f"{record.job_id}: already {record.state}")
            return 0
        controller = controller_for(record, log=log)
        log(f"{record.job_id}: controller pid {os.getpid()} supervising --to {record.target}")
        with _detach_on(controller, (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
            record = controller.run()
    except UserError as e:
        log(f"error: {e.message}")
        return e.exit_code
    log(f"{record.job_id}: {record.state}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
