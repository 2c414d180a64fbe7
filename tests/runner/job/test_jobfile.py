"""A job file given as a URL in the bucket (what `submit --to aws` hands the instance)."""

import uuid
from pathlib import Path

import pytest

from runner.job import JobError, load_job
from runner.job.jobfile import load_any
from runner.storage import open_store

ROOT = Path(__file__).resolve().parents[3]
BUCKET = "ten-test"  # created by the moto_endpoint fixture


@pytest.fixture
def job_url(moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", moto_endpoint)
    key = f"jobs-{uuid.uuid4().hex[:8]}/tiny.yaml"
    open_store(f"s3://{BUCKET}").put_bytes(key, (ROOT / "jobs" / "tiny-cpu.yaml").read_bytes())
    return f"s3://{BUCKET}/{key}"


def test_a_job_loads_from_a_bucket_url(job_url):
    job = load_any(job_url, sets=["train.max_steps=7"])
    assert job.name == "tiny-cpu" and job.train.max_steps == 7
    assert job.source_path is None  # nothing on this disk to resolve against


def test_a_missing_job_object_is_one_clear_line(job_url):
    missing = job_url.replace("tiny.yaml", "nope.yaml")
    with pytest.raises(JobError) as err:
        load_any(missing)
    assert err.value.errors == [f"{missing}: no such object"]


def test_a_bucket_error_is_one_line_naming_the_fix(job_url):
    url = "s3://no-such-bucket-here/jobs/x.yaml"
    with pytest.raises(JobError) as err:
        load_any(url)
    (line,) = err.value.errors
    assert line.startswith(f"{url}: cannot fetch: bucket 'no-such-bucket-here' does not exist")


def test_the_job_layer_alone_does_not_open_a_bucket(job_url):
    """runner.job never imports the storage layer: an s3:// job file is the CLI's to read
    (runner.job.jobfile), and load_job without a fetcher says so in one line."""
    with pytest.raises(JobError) as err:
        load_job(job_url)
    (line,) = err.value.errors
    assert line.startswith(f"{job_url}: a job file in a bucket is read by ten-runner itself")
