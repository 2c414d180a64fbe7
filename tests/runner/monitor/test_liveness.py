"""The container healthcheck: the pure verdict from a table, then ``check()`` following a
real pointer to a status.json written by the real heartbeat, and the click command."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from runner.monitor.heartbeat import Heartbeat
from runner.monitor.liveness import (
    check,
    healthcheck,
    judge,
    pointer_path,
    write_pointer,
)

NOW = 1_700_000_000.0


def status(state="running", age=0.0, period_s=30.0, **extra):
    return {"job": "j", "state": state, "time": NOW - age, "period_s": period_s, "step": 7,
            "diagnoses": [], **extra}


STALLED = {"code": "stalled", "severity": "critical",
           "message": "no training step for 700 s (last at step 7)"}

# (case, status, max_age_s, healthy, words in the reason)
TABLE = [
    ("no status yet", None, None, True, "starting"),
    ("fresh beat", status(age=5), None, True, "last beat 5s ago"),
    ("just under 3 periods", status(age=89.9, period_s=30), None, True, "running"),
    ("3 periods old", status(age=90, period_s=30), None, False, "stale"),
    ("short period: 60 s floor", status(age=59, period_s=5), None, True, "running"),
    ("short period: past the floor", status(age=61, period_s=5), None, False, "limit 60s"),
    ("long period", status(age=500, period_s=200), None, True, "running"),
    ("long period, stale", status(age=601, period_s=200), None, False, "stale"),
    ("explicit max age", status(age=20), 10.0, False, "limit 10s"),
    ("explicit max age, fresh", status(age=5), 10.0, True, "running"),
    ("no period: default 30 s", {"state": "running", "time": NOW - 89}, None, True, "running"),
    ("bad period: default", status(age=91, period_s="x"), None, False, "stale"),
    ("clock ahead of us", status(age=-30), None, True, "last beat 0s ago"),
    ("no time", {"state": "running", "period_s": 30}, None, False, "no valid time"),
    ("time not a number", {"state": "running", "time": "noon"}, None, False, "no valid time"),
    ("done: exiting", status("done", age=10_000), None, True, "exiting"),
    ("preempted: exiting", status("preempted", age=10_000), None, True, "exiting"),
    ("failed", status("failed", exit_code=4), None, False, "exit code 4"),
    ("failed, fresh", status("failed", age=1), None, False, "failed"),
    ("stalled final beat", status("stalled"), None, False, "stalled"),
    ("stall diagnosed while beating", status(age=3, diagnoses=[STALLED]), None, False,
     "no training step"),
    ("other diagnoses are fine", status(age=3, diagnoses=[{"code": "low_util"}]), None, True,
     "running"),
    ("unknown state: freshness rule", status("unknown", age=3), None, True, "unknown"),
]


@pytest.mark.parametrize("case,doc,max_age,healthy,words", TABLE, ids=[t[0] for t in TABLE])
def test_judge(case, doc, max_age, healthy, words):
    ok, reason = judge(doc, NOW, max_age)
    assert ok is healthy
    assert words in reason
    assert "\n" not in reason


@pytest.fixture
def pointer(tmp_path, monkeypatch):
    path = tmp_path / "cache" / "heartbeat-pointer"
    monkeypatch.setenv("TEN_HEARTBEAT_POINTER", str(path))
    return path


def test_pointer_path_defaults(monkeypatch, tmp_path):
    monkeypatch.delenv("TEN_HEARTBEAT_POINTER", raising=False)
    monkeypatch.setenv("TEN_CACHE_DIR", str(tmp_path / "c"))
    assert pointer_path() == tmp_path / "c" / "heartbeat-pointer"
    monkeypatch.delenv("TEN_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert pointer_path() == tmp_path / "home" / ".cache" / "ten" / "heartbeat-pointer"
    monkeypatch.setenv("TEN_HEARTBEAT_POINTER", "~/p")
    assert pointer_path() == tmp_path / "home" / "p"


def test_write_pointer_is_atomic_and_absolute(pointer, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_pointer(tmp_path / "a" / "status.json")
    write_pointer(type(tmp_path)("b/status.json"))  # relative: stored absolute
    assert pointer.read_text() == f"{tmp_path / 'b' / 'status.json'}\n"
    assert sorted(p.name for p in pointer.parent.iterdir()) == ["heartbeat-pointer"]


def test_check_follows_the_pointer_to_the_real_heartbeat(pointer, tmp_path):
    run_dir = tmp_path / "runs" / "job"
    assert check() == (True, f"starting: no heartbeat pointer at {pointer} yet")
    write_pointer(run_dir / "status.json")
    ok, reason = check()
    assert ok and reason.startswith("starting: no status.json")

    run_dir.mkdir(parents=True)  # the runner's log creates it first
    beat = Heartbeat(run_dir, period_s=30.0, log=lambda line: None)
    beat.beat()  # what the heartbeat thread writes every period
    ok, reason = check()
    assert ok and reason.startswith("running at step 0"), reason

    beat.stop("done", exit_code=0)
    assert check() == (True, "done at step 0: the runner is exiting")


def test_check_stale_and_failed(pointer, tmp_path):
    status_json = tmp_path / "run" / "status.json"
    status_json.parent.mkdir()
    write_pointer(status_json)
    started = pointer.stat().st_mtime
    status_json.write_text(json.dumps({"state": "running", "time": started + 1,
                                       "period_s": 10, "step": 3}))
    old = time.time() - 120  # the pointer (process start) is older than the status
    os.utime(pointer, (old - 10, old - 10))
    status_json.write_text(json.dumps({"state": "running", "time": old, "period_s": 10,
                                       "step": 3}))
    ok, reason = check()
    assert not ok and "stale: last beat 120s ago" in reason
    ok, reason = check(max_age_s=300)
    assert ok
    status_json.write_text(json.dumps({"state": "failed", "time": time.time(), "step": 3,
                                       "exit_code": 1}))
    assert check() == (False, "failed at step 3 (exit code 1)")


def test_a_status_from_a_previous_process_reads_as_starting(pointer, tmp_path):
    """After a container restart the old status.json still says "failed" until the new
    runner's first beat; the pointer written at process start tells the two apart."""
    status_json = tmp_path / "run" / "status.json"
    status_json.parent.mkdir()
    status_json.write_text(json.dumps({"state": "failed", "time": time.time() - 5,
                                       "step": 9, "exit_code": 1}))
    write_pointer(status_json)  # the new process starts
    ok, reason = check()
    assert ok and "previous run" in reason
    # Judged directly (no pointer), the same file is a failure.
    assert check(status_json)[0] is False


