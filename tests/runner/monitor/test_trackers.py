"""``monitor.report_to: [wandb]``: a run's figures reach W&B, offline without an account
(the real package, its offline run file read back), one W&B run for the job's whole
life; a tracker asked for and not installed stops the run at its start."""

import json
import sys

import pytest
from runhelpers import write_job

from runner.exit_codes import ExitCode

wandb = pytest.importorskip("wandb", reason="the test extra installs wandb")


def run(job_path, *sets):
    from runner.job import load_job
    from runner.run.jobrun import run_job
    from ten.train.stop import Stop

    with Stop().installed() as stop:
        return run_job(load_job(job_path, sets=list(sets)), stop, sample_prompt=None)


def wandb_records(path):
    """The protobuf records of a W&B offline run file: a 7-byte header (":W&B", a magic
    number, a version), then LevelDB's log format, 32 KiB blocks of records each with
    a 7-byte header (CRC, length, type: 1 whole, 2 first, 3 middle, 4 last part)."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    assert raw[:4] == b":W&B"
    pos, part, records = 7, b"", []
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a header: padding
            pos += left
            continue
        length, kind = int.from_bytes(raw[pos + 4:pos + 6], "little"), raw[pos + 6]
        part += raw[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(part)
            records.append(record)
            part = b""
    return records


def history(run_file):
    """(step, {name: value}) of each logged row."""
    rows = []
    for record in wandb_records(run_file):
        if record.WhichOneof("record_type") == "history":
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                   for item in record.history.item}
            rows.append((row.pop("_step"), row))
    return rows


def wandb_state(run_file, run_dir):
    """What a failed check needs to say: the run file's size and records by type, and
    the run log's W&B lines (a warning there names a failed log or finish)."""
    kinds = [r.WhichOneof("record_type") for r in wandb_records(run_file)]
    lines = [line for line in (run_dir / "run.log").read_text().splitlines()
             if "wandb" in line]
    return (f"{run_file.stat().st_size} B, records "
            f"{ {k: kinds.count(k) for k in sorted(set(kinds), key=str)} }; run.log: {lines}")


def offline_runs(run_dir):
    return sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


def test_the_figures_reach_wandb_offline_in_one_run_across_a_resume(tmp_path, corpus,
                                                                    monkeypatch):
    for name in ("WANDB_API_KEY", "WANDB_MODE", "WANDB_PROJECT"):
        monkeypatch.delenv(name, raising=False)
    job = write_job(tmp_path, corpus, name="tracked", steps=4, every=2)
    assert run(job, "monitor.report_to=[wandb]") == ExitCode.OK
    run_dir = tmp_path / "store" / "tracked"
    (first,) = offline_runs(run_dir)
    rows = dict(history(first))
    metrics = [r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
               if r["kind"] == "train"]
    assert [r["step"] for r in metrics] == [1, 2, 3, 4]
    # (a CI run once found no row for step 1: what the file and the run's log held then)
    assert {1, 2, 3, 4} <= set(rows), wandb_state(first, run_dir)
    for record in metrics:  # every train figure, at its step
        assert rows[record["step"]]["train/loss"] == pytest.approx(record["loss"])
        assert rows[record["step"]]["train/lr"] == pytest.approx(record["lr"])
    assert "eval/loss" in rows[4]
    log = (run_dir / "run.log").read_text()
    assert f"offline in {run_dir / 'wandb'} (to upload: wandb sync {run_dir / 'wandb'}" \
           "/offline-run-*)" in log
    # a larger budget resumes: the same W&B run id, steps going on from 5
    assert run(job, "monitor.report_to=[wandb]", "train.max_steps=6") == ExitCode.OK
    runs = offline_runs(run_dir)
    assert len(runs) == 2 and len({p.name for p in runs}) == 1  # run-<the same id>.wandb
    trained = [step for step, row in history(runs[1]) if "train/loss" in row]
    assert trained == [5, 6]


def test_every_tracker_a_job_may_name_has_a_sink_and_its_variables():
    from runner.job.schema import TRACKERS
    from runner.monitor.trackers import ENVIRONMENT, SINKS

    assert set(SINKS) == set(ENVIRONMENT) == set(TRACKERS)


def test_a_tracker_that_is_not_installed_stops_the_run_at_its_start(tmp_path, corpus,
                                                                    monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    job = write_job(tmp_path, corpus, name="untracked")
    assert run(job, "monitor.report_to=[wandb]") == ExitCode.CONFIG
    log = (tmp_path / "store" / "untracked" / "run.log").read_text()
    assert "config error: monitor.report_to lists wandb, which is not installed here: pip " \
           "install wandb (or remove it from monitor.report_to)" in log
    assert "data ready" not in log
