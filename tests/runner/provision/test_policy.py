"""The relaunch policy from a table: one row per rule (runner/README.md lists the same
rows), plus the README check that every state is documented."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from runner.exit_codes import ExitCode
from runner.provision.base import Phase
from runner.provision.policy import (
    Cause,
    Kind,
    Limits,
    Observation,
    State,
    backoff,
    classify_exit,
    decide,
    describe_exit,
)

README = Path(__file__).parents[3] / "runner" / "README.md"
L = Limits(capacity_timeout_s=100, backoff_s=10, backoff_max_s=40, start_timeout_s=50,
           unreachable_timeout_s=30, exit_grace_s=60, max_preemptions=None)
S, P = State, Phase
RUN, REC, PEN, STA = S.RUNNING, S.RECOVERING, S.PENDING, S.STARTING


def polled(phase, code=None, final=None, **kw):
    return Observation.polled(phase, code, final, zone=kw.pop("zone", "z1"), **kw)


def fin(state, code=None):
    return {"state": state, "exit_code": code, "time": 1.0}


# (id, state, observation, restarts, max_restarts, expected:
#  (next state, relaunch, charge, preempted, block, teardown, exit_code))
ROWS = [
    # launching
    ("launched", PEN, Observation(Kind.LAUNCHED), 0, 3, (STA, 0, 0, 0, None, 0, None)),
    ("relaunched stays recovering", REC, Observation(Kind.LAUNCHED), 1, 3,
     (REC, 0, 0, 0, None, 0, None)),
    ("no capacity waits", PEN, Observation(Kind.NO_CAPACITY, waited_s=5, tries=1), 0, 3,
     (PEN, 1, 0, 0, None, 0, None)),
    ("no capacity while recovering", REC, Observation(Kind.NO_CAPACITY, tries=2), 0, 3,
     (REC, 1, 0, 0, None, 0, None)),
    ("no capacity past the deadline", REC, Observation(Kind.NO_CAPACITY, waited_s=100), 0, 3,
     (S.FAILED, 0, 0, 0, None, 1, ExitCode.NO_CAPACITY)),
    ("bad credentials", PEN, Observation(Kind.LAUNCH_ERROR, exit_code=8), 0, 3,
     (S.FAILED, 0, 0, 0, None, 1, 8)),
    ("bad config at launch", PEN, Observation(Kind.LAUNCH_ERROR, exit_code=2), 0, 3,
     (S.FAILED, 0, 0, 0, None, 1, 2)),
    ("no healthy host left", REC, Observation(Kind.LAUNCH_ERROR, exit_code=5), 0, 3,
     (S.FAILED, 0, 0, 0, None, 1, 5)),
    ("host unreachable retried", PEN, Observation(Kind.LAUNCH_ERROR, exit_code=7), 0, 3,
     (PEN, 1, 1, 0, None, 0, None)),
    ("provider bug retried", PEN, Observation(Kind.LAUNCH_ERROR, exit_code=1), 2, 3,
     (PEN, 1, 1, 0, None, 0, None)),
    ("provider bug, no restarts left", PEN, Observation(Kind.LAUNCH_ERROR, exit_code=1), 3, 3,
     (S.FAILED, 0, 0, 0, None, 1, 1)),
    # an attempt that is still going
    ("pending", STA, polled(P.PENDING, waited_s=10), 0, 3, (STA, 0, 0, 0, None, 0, None)),
    ("started", STA, polled(P.RUNNING), 0, 3, (RUN, 0, 0, 0, None, 0, None)),
    ("recovered", REC, polled(P.RUNNING), 1, 3, (RUN, 0, 0, 0, None, 0, None)),
    ("still running", RUN, polled(P.RUNNING), 0, 3, (RUN, 0, 0, 0, None, 0, None)),
    ("stuck pending", STA, polled(P.PENDING, waited_s=50), 0, 3,
     (REC, 1, 1, 0, None, 1, None)),
    # how an attempt ended
    ("done", RUN, polled(P.EXITED, 0), 0, 3, (S.SUCCEEDED, 0, 0, 0, None, 1, 0)),
    ("preempted exit 75", RUN, polled(P.EXITED, 75), 3, 3, (REC, 1, 0, 1, None, 1, None)),
    ("killed by SIGKILL", RUN, polled(P.EXITED, -9), 3, 3, (REC, 1, 0, 1, None, 1, None)),
    ("docker 143 (SIGTERM)", RUN, polled(P.EXITED, 143), 3, 3, (REC, 1, 0, 1, None, 1, None)),
    ("machine reclaimed", RUN, polled(P.PREEMPTED), 3, 3, (REC, 1, 0, 1, None, 1, None)),
    ("reclaimed after finishing", RUN, polled(P.PREEMPTED, None, fin("done", 0)), 0, 3,
     (S.SUCCEEDED, 0, 0, 0, None, 1, 0)),
    ("crash", RUN, polled(P.EXITED, 1), 0, 3, (REC, 1, 1, 0, None, 1, None)),
    ("crash, no restarts left", RUN, polled(P.EXITED, 1), 3, 3,
     (S.FAILED, 0, 0, 0, None, 1, 1)),
    ("segfault", RUN, polled(P.EXITED, -11), 0, 3, (REC, 1, 1, 0, None, 1, None)),
    ("storage error", RUN, polled(P.EXITED, 4), 1, 3, (REC, 1, 1, 0, None, 1, None)),
    ("storage error, no restarts left", RUN, polled(P.EXITED, 4), 3, 3,
     (S.FAILED, 0, 0, 0, None, 1, 4)),
    ("config error", RUN, polled(P.EXITED, 2), 0, 3, (S.FAILED, 0, 0, 0, None, 1, 2)),
    ("data error", RUN, polled(P.EXITED, 3), 0, 3, (S.FAILED, 0, 0, 0, None, 1, 3)),
    ("diverged", RUN, polled(P.EXITED, 9), 0, 3, (S.FAILED, 0, 0, 0, None, 1, 9)),
    ("gpu unusable (driver too old for the image)", RUN, polled(P.EXITED, 10), 0, 3,
     (S.FAILED, 0, 0, 0, None, 1, 10)),
    ("unhealthy host", RUN, polled(P.EXITED, 5), 3, 3, (REC, 1, 0, 0, "z1", 1, None)),
    ("unhealthy, no zone known", RUN, polled(P.EXITED, 5, zone=None), 0, 3,
     (REC, 1, 1, 0, None, 1, None)),
    ("unknown exit code", RUN, polled(P.EXITED, 42), 0, 3, (REC, 1, 1, 0, None, 1, None)),
    ("exit code from the heartbeat", RUN, polled(P.EXITED, None, fin("failed", 3)), 0, 3,
     (S.FAILED, 0, 0, 0, None, 1, 3)),
    ("exit code unknown anywhere", RUN, polled(P.EXITED), 0, 3,
     (REC, 1, 1, 0, None, 1, None)),
    ("job ended, process still exiting", RUN,
     polled(P.RUNNING, None, fin("done", 0), final_age_s=59), 0, 3,
     (RUN, 0, 0, 0, None, 0, None)),
    ("job ended, machine up", RUN, polled(P.RUNNING, None, fin("done", 0), final_age_s=60),
     0, 3, (S.SUCCEEDED, 0, 0, 0, None, 1, 0)),
    ("job preempted, machine up", RUN,
     polled(P.RUNNING, None, fin("preempted", 75), final_age_s=60), 0, 3,
     (REC, 1, 0, 1, None, 1, None)),
    ("old heartbeat: state only", RUN,
     polled(P.RUNNING, None, {"state": "done"}, final_age_s=60), 0, 3,
     (S.SUCCEEDED, 0, 0, 0, None, 1, 0)),
    ("stalled, no code", RUN, polled(P.RUNNING, None, {"state": "stalled"}, final_age_s=60),
     0, 3, (REC, 1, 1, 0, None, 1, None)),
    ("vanished", RUN, polled(P.GONE), 0, 3, (REC, 1, 1, 0, None, 1, None)),
    ("vanished after finishing", RUN, polled(P.GONE, None, fin("done", 0)), 0, 3,
     (S.SUCCEEDED, 0, 0, 0, None, 1, 0)),
    # the provider cannot be asked
    ("unreachable a while", RUN, Observation(Kind.UNREACHABLE, waited_s=10), 0, 3,
     (RUN, 0, 0, 0, None, 0, None)),
    ("unreachable too long", RUN, Observation(Kind.UNREACHABLE, waited_s=30), 0, 3,
     (S.FAILED, 0, 0, 0, None, 1, ExitCode.HOST_UNREACHABLE)),
    # the user
    ("cancel running", RUN, Observation(Kind.CANCEL), 0, 3, (S.CANCELLED, 0, 0, 0, None, 1,
                                                             None)),
    ("cancel pending", PEN, Observation(Kind.CANCEL), 0, 3, (S.CANCELLED, 0, 0, 0, None, 1,
                                                             None)),
    ("cancel recovering", REC, Observation(Kind.CANCEL), 0, 3,
     (S.CANCELLED, 0, 0, 0, None, 1, None)),
    # terminal states do not move
    ("succeeded stays", S.SUCCEEDED, polled(P.EXITED, 1), 0, 3,
     (S.SUCCEEDED, 0, 0, 0, None, 0, None)),
    ("failed ignores cancel", S.FAILED, Observation(Kind.CANCEL), 0, 3,
     (S.FAILED, 0, 0, 0, None, 0, None)),
]


@pytest.mark.parametrize("state,obs,restarts,max_restarts,expected",
                         [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_decide(state, obs, restarts, max_restarts, expected):
    d = decide(state, obs, restarts=restarts, max_restarts=max_restarts, limits=L)
    got = (d.state, d.relaunch, d.charge, d.preempted, d.block, d.teardown, d.exit_code)
    assert got == expected, d.reason
    if d.state != state or d.relaunch:
        assert d.reason  # every change says why


def test_backoff_doubles_up_to_the_cap():
    assert [backoff(n, L) for n in range(1, 6)] == [10, 20, 40, 40, 40]
    d = decide(S.PENDING, Observation(Kind.NO_CAPACITY, tries=2), restarts=0, max_restarts=3,
               limits=L)
    assert d.wait_s == 20 and "retrying in 20 s" in d.reason


def test_preemption_cap_when_configured():
    capped = Limits(max_preemptions=2)
    d = decide(RUN, polled(P.PREEMPTED), restarts=0, max_restarts=3, preemptions=1,
               limits=capped)
    assert d.state == S.RECOVERING and d.relaunch
    d = decide(RUN, polled(P.PREEMPTED), restarts=0, max_restarts=3, preemptions=2,
               limits=capped)
    assert d.state == S.FAILED and d.exit_code == ExitCode.PREEMPTED and d.teardown


@pytest.mark.parametrize("code,cause", [
    (0, Cause.DONE), (75, Cause.PREEMPTED), (1, Cause.RETRY), (2, Cause.FATAL),
    (3, Cause.FATAL), (4, Cause.RETRY), (5, Cause.UNHEALTHY), (None, Cause.RETRY),
    (-signal.SIGKILL, Cause.PREEMPTED), (-signal.SIGTERM, Cause.PREEMPTED),
    (-signal.SIGINT, Cause.PREEMPTED), (-signal.SIGHUP, Cause.PREEMPTED),
    (128 + signal.SIGKILL, Cause.PREEMPTED), (-signal.SIGSEGV, Cause.RETRY),
    (128 + signal.SIGABRT, Cause.RETRY), (6, Cause.RETRY), (255, Cause.RETRY),
])
def test_classify_exit(code, cause):
    assert classify_exit(code) == cause


def test_describe_exit():
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(137) == "killed by SIGKILL"
    assert describe_exit(3) == "exit 3 (DATA)"
    assert describe_exit(42) == "exit 42"
    assert describe_exit(None) == "exit code unknown"


def test_state_values_and_terminal_set():
    assert [s.value for s in State] == ["PENDING", "STARTING", "RUNNING", "RECOVERING",
                                        "SUCCEEDED", "FAILED", "CANCELLED"]
    assert {s for s in State if s.terminal} == {S.SUCCEEDED, S.FAILED, S.CANCELLED}


def test_readme_documents_every_state_and_rule():
    text = README.read_text()
    for state in State:
        assert f"`{state.value}`" in text or state.value in text, state
    for needle in ("max_restarts", "capacity_timeout_s", "cancel", "controller.log",
                   "record.json", "UNHEALTHY_HOST", "PREEMPTED"):
        assert needle in text, needle


def test_readme_exit_code_table_agrees_with_the_policy():
    """Each `| code | NAME | decision |` row of the README says what classify_exit does."""
    import re

    rows = re.findall(r"^\| (\d+) \| ([A-Z_]+) \| (.+) \|$", README.read_text(), re.M)
    assert {int(code) for code, _, _ in rows} == {0, 1, 2, 3, 4, 5, 9, 10, 75}
    for code, name, decision in rows:
        assert ExitCode(int(code)).name == name
        cause = classify_exit(int(code))
        expected = {Cause.DONE: "`SUCCEEDED`", Cause.FATAL: "`FAILED` at once",
                    Cause.RETRY: "relaunch, counted", Cause.PREEMPTED: "relaunch, not counted",
                    Cause.UNHEALTHY: "block the zone/host, relaunch elsewhere, not counted"}
        assert decision.startswith(expected[cause]), (code, decision)
