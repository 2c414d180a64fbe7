"""A real AWS stand-in for the provisioning tests: one moto server (EC2, SSM, S3 and the
rest on one port), fake credentials, no user config files. boto3 is never mocked.

``moto_aws`` is the endpoint, reset before each test so every test starts with no
instances, parameters or buckets.
"""

from __future__ import annotations

import urllib.request

import pytest
from fakeaws import ACCESS_KEY, REGION, SECRET_KEY  # noqa: F401 - used by the tests


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
