"""The managed relaunch loop: launch an attempt, watch it (the provider's view and the
job's final heartbeat in the store), and on an interruption relaunch until the job
reports done, tearing everything down at the end. Every decision comes from the pure
:func:`runner.provision.policy.decide`; this module only observes, acts and records.

The record (``$TEN_RUNNER_HOME/jobs/<id>/record.json``) is saved at every transition
with its history, so ``ten-runner status JOB_ID`` can describe a job whose controller
runs in the background (``controller.log`` beside the record) or died.

Signals: Ctrl-C on a foreground controller does not stop the training; the controller
hands the job to a background one and returns. SIGTERM/SIGINT/SIGHUP to a background
controller make it stop supervising and exit, leaving the attempt running (a laptop
going to sleep must not kill a multi-day run); :func:`start_detached` adopts it again.
Only :func:`request_cancel` (``ten-runner cancel``) stops a job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from runner.exit_codes import ExitCode
from runner.provision.base import (
    Instance,
    LaunchSpec,
    NoCapacity,
    Phase,
    Provider,
    ProvisionError,
)
from runner.provision.policy import Kind, Limits, Observation, State, decide
from runner.provision.registry import JobRecord, job_dir, load_record, new_job_id

CANCEL = "cancel"  # a file in the job's directory: the user asked to cancel
LOCK = "controller.lock"  # held (flock) by the one controller of a job; holds its pid
CONTROLLER_LOG = "controller.log"
JOB_COPY = "job.yaml"
LIVE_STATES = ("running", "unknown")  # heartbeat states that are not an attempt's end


class Detached(Exception):
    """Internal: the controller stops supervising and leaves the attempt running."""


class ManagedJob:
    """One controller for one submitted job (see the module doc).

    ``make_spec(attempt)`` builds the launch spec of attempt ``attempt`` (1, 2, ...);
    ``final_status()`` returns the job's final heartbeat status (state done/preempted/
    failed with its exit code) or None while there is none. ``clock``/``sleep`` are
    injectable so tests run the loop on a fake clock.
    """

    def __init__(self, record: JobRecord, provider: Provider,
                 make_spec: Callable[[int], LaunchSpec],
                 final_status: Callable[[], dict[str, Any] | None], *, poll_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 log: Callable[[str], None] = print, limits: Limits | None = None,
                 max_restarts: int | None = None, status_every_s: float = 30.0) -> None:
        self.record, self.provider = record, provider
        self.make_spec, self.final_status = make_spec, final_status
        self.poll_s, self.clock, self.sleep, self.log = poll_s, clock, sleep, log
        self.limits = limits or Limits(**record.details.get("limits", {}))
        self.max_restarts = (int(record.details.get("max_restarts", 3))
                             if max_restarts is None else max_restarts)
        self.status_every_s = status_every_s
        self.instance: Instance | None = None
        self._next_launch = 0.0
        self._status_read: float | None = None  # clock() of the last final_status read
        self._attempt_final: dict[str, Any] | None = None  # this attempt's final heartbeat
        self._final_seen = 0.0  # clock() when it was first seen
        self._refused_since: float | None = None
        self._refusals = 0
        self._launched = 0.0  # clock() at the current attempt's launch (or adoption)
        self._answered = 0.0  # clock() of the provider's last answer to a poll
        self._detach = threading.Event()
        self._warned: set[str] = set()

    # -- public -------------------------------------------------------------------------
    def request_detach(self) -> None:
        """Stop supervising at the next step and leave the attempt running (thread- and
        signal-handler-safe)."""
        self._detach.set()

    def run(self) -> JobRecord:
        """Supervise until a terminal state (or a detach); returns the record."""
        with controller_lock(self.record.job_id):
            detached = False
            try:
                self._adopt()
                while not State(self.record.state).terminal:
                    if self._detach.is_set():
                        raise Detached
                    self._step()
            except Detached:
                detached = True
                self._note(State(self.record.state), "controller stopped; the attempt keeps "
                           "running unsupervised until a controller adopts it again")
            except Exception as e:  # noqa: BLE001 - a controller bug must not leak machines
                self.log("controller error:\n" + traceback.format_exc())
                self._end(State.FAILED, ExitCode.CRASH, f"controller error: {e}")
            except BaseException as e:  # KeyboardInterrupt with no handler installed
                self._end(State.CANCELLED, None, f"controller interrupted "
                          f"({type(e).__name__}); the attempt was torn down")
                raise
            finally:
                if not detached:
                    self._final_teardown()
                self.record.save()
        return self.record

    # -- one step -----------------------------------------------------------------------
    def _step(self) -> None:
        if (self.record.dir / CANCEL).exists():
            self._apply(Observation(Kind.CANCEL))
            return
        if self.instance is None:
            wait = self._next_launch - self.clock()
            if wait > 0:
                self.sleep(min(wait, self.poll_s))  # short naps: a cancel is seen quickly
                return
            self._apply(self._launch())
        else:
            self._apply(self._poll())
        if self.instance is not None and not State(self.record.state).terminal:
            self.sleep(self.poll_s)

    def _launch(self) -> Observation:
        attempt = self.record.attempt + 1
        spec = self.make_spec(attempt)
        try:
            instance = self.provider.launch(spec, frozenset(self.record.blocked))
        except NoCapacity as e:
            now = self.clock()
            if self._refused_since is None:
                self._refused_since = now
            self._refusals += 1
            return Observation(Kind.NO_CAPACITY, waited_s=now - self._refused_since,
                               tries=self._refusals, detail=str(e))
        except ProvisionError as e:
            return Observation(Kind.LAUNCH_ERROR, exit_code=e.exit_code, detail=str(e))
        except Exception as e:  # noqa: BLE001 - a provider bug or an SDK error
            return Observation(Kind.LAUNCH_ERROR, exit_code=ExitCode.CRASH,
                               detail=f"{type(e).__name__}: {e}")
        self._refused_since, self._refusals = None, 0
        self._new_attempt(instance)
        where = f" in {instance.zone}" if instance.zone else ""
        return Observation(Kind.LAUNCHED, detail=f"attempt {attempt}: {self.provider.name} "
                           f"{instance.id}{where}{' (spot)' if instance.spot else ''}")

    def _poll(self) -> Observation:
        instance = self.instance
        assert instance is not None
        try:
            status = self.provider.poll(instance)
        except Exception as e:  # noqa: BLE001 - a network error must not end the job
            self._warn_once("poll", f"cannot poll {instance.id}: {type(e).__name__}: {e}")
            return Observation(Kind.UNREACHABLE, waited_s=self.clock() - self._answered,
                               detail=f"{type(e).__name__}: {e}")
        now = self._answered = self.clock()
        self._warned.discard("poll")
        ended = status.phase not in (Phase.PENDING, Phase.RUNNING)
        if self._attempt_final is None and (
                ended or self._status_read is None
                or now - self._status_read >= self.status_every_s):
            # Each read is a GET on the bucket: while the provider sees the attempt
            # running, the heartbeat is only asked now and then (the job may have ended
            # on a machine that stays up). A final status, once seen, stays final.
            self._status_read = now
            self._attempt_final = self._final(instance)
            self._final_seen = now
        age = 0.0 if self._attempt_final is None else now - self._final_seen
        return Observation.polled(status.phase, status.exit_code, self._attempt_final,
                                  waited_s=now - self._launched, final_age_s=age,
                                  zone=instance.zone, detail=status.reason)

    def _final(self, instance: Instance) -> dict[str, Any] | None:
        """The job's final heartbeat, if this attempt wrote it: a status older than the
        launch belongs to a previous attempt (or a previous submit of the same job)."""
        try:
            status = self.final_status()
        except Exception as e:  # noqa: BLE001 - the store may be briefly unreachable
            self._warn_once("status", f"cannot read the job's status: {e}")
            return None
        self._warned.discard("status")
        if not status or status.get("state") in LIVE_STATES:
            return None
        if float(status.get("time") or 0.0) < instance.launched_at:
            return None
        return status

    def _apply(self, obs: Observation) -> None:
        rec = self.record
        d = decide(rec.state, obs, restarts=rec.restarts, max_restarts=self.max_restarts,
                   preemptions=rec.preemptions, limits=self.limits)
        if d.teardown:
            try:
                self._teardown()
            except Exception as e:  # noqa: BLE001
                if not d.state.terminal:
                    raise  # never relaunch beside an attempt that may still run
                d = dataclasses.replace(d, reason=f"{d.reason}; but {self._teardown_failed(e)}")
        rec.restarts += d.charge
        rec.preemptions += d.preempted
        if d.block and d.block not in rec.blocked:
            rec.blocked.append(d.block)
        if d.relaunch:
            self._next_launch = self.clock() + d.wait_s
        if d.state.terminal:
            self._end(d.state, d.exit_code, d.reason)
        elif d.state.value != rec.state or d.reason or d.charge or d.preempted or d.block:
            self._note(d.state, d.reason)

    # -- record and teardown -------------------------------------------------------------
    def _note(self, state: State, reason: str) -> None:
        self.record.transition(state.value, reason)
        self.record.save()
        self.log(f"{self.record.job_id}: {state.value}" + (f" - {reason}" if reason else ""))

    def _end(self, state: State, exit_code: int | None, reason: str) -> None:
        self.record.exit_code = None if exit_code is None else int(exit_code)
        self._note(state, reason)

    def _new_attempt(self, instance: Instance) -> None:
        self.instance = instance
        self._status_read = self._attempt_final = None
        self._launched = self._answered = self.clock()
        self.record.attempt += 1
        self.record.instance = instance.to_dict()
        self.record.save()  # before anything else can fail: the instance must be known

    def _adopt(self) -> None:
        """A restarted controller takes over the attempt its predecessor left running."""
        if self.record.instance and not State(self.record.state).terminal:
            self.instance = Instance.from_dict(self.record.instance)
            self._status_read = self._attempt_final = None
            self._launched = self._answered = self.clock()
            self.log(f"{self.record.job_id}: adopting attempt {self.record.attempt} "
                     f"({self.instance.provider} {self.instance.id})")

    def _teardown(self, tries: int = 3) -> None:
        """Terminate the current attempt, a few tries apart; raises if it cannot (the
        record then keeps the instance, so ``cancel`` can try again)."""
        instance = self.instance
        if instance is None:
            return
        for i in range(tries):
            try:
                self.provider.terminate(instance)
                break
            except Exception:  # noqa: BLE001
                if i == tries - 1:
                    raise
                self.sleep(self.poll_s)
        self.instance = None
        self.record.instance = None
        self.record.save()

    def _teardown_failed(self, error: Exception) -> str:
        inst = self.instance
        message = (f"could not terminate {inst.id if inst else '?'} ({error}): it may still "
                   f"be running (and billing); `ten-runner cancel {self.record.job_id}` "
                   "tries again")
        self.log(f"{self.record.job_id}: {message}")
        return message

    def _final_teardown(self) -> None:
        try:
            self._teardown()
        except Exception as e:  # noqa: BLE001
            self._teardown_failed(e)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            self.log(f"{self.record.job_id}: {message}")


# -- one controller per job ----------------------------------------------------------------
@contextlib.contextmanager
def controller_lock(job_id: str) -> Iterator[None]:
    """An exclusive flock on ``<job dir>/controller.lock`` (released when the holder
    dies, so a crashed controller never blocks the next); the file holds the pid."""
    import fcntl

    path = job_dir(job_id) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ProvisionError(f"job {job_id} already has a controller (pid "
                                 f"{_read_pid(path) or '?'})") from None
        f.seek(0)
        f.truncate()
        f.write(str(os.getpid()))
        f.flush()
        try:
            yield
        finally:
            f.seek(0)
            f.truncate()
            fcntl.flock(f, fcntl.LOCK_UN)


def controller_pid(job_id: str) -> int | None:
    """The pid of the job's live controller, None when none holds the lock."""
    import fcntl

    path = job_dir(job_id) / LOCK
    if not path.exists():
        return None
    with open(path, "a+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _read_pid(path) or -1
        fcntl.flock(f, fcntl.LOCK_UN)
    return None


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


# -- building a controller from a record ---------------------------------------------------
def make_provider(record: JobRecord, job: Any = None) -> Provider:
    """The provider of ``record.target``: ``local`` here, ``aws`` through
    ``runner.provision.aws.provider_for(job, record)`` (imported only then)."""
    if record.target == "local":
        from runner.provision.local import LocalProvider

        return LocalProvider(cwd=record.details.get("cwd"))
    if record.target == "aws":
        from runner.provision import aws  # boto3: only for aws jobs

        return aws.provider_for(job if job is not None else load_job_copy(record), record)
    raise ProvisionError(f"managed jobs run --to local or --to aws, not {record.target!r}")


def _upload_job(job: Any, job_file: Path, job_id: str, region: str | None,
                check: bool) -> str:
    """Check what can be checked before anything is created in the cloud (``check``:
    not for a provider the caller built), then put the job YAML into its bucket
    (returns the s3:// URL the instance runs)."""
    from runner.provision import aws

    if check:
        aws.check_submit(job, region)
    return aws.upload_job(job, job_file, job_id)


def load_job_copy(record: JobRecord) -> Any:
    """The job as submitted (the copy beside the record), validated again."""
    from runner.errors import UserError
    from runner.job import JobError, load_job

    try:
        return load_job(record.details["job_file"], check_model=False)
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


def final_status_reader(job: Any) -> Callable[[], dict[str, Any] | None]:
    """A reader of the job's final heartbeat (``<name>/status.json`` in its store, or
    its local run directory) that opens the store once. Returns the status when its
    state is final (done, preempted, failed, stalled, ...), else None; store errors
    propagate (the loop logs them and treats them as "no final status yet")."""
    from runner.monitor.status import read_status

    files: list[Any] = []

    def read() -> dict[str, Any] | None:
        if not files:
            files.append(_run_files(job))
        status = read_status(files[0])
        if status is None or status.get("state") in LIVE_STATES:
            return None
        return status
    return read


def _run_files(job: Any) -> Any:
    """The job's run files: ``<name>/`` in its bucket, or its local run directory."""
    from runner.monitor.source import RunFiles

    if job.storage.is_remote:
        from runner.storage import open_store

        store = open_store(job.storage.url, job.storage.endpoint_url or None,
                           job.storage.region or None)
        return RunFiles(f"{store.url}/{job.name}", store=store, job=job.name)
    from runner.run import run_dir_of

    return RunFiles(str(run_dir_of(job)), run_dir=run_dir_of(job))


def read_heartbeat(record: JobRecord) -> dict[str, Any] | None:
    """The job's latest heartbeat status, whatever its state (for ``describe``); None
    when there is none yet or the store cannot be read."""
    from runner.errors import UserError
    from runner.monitor.status import read_status

    try:
        return read_status(_run_files(load_job_copy(record)))
    except (UserError, OSError, KeyError):
        return None


def store_final_status(job: Any) -> dict[str, Any] | None:
    """The job's final heartbeat status (see :func:`final_status_reader`), read once."""
    return final_status_reader(job)()


def controller_for(record: JobRecord, provider: Provider | None = None, *,
                   log: Callable[[str], None] = print, **kw: Any) -> ManagedJob:
    job = load_job_copy(record)
    return ManagedJob(record, provider or make_provider(record, job),
                      spec_factory(record, job), final_status_reader(job),
                      poll_s=float(record.details.get("poll_s", 5.0)), log=log, **kw)


# -- what the CLI calls ---------------------------------------------------------------------
def submit_managed(job: Any, job_file: Path | str, target: str, *,
                   provider: Provider | None = None, detach: bool = True,
                   poll_s: float = 5.0, limits: Limits | None = None,
                   details: dict[str, Any] | None = None,
                   log: Callable[[str], None] = print) -> JobRecord:
    """Create the job's record (state PENDING, a copy of the job YAML beside it; for
    ``aws`` the YAML also goes to the job's bucket, where the instance reads it) and
    supervise it: in a background controller (``detach``, the default; returns at once)
    or here until it ends. A Ctrl-C in the foreground hands the job over to a
    background controller instead of stopping it. ``details``: more for the record
    (e.g. a region override), never secrets."""
    if target not in ("local", "aws"):
        raise ProvisionError(f"managed jobs run --to local or --to aws, not {target!r}")
    job_id = new_job_id(job.name)
    directory = job_dir(job_id)
    directory.mkdir(parents=True, exist_ok=False)
    copy = directory / JOB_COPY
    try:
        shutil.copyfile(job_file, copy)
        copy.chmod(0o600)  # the YAML may name secrets
        extra = dict(details or {})
        if target == "aws" and "job_url" not in extra:
            extra["job_url"] = _upload_job(job, copy, job_id, extra.get("region"),
                                           check=provider is None)
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)  # no half-submitted job is listed
        raise
    record = JobRecord(job_id=job_id, job_name=job.name, target=target,
                       state=State.PENDING.value, details={
                           "job_file": str(copy), "source": str(Path(job_file).resolve()),
                           "cwd": os.getcwd(), "storage": job.storage.url,
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
                            spec_factory(record, job), final_status_reader(job),
                            poll_s=poll_s, log=log, limits=limits)
    with _detach_on(controller, (signal.SIGINT,)):
        record = controller.run()
    if not State(record.state).terminal:  # Ctrl-C: hand over, do not stop the training
        pid = start_detached(job_id)
        log(f"{job_id}: still {record.state}; now supervised in the background (pid {pid}). "
            f"`ten-runner cancel {job_id}` stops it")
    return record


def start_detached(job_id: str) -> int:
    """Start ``python -m runner.provision.managed JOB_ID`` as a background controller
    (own session, output appended to ``<job dir>/controller.log``); returns its pid.
    Also adopts a job whose controller died."""
    record = load_record(job_id)
    if State(record.state).terminal:
        raise ProvisionError(f"job {job_id} already ended ({record.state})")
    pid = controller_pid(job_id)
    if pid is not None:
        raise ProvisionError(f"job {job_id} already has a controller (pid {pid})")
    with open(record.dir / CONTROLLER_LOG, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "runner.provision.managed", job_id],
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
        if record.instance:
            (provider or make_provider(record)).terminate(Instance.from_dict(record.instance))
            record.instance = None
        if State(record.state).terminal:
            record.transition(record.state, "leftover attempt torn down by cancel")
        else:
            record.exit_code = None
            record.transition(State.CANCELLED.value,
                              "cancelled by the user (no controller was running)")
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
                     f"{_age(now - float(inst.get('launched_at') or now))}")
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
                     f"{_age(now - float(heartbeat.get('time') or now))} ago)")
    lines.append(f"files      {record.dir}")
    lines.append("history")
    for h in record.history[-10:]:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(h.get("time", 0)))
        reason = f"  {h['reason']}" if h.get("reason") else ""
        lines.append(f"  {stamp}  {h.get('state', '?'):<10}{reason}")
    return "\n".join(lines)


def _age(seconds: float) -> str:
    s = max(0, int(seconds))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


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
    """``python -m runner.provision.managed JOB_ID``: the background controller."""
    from runner.errors import UserError

    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m runner.provision.managed JOB_ID", file=sys.stderr)
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
