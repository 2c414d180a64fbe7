"""The managed loop against a scripted cloud (tests/support/fakecloud.py) on a fake
clock: every path ends with nothing left running, and the record tells the story in
order."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from fakecloud import (
    GONE,
    PENDING,
    PREEMPTED,
    RUNNING,
    FakeClock,
    FakeCloud,
    Script,
    exited,
)

from runner.exit_codes import ExitCode
from runner.provision.base import CloudCredentials, LaunchSpec, ProvisionError
from runner.provision.jobs import describe, request_cancel
from runner.provision.managed import CANCEL, ManagedJob, controller_lock, controller_pid
from runner.provision.policy import Limits, State
from runner.provision.registry import JobRecord, load_record

LIMITS = Limits(capacity_timeout_s=600, backoff_s=10, backoff_max_s=60, start_timeout_s=300,
                unreachable_timeout_s=120)


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("TEN_RUNNER_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def new_record(max_restarts=2, job_id="fake-job-0a1b2c"):
    record = JobRecord(job_id=job_id, job_name="fake-job", target="fake",
                       state=State.PENDING.value, details={"max_restarts": max_restarts})
    record.transition(State.PENDING.value, "submitted")
    record.save()
    return record


def spec(attempt: int) -> LaunchSpec:
    return LaunchSpec(job_id="fake-job-0a1b2c", job_name="fake-job", job_file=Path("j.yaml"),
                      job_url=None, image="img", attempt=attempt)


def controller(cloud, record=None, clock=None, **kw):
    clock = clock or FakeClock()
    record = record or new_record()
    lines = []
    job = ManagedJob(record, cloud, spec, cloud.final_status, poll_s=5.0, clock=clock,
                     sleep=clock.sleep, log=lines.append, limits=kw.pop("limits", LIMITS),
                     **kw)
    return job, clock, lines


def states(record):
    """The history's states with repeats collapsed."""
    out = []
    for h in record.history:
        if not out or out[-1] != h["state"]:
            out.append(h["state"])
    return out


def test_preempted_then_relaunched_then_done():
    cloud = FakeCloud([Script.runs(3, PREEMPTED), Script.runs(2, exited(0))])
    job, _, _ = controller(cloud)
    record = job.run()
    assert record.state == "SUCCEEDED" and record.exit_code == 0
    assert (record.attempt, record.preemptions, record.restarts) == (2, 1, 0)
    assert states(record) == ["PENDING", "STARTING", "RUNNING", "RECOVERING", "RUNNING",
                              "SUCCEEDED"]
    assert [s.attempt for s, _ in cloud.launches] == [1, 2]
    assert load_record(record.job_id).state == "SUCCEEDED"  # persisted
    assert record.instance is None
    cloud.assert_clean()


def test_crashes_are_counted_up_to_max_restarts_then_failed():
    cloud = FakeCloud([Script.runs(1, exited(ExitCode.CRASH))])
    job, _, _ = controller(cloud, new_record(max_restarts=2))
    record = job.run()
    assert record.state == "FAILED" and record.exit_code == ExitCode.CRASH
    assert (len(cloud.launches), record.restarts, record.preemptions) == (3, 2, 0)
    assert "no restarts left (2/2 used)" in record.history[-1]["reason"]
    cloud.assert_clean()


def test_preemptions_do_not_use_up_restarts():
    cloud = FakeCloud([Script.runs(1, PREEMPTED)] * 5 + [Script.runs(1, exited(0))])
    job, _, _ = controller(cloud, new_record(max_restarts=0))
    record = job.run()
    assert record.state == "SUCCEEDED"
    assert (record.preemptions, record.restarts, len(cloud.launches)) == (5, 0, 6)
    cloud.assert_clean()


def test_config_error_fails_without_relaunch():
    cloud = FakeCloud([Script.runs(1, exited(ExitCode.CONFIG))])
    job, _, _ = controller(cloud, new_record(max_restarts=5))
    record = job.run()
    assert record.state == "FAILED" and record.exit_code == ExitCode.CONFIG
    assert len(cloud.launches) == 1 and record.restarts == 0
    assert "not retried" in record.history[-1]["reason"]
    cloud.assert_clean()


