"""``ten-runner status / logs / report`` through the CLI, on a run written the way a
real one is (the trainer's metrics writer, the heartbeat)."""

import json
import time

import pytest
from click.testing import CliRunner

from runner.cli import cli
from runner.exit_codes import ExitCode
from runner.monitor.heartbeat import Heartbeat
from ten.metrics import MetricsWriter


@pytest.fixture
def store(tmp_path):
    run = tmp_path / "runs" / "demo"
    metrics = MetricsWriter(run, tensorboard=False)
    metrics.write("start", 0, {"total_steps": 40, "tokens_per_step": 1024, "resumed": False})
    for step in range(10, 41, 10):
        metrics.write("train", step, {"loss": 6.0 - step / 20, "lr": 1e-3, "tokens": step * 1024,
                                      "tokens_per_s": 5000.0, "mfu": None, "step_time_s": 0.2,
                                      "data_wait_frac": 0.01, "checkpoint_frac": 0.0})
    metrics.write("eval", 40, {"loss": 4.1, "perplexity": 60.3})
    metrics.close()
    (run / "run.log").write_text("step 10/40 | loss 5.5\ndone: 40 steps\n")
    beat = Heartbeat(run, None, "demo", period_s=30.0, price_per_hour=0.9, log=lambda s: None)
    beat.start()
    beat.stop("done")
    return tmp_path / "runs"


def test_status_lists_the_run(store):
    result = CliRunner().invoke(cli, ["status", str(store)])
    assert result.exit_code == 0, result.output
    line = next(ln for ln in result.output.splitlines() if ln.startswith("demo"))
    assert "done" in line and "40/40" in line


def test_status_from_a_job_file(store, tmp_path):
    job = tmp_path / "demo.yaml"
    job.write_text(f"name: demo\nmodel: {{preset: tiny}}\ndata: {{dataset: x.txt}}\n"
                   f"train: {{max_steps: 40}}\nstorage: {{url: {store}}}\n")
    result = CliRunner().invoke(cli, ["status", str(job)])
    assert result.exit_code == 0, result.output
    assert "demo" in result.output


def test_logs_and_report(store, tmp_path):
    result = CliRunner().invoke(cli, ["logs", str(store), "--job", "demo"])
    assert result.exit_code == 0 and "done: 40 steps" in result.output
    out = tmp_path / "reports"
    result = CliRunner().invoke(cli, ["report", str(store), "--job", "demo", "--out", str(out)])
    assert result.exit_code == 0, result.output
    png, html = out / "demo-report.png", out / "demo-report.html"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "data:image/png;base64," in html.read_text()


def test_unknown_job_is_one_line_error(store):
    result = CliRunner().invoke(cli, ["status", str(store), "--job", "nope"])
    assert result.exit_code == ExitCode.CONFIG
    assert result.output.count("\n") == 1 and "Traceback" not in result.output


def test_stale_heartbeat_is_flagged(store):
    status_path = store / "demo" / "status.json"
    status = json.loads(status_path.read_text())
    status.update(state="running", time=time.time() - 3600)
    status_path.write_text(json.dumps(status))
    result = CliRunner().invoke(cli, ["status", str(store)])
    assert result.exit_code == 0 and "stale" in result.output
