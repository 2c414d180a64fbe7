"""Uploads that die part-way (the uploader SIGKILLed, the S3 server SIGKILLed and
restarted) never leave a checkpoint that readers trust, and later ones still commit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from sandbox import BUCKET

from runner.storage import StorageError, open_store
from runner.storage.checkpoints import (
    download_checkpoint,
    latest_committed,
    restore_latest,
    upload_checkpoint,
)
from ten.train import checkpoint as tc

JOB = "spot-job"
MiB = 1 << 20
UPLOADER = """
import sys
from pathlib import Path
from runner.storage import open_store
from runner.storage.checkpoints import upload_checkpoint
store = open_store(sys.argv[1], endpoint_url=sys.argv[2], part_size=5 << 20, check=False,
                   conditional_writes=False)
print("go", flush=True)
upload_checkpoint(store, sys.argv[4], Path(sys.argv[3]))
print("done", flush=True)
"""


def big_ckpt(root, step, model: bytes):
    return tc.save(root, step, {"model.pt": model, "optimizer.pt": os.urandom(6 * MiB),
                                "trainer.pt": f"step {step}".encode(), "config.json": b"{}"})


def assert_only_verified_steps_are_trusted(store, tmp_path, allowed):
    """Whatever latest_committed names downloads and verifies; nothing else is trusted."""
    step = latest_committed(store, JOB, report=lambda m: None)
    assert step in allowed
    out = tmp_path / f"check-{uuid.uuid4().hex[:6]}"
    download_checkpoint(store, JOB, step, out)  # raises if anything is off
    tc.verify(out / tc.step_name(step))
    return step


@pytest.mark.slow
def test_uploader_killed_mid_multipart_never_commits(rclone_endpoint, tmp_path):
    url = f"s3://{BUCKET}/kill-{uuid.uuid4().hex[:8]}"
    store = open_store(url, endpoint_url=rclone_endpoint)
    model = os.urandom(40 * MiB)  # 8 parts of 5 MiB
    local = tmp_path / "checkpoints"

    def run(step):
        return subprocess.Popen([sys.executable, "-c", UPLOADER, url, rclone_endpoint,
                                 str(big_ckpt(local, step, model)), JOB],
                                stdout=subprocess.PIPE, text=True)

    proc = run(1)  # a full upload, timed, so the kills below land inside one
    assert proc.stdout.readline() == "go\n"
    start = time.monotonic()
    assert proc.stdout.readline() == "done\n"
    full = time.monotonic() - start
    assert proc.wait() == 0
    committed = {1}
    for i, fraction in enumerate([0.1, 0.3, 0.5, 0.7, 0.9]):
        step = 2 + i
        proc = run(step)
        assert proc.stdout.readline() == "go\n"
        time.sleep(full * fraction)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        if store.head(f"{JOB}/checkpoints/{tc.step_name(step)}/manifest.json"):
            committed.add(step)  # it finished before the kill: then it must verify
        newest = assert_only_verified_steps_are_trusted(store, tmp_path, committed)
        assert newest == max(committed)
    print(f"full upload {full:.2f}s; committed despite a kill: {sorted(committed)}")
    assert len(committed) < 6, "no kill landed mid-upload; the test proves nothing"
    # the next writer commits normally
    upload_checkpoint(store, JOB, big_ckpt(local, 10, model))
    assert assert_only_verified_steps_are_trusted(store, tmp_path, {10}) == 10


@pytest.mark.slow
def test_s3_server_killed_mid_upload_and_restarted(rclone_server, rclone_endpoint, tmp_path):
    store = open_store(f"s3://{BUCKET}/restart-{uuid.uuid4().hex[:8]}",
                       endpoint_url=rclone_endpoint, part_size=5 * MiB, max_attempts=4,
                       connect_timeout=2, read_timeout=10)
    local = tmp_path / "checkpoints"
    model = os.urandom(40 * MiB)
    upload_checkpoint(store, JOB, big_ckpt(local, 1, model))
    parts_sent = threading.Event()
    # botocore's own event hook (no mocking): tells us multipart parts are on the wire
    store.client.meta.events.register("before-send.s3.UploadPart",
                                      lambda **kw: parts_sent.set())

    outcome = {}

    def upload():
        try:
            upload_checkpoint(store, JOB, big_ckpt(local, 2, model))
            outcome["result"] = "committed"
        except StorageError as e:
            outcome["result"] = f"failed: {e}"

    thread = threading.Thread(target=upload)
    thread.start()
    assert parts_sent.wait(30)
    time.sleep(0.02)
    rclone_server.kill()
    time.sleep(0.5)
    rclone_server.start()
    thread.join(120)
    assert not thread.is_alive()
    print(f"upload across a server restart: {outcome['result']}")
    assert "\n" not in outcome["result"]
    allowed = {1, 2} if outcome["result"] == "committed" else {1}
    assert_only_verified_steps_are_trusted(store, tmp_path, allowed)
    # later checkpoints commit against the restarted server
    upload_checkpoint(store, JOB, big_ckpt(local, 3, model))
    assert latest_committed(store, JOB) == 3
    assert restore_latest(store, JOB, tmp_path / "restored") == 3
    assert tc.latest_valid(tmp_path / "restored").step == 3