def test_remote_exit_code_comes_from_the_final_heartbeat():
    """The provider cannot tell the container's exit code: the heartbeat in the bucket
    says DATA, which is not retried."""
    cloud = FakeCloud([Script.runs(2, exited(None), {"state": "failed", "exit_code": 3})])
    job, _, _ = controller(cloud, new_record(max_restarts=5))
    record = job.run()
    assert record.state == "FAILED" and record.exit_code == ExitCode.DATA
    assert len(cloud.launches) == 1
    cloud.assert_clean()


def test_job_done_while_the_machine_still_runs_is_torn_down():
    cloud = FakeCloud([Script.runs(2, RUNNING, {"state": "done", "exit_code": 0})])
    job, _, _ = controller(cloud)
    record = job.run()
    assert record.state == "SUCCEEDED"
    assert cloud.terminations == ["i-0001"]
    cloud.assert_clean()


def test_heartbeat_is_read_sparingly_while_running_and_at_once_when_ended():
    cloud = FakeCloud([Script.runs(60, exited(None), {"state": "failed", "exit_code": 2})])
    job, clock, _ = controller(cloud)
    record = job.run()
    assert record.state == "FAILED" and record.exit_code == ExitCode.CONFIG
    # 62 polls 5 s apart: 61 while running, read at the first and every 6th after it
    # (11 reads, one per 30 s), then once more at the exit
    assert cloud.vms[0].polls == 62 and cloud.status_reads == 11 + 1
    cloud.assert_clean()


def test_stale_final_status_of_a_previous_attempt_is_ignored():
    """Attempt 1 wrote "preempted" and was relaunched; attempt 2 must not be judged by
    it while it runs."""
    cloud = FakeCloud([Script.runs(1, exited(None), {"state": "preempted", "exit_code": 75}),
                       Script.runs(6, exited(0))])
    job, _, _ = controller(cloud)
    record = job.run()
    assert record.state == "SUCCEEDED" and record.preemptions == 1
    assert cloud.vms[1].polls == 8  # ran to its own end
    cloud.assert_clean()


def test_unhealthy_host_blocks_the_zone_and_relaunches_elsewhere():
    cloud = FakeCloud([Script.runs(0, exited(ExitCode.UNHEALTHY_HOST)),
                       Script.runs(2, exited(0))])
    job, _, _ = controller(cloud, new_record(max_restarts=0))
    record = job.run()
    assert record.state == "SUCCEEDED"
    assert record.blocked == ["z1"] and record.restarts == 0
    (_, avoid1), (_, avoid2) = cloud.launches
    assert avoid1 == frozenset() and avoid2 == {"z1"}
    assert cloud.vms[1].instance.zone == "z2"
    cloud.assert_clean()


def test_unhealthy_everywhere_ends_when_no_zone_is_left():
    cloud = FakeCloud([Script.runs(0, exited(ExitCode.UNHEALTHY_HOST))], zones=("z1", "z2"))
    job, clock, _ = controller(cloud)
    record = job.run()
    assert record.state == "FAILED" and record.exit_code == ExitCode.NO_CAPACITY
    assert record.blocked == ["z1", "z2"] and len(cloud.vms) == 2
    cloud.assert_clean()


def test_no_capacity_waits_with_backoff_then_launches():
    cloud = FakeCloud([Script.runs(2, exited(0))], refuse=3)
    job, clock, _ = controller(cloud)
    record = job.run()
    assert record.state == "SUCCEEDED"
    assert cloud.refusals == 3 and len(cloud.vms) == 1
    assert clock.now >= 10 + 20 + 40  # the backoff was slept (in naps of <= poll_s)
    assert max(clock.slept) <= 5.0
    waits = [h["reason"] for h in record.history if "no capacity" in h["reason"]]
    assert [w.split("retrying in ")[1].split(" s")[0] for w in waits] == ["10", "20", "40"]
    assert states(record) == ["PENDING", "STARTING", "RUNNING", "SUCCEEDED"]
    cloud.assert_clean()


