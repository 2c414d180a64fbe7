"""``ten-runner submit --to ssh://...`` as a user types it: the submit command starts a
background controller process that runs the job on the sandbox host (tests/support/
fakessh.py); status, logs, cancel and jobs follow it."""

import time

from fakessh import ENV, TARGET, no_secret_in, write_job
from patience import machine_note

from runner.provision.registry import load_record


def test_the_cli_submits_and_follows_an_ssh_job(tmp_path, host, monkeypatch, moto_server):
    """What a user types: submit prints the id alone and a background controller runs
    the job; status, logs (from the job's bucket), cancel and jobs take the id; no
    secret from the environment appears in anything printed."""
    import boto3
    from click.testing import CliRunner

    from runner.cli import cli

    for key, value in {**ENV, "S3_ENDPOINT_URL": moto_server}.items():
        if key != "HOME":
            monkeypatch.setenv(key, value)
    s3 = boto3.client("s3", endpoint_url=moto_server, region_name="us-east-1")
    s3.create_bucket(Bucket="bkt")
    s3.put_object(Bucket="bkt", Key="runs/tiny-ssh/run.log", Body=b"step 4 loss 6\n")
    runner = CliRunner()
    out = runner.invoke(cli, ["submit", str(write_job(tmp_path)), "--to", TARGET])
    assert out.exit_code == 0, out.output
    job_id = out.stdout.strip()
    assert job_id.startswith("tiny-ssh-") and "\n" not in job_id
    deadline = time.monotonic() + 60
    while load_record(job_id).state != "RUNNING":
        assert time.monotonic() < deadline, (load_record(job_id).history, machine_note())
        time.sleep(0.2)
    status = runner.invoke(cli, ["status", job_id])
    assert status.exit_code == 0 and "RUNNING" in status.output
    assert f"ssh ten-{job_id}-1 in gpu-box" in status.output
    logs = runner.invoke(cli, ["logs", job_id])
    assert logs.exit_code == 0 and "step 4 loss 6" in logs.output
    assert job_id in runner.invoke(cli, ["jobs"]).output
    done = runner.invoke(cli, ["cancel", job_id])
    assert done.exit_code == 0 and done.output.strip() == f"{job_id}: CANCELLED"
    assert [c["argv"][-1] for c in host.docker("stop")] == [f"ten-{job_id}-1"]
    no_secret_in(out.output, status.output, logs.output, done.output,
                 *(p.read_text() for p in load_record(job_id).dir.iterdir() if p.is_file()))
    assert host.pwned() == []
