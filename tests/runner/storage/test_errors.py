"""Mistakes a user can make surface as one-line StorageErrors that name the fix and
never contain a secret."""

from __future__ import annotations

import time

import pytest
from sandbox import BUCKET, SECRET_KEY, free_port

from runner.storage import StorageError, open_store


def one_line_without_secrets(e: pytest.ExceptionInfo, *secrets: str) -> str:
    text = str(e.value)
    assert "\n" not in text
    for secret in (SECRET_KEY, *secrets):
        assert secret not in text
    assert e.value.exit_code == 4  # ExitCode.STORAGE
    return text


def test_wrong_credentials(rclone_endpoint, monkeypatch):
    wrong = "wrongSecretKeyValue987654321"
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", wrong)
    with pytest.raises(StorageError) as e:
        open_store(f"s3://{BUCKET}/x", endpoint_url=rclone_endpoint)
    text = one_line_without_secrets(e, wrong)
    assert "check AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY" in text
    assert "SignatureDoesNotMatch" in text


def test_no_credentials(moto_endpoint, monkeypatch):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(StorageError, match="no usable S3 credentials.*AWS_ACCESS_KEY_ID") as e:
        open_store(f"s3://{BUCKET}/x", endpoint_url=moto_endpoint)
    one_line_without_secrets(e)


@pytest.mark.parametrize("server", ["moto", "rclone"])
def test_missing_bucket(server, request):
    endpoint = request.getfixturevalue(f"{server}_endpoint")
    with pytest.raises(StorageError) as e:
        open_store("s3://no-such-bucket-here/run", endpoint_url=endpoint)
    text = one_line_without_secrets(e)
    assert f"bucket 'no-such-bucket-here' does not exist at {endpoint}" in text


def test_unreachable_endpoint(aws_env):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(StorageError) as e:
        open_store(f"s3://{BUCKET}/x", endpoint_url=endpoint, max_attempts=2,
                   connect_timeout=1)
    text = one_line_without_secrets(e)
    assert f"cannot reach endpoint {endpoint}" in text
    assert "check storage.endpoint_url" in text


def test_a_mistyped_endpoint_is_reported_in_seconds_not_after_a_minute_of_retries(aws_env):
    """With the store's default retries (8 attempts, backoff up to 20 s each) the opening
    check took ~60 s to say the endpoint is wrong; it now tries a few times only."""
    endpoint = f"http://127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    with pytest.raises(StorageError) as e:
        open_store(f"s3://{BUCKET}/x", endpoint_url=endpoint)  # the defaults a job uses
    assert time.monotonic() - t0 < 20
    assert f"cannot reach endpoint {endpoint}" in one_line_without_secrets(e)


def test_credentials_in_the_endpoint_url_are_not_repeated(aws_env):
    port = free_port()
    with pytest.raises(StorageError) as e:
        open_store(f"s3://{BUCKET}/x", endpoint_url=f"http://user:hunter2@127.0.0.1:{port}",
                   max_attempts=1, connect_timeout=1)
    text = one_line_without_secrets(e, "hunter2")
    assert f"http://127.0.0.1:{port}" in text


def test_server_gone_after_open(rclone_server, rclone_endpoint, aws_env):
    store = open_store(f"s3://{BUCKET}/gone", endpoint_url=rclone_endpoint, max_attempts=2,
                       connect_timeout=1)
    rclone_server.kill()
    try:
        with pytest.raises(StorageError, match="cannot reach endpoint") as e:
            store.get_bytes("anything")
        one_line_without_secrets(e)
    finally:
        rclone_server.start()
