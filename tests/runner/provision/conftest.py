"""A real AWS stand-in for the provisioning tests: one moto server (EC2, SSM, S3 and the
rest on one port), fake credentials, no user config files. boto3 is never mocked.

``moto_aws`` is the endpoint, reset before each test so every test starts with no
instances, parameters or buckets.
"""

from __future__ import annotations

import os
import urllib.request

import pytest

ACCESS_KEY = "AKIATENRUNNERPROV01"
SECRET_KEY = "tenRunnerProvisionSecret0123456789abcXYZ"
REGION = "us-east-1"


@pytest.fixture(scope="session")
def fake_aws_env():
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
def moto_aws_server(fake_aws_env):
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
