"""The managed job's relaunch policy, as one pure function: :func:`decide` maps (state,
what the loop just saw, counters, limits) to a :class:`Decision`. No clock, no I/O: the
loop (:mod:`runner.provision.managed`) measures times and passes them in, so every rule
is a row in a table test, and runner/README.md documents the same rows.

Lifecycle (SkyPilot's managed-job states)::

    PENDING -> STARTING -> RUNNING <-> RECOVERING -> SUCCEEDED | FAILED | CANCELLED

Which exits relaunch (runner/exit_codes.py):

* 0 OK: SUCCEEDED.
* 75 PREEMPTED, a death by SIGKILL/SIGTERM/SIGINT/SIGHUP, or the provider saying the
  machine was reclaimed: relaunch, never charged to ``max_restarts`` (the job resumes
  from its last committed checkpoint; being preempted is not the job's fault).
* 1 CRASH, 4 STORAGE (often transient: an endpoint or credentials hiccup), an unknown
  exit, a crash signal (SIGSEGV, SIGABRT, ...), a machine that vanished without a final
  heartbeat: relaunch while ``restarts < max_restarts``, each charged; then FAILED.
* 2 CONFIG, 3 DATA, 9 DIVERGED and 10 GPU_UNUSABLE: FAILED at once. All are
  deterministic (the same YAML, dataset or learning rate fails the same way on any
  machine, and a driver older than the image's CUDA on every host of that machine
  image); relaunching would only burn money.
* 5 UNHEALTHY_HOST (the GPU failed the pre-flight gate): block that zone/host and
  relaunch elsewhere, not charged (bad hardware is the cloud's fault). It is bounded
  because every failure blocks one more place and a provider with nowhere left to go
  refuses the launch (local: at once; a cloud: as no capacity, up to the deadline). A
  provider that names no zone has nothing to block: counted like a crash instead.
* No capacity at launch: stay PENDING/RECOVERING and retry with exponential backoff;
  after ``capacity_timeout_s`` of refusals in a row, FAILED with exit code 6.
* Cancel: CANCELLED, from any live state.

The teardown flag is set whenever the current attempt is over (before a relaunch, and
at every terminal state); the loop also tears down in a ``finally`` block.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass
from typing import Any

from runner.exit_codes import DETERMINISTIC_FAILURES, ExitCode
from runner.provision.base import Phase


class State(str, enum.Enum):
    PENDING = "PENDING"  # submitted, no machine asked for yet or none available
    STARTING = "STARTING"  # first attempt launched, not running yet
    RUNNING = "RUNNING"  # an attempt is running
    RECOVERING = "RECOVERING"  # an attempt ended early: relaunching (until it runs)
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({State.SUCCEEDED, State.FAILED, State.CANCELLED})


class Kind(str, enum.Enum):
    """What the loop observed."""

    LAUNCHED = "launched"  # provider.launch returned an instance
    NO_CAPACITY = "no_capacity"  # provider.launch raised NoCapacity
    LAUNCH_ERROR = "launch_error"  # provider.launch raised another error (exit_code says)
    POLLED = "polled"  # provider.poll answered (phase, exit_code) (+ heartbeat final)
    UNREACHABLE = "unreachable"  # provider.poll keeps failing (waited_s since last answer)
    CANCEL = "cancel"  # the user asked to cancel


@dataclass(frozen=True)
class Observation:
    kind: Kind
    phase: Phase | None = None  # POLLED
    exit_code: int | None = None  # POLLED: the provider's; LAUNCH_ERROR: the error's
    final: dict[str, Any] | None = None  # POLLED: the attempt's final heartbeat status
    waited_s: float = 0.0  # NO_CAPACITY: since refusals began; POLLED: since launch;
    #                        UNREACHABLE: since the last answer
    final_age_s: float = 0.0  # POLLED: since the loop first saw ``final``
    tries: int = 0  # NO_CAPACITY: refusals in a row so far (this one included)
    zone: str | None = None  # POLLED: where the attempt runs (what UNHEALTHY blocks)
    detail: str = ""  # a one-line message from the provider

    @classmethod
    def polled(cls, phase: Phase, exit_code: int | None = None,
               final: dict[str, Any] | None = None, **kw: Any) -> Observation:
        return cls(Kind.POLLED, phase=phase, exit_code=exit_code, final=final, **kw)


@dataclass(frozen=True)
class Limits:
    """The knobs of the policy (max_restarts comes from the job's resources)."""

    capacity_timeout_s: float = 3600.0  # give up after this long without capacity
    backoff_s: float = 30.0  # first wait after a refusal; doubles per refusal
    backoff_max_s: float = 600.0
    start_timeout_s: float = 1800.0  # an attempt still provider-PENDING after this: retry
    unreachable_timeout_s: float = 600.0  # the provider cannot tell us anything this long
    exit_grace_s: float = 60.0  # a final heartbeat while the process still runs: let it
    #                             exit by itself this long before tearing it down
    max_preemptions: int | None = None  # None: preemptions always relaunch


@dataclass(frozen=True)
class Decision:
    state: State
    relaunch: bool = False  # launch a new attempt (after wait_s)
    charge: bool = False  # count one restart against max_restarts
    preempted: bool = False  # count one preemption
    block: str | None = None  # never launch in this zone/host again
    teardown: bool = False  # terminate the current attempt now
    wait_s: float = 0.0  # before the next launch
    exit_code: int | None = None  # terminal states: the job's exit code
    reason: str = ""


class Cause(str, enum.Enum):
    """How an attempt ended, from its exit code (see :func:`classify_exit`)."""

    DONE = "done"
    PREEMPTED = "preempted"
    RETRY = "retry"  # charged relaunch
    FATAL = "fatal"  # no relaunch
    UNHEALTHY = "unhealthy"  # relaunch elsewhere


# Deaths that look like a reclaim (what a cloud or `kill` sends), not a crash. An OOM
# kill is also SIGKILL and cannot be told apart; see runner/README.md.
PREEMPT_SIGNALS = frozenset({signal.SIGKILL, signal.SIGTERM, signal.SIGINT, signal.SIGHUP})
FATAL_CODES = DETERMINISTIC_FAILURES


def signal_of(code: int) -> int | None:
    """The signal behind an exit code: -N (Python's Popen) or 128+N (shells, docker)."""
    if code < 0:
        return -code
    if 128 < code < 128 + 65:
        return code - 128
    return None


def classify_exit(code: int | None) -> Cause:
    if code is None:
        return Cause.RETRY  # not known: bounded like a crash
    if code == ExitCode.OK:
        return Cause.DONE
    if code == ExitCode.PREEMPTED:
        return Cause.PREEMPTED
    if code in FATAL_CODES:
        return Cause.FATAL
    if code == ExitCode.UNHEALTHY_HOST:
        return Cause.UNHEALTHY
    sig = signal_of(code)
    if sig is not None:
        return Cause.PREEMPTED if sig in PREEMPT_SIGNALS else Cause.RETRY
    return Cause.RETRY  # CRASH, STORAGE and anything unexpected


def describe_exit(code: int | None) -> str:
    if code is None:
        return "exit code unknown"
    sig = signal_of(code)
    if sig is not None:
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    try:
        return f"exit {code} ({ExitCode(code).name})"
    except ValueError:
        return f"exit {code}"


def final_exit_code(final: dict[str, Any] | None) -> int | None:
    """The exit code a final heartbeat status recorded; older runners wrote only the
    state, which still tells done from preempted."""
    if not final:
        return None
    code = final.get("exit_code")
    if isinstance(code, int) and not isinstance(code, bool):
        return code
    return {"done": ExitCode.OK, "preempted": ExitCode.PREEMPTED}.get(final.get("state"))


def attempt_end(obs: Observation, limits: Limits = Limits()
                ) -> tuple[Cause, int | None, str] | None:
    """How the polled attempt ended, or None while it still runs. The process's own exit
    code wins; the heartbeat's final status fills in when the provider cannot know it (a
    remote container, a process that is not our child; while the provider still sees it
    running, only after ``exit_grace_s``); a reclaim wins over everything but a job that
    had already finished."""
    phase, final_code = obs.phase, final_exit_code(obs.final)
    if phase in (Phase.PENDING, Phase.RUNNING):
        if obs.final is None:
            return None
        if obs.final_age_s < limits.exit_grace_s:
            return None  # the job said its last word; let the process end by itself
        return classify_exit(final_code), final_code, "the job's final heartbeat"
    if phase == Phase.EXITED:
        code = obs.exit_code if obs.exit_code is not None else final_code
        return classify_exit(code), code, "the attempt ended"
    if phase == Phase.PREEMPTED:
        if final_code == ExitCode.OK:
            return Cause.DONE, 0, "finished before the machine was reclaimed"
        code = obs.exit_code if obs.exit_code is not None else ExitCode.PREEMPTED
        return Cause.PREEMPTED, code, "preempted"
    # GONE: the machine or process vanished; only a final heartbeat says how it ended.
    if obs.final is not None:
        return classify_exit(final_code), final_code, "the attempt is gone"
    return Cause.RETRY, None, "the attempt vanished without a final heartbeat"


def backoff(tries: int, limits: Limits) -> float:
    return min(limits.backoff_max_s, limits.backoff_s * 2 ** max(0, tries - 1))


def decide(state: State | str, obs: Observation, *, restarts: int, max_restarts: int,
           preemptions: int = 0, limits: Limits = Limits()) -> Decision:
    """The next step of a managed job (pure; see the module doc and runner/README.md)."""
    state = State(state)
    if state.terminal:
        return Decision(state, reason=f"already {state.value}")
    if obs.kind == Kind.CANCEL:
        return Decision(State.CANCELLED, teardown=True, reason="cancelled by the user")
    if obs.kind == Kind.LAUNCHED:
        nxt = State.STARTING if state == State.PENDING else state
        return Decision(nxt, reason=obs.detail or "launched")
    if obs.kind == Kind.NO_CAPACITY:
        if obs.waited_s >= limits.capacity_timeout_s:
            return Decision(State.FAILED, teardown=True, exit_code=ExitCode.NO_CAPACITY,
                            reason=f"no capacity for {obs.waited_s:.0f} s "
                                   f"({obs.tries} tries): {obs.detail}".rstrip(": "))
        wait = backoff(obs.tries, limits)
        return Decision(state, relaunch=True, wait_s=wait,
                        reason=f"no capacity, retrying in {wait:.0f} s: {obs.detail}"
                        .rstrip(": "))
    if obs.kind == Kind.LAUNCH_ERROR:
        return _launch_error(state, obs, restarts, max_restarts, limits)
    if obs.kind == Kind.UNREACHABLE:
        if obs.waited_s >= limits.unreachable_timeout_s:
            return Decision(State.FAILED, teardown=True, exit_code=ExitCode.HOST_UNREACHABLE,
                            reason=f"the attempt could not be observed for "
                                   f"{obs.waited_s:.0f} s: {obs.detail}".rstrip(": "))
        return Decision(state)
    return _polled(state, obs, restarts, max_restarts, preemptions, limits)


def _launch_error(state: State, obs: Observation, restarts: int, max_restarts: int,
                  limits: Limits) -> Decision:
    code = obs.exit_code if obs.exit_code is not None else ExitCode.CRASH
    retryable = code in (ExitCode.CRASH, ExitCode.HOST_UNREACHABLE, ExitCode.STORAGE)
    if retryable and restarts < max_restarts:
        wait = backoff(restarts + 1, limits)
        return Decision(state, relaunch=True, charge=True, wait_s=wait,
                        reason=f"launch failed ({describe_exit(code)}), retry "
                               f"{restarts + 1}/{max_restarts} in {wait:.0f} s: {obs.detail}")
    why = "" if not retryable else f" after {restarts} restarts"
    return Decision(State.FAILED, teardown=True, exit_code=code,
                    reason=f"launch failed{why}: {obs.detail or describe_exit(code)}")


def _polled(state: State, obs: Observation, restarts: int, max_restarts: int,
            preemptions: int, limits: Limits) -> Decision:
    end = attempt_end(obs, limits)
    if end is None:
        if obs.phase == Phase.RUNNING:
            return Decision(State.RUNNING, reason="running" if state != State.RUNNING else "")
        if obs.waited_s >= limits.start_timeout_s:  # stuck booting / pulling the image
            return _retry(state, f"did not start within {obs.waited_s:.0f} s", None,
                          restarts, max_restarts)
        return Decision(state)
    cause, code, how = end
    what = f"{how}: {describe_exit(code)}"
    if cause == Cause.DONE:
        return Decision(State.SUCCEEDED, teardown=True, exit_code=0, reason=what)
    if cause == Cause.FATAL:
        return Decision(State.FAILED, teardown=True, exit_code=code,
                        reason=f"{what}; not retried: it would fail the same way again")
    if cause == Cause.PREEMPTED:
        if limits.max_preemptions is not None and preemptions >= limits.max_preemptions:
            return Decision(State.FAILED, teardown=True, preempted=True,
                            exit_code=ExitCode.PREEMPTED,
                            reason=f"{what}; {preemptions + 1} preemptions, the limit is "
                                   f"{limits.max_preemptions}")
        return Decision(State.RECOVERING, relaunch=True, preempted=True, teardown=True,
                        reason=f"{what}; relaunching (preemption {preemptions + 1}, "
                               "not counted as a restart)")
    if cause == Cause.UNHEALTHY:
        if obs.zone is None:  # nothing to block: bounded like a crash instead
            return _retry(state, f"{what}; the provider names no zone to avoid", code,
                          restarts, max_restarts)
        return Decision(State.RECOVERING, relaunch=True, teardown=True, block=obs.zone,
                        reason=f"{what}; {obs.zone} blocked, relaunching elsewhere (not "
                               "counted as a restart)")
    return _retry(state, what, code, restarts, max_restarts)


def _retry(state: State, what: str, code: int | None, restarts: int,
           max_restarts: int) -> Decision:
    if restarts < max_restarts:
        return Decision(State.RECOVERING, relaunch=True, charge=True, teardown=True,
                        reason=f"{what}; restart {restarts + 1}/{max_restarts}")
    return Decision(State.FAILED, teardown=True,
                    exit_code=code if code is not None else ExitCode.CRASH,
                    reason=f"{what}; no restarts left ({restarts}/{max_restarts} used)")
