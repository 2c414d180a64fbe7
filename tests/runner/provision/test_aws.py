"""The EC2 provider against moto's server (real boto3, real HTTP), plus its pure
decisions (error code -> next step, describe_instances record -> status) from tables.

moto cannot refuse capacity or interrupt a spot instance, so those paths run through a
provider whose one creating call refuses with a real ``ClientError`` before handing over
to moto (``Refusing`` below), and through :func:`classify` on realistic records.
"""

from __future__ import annotations

import base64
import functools
import time
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError
from fakeaws import ACCESS_KEY, REGION, SECRET_KEY

from runner.exit_codes import ExitCode
from runner.provision import aws, ec2_rules
from runner.provision.aws import AWSProvider
from runner.provision.base import (
    CloudCredentials,
    Instance,
    LaunchSpec,
    NoCapacity,
    Phase,
    ProvisionError,
)
from runner.provision.ec2_rules import Step, classify, launch_step, plan_attempts
from runner.provision.env import upload_job
from runner.provision.registry import JobRecord

USER_DATA = "#cloud-config\nruncmd: [[echo, {job_id}]]\n"


def ec2(endpoint):
    return boto3.client("ec2", endpoint_url=endpoint, region_name=REGION)


@functools.cache
def x86_image(endpoint) -> str:
    """moto's built-in images are the same after every reset; listing them takes ~1 s."""
    images = ec2(endpoint).describe_images(
        Filters=[{"Name": "architecture", "Values": ["x86_64"]}])["Images"]
    return sorted(i["ImageId"] for i in images)[0]


def spec(job_id="tiny-aws-1a2b3c", attempt=1, spot=True) -> LaunchSpec:
    return LaunchSpec(job_id=job_id, job_name="tiny-aws", job_file=Path("/nonexistent.yaml"),
                      job_url=f"s3://bucket/tiny-aws/submitted/{job_id}.yaml",
                      image="ghcr.io/ten-runner/ten-runner:latest", attempt=attempt, spot=spot)


@functools.cache
def shared_session() -> boto3.session.Session:
    """One session for the tests that do not look at credentials: loading the EC2 model
    into a fresh session costs ~0.3 s."""
    return boto3.session.Session()


def provider(endpoint, cls=AWSProvider, **kw) -> AWSProvider:
    kw.setdefault("session", shared_session())
    kw.setdefault("ami", x86_image(endpoint))
    kw.setdefault("max_price", 1.25)
    kw.setdefault("on_demand_fallback", False)
    kw.setdefault("instance_profile", None)
    kw.setdefault("user_data", lambda s: USER_DATA.format(job_id=s.job_id))
    return cls(REGION, kw.pop("instance_type", "g6e.xlarge"), endpoint_url=endpoint, **kw)


def live(endpoint, job_id=None) -> list[dict]:
    filters = [{"Name": "instance-state-name", "Values": list(ec2_rules.LIVE_STATES)}]
    if job_id:
        filters.append({"Name": f"tag:{aws.TAG_JOB_ID}", "Values": [job_id]})
    found = ec2(endpoint).describe_instances(Filters=filters)["Reservations"]
    return [i for r in found for i in r["Instances"]]


def client_error(code: str, message: str = "refused") -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": message}}, "RunInstances")


class Refusing(AWSProvider):
    """EC2 as moto, except that ``refuse(params)`` may answer with an error code first."""

    def __init__(self, *args, refuse, **kw):
        super().__init__(*args, **kw)
        self.refuse, self.calls = refuse, []

    def _run_instances(self, **params):
        market = "spot" if "InstanceMarketOptions" in params else "on-demand"
        zone = params["Placement"]["AvailabilityZone"]
        self.calls.append((market, zone))
        code = self.refuse(market, zone)
        if code:
            raise client_error(code)
        return super()._run_instances(**params)


# -- launch ------------------------------------------------------------------------------

