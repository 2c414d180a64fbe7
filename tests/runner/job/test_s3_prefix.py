"""s3:// URLs whose prefix has an empty, '.' or '..' segment are refused, by the
job schema (storage.url, a job file's own URL) and by runner.storage.open_store, in one
line that never echoes the URL."""

from __future__ import annotations

import pytest
from runhelpers import MINIMAL_JOB

from runner.job import JobError, parse_job
from runner.job.jobfile import load_any
from runner.storage import StorageError, StoreURL, open_store
from runner.storage.base import check_prefix

MINIMAL = MINIMAL_JOB
BAD = {
    "s3://bucket/../../etc": "a '..' segment",
    "s3://bucket/runs/..": "a '..' segment",
    "s3://bucket/./runs": "a '.' segment",
    "s3://bucket/runs/.": "a '.' segment",
    "s3://bucket//runs": "an empty segment ('//')",
    "s3://bucket/runs//x": "an empty segment ('//')",
    "s3://bucket/runs//": "an empty segment ('//')",
    "s3://bucket//": "an empty segment ('//')",
}
GOOD = {
    "s3://bucket": ("bucket", ""), "s3://bucket/": ("bucket", ""),
    "s3://bucket/runs": ("bucket", "runs"), "s3://bucket/runs/": ("bucket", "runs"),
    "s3://bucket/a/b.c/..d/e..": ("bucket", "a/b.c/..d/e.."), "S3://bucket/x": ("bucket", "x"),
}


@pytest.mark.parametrize("url,what", BAD.items())
def test_split_rejects(url, what):
    with pytest.raises(ValueError) as info:
        StoreURL.parse(url)
    assert str(info.value) == f"the s3 prefix has {what}; write s3://bucket/a/b with plain " \
                              "names between the slashes"


@pytest.mark.parametrize("url,parts", GOOD.items())
def test_split_accepts(url, parts):
    where = StoreURL.parse(url)
    assert (where.bucket, where.prefix) == parts and where.is_remote


def test_check_prefix_alone():
    assert check_prefix("") == "" and check_prefix("a/b/") == "a/b"
    with pytest.raises(ValueError):
        check_prefix("a/../b")


@pytest.mark.parametrize("url,what", BAD.items())
def test_job_storage_url_rejects(url, what):
    with pytest.raises(JobError) as info:
        parse_job(MINIMAL + f"storage: {{url: '{url}'}}\n", check_model=False)
    assert info.value.errors == [f"<job>:5 storage.url: the s3 prefix has {what}; write "
                                 "s3://bucket/a/b with plain names between the slashes"]


@pytest.mark.parametrize("url", GOOD)
def test_job_storage_url_accepts(url):
    assert parse_job(MINIMAL + f"storage: {{url: '{url}'}}\n", check_model=False)


@pytest.mark.parametrize("url,what", BAD.items())
def test_open_store_rejects_before_touching_the_network(url, what):
    with pytest.raises(StorageError) as info:
        open_store(url, endpoint_url="http://127.0.0.1:9")  # nothing listens there
    assert info.value.message == f"storage.url: the s3 prefix has {what}; write " \
                                 "s3://bucket/a/b with plain names between the slashes"


def test_the_value_is_never_echoed():
    secret = "zz-secret-zz"
    with pytest.raises(JobError) as info:
        parse_job(MINIMAL + "storage: {url: 's3://bucket/${S}/../x'}\n", env={"S": secret},
                  check_model=False)
    assert secret not in str(info.value) and "'..' segment" in str(info.value)
    with pytest.raises(StorageError) as err:
        open_store(f"s3://bucket/{secret}//x")
    assert secret not in err.value.message


def test_a_job_file_url_with_dot_dot_is_refused():
    with pytest.raises(JobError) as info:
        load_any("s3://bucket/jobs/../../etc/job.yaml")
    assert info.value.errors == ["s3://bucket/jobs/../../etc/job.yaml: the s3 prefix has a "
                                 "'..' segment; write s3://bucket/a/b with plain names between "
                                 "the slashes"]
