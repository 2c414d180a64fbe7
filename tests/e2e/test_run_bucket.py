"""``ten-runner run`` with its checkpoints in a bucket (moto, rclone): the spot-instance
life — the machine and its disk vanish, the next one resumes from the bucket exactly."""

import json
import os
import re
import shutil
import signal
import time
import uuid
from pathlib import Path

import pytest
from patience import communicate
from runhelpers import (
    FakeIMDS,
    cli,
    final_weights,
    kill_points,
    losses,
    run_to_end,
    same_weights,
    wait_for_step,
    write_job,
)

from runner.exit_codes import ExitCode
from runner.storage import StoreURL, open_store
from runner.storage.checkpoints import committed_steps, latest_committed

# whole runs in subprocesses (seconds each): skipped by the inner loop, -m "not slow"
pytestmark = pytest.mark.slow

BUCKET = "ten-test"


def bucket_job(tmp_path, corpus, endpoint, name, extra="", **kw):
    job = write_job(tmp_path, corpus, name=name, **kw)
    url = f"s3://{BUCKET}/{uuid.uuid4().hex[:10]}"
    text = job.read_text().replace(f"storage: {{url: {tmp_path / 'store'}}}",
                                   f"storage: {{url: '{url}', endpoint_url: '{endpoint}'}}")
    job.write_text(text + extra)
    local = corpus / "cache" / "runs" / StoreURL.parse(url).key(endpoint) / name
    return job, open_store(url, endpoint_url=endpoint), local


def reference(tmp_path, corpus, steps=40):
    job = write_job(tmp_path, corpus, name="ref", steps=steps)
    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    return tmp_path / "store" / "ref"


def test_round_trip_through_the_bucket_is_bit_exact(tmp_path, corpus, moto_endpoint):
    ref = reference(tmp_path, corpus)
    name = f"rt-{uuid.uuid4().hex[:6]}"
    job, store, local = bucket_job(tmp_path, corpus, moto_endpoint, name)
    proc = cli("run", job, "--no-sample")
    wait_for_step(local / "metrics.jsonl", proc, 10)
    proc.send_signal(signal.SIGTERM)
    _, err = communicate(proc, 120)
    assert proc.returncode == ExitCode.PREEMPTED, err
    step = max(losses(local))
    assert latest_committed(store, name) == step  # committed in the bucket before exit
    shutil.rmtree(local)  # the machine is gone

    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    assert f"restored step {step} from" in err
    assert losses(local) == losses(ref)  # the history follows the run through the bucket
    (s1, w1), (s2, w2) = final_weights(ref), final_weights(local)
    assert s1 == s2 == 40 and same_weights(w1, w2)
    assert latest_committed(store, name) == 40
    assert store.get_bytes(f"{name}/job.json") and store.get_bytes(f"{name}/metrics.jsonl")


def remove_while_written(folder: Path) -> None:
    """``rm -rf`` of a folder a live run writes into: a file the run creates while the
    removal walks it leaves its folder not empty (the suite saw OSError 39 on a checkpoint
    being saved), so the removal goes again, as a user would, until it is done."""
    for _ in range(100):
        try:
            shutil.rmtree(folder)
        except OSError:  # an entry the run made or removed while the walk went by
            pass
        if not folder.exists():
            return
    raise AssertionError(f"{folder} could not be removed in 100 tries")


def test_the_working_copy_deleted_mid_run_is_a_storage_error(tmp_path, corpus,
                                                            moto_endpoint):
    """The run's local working copy (under the cache) removed while it trains (issue 23,
    fault 9): a tensorboard FileNotFoundError traceback, exit 1. One line, exit 4; what
    the bucket holds is untouched, and the next run resumes from it."""
    name = f"wc-{uuid.uuid4().hex[:6]}"
    job, store, local = bucket_job(tmp_path, corpus, moto_endpoint, name, every=5)
    proc = cli("run", job, "--no-sample")
    # once step 5 is in the bucket (deleted while its upload runs, it would be lost with
    # the working copy: the suite saw that race once)
    deadline = time.time() + 120
    while (latest_committed(store, name) or 0) < 5:
        assert proc.poll() is None and time.time() < deadline, "step 5 never reached the bucket"
        time.sleep(0.05)
    remove_while_written(local)
    _, err = communicate(proc, 300)
    assert proc.returncode == ExitCode.STORAGE, err[-3000:]
    assert "Traceback" not in err and "storage error" in err
    committed = latest_committed(store, name)
    assert committed is not None and committed >= 5
    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err[-3000:]
    # from the bucket, or from a working copy the dying run wrote again after the delete
    # (a save recreates the folder before the upload that commits it): no step lost
    resumed = re.findall(r"^resumed from \S+ \(step (\d+),", err, re.MULTILINE)
    assert len(resumed) == 1 and int(resumed[0]) >= committed, err[-3000:]