def test_launch_creates_one_tagged_spot_instance(moto_aws):
    seen = {}
    session = boto3.session.Session()
    session.events.register("provide-client-params.ec2.RunInstances",
                            lambda params, **_: seen.update(params))
    p = provider(moto_aws, session=session)
    inst = p.launch(spec())
    assert inst.provider == "aws" and inst.spot and inst.zone.startswith(REGION)
    assert inst.details["market"] == "spot" and inst.details["region"] == REGION

    [vm] = live(moto_aws)
    assert vm["InstanceId"] == inst.id and vm["InstanceType"] == "g6e.xlarge"
    assert vm["InstanceLifecycle"] == "spot"
    assert vm["Placement"]["AvailabilityZone"] == inst.zone
    tags = {t["Key"]: t["Value"] for t in vm["Tags"]}
    assert tags == {"ten-runner:job-id": "tiny-aws-1a2b3c", "ten-runner:job": "tiny-aws",
                    "ten-runner:attempt": "1", "Name": "tiny-aws-1a2b3c attempt 1"}
    volumes = ec2(moto_aws).describe_volumes(
        Filters=[{"Name": "tag:ten-runner:job-id", "Values": ["tiny-aws-1a2b3c"]}])["Volumes"]
    assert [v["Attachments"][0]["InstanceId"] for v in volumes] == [inst.id]
    attr = ec2(moto_aws).describe_instance_attribute
    assert attr(InstanceId=inst.id, Attribute="instanceInitiatedShutdownBehavior")[
        "InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    user_data = attr(InstanceId=inst.id, Attribute="userData")["UserData"]["Value"]
    assert base64.b64decode(user_data).decode() == USER_DATA.format(job_id="tiny-aws-1a2b3c")
    # What was asked (moto does not echo market options back).
    assert seen["InstanceMarketOptions"] == {"MarketType": "spot", "SpotOptions": {
        "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate",
        "MaxPrice": "1.25"}}
    assert seen["MinCount"] == seen["MaxCount"] == 1
    assert {t["ResourceType"] for t in seen["TagSpecifications"]} == {"instance", "volume"}


def test_on_demand_job_and_instance_profile_by_name(moto_aws):
    iam = boto3.client("iam", endpoint_url=moto_aws, region_name=REGION)
    iam.create_instance_profile(InstanceProfileName="ten-runner-bucket")
    seen = {}
    session = boto3.session.Session()
    session.events.register("provide-client-params.ec2.RunInstances",
                            lambda params, **_: seen.update(params))
    inst = provider(moto_aws, session=session, instance_profile="ten-runner-bucket",
                    max_price=None).launch(spec(spot=False))
    assert not inst.spot and "InstanceMarketOptions" not in seen
    assert seen["IamInstanceProfile"] == {"Name": "ten-runner-bucket"}
    [vm] = live(moto_aws)
    assert "InstanceLifecycle" not in vm


def test_avoid_zones_and_all_zones_blocked(moto_aws):
    p = provider(moto_aws)
    zones = sorted(o["Location"] for o in ec2(moto_aws).describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["g6e.xlarge"]}])["InstanceTypeOfferings"])
    assert len(zones) >= 2
    inst = p.launch(spec(), avoid=frozenset(zones[:-1]))
    assert inst.zone == zones[-1]
    with pytest.raises(NoCapacity) as err:
        p.launch(spec(attempt=2), avoid=frozenset(zones))
    assert err.value.exit_code == ExitCode.NO_CAPACITY and "blocked" in str(err.value)
    assert [vm["InstanceId"] for vm in live(moto_aws)] == [inst.id]