def test_no_capacity_forever_fails_after_the_deadline():
    cloud = FakeCloud([Script.runs(1, exited(0))], refuse=-1)
    job, clock, _ = controller(cloud)
    record = job.run()
    assert record.state == "FAILED" and record.exit_code == ExitCode.NO_CAPACITY
    assert clock.now >= LIMITS.capacity_timeout_s
    assert clock.now < LIMITS.capacity_timeout_s + 2 * LIMITS.backoff_max_s
    assert not cloud.vms and record.instance is None
    cloud.assert_clean()


def test_cloud_credentials_fail_at_once():
    cloud = FakeCloud([Script.runs(1, exited(0))],
                      launch_errors=[CloudCredentials("no AWS credentials: run aws configure")])
    job, _, _ = controller(cloud)
    record = job.run()
    assert record.state == "FAILED" and record.exit_code == ExitCode.CLOUD_CREDENTIALS
    assert "aws configure" in record.history[-1]["reason"]
    cloud.assert_clean()


def test_provider_bug_at_launch_is_retried_as_a_counted_restart():
    cloud = FakeCloud([Script.runs(1, exited(0))], launch_errors=[RuntimeError("boom")])
    job, _, _ = controller(cloud)
    record = job.run()
    assert record.state == "SUCCEEDED" and record.restarts == 1
    cloud.assert_clean()


def test_vanished_machine_is_a_counted_restart():
    cloud = FakeCloud([Script.runs(1, GONE), Script.runs(1, exited(0))])
    job, _, _ = controller(cloud, new_record(max_restarts=1))
    record = job.run()
    assert record.state == "SUCCEEDED" and record.restarts == 1 and record.preemptions == 0
    cloud.assert_clean()


def test_attempt_stuck_pending_is_replaced():
    cloud = FakeCloud([Script([PENDING]),
                       Script.runs(1, exited(0))])
    job, clock, _ = controller(cloud)
    record = job.run()
    assert record.state == "SUCCEEDED" and record.restarts == 1
    assert "did not start within" in " ".join(h["reason"] for h in record.history)
    cloud.assert_clean()


def test_poll_outage_recovers_or_fails_after_the_timeout():
    cloud = FakeCloud([Script.runs(2, exited(0))], poll_errors=3)
    job, _, lines = controller(cloud)
    assert job.run().state == "SUCCEEDED"
    assert sum("cannot poll" in line for line in lines) == 1  # warned once
    cloud.assert_clean()

    cloud = FakeCloud([Script.runs(2, exited(0))], poll_errors=10_000)
    job, clock, _ = controller(cloud, new_record(job_id="fake-job-0a1b2d"))
    record = job.run()
    assert record.state == "FAILED" and record.exit_code == ExitCode.HOST_UNREACHABLE
    assert cloud.terminations == ["i-0001"]  # torn down even so
    cloud.assert_clean()


def test_cancel_tears_down_and_records_cancelled(home):
    cloud = FakeCloud([Script.runs(1000, exited(0))])
    job, clock, _ = controller(cloud)

    def cancel_later(c):
        if c.now >= 30 and not (job.record.dir / CANCEL).exists():
            assert controller_pid(job.record.job_id) is not None  # the loop holds the lock
            record = request_cancel(job.record.job_id, wait_s=0)  # only writes the file
            assert record.state == "RUNNING"
    clock.on_sleep = cancel_later
    record = job.run()
    assert record.state == "CANCELLED" and record.exit_code is None
    assert states(record)[-2:] == ["RUNNING", "CANCELLED"]
    assert clock.now < 45  # seen at the next step
    cloud.assert_clean()
    assert "CANCELLED" in describe(record)


@pytest.mark.parametrize("fails", [False, True])
def test_a_cancel_is_announced_to_the_run_before_its_attempt_is_stopped(home, fails):
    """The run must know the SIGTERM it is about to get is a cancel, not a preemption:
    the mark goes out before the teardown; a mark that cannot be written is said, and
    the cancel goes on."""
    cloud = FakeCloud([Script.runs(1000, exited(0))])
    order = []

    def announce():
        order.append(("announce", list(cloud.terminations)))
        if fails:
            raise ConnectionError("bucket unreachable")
    job, clock, lines = controller(cloud, announce_cancel=announce)
    clock.on_sleep = lambda c: (job.record.dir / CANCEL).touch() if c.now >= 30 else None
    assert job.run().state == "CANCELLED"
    assert order == [("announce", [])]  # once, before any termination
    assert cloud.terminations
    said = [line for line in lines if "could not tell the run" in line]
    assert bool(said) is fails, lines
    cloud.assert_clean()