def test_repeated_kill_9_new_machine_each_time(tmp_path, corpus, rclone_endpoint):
    """kill -9 at random moments (uploads run in the background all the time), the
    local disk deleted each time: every resume starts from a committed checkpoint and
    the end result equals the uninterrupted run."""
    ref = reference(tmp_path, corpus, steps=30)
    name = f"k9-{uuid.uuid4().hex[:6]}"
    job, store, local = bucket_job(tmp_path, corpus, rclone_endpoint, name, steps=30, every=2)
    rng = kill_points("the kill -9 steps")
    all_losses = {}
    for _ in range(3):  # three machines killed (~6 s each alone, twice that in the suite)
        start = latest_committed(store, name) or 0
        if start >= 24:
            break
        proc = cli("run", job, "--no-sample")
        wait_for_step(local / "metrics.jsonl", proc, start + rng.randint(1, 5))
        proc.send_signal(signal.SIGKILL)
        proc.communicate()
        all_losses.update(losses(local))
        shutil.rmtree(local)
    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    all_losses.update(losses(local))
    ref_losses = losses(ref)
    assert all(ref_losses[s] == v for s, v in all_losses.items())
    (s1, w1), (s2, w2) = final_weights(ref), final_weights(local)
    assert s1 == s2 == 30 and same_weights(w1, w2)
    assert committed_steps(store, name)[-1] == 30


def test_spot_notice_commits_the_step_in_the_bucket(tmp_path, corpus, moto_endpoint):
    imds = FakeIMDS()
    name = f"sn-{uuid.uuid4().hex[:6]}"
    extra = ("resources:\n  spot: true\n  spot_notice: aws\n"
             f"  metadata_endpoint: {imds.url}\n  notice_poll_s: 0.05\n")
    try:
        job, store, local = bucket_job(tmp_path, corpus, moto_endpoint, name, extra=extra,
                                       every=100)
        proc = cli("run", job, "--no-sample")
        wait_for_step(local / "metrics.jsonl", proc, 5)
        imds.notice = True
        _, err = communicate(proc, 120)
    finally:
        imds.close()
    assert proc.returncode == ExitCode.PREEMPTED, err
    assert "before the deadline" in err
    assert latest_committed(store, name) == max(losses(local))


def test_bad_credentials_one_line_storage_error(tmp_path, corpus, rclone_endpoint,
                                                monkeypatch):
    job, _, _ = bucket_job(tmp_path, corpus, rclone_endpoint, "bad-creds")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret-0123456789")
    code, out, err = run_to_end("run", job, "--no-sample")
    assert code == ExitCode.STORAGE
    assert "storage error" in err and "Traceback" not in err + out
    assert "wrong-secret-0123456789" not in err + out


def test_unreachable_endpoint_one_line_storage_error(tmp_path, corpus, moto_endpoint):
    job, _, _ = bucket_job(tmp_path, corpus, moto_endpoint, "no-endpoint")
    job.write_text(job.read_text().replace(moto_endpoint, "http://127.0.0.1:9"))
    code, out, err = run_to_end("run", job, "--no-sample", timeout=120)
    assert code == ExitCode.STORAGE
    assert "storage error" in err and "127.0.0.1:9" in err and "Traceback" not in err + out


def test_store_down_mid_run_then_back(tmp_path, corpus, rclone_server, rclone_endpoint):
    """The S3 server dies mid-run (uploads fail and are retried) and comes back: training
    never stops, later checkpoints commit, and the last one is in the bucket at exit."""
    name = f"dn-{uuid.uuid4().hex[:6]}"
    job, store, local = bucket_job(tmp_path, corpus, rclone_endpoint, name, steps=300,
                                   every=2)
    proc = cli("run", job, "--no-sample")
    wait_for_step(local / "metrics.jsonl", proc, 8)
    rclone_server.kill()
    down_at = wait_for_step(local / "metrics.jsonl", proc, 12)
    time.sleep(2.0)
    assert proc.poll() is None  # training goes on while the store is down
    rclone_server.start()
    _, err = communicate(proc, 300)
    assert proc.returncode == 0, err[-3000:]
    assert "upload of" in err  # the outage was felt: an upload failed or was superseded
    assert max(losses(local)) > down_at + 20
    assert latest_committed(store, name) == 300