def test_no_spot_capacity_falls_back_to_on_demand(moto_aws):
    p = provider(moto_aws, cls=Refusing, on_demand_fallback=True,
                 refuse=lambda market, zone: "InsufficientInstanceCapacity"
                 if market == "spot" else None)
    inst = p.launch(spec())
    zones = [z for market, z in p.calls if market == "spot"]
    assert p.calls == [("spot", z) for z in zones] + [("on-demand", zones[0])]
    assert not inst.spot and inst.details["market"] == "on-demand"
    assert [vm["InstanceId"] for vm in live(moto_aws)] == [inst.id]


def test_no_capacity_anywhere_names_type_region_and_tries(moto_aws):
    p = provider(moto_aws, cls=Refusing, refuse=lambda market, zone: "SpotMaxPriceTooLow")
    with pytest.raises(NoCapacity) as err:
        p.launch(spec())
    text = str(err.value)
    assert err.value.exit_code == ExitCode.NO_CAPACITY and "\n" not in text
    assert "g6e.xlarge" in text and REGION in text and "spot in us-east-1a" in text
    assert "resources.aws.max_price" in text and "on_demand_fallback" in text
    assert live(moto_aws) == []


def test_spot_quota_skips_to_on_demand_and_on_demand_quota_stops(moto_aws):
    p = provider(moto_aws, cls=Refusing, on_demand_fallback=True,
                 refuse=lambda market, zone: "MaxSpotInstanceCountExceeded"
                 if market == "spot" else "VcpuLimitExceeded")
    with pytest.raises(NoCapacity) as err:
        p.launch(spec())
    assert [m for m, _ in p.calls] == ["spot", "on-demand"]  # a quota is not per zone
    assert "quota" in str(err.value)


def test_config_error_at_launch_stops_at_once(moto_aws):
    p = provider(moto_aws, cls=Refusing,
                 refuse=lambda market, zone: "InvalidParameterCombination")
    with pytest.raises(ProvisionError) as err:
        p.launch(spec())
    assert err.value.exit_code == ExitCode.CONFIG and len(p.calls) == 1


# -- validation: nothing is created ---------------------------------------------------------

def test_unknown_instance_type_is_config_with_suggestion(moto_aws):
    with pytest.raises(ProvisionError) as err:
        provider(moto_aws, instance_type="g6e.xlarg").launch(spec())
    text = str(err.value)
    assert err.value.exit_code == ExitCode.CONFIG
    assert "resources.aws.instance_type" in text and "did you mean g6e.xlarge" in text
    assert live(moto_aws) == []


def test_unknown_region_is_config_with_near_matches():
    with pytest.raises(ProvisionError) as err:
        ec2_rules.check_region("us-east-9")
    assert err.value.exit_code == ExitCode.CONFIG
    assert "resources.aws.region" in str(err.value) and "us-east-1" in str(err.value)
    assert ec2_rules.check_region("eu-west-1") == "eu-west-1"


def test_missing_region_names_the_field(aws_env, monkeypatch):
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(ProvisionError) as err:
        ec2_rules.resolve_region(None, boto3.session.Session())
    assert "resources.aws.region" in str(err.value) and "AWS_REGION" in str(err.value)
    monkeypatch.setenv("AWS_REGION", "eu-central-1")
    assert ec2_rules.resolve_region(None, boto3.session.Session()) == "eu-central-1"
    assert ec2_rules.resolve_region("us-west-2") == "us-west-2"


def test_no_credentials_is_exit_8_and_prints_no_secret(moto_aws, monkeypatch, tmp_path):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                 "AWS_WEB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "config").write_text("")
    (tmp_path / "credentials").write_text("")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    p = provider(moto_aws, ami="ami-12345678", session=None)  # a fresh credential chain
    with pytest.raises(CloudCredentials) as err:
        p.launch(spec())
    text = str(err.value)
    assert err.value.exit_code == ExitCode.CLOUD_CREDENTIALS == 8
    assert "AWS_PROFILE" in text and "AWS_ACCESS_KEY_ID" in text and "\n" not in text
    assert SECRET_KEY not in text and ACCESS_KEY not in text
    monkeypatch.undo()
    assert live(moto_aws) == []