def test_a_live_heartbeat_is_reported_as_progress(home):
    """`submit --wait` (and the controller's log) hear the step, loss and ETA as the job
    trains, once per step reached, not only the state changes."""
    import time as real_time

    cloud = FakeCloud([Script.runs(6, exited(0))])
    steps = iter([None, 10, 10, 20, 30])

    def read_status():
        step = next(steps, None)
        if step is None:
            return cloud.final_status()
        return {"state": "running", "time": real_time.time(), "step": step,
                "total_steps": 40, "loss": 6.0 - step / 10, "eta_s": 4.0 * (40 - step)}
    clock = FakeClock()
    lines = []
    job = ManagedJob(new_record(), cloud, spec, read_status, poll_s=5.0, clock=clock,
                     sleep=clock.sleep, log=lines.append, limits=LIMITS, status_every_s=0)
    assert job.run().state == "SUCCEEDED"
    progress = [line.split(": ", 1)[1] for line in lines if ": step " in line]
    assert progress == ["step 10/40, loss 5.0000, ETA 0:02:00",
                        "step 20/40, loss 4.0000, ETA 0:01:20",
                        "step 30/40, loss 3.0000, ETA 0:00:40"]
    cloud.assert_clean()


def test_exception_in_the_loop_still_tears_down():
    """The finally block: a controller bug ends FAILED with nothing left running."""
    cloud = FakeCloud([Script.runs(1000, exited(0))])
    job, clock, _ = controller(cloud)

    def explode(c):
        if c.now >= 20:
            raise RuntimeError("controller bug")
    clock.on_sleep = explode
    record = job.run()
    assert record.state == "FAILED" and "controller bug" in record.history[-1]["reason"]
    cloud.assert_clean()

    cloud = FakeCloud([Script.runs(1000, exited(0))])
    job, clock, _ = controller(cloud, new_record(job_id="fake-job-0a1b2d"))

    def interrupt(c):
        if c.now >= 20:
            raise KeyboardInterrupt
    clock.on_sleep = interrupt
    with pytest.raises(KeyboardInterrupt):
        job.run()
    assert job.record.state == "CANCELLED"
    cloud.assert_clean()


def test_teardown_is_retried_and_a_failed_one_is_left_for_cancel():
    cloud = FakeCloud([Script.runs(1, exited(0))], terminate_errors=2)
    job, _, _ = controller(cloud)
    assert job.run().state == "SUCCEEDED"
    assert cloud.terminations == ["i-0001"] * 3
    cloud.assert_clean()

    cloud = FakeCloud([Script.runs(1, exited(0))], terminate_errors=6)
    job, _, lines = controller(cloud, new_record(job_id="fake-job-0a1b2d"))
    record = job.run()
    assert record.state == "SUCCEEDED" and record.exit_code == 0  # the job did succeed
    assert "could not terminate i-0001" in record.history[-1]["reason"]
    assert record.instance["id"] == "i-0001" and cloud.running() == ["i-0001"]
    assert "may still run" in describe(load_record(record.job_id))
    record = request_cancel(record.job_id, provider=cloud)  # the cloud answers again
    assert record.state == "SUCCEEDED" and record.instance is None
    cloud.assert_clean()


def test_cancel_with_no_controller_running_tears_down_itself():
    cloud = FakeCloud([Script.runs(1000, exited(0))])
    job, clock, _ = controller(cloud)
    clock.on_sleep = lambda c: job.request_detach() if c.now >= 15 else None
    assert job.run().state == "RUNNING" and cloud.running() == ["i-0001"]
    # request_cancel builds a controller from the record: give it the same cloud
    record = request_cancel(job.record.job_id, provider=cloud, wait_s=0)
    assert record.state == "CANCELLED"
    cloud.assert_clean()


