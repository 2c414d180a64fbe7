"""A bucket behind a flaky network (issue 23, fault 3): a small GET whose 200 body stops
half-way is retried, not a run that ends at start or a checkpoint silently not uploaded."""

import uuid

import pytest
from faultproxy import FaultProxy
from sandbox import BUCKET

from runner.storage import open_store
from ten.train import checkpoint as tc


@pytest.fixture
def flaky(rclone_endpoint):
    proxy = FaultProxy(rclone_endpoint).start()
    url = f"s3://{BUCKET}/t-{uuid.uuid4().hex[:12]}"
    # botocore's own retries (up to 8, with backoff) would hide a fault that lasts
    yield proxy, open_store(url, endpoint_url=rclone_endpoint), open_store(
        url, endpoint_url=proxy.endpoint, max_attempts=2)
    proxy.stop()


@pytest.mark.parametrize("key", ["job/LATEST", "job/lease.json",
                                 "job/checkpoints/step-00000003/manifest.json"])
def test_a_small_get_cut_half_way_is_retried(flaky, key):
    proxy, direct, store = flaky
    body = b'{"files": {}, "step": 3}' * 20
    direct.put_bytes(key, body)
    proxy.cut_body("GET", "/" + key, times=2)
    assert store.get_bytes(key) == body
    assert proxy.hits == 2


def test_a_failed_checkpoint_upload_is_tried_again_without_a_newer_one(flaky, tmp_path):
    """The bucket refused every PUT of a checkpoint's manifest for a while: the uploader
    tries the same checkpoint again, where it used to wait for the next checkpoint."""
    import os
    import time

    from runner.storage.checkpoints import latest_committed
    from runner.storage.sync import CheckpointSync

    proxy, direct, store = flaky
    logs = []
    proxy.fail("PUT", "/manifest.json")
    sync = CheckpointSync(store, "job", keep_last=3, milestone_every=None, lease=None,
                          log=logs.append, retry_delays=(0.2, 0.2, 0.2))
    try:
        sync.submit(tc.save(tmp_path / "checkpoints", 3, {
            "model.pt": os.urandom(3000), "config.json": b'{"d_model": 32}'}))
        deadline = time.monotonic() + 120
        while not any("failed" in line for line in logs):  # the event: one failure
            assert time.monotonic() < deadline, logs
            time.sleep(0.05)
        proxy.clear()
        while "step-00000003" not in sync.uploaded:
            assert time.monotonic() < deadline, logs
            time.sleep(0.05)
    finally:
        sync.close()
    assert latest_committed(direct, "job") == 3
    assert any("retrying the upload of step-00000003" in line for line in logs)