def test_missing_ami_and_default_ami_parameter(moto_aws):
    with pytest.raises(ProvisionError) as err:
        provider(moto_aws, ami="ami-12345678").prepare()
    assert "resources.aws.ami" in str(err.value) and "ami-12345678" in str(err.value)
    # moto has no Deep Learning AMI parameter: the error says what to set.
    with pytest.raises(ProvisionError) as err:
        provider(moto_aws, ami=None).prepare()
    assert err.value.exit_code == ExitCode.CONFIG
    assert "resources.aws.ami" in str(err.value) and ec2_rules.DLAMI_PARAMETER in str(err.value)
    # A parameter that exists resolves to its AMI (names under /aws/ are reserved).
    ssm = boto3.client("ssm", endpoint_url=moto_aws, region_name=REGION)
    ssm.put_parameter(Name="/ten-runner/test/ami-id", Value=x86_image(moto_aws), Type="String")
    p = provider(moto_aws, ami=None, ami_parameter="/ten-runner/test/ami-id")
    assert p.prepare() == x86_image(moto_aws)
    assert live(moto_aws) == []


def test_ami_architecture_must_match_the_type(moto_aws):
    arm = ec2(moto_aws).describe_images(
        Filters=[{"Name": "architecture", "Values": ["arm64"]}])["Images"][0]["ImageId"]
    with pytest.raises(ProvisionError) as err:
        provider(moto_aws, ami=arm).launch(spec())
    assert "arm64" in str(err.value) and "x86_64" in str(err.value)
    assert live(moto_aws) == []


def test_user_data_over_the_limit_is_refused_before_launch(moto_aws):
    with pytest.raises(ProvisionError) as err:
        provider(moto_aws, user_data=lambda s: "#" * (ec2_rules.USER_DATA_LIMIT + 1)).launch(spec())
    assert "user data" in str(err.value)
    assert live(moto_aws) == []


def test_unknown_instance_profile_leaves_nothing(moto_aws):
    with pytest.raises(ProvisionError) as err:
        provider(moto_aws, instance_profile="no-such-profile").launch(spec())
    assert err.value.exit_code == ExitCode.CONFIG
    assert "resources.aws.instance_profile" in str(err.value)
    assert live(moto_aws) == []


def test_failure_after_the_instance_exists_terminates_it(moto_aws):
    launched = []

    def record_then_fail(instance):
        launched.append(instance.id)
        raise KeyboardInterrupt  # Ctrl-C right after run_instances answered

    with pytest.raises(KeyboardInterrupt):
        provider(moto_aws, on_launch=record_then_fail).launch(spec())
    assert len(launched) == 1 and live(moto_aws) == []
    [vm] = [i for r in ec2(moto_aws).describe_instances(InstanceIds=launched)["Reservations"]
            for i in r["Instances"]]
    assert vm["State"]["Name"] == "terminated"


# -- poll, terminate, logs, teardown -----------------------------------------------------------

def test_poll_running_then_gone_after_terminate_idempotent(moto_aws):
    p = provider(moto_aws)
    inst = p.launch(spec())
    assert p.poll(inst).phase is Phase.RUNNING
    p.terminate(inst)
    p.terminate(inst)  # already terminated: fine
    status = p.poll(inst)
    assert status.phase is Phase.GONE and "UserInitiated" in status.reason
    assert live(moto_aws) == []


def test_poll_not_found_is_pending_only_right_after_launch(moto_aws):
    p = provider(moto_aws)
    ghost = Instance(provider="aws", id="i-0123456789abcdef0", launched_at=time.time())
    assert p.poll(ghost).phase is Phase.PENDING  # EC2 is eventually consistent
    ghost.launched_at -= ec2_rules.VISIBILITY_GRACE_S + 1
    assert p.poll(ghost).phase is Phase.GONE
    p.terminate(ghost)  # not found: fine


