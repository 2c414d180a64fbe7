"""``submit --to local`` end to end, with a real bucket (moto): submit, kill -9 the
training process once a checkpoint is committed in the bucket (a spot interruption),
the loop relaunches it on a "new machine" (its local run directory deleted), the new
attempt resumes from the bucket, the job SUCCEEDS, and its final weights equal those
of an uninterrupted run. Nothing is left running."""

from __future__ import annotations

import os
import re
import shutil
import signal
import threading
import time
import uuid

import boto3
import pytest
from patience import machine_note, wait_until
from runhelpers import final_weights, run_to_end, same_weights, write_job

from runner.job import load_job
from runner.job.layout import run_dir_of
from runner.provision.jobs import (
    describe,
    read_heartbeat,
    request_cancel,
    start_detached,
    status_reader,
    submit_managed,
)
from runner.provision.local import LocalProvider, _group_alive
from runner.provision.managed import controller_pid
from runner.provision.policy import State
from runner.provision.registry import list_records, load_record
from runner.storage import open_store
from runner.storage.checkpoints import latest_committed
from ten.train.metrics import read_metrics

STEPS = 40
EVERY = 5
BUCKET = "ten-e2e"


class NewMachineEachAttempt(LocalProvider):
    """LocalProvider whose relaunches start on an empty disk, as a new spot instance
    would: only the bucket can make attempt 2 resume."""

    def __init__(self, run_dir, **kw):
        super().__init__(**kw)
        self.run_dir, self.launched = run_dir, []

    def launch(self, spec, avoid=frozenset()):
        if spec.attempt > 1:
            shutil.rmtree(self.run_dir)
        instance = super().launch(spec, avoid)
        self.launched.append(instance)
        return instance


@pytest.mark.slow  # 15 s on 2 idle cores, up to 30 s on busy ones: three training runs
def test_kill_9_relaunch_resume_from_the_bucket_succeeds(tmp_path, corpus, moto_aws,
                                                          monkeypatch):
    monkeypatch.setenv("TEN_RUNNER_HOME", str(tmp_path / "home"))
    boto3.client("s3", endpoint_url=moto_aws).create_bucket(Bucket=BUCKET)
    ref = write_job(tmp_path, corpus, name="ref", steps=STEPS, every=STEPS)
    code, _, err = run_to_end("run", ref, "--no-sample")
    assert code == 0, err

    name = f"e2e-{uuid.uuid4().hex[:6]}"
    path = write_job(tmp_path, corpus, name=name, steps=STEPS, every=EVERY)
    url = f"s3://{BUCKET}/runs"
    path.write_text(path.read_text().replace(
        f"storage: {{url: {tmp_path / 'store'}}}",
        f"storage: {{url: '{url}', endpoint_url: '{moto_aws}'}}"))
    job = load_job(path, check_model=False)
    store = open_store(url, endpoint_url=moto_aws)
    provider = NewMachineEachAttempt(run_dir_of(job), grace_s=10)
    lines: list[str] = []
    done: dict = {}
    thread = threading.Thread(target=lambda: done.update(record=submit_managed(
        job, path, "local", provider=provider, detach=False, poll_s=0.2, log=lines.append)))
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while latest_committed(store, name) is None:  # in the bucket, not just on disk
            assert thread.is_alive() and time.monotonic() < deadline, (lines, machine_note())
            time.sleep(0.2)
        (record,) = list_records()
        pid = record.instance["details"]["pid"]
        os.kill(pid, signal.SIGKILL)  # the spot instance is gone, no notice
        thread.join(timeout=180)
        assert not thread.is_alive(), lines
    finally:  # whatever happened, leave nothing running
        if thread.is_alive():
            for rec in list_records():
                request_cancel(rec.job_id, wait_s=60)
            thread.join(timeout=60)
        for instance in provider.launched:
            provider.terminate(instance)
    record = done["record"]
    logs = {n: (record.dir / f"attempt-{n}.log").read_text() for n in (1, 2)}
    assert record.state == "SUCCEEDED", describe(record) + "\n" + logs.get(2, "")
    assert (record.attempt, record.preemptions, record.restarts) == (2, 1, 0)
    assert "killed by SIGKILL" in " ".join(h["reason"] for h in record.history)
    history = [h["state"] for h in record.history]
    assert history[:3] == ["PENDING", "STARTING", "RUNNING"] and history[-1] == "SUCCEEDED"
    assert "RECOVERING" in history

    restored = re.search(r"restored step (\d+) from s3://", logs[2])
    assert restored and 0 < int(restored.group(1)) < STEPS, logs[2]  # resumed, not redone
    assert "restored step" not in logs[1]

    (s1, w1), (s2, w2) = final_weights(tmp_path / "store" / "ref"), final_weights(run_dir_of(job))
    assert s1 == s2 == STEPS and same_weights(w1, w2)
    assert latest_committed(store, name) == STEPS
    final = status_reader(job)()
    assert final["state"] == "done" and final["exit_code"] == 0
    assert record.instance is None
    assert not any(_group_alive(int(i.details["pgid"])) for i in provider.launched)