def test_zombie_writer_stops_when_a_newer_one_takes_the_lease(tmp_path, corpus,
                                                              moto_endpoint):
    from runner.storage.checkpoints import Lease

    name = f"zb-{uuid.uuid4().hex[:6]}"
    job, store, local = bucket_job(tmp_path, corpus, moto_endpoint, name, steps=400, every=2)
    proc = cli("run", job, "--no-sample")
    wait_for_step(local / "metrics.jsonl", proc, 6)
    Lease.acquire(store, name, owner="the-relaunched-instance")
    taken_over = committed_steps(store, name)
    _, err = communicate(proc, 120)
    assert proc.returncode == ExitCode.STORAGE, err[-3000:]
    assert "lease lost" in err and "the-relaunched-instance" in err
    # one line each, and no advice to run the zombie again (issue 45, fault 6)
    stopped = next(ln for ln in err.splitlines() if ln.startswith("stopped by"))
    assert stopped.startswith("stopped by a lost writer lease after step ")
    assert stopped.endswith(": checkpoint committed, not in the bucket: another writer holds "
                            "this run now (see the lease line above), so this one ends")
    assert "run again" not in err
    # nothing committed after the takeover, beyond an upload already past its check
    assert committed_steps(store, name)[-1] <= max(taken_over) + 2


def test_second_machine_downloads_prepared_data_instead_of_tokenizing(tmp_path, corpus,
                                                                      moto_endpoint):
    first, store, _ = bucket_job(tmp_path, corpus, moto_endpoint, "prep-a", steps=2)
    text = first.read_text().replace(f"cache_dir: {corpus / 'cache'}",
                                     f"cache_dir: {tmp_path / 'cache-a'}")
    first.write_text(text)
    code, _, err = run_to_end("run", first, "--no-sample")
    assert code == 0, err
    assert "shared in" in err  # tokenizer and shards published
    second = tmp_path / "prep-b.yaml"  # another machine: empty cache, same bucket and data
    second.write_text(text.replace("name: prep-a", "name: prep-b")
                      .replace(str(tmp_path / "cache-a"), str(tmp_path / "cache-b")))
    code, _, err = run_to_end("run", second, "--no-sample")
    assert code == 0, err
    assert "tokenizer-" in err and "shards-" in err and err.count("downloaded from") == 2
    assert "tokenizing" not in err
    tok_a = sorted((tmp_path / "cache-a" / "tokenizers").glob("*/tokenizer.model"))
    tok_b = sorted((tmp_path / "cache-b" / "tokenizers").glob("*/tokenizer.model"))
    assert tok_a[0].read_bytes() == tok_b[0].read_bytes()


OLD_DRIVER = Path(__file__).resolve().parents[1] / "support" / "old_driver"


def test_a_gpu_torch_cannot_use_ends_the_run_with_exit_10_reported_in_the_bucket(
        tmp_path, corpus, moto_endpoint):
    """device: auto on a host whose NVML sees a GPU that torch cannot use (here: this
    machine's CPU-only torch) refuses to train on the CPU; the managed loop, which sees
    a remote attempt only through the bucket, finds the exit code there."""
    name = f"gpu-{uuid.uuid4().hex[:6]}"
    job, store, local = bucket_job(tmp_path, corpus, moto_endpoint, name)
    job.write_text(job.read_text().replace("device: cpu", "device: auto"))
    path = os.pathsep.join(filter(None, [str(OLD_DRIVER), os.environ.get("PYTHONPATH")]))
    code, _, err = run_to_end("run", job, "--no-sample", env={"PYTHONPATH": path})
    assert code == ExitCode.GPU_UNUSABLE, err
    verdict = [line for line in err.splitlines() if "unfit host" in line]
    assert len(verdict) == 1, err
    assert ("NVML sees 1 GPU(s) (NVIDIA L40S, driver 535.104.05) but torch cannot use "
            "them: this torch is a CPU-only build") in verdict[0]
    assert "train.device: cpu" in verdict[0] and "Traceback" not in err
    status = json.loads(store.get_bytes(f"{name}/status.json"))
    assert status["state"] == "failed" and status["exit_code"] == ExitCode.GPU_UNUSABLE
    assert committed_steps(store, name) == [] and not (local / "checkpoints").exists()


