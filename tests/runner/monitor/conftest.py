"""Recorded tables for the monitor tests (monitor_tables.py, importable because this
folder is put on sys.path here) and a bucket on the shared moto server
(tests/support/sandbox.py)."""

import sys
import uuid
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

BUCKET = "ten-monitor-test"


@pytest.fixture(scope="session")
def moto_endpoint(moto_server):
    import boto3
    from botocore.config import Config

    boto3.session.Session().client(
        "s3", endpoint_url=moto_server, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"})).create_bucket(Bucket=BUCKET)
    return moto_server


@pytest.fixture(params=["local", "moto"])
def store_url(request, tmp_path):
    """(url, endpoint_url) of an empty store: a directory, or a fresh prefix on moto."""
    if request.param == "local":
        (tmp_path / "store").mkdir()
        return str(tmp_path / "store"), None
    endpoint = request.getfixturevalue("moto_endpoint")
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}", endpoint
