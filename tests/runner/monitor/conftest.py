"""Recorded tables for the monitor tests (monitor_tables.py, importable because this
folder is put on sys.path here) and an in-process S3 server (moto), as in
tests/runner/storage/conftest.py."""

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

BUCKET = "ten-monitor-test"


@pytest.fixture(scope="session")
def moto_endpoint(aws_env):
    import boto3
    from botocore.config import Config
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"})).create_bucket(Bucket=BUCKET)
    yield endpoint
    server.stop()


@pytest.fixture(params=["local", "moto"])
def store_url(request, tmp_path):
    """(url, endpoint_url) of an empty store: a directory, or a fresh prefix on moto."""
    if request.param == "local":
        (tmp_path / "store").mkdir()
        return str(tmp_path / "store"), None
    endpoint = request.getfixturevalue("moto_endpoint")
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}", endpoint
