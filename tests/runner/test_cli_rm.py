"""``ten-runner rm``: one run's files go, in a run directory or a bucket; nothing else,
never a live run's without --force, never without being asked or --yes."""

from __future__ import annotations

import json
import time

import pytest
from click.testing import CliRunner

from runner.cli import cli
from runner.exit_codes import ExitCode


def write_run(put, name: str, state: str, beat_age_s: float = 0.0) -> None:
    """A run's files as a run leaves them: status, metrics, a committed checkpoint."""
    status = {"job": name, "state": state, "time": time.time() - beat_age_s,
              "period_s": 30.0, "step": 7}
    put(f"{name}/status.json", json.dumps(status).encode())
    put(f"{name}/metrics.jsonl", b'{"kind": "train", "step": 7}\n')
    put(f"{name}/checkpoints/step-00000007/model.pt", b"w" * 1000)
    put(f"{name}/checkpoints/step-00000007/manifest.json", b"{}")


def rm(*args, answer=None):
    return CliRunner().invoke(cli, ["rm", *map(str, args)], input=answer)


@pytest.fixture
def runs(tmp_path):
    def put(key, data):
        path = tmp_path / "runs" / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    write_run(put, "done-run", "done")
    write_run(put, "other", "done")
    return tmp_path / "runs"


def test_rm_removes_one_run_directory_and_leaves_the_others(runs):
    out = rm(runs, "--job", "done-run", "--yes")
    assert out.exit_code == 0, out.output
    assert out.output.strip() == f"removed 4 files, 0.0 MB, in {runs / 'done-run'}"
    assert not (runs / "done-run").exists() and (runs / "other" / "status.json").exists()


def test_rm_takes_the_whole_run_directory_with_what_a_crash_left(runs):
    """A half-written checkpoint (a temporary folder no listing names) goes too: the run
    directory itself is removed, not only the files a store lists."""
    tmp = runs / "done-run" / "checkpoints" / ".tmp-step-00000008-123"
    tmp.mkdir(parents=True)
    (tmp / "model.pt").write_bytes(b"w")
    out = rm(runs, "--job", "done-run", "--yes")
    assert out.exit_code == 0, out.output
    assert not (runs / "done-run").exists() and (runs / "other").is_dir()


def test_reading_a_run_that_has_not_started_creates_nothing(tmp_path):
    from runner.monitor.source import RunFiles

    files = RunFiles.in_dir(tmp_path / "not-yet")
    assert files.read_json("status.json") is None
    assert not (tmp_path / "not-yet").exists()


def test_rm_asks_first_and_no_answer_removes_nothing(runs):
    out = rm(runs / "done-run")  # no input: end of input is no
    assert out.exit_code == ExitCode.CONFIG
    assert "remove 4 files" in out.output and "nothing removed" in out.output
    assert (runs / "done-run" / "status.json").exists()
    assert rm(runs / "done-run", answer="y\n").exit_code == 0
    assert not (runs / "done-run").exists()


def test_rm_refuses_a_live_run_unless_forced(runs):
    def put(key, data):
        (runs / key).parent.mkdir(parents=True, exist_ok=True)
        (runs / key).write_bytes(data)
    write_run(put, "live", "running", beat_age_s=5)
    out = rm(runs / "live", "--yes")
    assert out.exit_code == ExitCode.CONFIG
    assert "is training (its heartbeat is 5 s old, step 7)" in out.output
    assert (runs / "live" / "status.json").exists()
    write_run(put, "stale", "running", beat_age_s=3600)  # a dead machine's last beat
    assert rm(runs / "stale", "--yes").exit_code == 0
    assert rm(runs / "live", "--yes", "--force").exit_code == 0
    assert not (runs / "live").exists()


def test_rm_removes_a_bucket_run_and_only_it(moto_endpoint):
    from sandbox import BUCKET

    from runner.storage import open_store

    store = open_store(f"s3://{BUCKET}/rm-test", endpoint_url=moto_endpoint)
    write_run(store.put_bytes, "gone", "done")
    write_run(store.put_bytes, "kept", "preempted")
    store.put_bytes("gone-but-not-this/status.json", b"{}")  # a longer name, same start
    out = rm(f"s3://{BUCKET}/rm-test/gone", "--endpoint-url", moto_endpoint, "--yes")
    assert out.exit_code == 0, out.output
    assert out.output.startswith("removed 4 files, 0.0 MB, in s3://")
    assert store.list("gone/") == []
    assert len(store.list("kept/")) == 4 and store.list("gone-but-not-this/")