def test_stopped_by_someone_is_gone(moto_aws):
    p = provider(moto_aws)
    inst = p.launch(spec())
    ec2(moto_aws).stop_instances(InstanceIds=[inst.id])
    assert p.poll(inst).phase is Phase.GONE


def test_logs_decoded_console_or_empty(moto_aws):
    p = provider(moto_aws)
    inst = p.launch(spec())
    assert "Linux version" in p.logs(inst)
    assert p.logs(Instance(provider="aws", id="i-0123456789abcdef0")) == ""
    assert ec2_rules.decode_console(base64.b64encode(b"cloud-init done\n").decode()) == \
        "cloud-init done\n"


def test_teardown_job_terminates_every_attempt_of_that_job_only(moto_aws):
    p = provider(moto_aws)
    first = p.launch(spec(attempt=1))
    second = p.launch(spec(attempt=2, spot=False))
    other = p.launch(spec(job_id="other-job-000000"))
    ids = p.teardown_job("tiny-aws-1a2b3c")
    assert sorted(ids) == sorted([first.id, second.id])
    assert live(moto_aws, "tiny-aws-1a2b3c") == []
    assert [vm["InstanceId"] for vm in live(moto_aws)] == [other.id]
    assert p.teardown_job("tiny-aws-1a2b3c") == []  # nothing left: a no-op


# -- the job's side: upload and provider_for ---------------------------------------------------

JOB = """\
name: tiny-aws
model: {preset: tiny}
data: {dataset: builtin:botocore-docs}
train: {max_steps: 10, device: cpu}
storage: {url: "STORE"}
resources:
  spot: true
  aws: {instance_type: g5.xlarge, region: us-west-2, max_price: 1.2,
        on_demand_fallback: true, instance_profile: ten-runner-bucket}
"""


