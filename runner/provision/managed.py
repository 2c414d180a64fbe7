"""The managed relaunch loop: launch an attempt, watch it (the provider's view and the
job's final heartbeat in the store), and on an interruption relaunch until the job
reports done, tearing everything down at the end. Every decision comes from the pure
:func:`runner.provision.policy.decide`; this module only observes, acts and records.

The record (``$TEN_RUNNER_HOME/jobs/<id>/record.json``) is saved at every transition
with its history, so ``ten-runner status JOB_ID`` can describe a job whose controller
runs in the background (``controller.log`` beside the record) or died. One controller
per job: :func:`controller_lock` is held while the loop runs.

Submitting, the background controller process, signals and cancelling are in
:mod:`runner.provision.jobs`; a detach (:meth:`ManagedJob.request_detach`) stops
supervising and leaves the attempt running; only a ``cancel`` file stops a job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
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
from runner.provision.registry import JobRecord, job_dir
from ten.text import clock as hms

CANCEL = "cancel"  # a file in the job's directory: the user asked to cancel
LOCK = "controller.lock"  # held (flock) by the one controller of a job; holds its pid
LIVE_STATES = ("running", "unknown")  # heartbeat states that are not an attempt's end


class Detached(Exception):
    """Internal: the controller stops supervising and leaves the attempt running."""


class ManagedJob:
    """One controller for one submitted job (see the module doc).

    ``make_spec(attempt)`` builds the launch spec of attempt ``attempt`` (1, 2, ...);
    ``read_status()`` returns the job's latest heartbeat status (None while there is
    none): a final one (done/preempted/failed, with its exit code) ends the attempt, a
    live one is progress to report (step, loss, ETA). ``announce_cancel()`` tells
    the run, before its attempt is torn down, that the stop it is about to get is the
    user's cancel (see :func:`runner.monitor.cancel.announce`). ``clock``/``sleep`` are
    injectable so tests run the loop on a fake clock.
    """

    def __init__(self, record: JobRecord, provider: Provider,
                 make_spec: Callable[[int], LaunchSpec],
                 read_status: Callable[[], dict[str, Any] | None], *, poll_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep,
                 log: Callable[[str], None] = print, limits: Limits | None = None,
                 max_restarts: int | None = None, status_every_s: float = 30.0,
                 announce_cancel: Callable[[], None] = lambda: None) -> None:
        self.record, self.provider = record, provider
        self.announce_cancel = announce_cancel
        self.make_spec, self.read_status = make_spec, read_status
        self.poll_s, self.clock, self.sleep, self.log = poll_s, clock, sleep, log
        self.limits = limits or Limits(**record.details.get("limits", {}))
        self.max_restarts = (int(record.details.get("max_restarts", 3))
                             if max_restarts is None else max_restarts)
        self.status_every_s = status_every_s
        self.instance: Instance | None = None
        self._next_launch = 0.0
        self._status_read: float | None = None  # clock() of the last read_status()
        self._shown_step: int | None = None  # the step of the last progress line
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
        launch belongs to a previous attempt (or a previous submit of the same job). A
        live one of this attempt is reported as progress when its step moved."""
        try:
            status = self.read_status()
        except Exception as e:  # noqa: BLE001 - the store may be briefly unreachable
            self._warn_once("status", f"cannot read the job's status: {e}")
            return None
        self._warned.discard("status")
        if not status or float(status.get("time") or 0.0) < instance.launched_at:
            return None
        if status.get("state") in LIVE_STATES:
            self._progress(status)
            return None
        return status

    def _progress(self, status: dict[str, Any]) -> None:
        step, total = status.get("step"), status.get("total_steps")
        if not isinstance(step, int) or step == self._shown_step:
            return
        self._shown_step = step
        parts = [f"step {step}" + (f"/{total}" if total else "")]
        if isinstance(status.get("loss"), int | float):
            parts.append(f"loss {status['loss']:.4f}")
        if isinstance(status.get("eta_s"), int | float):
            parts.append(f"ETA {hms(status['eta_s'])}")
        self.log(f"{self.record.job_id}: {', '.join(parts)}")

    def _apply(self, obs: Observation) -> None:
        rec = self.record
        d = decide(rec.state, obs, restarts=rec.restarts, max_restarts=self.max_restarts,
                   preemptions=rec.preemptions, limits=self.limits)
        if obs.kind == Kind.CANCEL and self.instance is not None:
            self._announce_cancel()
        if d.teardown:
            try:
                self._teardown()
            except Exception as e:  # noqa: BLE001
                if not d.state.terminal:
                    raise  # never relaunch beside an attempt that may still run
                d = dataclasses.replace(d, reason=f"{d.reason}; but {self._teardown_failed(e)}")
        if d.state.terminal:  # the job is over: nothing of it may keep running
            swept = "".join(f"; {line}" for line in sweep_leftovers(self.provider, rec.job_id))
            d = dataclasses.replace(d, reason=d.reason + swept)
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

    def _announce_cancel(self) -> None:
        try:
            self.announce_cancel()
        except Exception as e:  # noqa: BLE001 - the cancel goes on; the run says "preempted"
            self.log(f"could not tell the run it is cancelled ({e}); its heartbeat may say "
                     "preempted")

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


def sweep_leftovers(provider: Provider, job_id: str) -> list[str]:
    """Once a job has ended: terminate whatever the cloud still runs under its tag that the
    record does not know (a controller killed between the launch call and saving the
    record): :meth:`Provider.teardown_job`. A failure is reported, not raised: the job's
    own attempt is already down."""
    try:
        ids = provider.teardown_job(job_id)
    except Exception as e:  # noqa: BLE001
        return [f"could not look for leftover instances ({e}); check the console for "
                f"instances tagged {job_id}"]
    return [f"terminated leftover instance {i} (launched, never recorded)" for i in ids]


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