def test_check_unreadable_status(pointer, tmp_path):
    status_json = tmp_path / "status.json"
    write_pointer(status_json)
    status_json.write_text("{not json")
    ok, reason = check()
    assert not ok and "not a JSON status document" in reason
    status_json.write_text("[1, 2]")
    assert check()[0] is False
    pointer.write_text("")
    assert check() == (False, f"the heartbeat pointer {pointer} is empty")


def test_healthcheck_command(pointer, tmp_path):
    runner = CliRunner()
    result = runner.invoke(healthcheck, [])
    assert result.exit_code == 0
    assert result.output.startswith("healthy: starting") and result.output.count("\n") == 1

    status_json = tmp_path / "status.json"
    status_json.write_text(json.dumps({"state": "running", "time": time.time() - 100,
                                       "period_s": 30, "step": 1}))
    result = runner.invoke(healthcheck, ["--status", str(status_json)])
    assert result.exit_code == 1
    assert result.output.startswith("unhealthy: heartbeat stale")
    result = runner.invoke(healthcheck, ["--status", str(status_json), "--max-age", "1000"])
    assert result.exit_code == 0 and result.output.startswith("healthy: running")
    assert runner.invoke(healthcheck, ["--max-age", "0"]).exit_code == 2  # usage error


def test_healthcheck_process_imports_no_torch(pointer):
    """Docker runs it every interval: it must not import torch (seconds of CPU)."""
    code = ("import sys; from runner.monitor import liveness; "
            "assert 'torch' not in sys.modules and 'runner.monitor.heartbeat' not in "
            "sys.modules; liveness.healthcheck()")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, cwd=Path(__file__).resolve().parents[3])
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("healthy: starting")