def test_detach_leaves_the_attempt_running_and_a_new_controller_adopts_it():
    cloud = FakeCloud([Script.runs(8, exited(0))])
    job, clock, _ = controller(cloud)
    clock.on_sleep = lambda c: job.request_detach() if c.now >= 15 else None
    record = job.run()
    assert record.state == "RUNNING" and cloud.running() == ["i-0001"]  # not torn down
    assert "unsupervised" in record.history[-1]["reason"]
    assert "no controller is running" in describe(load_record(record.job_id))

    again, _, lines = controller(cloud, load_record(record.job_id))
    record = again.run()
    assert record.state == "SUCCEEDED" and len(cloud.launches) == 1
    assert any("adopting attempt 1" in line for line in lines)
    cloud.assert_clean()


def test_one_controller_per_job():
    record = new_record()
    held, release = threading.Event(), threading.Event()

    def hold():
        with controller_lock(record.job_id):
            held.set()
            release.wait(10)
    thread = threading.Thread(target=hold)
    thread.start()
    held.wait(10)
    try:
        cloud = FakeCloud([Script.runs(1, exited(0))])
        job, _, _ = controller(cloud, record)
        with pytest.raises(ProvisionError, match="already has a controller"):
            job.run()
        assert not cloud.launches
    finally:
        release.set()
        thread.join()
    assert controller_pid(record.job_id) is None


def test_submit_to_aws_puts_the_job_in_the_bucket_for_the_instance(tmp_path, corpus,
                                                                    moto_aws):
    import boto3
    from runhelpers import write_job

    from runner.job import load_job
    from runner.provision.jobs import submit_managed
    from runner.provision.registry import list_records
    from runner.storage import open_store

    boto3.client("s3", endpoint_url=moto_aws).create_bucket(Bucket="ten-submit")
    path = write_job(tmp_path, corpus, name="to-aws")
    local = load_job(path, check_model=False)
    with pytest.raises(ProvisionError, match="is a local path, but the job runs on another"):
        submit_managed(local, path, "aws", provider=FakeCloud([]), detach=False)
    assert list_records() == [] and not list((tmp_path / "home" / "jobs").iterdir())

    path.write_text(path.read_text().replace(
        f"storage: {{url: {tmp_path / 'store'}}}",
        f"storage: {{url: 's3://ten-submit/runs', endpoint_url: '{moto_aws}'}}"))
    job = load_job(path, check_model=False)
    cloud = FakeCloud([Script.runs(1, exited(0))])
    record = submit_managed(job, path, "aws", provider=cloud, detach=False, poll_s=0.001,
                            log=lambda line: None)
    assert record.state == "SUCCEEDED"
    url = record.details["job_url"]
    assert cloud.launches[0][0].job_url == url and url.startswith("s3://ten-submit/runs/")
    store = open_store("s3://ten-submit/runs", endpoint_url=moto_aws)
    assert store.get_bytes(url[len("s3://ten-submit/runs/"):]) == path.read_bytes()
    assert (record.dir / "job.yaml").read_bytes() == path.read_bytes()
    assert (record.dir / "job.yaml").stat().st_mode & 0o777 == 0o600
    cloud.assert_clean()


def test_submit_to_aws_checks_the_cloud_before_creating_anything(tmp_path, corpus, moto_aws,
                                                                 monkeypatch):
    """An unknown instance type is a config error at submit: no record, no job YAML in
    the bucket, no instance."""
    import boto3
    from runhelpers import write_job

    from runner.exit_codes import ExitCode
    from runner.job import load_job
    from runner.provision.jobs import submit_managed
    from runner.provision.registry import list_records
    from runner.storage import open_store

    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_aws)  # every AWS API goes to moto
    boto3.client("s3").create_bucket(Bucket="ten-submit")
    path = write_job(tmp_path, corpus, name="bad-type")
    path.write_text(path.read_text().replace(
        f"storage: {{url: {tmp_path / 'store'}}}",
        "storage: {url: 's3://ten-submit/runs'}\nresources: {aws: {instance_type: g6e.xlarg}}"))
    job = load_job(path, check_model=False)
    with pytest.raises(ProvisionError) as err:
        submit_managed(job, path, "aws", detach=False)
    assert err.value.exit_code == ExitCode.CONFIG
    assert "resources.aws.instance_type" in str(err.value) and "g6e.xlarge" in str(err.value)
    assert list_records() == []
    assert open_store("s3://ten-submit/runs").list() == []
    assert boto3.client("ec2").describe_instances()["Reservations"] == []


