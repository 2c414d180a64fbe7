"""``ten-runner status / logs / report`` through the CLI, on a run written the way a
real one is (the trainer's metrics writer, the heartbeat)."""

import json
import time

import pytest
from click.testing import CliRunner

from runner.cli import cli
from runner.exit_codes import ExitCode
from runner.monitor.heartbeat import Heartbeat
from ten.train.metrics import MetricKind, MetricsWriter


@pytest.fixture
def store(tmp_path):
    run = tmp_path / "runs" / "demo"
    metrics = MetricsWriter(run, tensorboard=False)
    metrics.write(MetricKind.START, 0,
                  {"total_steps": 40, "tokens_per_step": 1024, "resumed": False})
    for step in range(10, 41, 10):
        metrics.write(MetricKind.TRAIN, step,
                      {"loss": 6.0 - step / 20, "lr": 1e-3, "tokens": step * 1024,
                       "tokens_per_s": 5000.0, "mfu": None, "step_time_s": 0.2,
                       "data_wait_frac": 0.01, "checkpoint_frac": 0.0})
    metrics.write(MetricKind.EVAL, 40, {"loss": 4.1, "perplexity": 60.3})
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


def test_a_job_files_variables_stay_out_of_reports_and_errors(store, tmp_path, monkeypatch):
    """``report JOB.yaml`` resolves the job's ${VAR}s to find the run: the page and the
    error lines named the resolved place (issue 23, fault 19)."""
    monkeypatch.setenv("RUNS_DIR", str(store))
    job = tmp_path / "demo.yaml"
    job.write_text("name: demo\nmodel: {preset: tiny}\ndata: {dataset: x.txt}\n"
                   "train: {max_steps: 40}\nstorage: {url: '${RUNS_DIR}'}\n")
    out = tmp_path / "reports"
    result = CliRunner().invoke(cli, ["report", str(job), "--out", str(out)])
    assert result.exit_code == 0, result.output
    page = (out / "demo-report.html").read_text()
    assert "data:image/png;base64," in page and str(store) not in page
    for command in (["report", str(job), "--job", "nope", "--out", str(out)],
                    ["sample", str(job), "--job", "nope"]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code != 0 and "nope" in result.output
        assert str(store) not in result.output, command


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


# -- no argument: ./runs, as status -------------------------------------------------------

def test_logs_and_report_default_to_the_one_run_in_dot_runs(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # tmp_path/runs holds the one run "demo"
    result = CliRunner().invoke(cli, ["logs"])
    assert result.exit_code == 0, result.output
    assert "done: 40 steps" in result.output
    result = CliRunner().invoke(cli, ["report", "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "out" / "demo-report.html").is_file()


def test_a_report_goes_beside_its_run_not_into_the_current_folder(store, tmp_path,
                                                                  monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    result = CliRunner().invoke(cli, ["report", str(store / "demo")])
    assert result.exit_code == 0, result.output
    assert (store / "demo" / "reports" / "demo-report.html").is_file()
    assert list(elsewhere.iterdir()) == []
    assert str(store / "demo" / "reports" / "demo-report.png") in result.output


def test_several_runs_need_a_job_name(store, tmp_path, monkeypatch):
    import shutil

    shutil.copytree(store / "demo", store / "other")
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli, ["logs"])
    assert result.exit_code == ExitCode.CONFIG
    assert result.output == "Error: ./runs holds 2 runs (demo, other); name one with --job\n"
    result = CliRunner().invoke(cli, ["logs", "--job", "other"])
    assert result.exit_code == 0 and "done: 40 steps" in result.output


def test_a_run_is_named_by_its_name_in_dot_runs(store, tmp_path, monkeypatch):
    """``ten-runner logs demo`` reads ./runs/demo (said "demo: no such directory")."""
    import shutil

    shutil.copytree(store / "demo", store / "other")
    monkeypatch.chdir(tmp_path)
    for command in (["logs", "other"], ["status", "demo"]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 0, result.output
    assert "done: 40 steps" in CliRunner().invoke(cli, ["logs", "demo"]).output
    result = CliRunner().invoke(cli, ["logs", "nope"])
    assert result.exit_code == ExitCode.CONFIG
    assert result.output == ("Error: nope: no such directory, and no run named nope in ./runs "
                             "(runs there: demo, other); give a run directory, a store, an "
                             "s3:// URL, a job file or a job id\n")


# -- a bucket run: s3://bucket/prefix/JOB --------------------------------------------------

BUCKET = "ten-cli-monitor"


@pytest.fixture
def bucket(moto_server):
    """(s3://bucket/prefix, endpoint, store) on the shared moto server."""
    import uuid

    import boto3

    from runner.storage import open_store

    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    if BUCKET not in [b["Name"] for b in s3.list_buckets()["Buckets"]]:
        s3.create_bucket(Bucket=BUCKET)
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}"
    return url, moto_server, open_store(url, moto_server)


def test_logs_and_report_of_a_bucket_run(store, bucket, tmp_path):
    url, endpoint, remote = bucket
    for path in (store / "demo").iterdir():
        if path.is_file():
            remote.put_bytes(f"demo/{path.name}", path.read_bytes())
    result = CliRunner().invoke(cli, ["logs", f"{url}/demo", "--endpoint-url", endpoint])
    assert result.exit_code == 0, result.output
    assert "done: 40 steps" in result.output
    result = CliRunner().invoke(cli, ["report", f"{url}/demo", "--endpoint-url", endpoint,
                                      "--out", str(tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert f"source {url}/demo" in (tmp_path / "out" / "demo-report.html").read_text()
    result = CliRunner().invoke(cli, ["logs", f"{url}/nope", "--endpoint-url", endpoint])
    assert result.exit_code == ExitCode.CONFIG
    assert result.output.count("\n") == 1 and "no runs under" in result.output


def test_a_commands_storage_errors_name_its_flags_not_job_keys(moto_server):
    """A command given a bucket on the command line is told to fix --endpoint-url, which
    it set, not storage.endpoint_url, which it has no file for."""
    for command in ("logs", "sample"):
        result = CliRunner().invoke(cli, [command, "s3://no-such-bucket-here/x",
                                          "--endpoint-url", moto_server])
        assert result.exit_code == ExitCode.STORAGE, result.output
        assert "or fix the URL / --endpoint-url" in result.output
        assert "storage." not in result.output


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A committed checkpoint of a tiny model and its tokenizer, as a run writes them."""
    import dataclasses

    from ten.data.tokenizer import train
    from ten.model.presets import build_model, model_config
    from ten.train import checkpoint as ckpt

    root = tmp_path_factory.mktemp("trained")
    words = "a checkpoint is committed only when its manifest is written last".split()
    train((" ".join(words[i:] + words[:i]) for i in range(200)), root / "tokenizer.model",
          vocab_size=300)
    config = model_config("ten", "tiny", vocab_size=300, d_model=32, n_layers=1,
                          n_eigenstates=8, n_heads=2, chunk_size=16, seq_len=32)
    model = build_model(config)
    meta = {"identity": {}, "resolved": {}, "model_config": dataclasses.asdict(config),
            "model_class": type(model).__name__}
    path = ckpt.save(root / "checkpoints", 7, {"model.pt": model.state_dict(),
                                                "config.json": json.dumps(meta).encode()})
    return root, path


def test_sample_a_bucket_run(bucket, trained, tmp_path, monkeypatch):
    from runner.storage.checkpoints import upload_checkpoint

    url, endpoint, remote = bucket
    monkeypatch.setenv("TEN_CACHE_DIR", str(tmp_path / "cache"))
    local, step_dir = trained
    args = ["sample", f"{url}/tiny", "--endpoint-url", endpoint, "--prompt", "a",
            "--max-new-tokens", "3"]
    result = CliRunner().invoke(cli, args)  # nothing in the bucket yet
    assert result.exit_code == ExitCode.CONFIG
    assert result.output == (f"Error: no committed checkpoint under {url}/tiny/checkpoints; "
                             "the run has not committed one yet (or the URL names no run)\n")
    upload_checkpoint(remote, "tiny", step_dir)
    result = CliRunner().invoke(cli, args)  # a run from before tokenizers were uploaded
    assert result.exit_code == ExitCode.CONFIG
    assert result.output.splitlines() == [f"Error: {url}/tiny/tokenizer.model is missing; a "
                                          "run puts it there when it starts, so restart the "
                                          "job once with this runner version"]
    remote.put_bytes("tiny/tokenizer.model", (local / "tokenizer.model").read_bytes())
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("[tiny step 7] a")
    again = CliRunner().invoke(cli, ["sample", url, "--job", "tiny", *args[2:]])
    assert again.exit_code == 0, again.output  # the same run, named with --job
    assert again.output == result.output
    assert list((tmp_path / "cache" / "samples").glob("*/tiny/checkpoints/step-00000007"))


def test_a_reader_that_finds_no_whole_checkpoint_gives_no_writers_advice(bucket, trained,
                                                                         tmp_path, monkeypatch):
    """Issue 23, fault 21, in the bucket: a reader (sample, export-model, eval) that finds
    every committed step incomplete, as when a running job prunes them under it, said
    "delete that folder to start over": advice for a run resuming, and one that destroys
    data. It says what it saw and that a running job replaces them."""
    from runner.storage.checkpoints import upload_checkpoint

    url, endpoint, remote = bucket
    monkeypatch.setenv("TEN_CACHE_DIR", str(tmp_path / "cache"))
    local, step_dir = trained
    upload_checkpoint(remote, "tiny", step_dir)
    remote.put_bytes("tiny/tokenizer.model", (local / "tokenizer.model").read_bytes())
    remote.delete([k for k in remote.list("tiny/checkpoints/") if k.endswith("model.pt")])
    result = CliRunner().invoke(cli, ["sample", f"{url}/tiny", "--endpoint-url", endpoint])
    assert result.exit_code == ExitCode.STORAGE
    assert "none downloads and verifies" in result.output
    assert "delete" not in result.output and "try again" in result.output


def test_export_a_bucket_run(bucket, trained, tmp_path, monkeypatch):
    """export-model takes a bucket run as sample does, newest step or --step."""
    from runner.storage.checkpoints import upload_checkpoint

    url, endpoint, remote = bucket
    monkeypatch.setenv("TEN_CACHE_DIR", str(tmp_path / "cache"))
    local, step_dir = trained
    upload_checkpoint(remote, "tiny", step_dir)
    remote.put_bytes("tiny/tokenizer.model", (local / "tokenizer.model").read_bytes())
    out = tmp_path / "hf"
    result = CliRunner().invoke(cli, ["export-model", f"{url}/tiny", "--endpoint-url",
                                      endpoint, "--out", str(out), "--step", "7"])
    assert result.exit_code == 0, result.output
    assert "exported at step 7" in (out / "README.md").read_text()
    assert (out / "model.safetensors").stat().st_size > 0
    result = CliRunner().invoke(cli, ["export-model", f"{url}/tiny", "--endpoint-url",
                                      endpoint, "--out", str(tmp_path / "x"), "--step", "8"])
    assert result.exit_code == ExitCode.CONFIG and result.output.count("\n") == 1
    assert "step 8 of" in result.output and "is not committed" in result.output


def test_sample_while_the_run_prunes_its_newest_checkpoint(trained, tmp_path, monkeypatch):
    """Issue 23, fault 21: a checkpoint pruned between being found and being loaded
    (a run in progress with keep_last: 1) is a race: the reader looks again and samples
    the newest one left, instead of exiting 2 "cannot load model.pt"."""
    import shutil

    from runner.trained import sample as sample_mod
    from ten.train import checkpoint as ckpt

    local, step_dir = trained
    run = tmp_path / "run"
    shutil.copytree(local, run)
    newer = ckpt.save(run / "checkpoints", 9, {
        "model.pt": ckpt.load(step_dir, "model.pt"),
        "config.json": (step_dir / "config.json").read_bytes()})
    found_first = sample_mod.trained_checkpoint

    def found_then_pruned(*args, **kwargs):
        found = found_first(*args, **kwargs)
        if found[2].step == 9:  # the pruner wins the race once
            shutil.rmtree(newer)
        return found

    monkeypatch.setattr(sample_mod, "trained_checkpoint", found_then_pruned)
    result = CliRunner().invoke(cli, ["sample", str(run), "--prompt", "a",
                                      "--max-new-tokens", "3"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("[run step 7] a")
    assert ckpt.committed_steps(run / "checkpoints") == [7]