def write_job(tmp_path, store: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(JOB.replace("STORE", store))
    return path


def test_upload_job_puts_the_yaml_in_the_bucket(moto_aws, tmp_path):
    from runner.job import load_job

    s3 = boto3.client("s3", endpoint_url=moto_aws, region_name=REGION)
    s3.create_bucket(Bucket="ten-jobs")
    path = write_job(tmp_path, "s3://ten-jobs/runs")
    job = load_job(path)
    job_with_endpoint = job.model_copy(update={"storage": job.storage.model_copy(
        update={"endpoint_url": moto_aws})})
    url = upload_job(job_with_endpoint, path, "tiny-aws-1a2b3c")
    assert url == "s3://ten-jobs/runs/tiny-aws/submitted/tiny-aws-1a2b3c.yaml"
    body = s3.get_object(Bucket="ten-jobs", Key="runs/tiny-aws/submitted/tiny-aws-1a2b3c.yaml")
    assert body["Body"].read() == path.read_bytes()

    local = load_job(write_job(tmp_path, str(tmp_path / "runs")))
    with pytest.raises(ProvisionError) as err:
        upload_job(local, path, "tiny-aws-1a2b3c")
    assert "storage.url" in str(err.value) and "s3://" in str(err.value)


def test_provider_for_takes_the_jobs_resources(aws_env, tmp_path):
    from runner.job import load_job

    job = load_job(write_job(tmp_path, "s3://ten-jobs/runs"))
    record = JobRecord(job_id="tiny-aws-1a2b3c", job_name="tiny-aws", target="aws",
                       state="starting", details={"job_url": "s3://ten-jobs/runs/x.yaml"})
    p = aws.provider_for(job, record)
    assert (p.region, p.instance_type, p.max_price, p.on_demand_fallback,
            p.instance_profile, p.ami) == ("us-west-2", "g5.xlarge", 1.2, True,
                                           "ten-runner-bucket", None)
    text = p.user_data(spec())
    assert "s3://bucket/tiny-aws/submitted/tiny-aws-1a2b3c.yaml" in text
    assert "AWS_DEFAULT_REGION=us-west-2" in text and len(text) <= ec2_rules.USER_DATA_LIMIT
    # Crashes are counted by the managed loop only: the VM never restarts the container.
    assert "--restart=no" in text and "--restart=on-failure" not in text


# -- pure decisions from tables -----------------------------------------------------------------

@pytest.mark.parametrize("code, step", [
    ("InsufficientInstanceCapacity", Step.NEXT_ZONE),
    ("SpotMaxPriceTooLow", Step.NEXT_ZONE),
    ("Unsupported", Step.NEXT_ZONE),
    ("MaxSpotInstanceCountExceeded", Step.NEXT_MARKET),
    ("VcpuLimitExceeded", Step.NEXT_MARKET),
    ("InstanceLimitExceeded", Step.NEXT_MARKET),
    ("AuthFailure", Step.CREDENTIALS),
    ("UnauthorizedOperation", Step.CREDENTIALS),
    ("InvalidAMIID.NotFound", Step.CONFIG),
    ("InvalidParameterValue", Step.CONFIG),
    ("InternalError", Step.FAIL),
])
def test_launch_step_table(code, step):
    assert launch_step(code) is step


@pytest.mark.parametrize("code, exit_code", [
    ("AuthFailure", ExitCode.CLOUD_CREDENTIALS),
    ("UnauthorizedOperation", ExitCode.CLOUD_CREDENTIALS),
    ("InvalidParameterValue", ExitCode.CONFIG),
    ("InternalError", ExitCode.CRASH),
])
def test_aws_error_exit_codes(code, exit_code):
    err = ec2_rules.aws_error(client_error(code, "x" * 500), "launching g6e.xlarge", REGION)
    assert err.exit_code == exit_code and len(str(err)) < 400 and "\n" not in str(err)


def test_plan_attempts_table():
    assert plan_attempts(["a", "b"], spot=True, on_demand_fallback=False) == [
        ("spot", "a"), ("spot", "b")]
    assert plan_attempts(["a", "b"], spot=True, on_demand_fallback=True) == [
        ("spot", "a"), ("spot", "b"), ("on-demand", "a"), ("on-demand", "b")]
    assert plan_attempts(["a"], spot=False, on_demand_fallback=True) == [("on-demand", "a")]


def _vm(state, code="", message="", transition="", request=None):
    record = {"InstanceId": "i-0abc", "State": {"Name": state}, "StateTransitionReason":
              transition, "InstanceLifecycle": "spot", "SpotInstanceRequestId": "sir-1"}
    if code:
        record["StateReason"] = {"Code": code, "Message": message or f"{code}: ..."}
    return record


@pytest.mark.parametrize("record, request_status, phase", [
    (_vm("pending", "pending", "pending"), None, Phase.PENDING),
    (_vm("running"), None, Phase.RUNNING),
    (_vm("running"), "marked-for-termination", Phase.RUNNING),
    (_vm("shutting-down", "Server.SpotInstanceTermination",
         "Server.SpotInstanceTermination: Spot instance termination"), None, Phase.PREEMPTED),
    (_vm("terminated", "Server.SpotInstanceTermination",
         transition="Service initiated (2026-03-01 10:00:00 GMT)"), "instance-terminated-no-"
     "capacity", Phase.PREEMPTED),
    (_vm("terminated", transition="Service initiated"), "instance-terminated-by-price",
     Phase.PREEMPTED),
    (_vm("stopped", "Server.SpotInstanceShutdown"), None, Phase.PREEMPTED),
    (_vm("terminated", "Server.InsufficientInstanceCapacity"), None, Phase.PREEMPTED),
    (_vm("terminated", "Client.InstanceInitiatedShutdown",
         "Client.InstanceInitiatedShutdown: Instance initiated shutdown",
         transition="User initiated (2026-03-01 10:00:00 GMT)"), None, Phase.EXITED),
    (_vm("shutting-down", "Client.InstanceInitiatedShutdown"), "instance-terminated-by-user",
     Phase.EXITED),
    (_vm("terminated", "Client.UserInitiatedShutdown",
         transition="User initiated (2026-03-01 10:00:00 GMT)"), None, Phase.GONE),
    (_vm("terminated", transition="User initiated"), "instance-terminated-by-user",
     Phase.GONE),
    (_vm("stopped", "Client.UserInitiatedShutdown"), None, Phase.GONE),
    (_vm("terminated", "Server.InternalError"), None, Phase.GONE),
    (_vm("terminated"), None, Phase.GONE),
])
def test_classify_table(record, request_status, phase):
    request = {"SpotInstanceRequestId": "sir-1", "State": "closed",
               "Status": {"Code": request_status}} if request_status else None
    status = classify(record, request)
    assert status.phase is phase
    assert status.exit_code is None
    assert status.reason


# -- the managed loop on moto --------------------------------------------------------------------

def test_managed_loop_relaunches_after_the_vm_vanishes_and_tears_down(moto_aws, tmp_path,
                                                                      monkeypatch):
    """Attempt 1 runs, then someone terminates its VM (no final heartbeat: a charged
    restart); the relaunch first finds no spot capacity anywhere, backs off on the fake
    clock, launches attempt 2, which reports done; nothing of the job is left running."""
    managed = pytest.importorskip("runner.provision.managed")
    from runner.provision.policy import Limits, State

    monkeypatch.setenv("TEN_RUNNER_HOME", str(tmp_path / "home"))
    job_id = "tiny-aws-1a2b3c"
    zones = ec2(moto_aws).describe_instance_type_offerings(
        LocationType="availability-zone",
        Filters=[{"Name": "instance-type", "Values": ["g6e.xlarge"]}])["InstanceTypeOfferings"]
    refusals = {"left": 0}

    def refuse(market, zone):
        if refusals["left"]:
            refusals["left"] -= 1
            return "InsufficientInstanceCapacity"
        return None

    p = provider(moto_aws, cls=Refusing, refuse=refuse)
    record = JobRecord(job_id=job_id, job_name="tiny-aws", target="aws",
                       state=State.PENDING.value, details={"max_restarts": 2})
    record.save()
    now = [0.0]
    polls = {1: 0, 2: 0}

    def final_status():
        attempt = controller.record.attempt
        polls[attempt] += 1
        if attempt == 1 and polls[1] == 2:  # the VM is terminated behind our back
            ec2(moto_aws).terminate_instances(InstanceIds=[controller.instance.id])
            refusals["left"] = len(zones)  # and the next launch finds no capacity
        if attempt == 2 and polls[2] == 2:
            return {"state": "done", "exit_code": 0, "time": time.time()}
        return None

    controller = managed.ManagedJob(
        record, p, lambda attempt: spec(job_id=job_id, attempt=attempt), final_status,
        poll_s=5.0, clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s),
        log=lambda line: None, limits=Limits(backoff_s=10, capacity_timeout_s=600))
    record = controller.run()

    assert record.state == State.SUCCEEDED.value and record.exit_code == 0
    assert (record.attempt, record.restarts, record.preemptions) == (2, 1, 0)
    reasons = " | ".join(h["reason"] for h in record.history)
    assert "vanished" in reasons and "no capacity" in reasons
    assert live(moto_aws, job_id) == []
    ended = ec2(moto_aws).describe_instances(Filters=[
        {"Name": f"tag:{aws.TAG_JOB_ID}", "Values": [job_id]}])["Reservations"]
    states = sorted((tag["Value"], i["State"]["Name"]) for r in ended for i in r["Instances"]
                    for tag in i["Tags"] if tag["Key"] == aws.TAG_ATTEMPT)
    assert states == [("1", "terminated"), ("2", "terminated")]
