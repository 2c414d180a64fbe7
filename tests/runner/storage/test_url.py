"""StoreURL: a store's address parsed once, for the job's validator, open_store, the run
directory's place and a bucket's working-copy folder alike."""

from pathlib import Path

import pytest

from runner.storage import StoreURL
from runner.storage.url import StoreURLError


@pytest.mark.parametrize("url,path", [
    ("./runs", Path("runs")),
    ("/data/runs", Path("/data/runs")),
    ("file:///data/runs", Path("/data/runs")),
    ("FILE://localhost/data/runs", Path("/data/runs")),
])
def test_a_local_store_is_its_folder(url, path):
    where = StoreURL.parse(url)
    assert (where.path, where.bucket, where.is_remote) == (path, None, False)


def test_a_home_folder_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert StoreURL.parse("~/runs").path == tmp_path / "runs"


def test_a_bucket_store_is_its_bucket_and_prefix():
    where = StoreURL.parse("S3://bucket/a/b/")
    assert (where.bucket, where.prefix, where.path, where.is_remote) == ("bucket", "a/b", None,
                                                                        True)


@pytest.mark.parametrize("url,problem", [
    ("", "is empty"),
    ("gs://b/x", "unsupported scheme 'gs://'"),
    ("file://relative/x", "is a file:// URL without an absolute path"),
    ("s3://", "needs a bucket: s3://bucket/prefix"),
    ("s3://KEY:secret@bucket/x", "needs a bucket: s3://bucket/prefix"),
    ("s3://bucket/a//b", "the s3 prefix has an empty segment ('//')"),
])
def test_what_names_no_store_is_one_line_with_its_fix_and_no_echo(url, problem):
    with pytest.raises(StoreURLError) as e:
        StoreURL.parse(url)
    assert str(e.value).startswith(problem) and "secret" not in str(e.value)


def test_a_buckets_working_copy_keeps_its_folder_name_across_releases():
    # where a bucket run's working copy lives on a machine: a changed name would leave
    # every existing copy behind (these are the names the releases before this one gave)
    assert StoreURL.parse("s3://my-bucket/runs").key() == "my-bucket_runs-4aa65be0"
    assert StoreURL.parse("s3://my-bucket/runs").key("http://127.0.0.1:9000") \
        == "my-bucket_runs-bb566251"
