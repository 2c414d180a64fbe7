"""Recorded tables for the monitor tests (monitor_tables.py, importable because this
folder is put on sys.path here) and a bucket on the shared moto server
(tests/support/sandbox.py)."""

import sys
import uuid
from pathlib import Path

import pytest
from sandbox import ensure_bucket

sys.path.insert(0, str(Path(__file__).parent))

BUCKET = "ten-monitor-test"


@pytest.fixture
def moto_endpoint(moto_server):
    ensure_bucket(moto_server, BUCKET)
    return moto_server


@pytest.fixture(params=["local", "moto"])
def store_url(request, tmp_path):
    """(url, endpoint_url) of an empty store: a directory, or a fresh prefix on moto."""
    if request.param == "local":
        (tmp_path / "store").mkdir()
        return str(tmp_path / "store"), None
    endpoint = request.getfixturevalue("moto_endpoint")
    return f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}", endpoint