def wait_for(predicate, timeout=120, what=""):
    return wait_until(predicate, timeout, what)


def metrics_steps(run_dir):
    try:
        return [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")
                if r["kind"] == "train"]
    except OSError:
        return []


def test_background_controller_stopped_then_adopted_then_cancel(tmp_path, corpus,
                                                                 monkeypatch):
    """The detached controller (python -m runner.provision.jobs) is SIGTERMed: it
    leaves the training running; a new one adopts the process it did not start and
    sees it through; then `cancel` ends a second job: SIGTERM, checkpoint, CANCELLED."""
    monkeypatch.setenv("TEN_RUNNER_HOME", str(tmp_path / "home"))
    path = write_job(tmp_path, corpus, name="bg", steps=30, every=10)
    job = load_job(path, check_model=False)
    record = submit_managed(job, path, "local", poll_s=0.2, log=lambda s: None)
    run_dir = run_dir_of(job)
    wait_for(lambda: load_record(record.job_id).state == "RUNNING", what="RUNNING")
    first = controller_pid(record.job_id)
    assert first and load_record(record.job_id).instance
    wait_for(lambda: metrics_steps(run_dir), what="training")
    os.kill(first, signal.SIGTERM)  # e.g. the laptop logs out
    wait_for(lambda: controller_pid(record.job_id) is None, what="controller exit")
    stopped = load_record(record.job_id)
    assert stopped.state == "RUNNING" and "unsupervised" in stopped.history[-1]["reason"]
    pid = stopped.instance["details"]["pid"]
    os.kill(pid, 0)  # the training did not stop with it

    second = start_detached(record.job_id)  # adopts a process it is not the parent of
    assert second != first
    wait_for(lambda: State(load_record(record.job_id).state).terminal, what="the end")
    done = load_record(record.job_id)
    assert done.state == "SUCCEEDED" and done.attempt == 1 and done.exit_code == 0, \
        describe(done)
    assert "the attempt is gone: exit 0" in done.history[-1]["reason"]  # from the heartbeat
    text = describe(done, read_heartbeat(done))
    assert "progress   step 30/30" in text and "heartbeat done" in text
    log = (done.dir / "controller.log").read_text()
    assert "adopting attempt 1" in log and f"controller pid {second}" in log
    assert max(metrics_steps(run_dir)) == 30

    path = write_job(tmp_path, corpus, name="bg-cancel", steps=10_000, every=10_000)
    job = load_job(path, check_model=False)
    record = submit_managed(job, path, "local", poll_s=0.2, log=lambda s: None)
    wait_for(lambda: metrics_steps(run_dir_of(job)), what="training")
    pid = load_record(record.job_id).instance["details"]["pid"]
    cancelled = request_cancel(record.job_id, wait_s=60)
    assert cancelled.state == "CANCELLED" and cancelled.instance is None
    assert not _group_alive(pid)
    # it checkpointed on its way out, and knows the stop was the cancel, not a preemption
    assert status_reader(job)()["state"] == "cancelled"
    wait_for(lambda: controller_pid(record.job_id) is None, what="controller exit")


def test_a_process_we_did_not_start_is_polled_and_terminated_by_pid_and_start_time():
    """What a restarted controller sees: no Popen object, only the record's details. A
    reused pid (another start time) is neither reported running nor signalled."""
    import subprocess
    import sys

    from runner.provision.base import Instance, Phase
    from runner.provision.local import _start_ticks

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                            start_new_session=True)
    try:
        ticks = _start_ticks(proc.pid)
        details = {"pid": proc.pid, "pgid": proc.pid, "start_ticks": ticks}
        fresh = LocalProvider(grace_s=5)  # not its parent, as after a controller restart
        if ticks is not None:  # Linux: the start time tells a reused pid apart
            impostor = Instance("local", str(proc.pid), details={**details,
                                                                 "start_ticks": ticks + 1})
            assert fresh.poll(impostor).phase == Phase.GONE
            fresh.terminate(impostor)  # not ours: left alone
            assert proc.poll() is None
        ours = Instance("local", str(proc.pid), details=details)
        assert fresh.poll(ours).phase == Phase.RUNNING
        fresh.terminate(ours)
        assert proc.wait(timeout=10) == -signal.SIGTERM
        assert fresh.poll(ours).phase == Phase.GONE
        fresh.terminate(ours)  # idempotent
    finally:
        proc.kill()
        proc.wait()