def test_a_bucket_whose_every_committed_step_is_incomplete_is_not_started_over(
        tmp_path, corpus, moto_endpoint):
    """Issue 23's first fault: a file missing from every committed step (manifests
    intact), and a new machine: exit 4, one line, and the steps are still there."""
    name = f"inc-{uuid.uuid4().hex[:6]}"
    job, store, local = bucket_job(tmp_path, corpus, moto_endpoint, name, steps=6, every=3)
    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    steps = committed_steps(store, name)
    assert steps == [3, 6]
    for step in steps:
        store.delete([f"{name}/checkpoints/step-{step:08d}/trainer.pt"])
    shutil.rmtree(local)  # a new machine
    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == ExitCode.STORAGE, err
    assert "none downloads and verifies; refusing to start from scratch" in err
    assert "Traceback" not in err
    assert committed_steps(store, name) == steps  # nothing pruned, nothing trained
    assert not (local / "metrics.jsonl").exists() or "step" not in (
        local / "metrics.jsonl").read_text()


def test_two_bucket_jobs_of_one_name_keep_apart_on_one_machine(tmp_path, corpus,
                                                               moto_endpoint):
    """Issue 23's second fault: job B of the same name on a fresh prefix, on a machine
    that ran job A, trains its own steps into its own bucket instead of "resuming" from
    A's working copy and finishing with nothing committed."""
    name = f"twin-{uuid.uuid4().hex[:6]}"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    job_a, store_a, local_a = bucket_job(tmp_path / "a", corpus, moto_endpoint, name,
                                         steps=6, every=3)
    job_b, store_b, local_b = bucket_job(tmp_path / "b", corpus, moto_endpoint, name,
                                         steps=6, every=3)
    assert local_a != local_b
    for job in (job_a, job_b):
        code, _, err = run_to_end("run", job, "--no-sample")
        assert code == 0, err
    assert "resum" not in err and "restored" not in err  # B started from nothing
    assert committed_steps(store_b, name) == committed_steps(store_a, name) == [3, 6]
    assert losses(local_a) == losses(local_b)  # the same job, trained twice, apart


def test_signals_during_the_final_upload_do_not_abandon_it(tmp_path, corpus, rclone_endpoint):
    """Issue 23, fault 5: with a slow bucket, more SIGTERMs during the last upload made
    the run exit with its last step committed only on the local disk. They are noted;
    the upload finishes."""
    from faultproxy import FaultProxy

    proxy = FaultProxy(rclone_endpoint).start()
    try:
        name = f"slow-{uuid.uuid4().hex[:6]}"
        job, store, _ = bucket_job(tmp_path, corpus, proxy.endpoint, name, steps=12, every=6)
        proxy.delay("PUT", "step-00000012/manifest.json", seconds=4.0)
        proc = cli("run", job, "--no-sample")
        assert proxy.delayed.wait(180), "the last checkpoint's upload never started"
        for _ in range(5):
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.1)
        _, err = communicate(proc, 120)
    finally:
        proxy.stop()
    assert proc.returncode in (ExitCode.OK, ExitCode.PREEMPTED), err
    direct = open_store(store.url, endpoint_url=rclone_endpoint)
    assert latest_committed(direct, name) == 12, err
    assert "finishing it first" in err and "may not be in the bucket" not in err


def test_a_relaunch_uploads_the_steps_the_bucket_lacks_before_it_says_done(
        tmp_path, corpus, rclone_endpoint):
    """Issue 45, fault 1: run A's last upload never reaches the bucket (A exits 4, its
    step committed only on the disk). The relaunch on the same machine said "done" with
    exit 0 while the bucket stayed steps behind. Now it uploads that step first: while the
    bucket still refuses it, exit 4 and no "done"; once the bucket takes it, done."""
    from faultproxy import FaultProxy

    proxy = FaultProxy(rclone_endpoint).start()
    try:
        name = f"behind-{uuid.uuid4().hex[:6]}"
        job, store, _ = bucket_job(tmp_path, corpus, proxy.endpoint, name, steps=6, every=3)
        proxy.fail("PUT", "step-00000006/manifest.json", status=403)  # turned read-only
        code, _, err = run_to_end("run", job, "--no-sample")
        assert code == ExitCode.STORAGE, err
        direct = open_store(store.url, endpoint_url=rclone_endpoint)
        assert latest_committed(direct, name) == 3

        code, _, err = run_to_end("run", job, "--no-sample")  # the bucket still refuses it
        assert code == ExitCode.STORAGE, err
        assert "step-00000006 is committed here but not in" in err
        assert "step-00000006 is committed in" in err and "done:" not in err
        assert latest_committed(direct, name) == 3

        proxy.clear()  # the outage passes
        code, _, err = run_to_end("run", job, "--no-sample")
    finally:
        proxy.stop()
    assert code == ExitCode.OK, err
    assert latest_committed(direct, name) == 6, err
    assert "done: 6 steps" in err