def test_the_jobs_max_preemptions_caps_relaunches(tmp_path, corpus):
    """resources.max_preemptions: at most that many relaunches after preemptions, then
    FAILED instead of relaunching forever (a process killed for memory also dies by
    SIGKILL)."""
    from runhelpers import write_job

    from runner.job import load_job
    from runner.provision.jobs import submit_managed

    path = write_job(tmp_path, corpus, name="capped")
    path.write_text(path.read_text() + "resources: {max_preemptions: 1}\n")
    job = load_job(path, check_model=False)
    cloud = FakeCloud([Script.runs(1, PREEMPTED)])
    record = submit_managed(job, path, "local", provider=cloud, detach=False, poll_s=0.001,
                            log=lambda line: None)
    assert record.state == "FAILED" and record.preemptions == 2
    assert len(cloud.launches) == 2 and record.details["limits"]["max_preemptions"] == 1
    cloud.assert_clean()


def test_the_job_record_holds_the_storage_url_as_written_not_its_secrets(tmp_path, corpus,
                                                                          monkeypatch):
    """Issue 23, fault 17: `jobs --json` and `status ID --json` printed the resolved
    storage.url, ${VAR} values included."""
    from runhelpers import write_job

    from runner.job import load_job
    from runner.provision.jobs import submit_managed

    monkeypatch.setenv("RUNS_TOKEN", "tok-s3cr3t-runs")
    path = write_job(tmp_path, corpus, name="written")
    text = path.read_text()
    path.write_text(text.replace(f"storage: {{url: {tmp_path / 'store'}}}",
                                 f"storage: {{url: '{tmp_path}/${{RUNS_TOKEN}}'}}"))
    job = load_job(path, check_model=False)
    cloud = FakeCloud([Script.runs(1, 0)])
    record = submit_managed(job, path, "local", provider=cloud, detach=False, poll_s=0.001,
                            log=lambda line: None)
    assert record.details["storage"] == f"{tmp_path}/${{RUNS_TOKEN}}"
    assert "s3cr3t" not in json.dumps(record.details)


def test_submit_with_sets_runs_the_job_with_the_overrides(tmp_path, corpus, home):
    """``submit --set``: the file the attempts run (the record's copy) holds the
    overrides, so every relaunch trains the job as submitted; ${VAR}s stay references."""
    from runhelpers import write_job

    from runner.job import load_job
    from runner.provision.jobs import submit_managed

    path = write_job(tmp_path, corpus, name="with-sets")
    path.write_text(path.read_text().replace("  mode:", "  text_field: ${FIELD:-text}\n  mode:"))
    sets = ["train.max_steps=7", "train.lr=1e-3"]
    job = load_job(path, sets, check_model=False)
    cloud = FakeCloud([Script.runs(1, exited(0))])
    record = submit_managed(job, path, "local", provider=cloud, detach=False, poll_s=0.001,
                            log=lambda line: None, sets=sets)
    assert record.state == "SUCCEEDED"
    ran = cloud.launches[0][0].job_file
    copy = load_job(ran, check_model=False)
    assert (copy.train.max_steps, copy.train.lr) == (7, 1e-3)
    assert copy.data.dataset == job.data.dataset and "${FIELD:-text}" in ran.read_text()
    assert ran.stat().st_mode & 0o777 == 0o600


def test_submit_with_a_bad_set_is_one_line_and_submits_nothing(tmp_path, corpus, home):
    from click.testing import CliRunner
    from runhelpers import write_job

    from runner.cli import cli
    from runner.provision.registry import list_records

    path = write_job(tmp_path, corpus, name="bad-set")
    out = CliRunner().invoke(cli, ["submit", str(path), "--to", "local",
                                   "--set", "train.lr=-1"])
    assert out.exit_code == ExitCode.CONFIG, out.output
    assert out.output.strip().splitlines()[-1].endswith("--set train.lr: must be > 0.0, got -1")
    assert list_records() == []
