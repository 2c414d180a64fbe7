"""`validate`, `status` and `jobs` take --json for scripts: JSON alone on stdout,
exit codes as without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from runner.cli import cli
from runner.exit_codes import ExitCode
from runner.monitor.heartbeat import Heartbeat
from runner.provision.registry import JobRecord

ROOT = Path(__file__).resolve().parents[2]
GOOD = ROOT / "jobs" / "tiny-cpu.yaml"


def invoke(*args: str, **kw):
    return CliRunner().invoke(cli, list(args), **kw)


# --- validate ---------------------------------------------------------------------------


def test_validate_json_lists_every_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.read_text().replace("name: tiny-cpu", "name: Bad"))
    result = invoke("validate", "--json", str(GOOD), str(bad))
    assert result.exit_code == ExitCode.CONFIG
    out = json.loads(result.stdout)
    assert [r["file"] for r in out] == [str(GOOD), str(bad)]
    assert out[0] == {"file": str(GOOD), "ok": True, "errors": [], "warnings": [],
                      "summary": out[0]["summary"], "model": out[0]["model"]}
    assert out[0]["summary"].startswith("name=tiny-cpu, ten/tiny, ")
    assert out[0]["model"].startswith("model ten/tiny: n_layers 4, d_model 128, ")
    assert out[1]["ok"] is False and out[1]["summary"] is None and out[1]["model"] is None
    assert out[1]["errors"][0].startswith(f"{bad}:3 name: must be 1-63 characters")
    # stderr: only click's one-line reason for the exit code, not the problems again
    assert result.stderr.strip() == "Error: 1 of 2 job files invalid"


def test_validate_json_all_ok_exits_0():
    result = invoke("validate", "--json", str(GOOD), "--set", "train.max_steps=3")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)[0]["summary"].endswith("3 steps")
    assert result.stderr == ""


def test_validate_json_missing_file_and_secret(tmp_path):
    result = invoke("validate", "--json", str(GOOD), str(tmp_path / "nope.yaml"),
                    "--set", "storage.endpoint_url=${EP}", "--set", "name=${EP}",
                    env={"EP": "https://very-secret.example"})
    assert result.exit_code == ExitCode.CONFIG
    assert "very-secret" not in result.output
    out = json.loads(result.stdout)
    assert out[0]["errors"] == ["--set name: must be 1-63 characters of a-z, 0-9 and '-', "
                                "starting with a letter or digit (it is used in paths), got "
                                "a value of type str (from ${EP})"]
    assert out[1]["errors"] == [f"{tmp_path / 'nope.yaml'}: no such file"]


# --- status -----------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path):
    run = tmp_path / "runs" / "demo"
    run.mkdir(parents=True)
    beat = Heartbeat(run, None, "demo", period_s=30.0, log=lambda s: None)
    beat.start()
    beat.stop("done")
    return tmp_path / "runs"


def test_status_json_of_a_store(store):
    result = invoke("status", str(store), "--json")
    assert result.exit_code == 0, result.output
    (status,) = json.loads(result.stdout)
    assert status["job"] == "demo" and status["state"] == "done" and status["stale"] is False
    assert result.stderr == ""


def test_status_json_without_runs_prints_an_empty_list_and_fails(tmp_path):
    (tmp_path / "empty").mkdir()
    result = invoke("status", str(tmp_path / "empty"), "--json")
    assert result.exit_code == ExitCode.CONFIG
    assert json.loads(result.stdout) == []
    assert result.stderr.startswith("Error: no runs with a heartbeat")


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TEN_RUNNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _record(job_id: str, **kw) -> JobRecord:
    record = JobRecord(job_id=job_id, job_name="demo", target="local", state="RUNNING",
                       attempt=2, details={"max_restarts": 3}, **kw)
    record.transition("RUNNING", "attempt 2")
    record.save()
    return record


def test_status_json_of_a_submitted_job(home):
    _record("demo-abc123")
    result = invoke("status", "demo-abc123", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert (out["job_id"], out["state"], out["attempt"]) == ("demo-abc123", "RUNNING", 2)
    assert out["controller_pid"] is None and out["heartbeat"] is None
    assert out["history"][-1]["reason"] == "attempt 2"


# --- jobs -------------------------------------------------------------------------------


def test_jobs_json(home):
    result = invoke("jobs", "--json")
    assert result.exit_code == 0 and json.loads(result.stdout) == []
    _record("demo-abc123")
    _record("demo-def456")
    result = invoke("jobs", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert [r["job_id"] for r in out] == ["demo-abc123", "demo-def456"]
    assert out[0]["target"] == "local" and out[0]["state"] == "RUNNING"
    # the table is unchanged without --json
    assert "demo-abc123" in invoke("jobs").stdout.splitlines()[1]


def test_status_json_is_strict_json_even_with_a_nan_loss(store):
    path = store / "demo" / "status.json"
    status = json.loads(path.read_text())
    status["loss"] = float("nan")
    path.write_text(json.dumps(status))  # Python writes NaN, which is not JSON
    result = invoke("status", str(store), "--json")
    assert result.exit_code == 0, result.output
    assert "NaN" not in result.stdout
    assert json.loads(result.stdout)[0]["loss"] is None
