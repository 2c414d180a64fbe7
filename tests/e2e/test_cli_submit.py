"""The submission commands as a user types them: submit, jobs, status, logs, cancel,
export, through the real console entry point (separate processes, as on a laptop)."""

from __future__ import annotations

import base64
import os
import subprocess
import sys

import yaml
from fakeaws import REGION
from patience import wait_until
from runhelpers import write_job


def ten(*args, home, check=True, timeout=120):
    env = {**os.environ, "TEN_RUNNER_HOME": str(home)}
    p = subprocess.run([sys.executable, "-m", "runner.cli", *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    if check:
        assert p.returncode == 0, p.stderr
    return p




def test_submit_local_then_status_logs_jobs_and_cancel(tmp_path, corpus):
    home = tmp_path / "home"
    job = write_job(tmp_path, corpus, name="cli-sub", steps=10_000, every=10_000)
    out = ten("submit", job, "--to", "local", home=home)
    job_id = out.stdout.strip()
    assert job_id.startswith("cli-sub-") and "\n" not in job_id  # stdout: the id alone
    assert "controller pid" in out.stderr

    assert job_id in ten("jobs", home=home).stdout
    def status_when_running():
        text = ten("status", job_id, home=home).stdout
        return text if "RUNNING" in text else None

    def log_when_training():
        p = ten("logs", job_id, home=home, check=False)
        return p.stdout if p.returncode == 0 and "step" in p.stdout else None

    status = wait_until(status_when_running, what="RUNNING")
    assert f"job        {job_id} (cli-sub) --to local" in status
    log = wait_until(log_when_training, what="training in run.log")
    assert "job cli-sub: ten/tiny" in log

    out = ten("cancel", job_id, home=home)
    assert out.stdout.strip() == f"{job_id}: CANCELLED"
    status = ten("status", job_id, home=home).stdout
    assert "CANCELLED" in status and "(heartbeat cancelled," in status, status
    assert "checkpoint committed" in ten("logs", job_id, home=home).stdout  # on its way out
    # the run's own files say so too, not "preempted": the store's status table
    assert "cancelled" in ten("status", tmp_path / "store", home=home).stdout


def test_submit_errors_are_one_line_with_their_exit_code(tmp_path, corpus):
    home = tmp_path / "home"
    job = write_job(tmp_path, corpus, name="cli-bad")
    p = ten("submit", job, "--to", "gcp", home=home, check=False)
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "--to 'gcp'" in p.stderr
    p = ten("submit", job, "--to", "aws", home=home, check=False)  # a local store
    assert p.returncode == 2 and "use an s3:// storage.url" in p.stderr
    p = ten("submit", job, "--to", "local", "--region", "eu-west-1", home=home, check=False)
    assert p.returncode == 2 and "--region: --to local takes no region (clouds with one: aws)" \
        in p.stderr, p.stderr
    p = ten("submit", job, "--to", "ssh://-oProxyCommand=x", home=home, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = ten("status", "no-such-job-abc123", home=home, check=False)
    assert p.returncode != 0 and "Traceback" not in p.stderr
    assert ten("jobs", home=home).stdout.startswith("no submitted jobs")


def test_export_prints_or_writes_the_manifest(tmp_path):
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = ten("export", root / "jobs/l40s-small-32k.yaml", "--to", "k8s", home=tmp_path)
    kinds = [d["kind"] for d in yaml.safe_load_all(out.stdout) if d]
    assert kinds == ["ConfigMap", "Job"]
    target = tmp_path / "task.yaml"
    ten("export", root / "jobs/l40s-small-32k.yaml", "--to", "skypilot", "-o", target,
        home=tmp_path)
    task = yaml.safe_load(target.read_text())
    assert task["resources"]["use_spot"] is True
    p = ten("export", root / "jobs/tiny-cpu.yaml", "--to", "slurm", home=tmp_path,
            check=False)
    assert p.returncode == 2 and "slurm" in p.stderr


def test_submit_to_aws_launches_a_tagged_spot_instance_and_cancel_removes_it(
        tmp_path, corpus, moto_aws):
    """The whole `--to aws` wiring through the CLI, against moto: checks, the job YAML
    into the bucket, a background controller launching a spot instance whose user data
    runs that URL; `cancel` terminates it. (moto's instance never runs the container.)"""
    import boto3

    home = tmp_path / "home"
    env = {**os.environ, "AWS_ENDPOINT_URL": moto_aws, "TEN_RUNNER_HOME": str(home)}
    ec2 = boto3.client("ec2", endpoint_url=moto_aws)
    boto3.client("s3", endpoint_url=moto_aws).create_bucket(Bucket="ten-cli")
    image = sorted(i["ImageId"] for i in ec2.describe_images(
        Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"])[0]
    job = write_job(tmp_path, corpus, name="cli-aws")
    job.write_text(job.read_text().replace(
        f"storage: {{url: {tmp_path / 'store'}}}",
        "storage: {url: 's3://ten-cli/runs'}\n"
        f"resources: {{spot: true, aws: {{max_price: 1.5, ami: {image}}}}}"))

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "runner.cli", *map(str, args)], env=env,
                              capture_output=True, text=True, timeout=120)

    out = cli("submit", job, "--to", "aws", "--region", REGION)
    assert out.returncode == 0, out.stderr
    job_id = out.stdout.strip()
    submitted = yaml.safe_load((home / "jobs" / job_id / "job.yaml").read_text())
    assert submitted["resources"]["aws"]["region"] == REGION  # --region is that --set

    def instances():
        found = ec2.describe_instances(Filters=[
            {"Name": "tag:ten-runner:job-id", "Values": [job_id]}])["Reservations"]
        return [i for r in found for i in r["Instances"]]

    (inst,) = wait_until(instances, what="an instance")
    assert inst["InstanceType"] == "g6e.xlarge" and inst["ImageId"] == image
    assert inst.get("InstanceLifecycle") == "spot"
    user_data = ec2.describe_instance_attribute(InstanceId=inst["InstanceId"],
                                                Attribute="userData")
    text = base64.b64decode(user_data["UserData"]["Value"]).decode()
    assert f"s3://ten-cli/runs/cli-aws/submitted/{job_id}.yaml" in text
    assert os.environ["AWS_SECRET_ACCESS_KEY"] not in text
    status = cli("status", job_id)
    assert inst["InstanceId"] in status.stdout, status.stdout

    # An instance the record never learned of (a controller killed between the launch
    # call and saving the record): tagged with the job, so the end of the job finds it.
    orphan = ec2.run_instances(ImageId=image, InstanceType="g6e.xlarge", MinCount=1,
                               MaxCount=1, TagSpecifications=[{
                                   "ResourceType": "instance",
                                   "Tags": [{"Key": "ten-runner:job-id", "Value": job_id}]}])
    orphan_id = orphan["Instances"][0]["InstanceId"]

    done = cli("cancel", job_id)
    assert done.stdout.strip() == f"{job_id}: CANCELLED", done.stderr
    states = {i["InstanceId"]: i["State"]["Name"] for i in instances()}
    assert states.keys() == {inst["InstanceId"], orphan_id}
    assert set(states.values()) <= {"terminated", "shutting-down"}, states
