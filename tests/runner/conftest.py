"""Shared by the runner tests: a small corpus, fake AWS credentials, and the subprocess
helpers in runhelpers.py (importable because this folder is put on sys.path here)."""

import json
import os
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fakeaws import ACCESS_KEY, REGION, SECRET_KEY  # noqa: E402
from runhelpers import WORDS  # noqa: E402


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
