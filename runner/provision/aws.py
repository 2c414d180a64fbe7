"""``ten-runner submit JOB.yaml --to aws``: one EC2 (spot) instance per attempt.

The instance boots the cloud-init user data (:mod:`runner.provision.cloudinit`), which
runs ``ten-runner run s3://.../<job id>.yaml`` in the container and powers the machine
off when the job ends; ``InstanceInitiatedShutdownBehavior=terminate`` makes that
power-off delete the instance, so a finished or crashed job stops costing money even if
nobody is watching. The managed loop (:mod:`runner.provision.managed`) watches through
:meth:`AWSProvider.poll` and the heartbeat in the bucket.

Rules this module keeps:

* Validate before creating anything (region, credentials, instance type, AMI): a
  mistake costs one API call, not a half-launched machine.
* Tags go on the instance and its volumes *in* ``run_instances`` (TagSpecifications),
  never in a second call that could fail after the launch, so :meth:`teardown_job` can
  always find what a job created.
* Once an instance id exists, any failure (or Ctrl-C) terminates it before raising.
* What EC2's answers mean (error codes, instance states) is decided by the pure rules
  in :mod:`runner.provision.ec2_rules`; this module makes the calls and acts on them.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from runner.provision.base import (
    CloudCredentials,
    Instance,
    InstanceStatus,
    LaunchSpec,
    NoCapacity,
    Phase,
    Provider,
    ProvisionError,
)
from runner.provision.destinations import Destination
from runner.provision.ec2_rules import (
    CREDENTIAL_CODES,
    DLAMI_PARAMETER,
    LIVE_STATES,
    STEPS,
    USER_DATA_LIMIT,
    VISIBILITY_GRACE_S,
    Step,
    aws_error,
    aws_message,
    check_instance_type,
    check_region,
    classify,
    decode_console,
    error_code,
    launch_step,
    plan_attempts,
    resolve_region,
)
from runner.provision.env import require_bucket

TAG_JOB_ID, TAG_JOB, TAG_ATTEMPT = "ten-runner:job-id", "ten-runner:job", "ten-runner:attempt"


# -- the provider -------------------------------------------------------------------------

class AWSProvider(Provider):
    """EC2 attempts of one job. Cheap to build (no API call); :meth:`prepare` validates
    and is run by the first :meth:`launch` (the CLI can call it before uploading
    anything)."""

    name = "aws"

    def __init__(self, region: str, instance_type: str = "g6e.xlarge", *,
                 ami: str | None = None, max_price: float | None = None,
                 on_demand_fallback: bool = False, instance_profile: str | None = None,
                 user_data: Callable[[LaunchSpec], str], endpoint_url: str | None = None,
                 zones: Sequence[str] | None = None, subnet_ids: Sequence[str] | None = None,
                 session: Any = None, ami_parameter: str = DLAMI_PARAMETER,
                 on_launch: Callable[[Instance], None] | None = None):
        self.region, self.instance_type = region, instance_type
        self.ami, self.max_price = ami, max_price
        self.on_demand_fallback, self.instance_profile = on_demand_fallback, instance_profile
        self.user_data, self.endpoint_url = user_data, endpoint_url
        self.zones, self.subnet_ids = list(zones or []), list(subnet_ids or [])
        self.ami_parameter = ami_parameter
        # Called with the new instance before launch returns (e.g. to record its id at
        # once); if it raises, the instance is terminated.
        self.on_launch = on_launch
        self._session = session
        self._clients: dict[str, Any] = {}
        self._image: str | None = None

    # -- plumbing ----------------------------------------------------------------------
    def _client(self, service: str) -> Any:
        if service not in self._clients:
            if self._session is None:  # one session: the service models load once
                self._session = boto3.session.Session()
            session = self._session
            config = Config(retries={"max_attempts": 5, "mode": "standard"},
                            connect_timeout=10, read_timeout=60, user_agent_extra="ten-runner")
            try:
                self._clients[service] = session.client(
                    service, region_name=self.region, endpoint_url=self.endpoint_url,
                    config=config)
            except (BotoCoreError, ValueError) as e:
                raise ProvisionError(f"cannot configure the AWS {service} client for "
                                     f"{self.region}: {type(e).__name__}") from None
        return self._clients[service]

    @property
    def ec2(self) -> Any:
        return self._client("ec2")

    def _api(self, what: str, fn: Callable[..., Any], **params: Any) -> Any:
        try:
            return fn(**params)
        except (ClientError, BotoCoreError) as e:
            raise aws_error(e, what, self.region) from None

    # -- validation --------------------------------------------------------------------
    def prepare(self) -> str:
        """Check region, credentials, instance type and machine image; return the AMI id.
        Raises ProvisionError (CONFIG / CloudCredentials) and creates nothing."""
        if self._image is None:
            check_region(self.region)
            info = check_instance_type(self.ec2, self.instance_type, self.region)
            image = self._resolve_image()
            arches = (info.get("ProcessorInfo") or {}).get("SupportedArchitectures") or []
            arch = image.get("Architecture")
            if arches and arch and arch not in arches:
                raise ProvisionError(f"resources.aws.ami {image['ImageId']} is {arch} but "
                                     f"{self.instance_type} runs {'/'.join(arches)}: pick a "
                                     "matching AMI or instance type")
            self._image = image["ImageId"]
        return self._image

    def _resolve_image(self) -> dict[str, Any]:
        ami = self.ami
        if ami is None:
            ssm = self._client("ssm")
            try:
                ami = ssm.get_parameter(Name=self.ami_parameter)["Parameter"]["Value"]
            except ClientError as e:
                code = error_code(e)
                if code in CREDENTIAL_CODES and code not in ("AccessDenied",
                                                             "AccessDeniedException"):
                    raise aws_error(e, "read the default AMI from SSM", self.region) from None
                raise ProvisionError(
                    f"cannot find the default GPU AMI in {self.region} ({code} reading SSM "
                    f"parameter {self.ami_parameter}): set resources.aws.ami to an AMI with "
                    "docker and the NVIDIA container toolkit") from None
            except BotoCoreError as e:
                raise aws_error(e, "read the default AMI from SSM", self.region) from None
        try:
            images = self.ec2.describe_images(ImageIds=[ami])["Images"]
        except ClientError as e:
            if not error_code(e).startswith("InvalidAMIID"):
                raise aws_error(e, "describe images", self.region) from None
            images = []
        except BotoCoreError as e:
            raise aws_error(e, "describe images", self.region) from None
        if not images:
            raise ProvisionError(f"resources.aws.ami {ami!r} does not exist in {self.region} (or "
                                 "is not shared with this account); null picks the AWS Deep "
                                 "Learning Base GPU AMI")
        return images[0]

    def _zones(self, avoid: frozenset[str]) -> tuple[list[str], dict[str, str]]:
        """Zones of the region offering the type (in the given subnets' zones when set),
        minus ``avoid``; and the subnet to use per zone."""
        pages = self.ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone",
            Filters=[{"Name": "instance-type", "Values": [self.instance_type]}])
        try:
            offered = sorted({o["Location"] for page in pages
                              for o in page["InstanceTypeOfferings"]})
        except (ClientError, BotoCoreError) as e:
            raise aws_error(e, "describe instance type offerings", self.region) from None
        subnets: dict[str, str] = {}
        if self.subnet_ids:
            found = self._api("describe subnets", self.ec2.describe_subnets,
                              SubnetIds=self.subnet_ids)["Subnets"]
            subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in found}
            offered = [z for z in offered if z in subnets]
        if self.zones:
            offered = [z for z in self.zones if z in offered]
        if not offered:
            where = "the zones of the given subnets/zones" if self.subnet_ids or self.zones \
                else "any availability zone"
            raise ProvisionError(f"resources.aws.instance_type {self.instance_type} is not "
                                 f"offered in {where} of {self.region}: pick another "
                                 "resources.aws.region or instance_type")
        usable = [z for z in offered if z not in avoid]
        if not usable:
            raise NoCapacity(f"every zone offering {self.instance_type} in {self.region} is "
                             f"blocked after failed health checks: {', '.join(offered)}")
        return usable, subnets

    # -- Provider ----------------------------------------------------------------------
    def launch(self, spec: LaunchSpec, avoid: frozenset[str] = frozenset()) -> Instance:
        image = self.prepare()
        user_data = self.user_data(spec)
        if len(user_data.encode()) > USER_DATA_LIMIT:
            raise ProvisionError(f"the instance user data is {len(user_data.encode())} bytes; "
                                 f"EC2 allows {USER_DATA_LIMIT}: shorten resources.image or "
                                 "the environment passed to the job")
        zones, subnets = self._zones(avoid)
        tried: list[str] = []
        skipped: set[str] = set()
        codes: set[str] = set()
        for market, zone in plan_attempts(zones, spec.spot, self.on_demand_fallback):
            if market in skipped:
                continue
            params = self._launch_params(spec, image, user_data, market, zone,
                                         subnets.get(zone))
            try:
                described = self._run_instances(**params)["Instances"][0]
            except ClientError as e:
                code = error_code(e)
                step = launch_step(code)
                if step in (Step.NEXT_ZONE, Step.NEXT_MARKET):
                    tried.append(f"{market} in {zone}: {code}")
                    codes.add(code)
                    if step is Step.NEXT_MARKET:
                        skipped.add(market)
                    continue
                raise self._launch_error(e) from None
            except BaseException as e:
                # No answer (network, Ctrl-C): the instance may exist all the same.
                self._terminate_attempt(spec)
                if isinstance(e, BotoCoreError):
                    raise aws_error(e, "run instances", self.region) from None
                raise
            return self._launched(described, spec, market, image)
        raise NoCapacity(self._no_capacity(tried, codes, spec.spot))

    def _run_instances(self, **params: Any) -> dict[str, Any]:
        """The one call that creates an instance (a test double may refuse capacity)."""
        return self.ec2.run_instances(**params)

    def _launch_params(self, spec: LaunchSpec, image: str, user_data: str, market: str,
                       zone: str, subnet: str | None) -> dict[str, Any]:
        tags = [{"Key": TAG_JOB_ID, "Value": spec.job_id}, {"Key": TAG_JOB, "Value": spec.job_name},
                {"Key": TAG_ATTEMPT, "Value": str(spec.attempt)},
                {"Key": "Name", "Value": f"{spec.job_id} attempt {spec.attempt}"}]
        params: dict[str, Any] = dict(
            ImageId=image, InstanceType=self.instance_type, MinCount=1, MaxCount=1,
            UserData=user_data, InstanceInitiatedShutdownBehavior="terminate",
            ClientToken=uuid.uuid4().hex,  # retries of this call never start a second VM
            TagSpecifications=[{"ResourceType": "instance", "Tags": tags},
                               {"ResourceType": "volume", "Tags": tags}],
        )
        if subnet:
            params["SubnetId"] = subnet
        else:
            params["Placement"] = {"AvailabilityZone": zone}
        if market == "spot":
            options: dict[str, Any] = {"SpotInstanceType": "one-time",
                                       "InstanceInterruptionBehavior": "terminate"}
            if self.max_price is not None:
                options["MaxPrice"] = f"{self.max_price:.6f}".rstrip("0").rstrip(".")
            params["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": options}
        if self.instance_profile:
            key = "Arn" if self.instance_profile.startswith("arn:") else "Name"
            params["IamInstanceProfile"] = {key: self.instance_profile}
        return params

    def _launched(self, described: dict[str, Any], spec: LaunchSpec, market: str,
                  image: str) -> Instance:
        instance_id = described["InstanceId"]
        try:
            instance = Instance(
                provider=self.name, id=instance_id,
                zone=(described.get("Placement") or {}).get("AvailabilityZone"),
                spot=market == "spot", launched_at=time.time(),
                details={"region": self.region, "instance_type": self.instance_type,
                         "market": market, "ami": image, "attempt": spec.attempt,
                         "spot_request_id": described.get("SpotInstanceRequestId")})
            if self.on_launch is not None:
                self.on_launch(instance)
            return instance
        except BaseException:
            self._terminate_quietly(instance_id, described.get("SpotInstanceRequestId"))
            raise

    def _launch_error(self, e: ClientError) -> ProvisionError:
        code, message = error_code(e), aws_message(e)
        if self.instance_profile and ("nstance profile" in message or
                                      "iamInstanceProfile" in message or code == "NoSuchEntity"):
            return ProvisionError(f"resources.aws.instance_profile {self.instance_profile!r} "
                                  f"is not usable in {self.region}: {code}: {message}")
        error = aws_error(e, f"launching {self.instance_type}", self.region)
        if self.instance_profile and code == "UnauthorizedOperation":
            error = CloudCredentials(f"{error.message}; launching with "
                                     "resources.aws.instance_profile also needs iam:PassRole on "
                                     "its role")
        return error

    def _no_capacity(self, tried: list[str], codes: set[str], spot: bool) -> str:
        hints = []
        if codes & STEPS[Step.NEXT_MARKET]:
            hints.append("ask AWS for a higher quota (Service Quotas, EC2: 'All G and VT "
                         "Spot Instance Requests' / 'Running On-Demand G and VT instances')")
        if "SpotMaxPriceTooLow" in codes:
            hints.append("raise resources.aws.max_price")
        if spot and not self.on_demand_fallback:
            hints.append("set resources.aws.on_demand_fallback: true")
        hints.append("try another resources.aws.region or instance_type, or submit again later")
        return (f"no capacity for {self.instance_type} in {self.region}; tried "
                f"{'; '.join(tried)}: {', '.join(hints)}")

    def poll(self, instance: Instance) -> InstanceStatus:
        try:
            found = self.ec2.describe_instances(InstanceIds=[instance.id])["Reservations"]
        except ClientError as e:
            if error_code(e) != "InvalidInstanceID.NotFound":
                raise aws_error(e, "describe instances", self.region) from None
            found = []
        except BotoCoreError as e:
            raise aws_error(e, "describe instances", self.region) from None
        records = [i for r in found for i in r["Instances"]]
        if not records:
            if time.time() - (instance.launched_at or 0.0) < VISIBILITY_GRACE_S:
                return InstanceStatus(Phase.PENDING, reason="instance not visible yet")
            return InstanceStatus(Phase.GONE, reason=f"instance {instance.id} not found")
        record = records[0]
        request = None
        request_id = record.get("SpotInstanceRequestId")
        if request_id and record.get("State", {}).get("Name") not in ("pending",):
            try:
                requests = self.ec2.describe_spot_instance_requests(
                    SpotInstanceRequestIds=[request_id])["SpotInstanceRequests"]
                request = requests[0] if requests else None
            except (ClientError, BotoCoreError):
                request = None  # the instance's own StateReason usually suffices
        return classify(record, request)

    def terminate(self, instance: Instance) -> None:
        """Terminate the instance and cancel its spot request; fine when already gone."""
        request_id = instance.details.get("spot_request_id")
        try:
            self.ec2.terminate_instances(InstanceIds=[instance.id])
        except ClientError as e:
            if error_code(e) not in ("InvalidInstanceID.NotFound", "IncorrectInstanceState"):
                raise aws_error(e, f"terminate {instance.id}", self.region) from None
        except BotoCoreError as e:
            raise aws_error(e, f"terminate {instance.id}", self.region) from None
        if request_id:
            self._cancel_spot_requests([request_id])

    def logs(self, instance: Instance) -> str:
        """The instance's serial console (boot and cloud-init output); '' when none."""
        try:
            output = self.ec2.get_console_output(InstanceId=instance.id).get("Output") or ""
        except (ClientError, BotoCoreError):
            return ""
        return decode_console(output)

    # -- clean-up ----------------------------------------------------------------------
    def job_instances(self, job_id: str, states: Sequence[str] = LIVE_STATES,
                      attempt: int | None = None) -> list[dict[str, Any]]:
        """Every instance tagged with the job id (and attempt) in one of ``states``."""
        filters = [{"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]},
                   {"Name": "instance-state-name", "Values": list(states)}]
        if attempt is not None:
            filters.append({"Name": f"tag:{TAG_ATTEMPT}", "Values": [str(attempt)]})
        try:
            pages = self.ec2.get_paginator("describe_instances").paginate(Filters=filters)
            return [i for page in pages for r in page["Reservations"] for i in r["Instances"]]
        except (ClientError, BotoCoreError) as e:
            raise aws_error(e, "describe instances", self.region) from None

    def teardown_job(self, job_id: str) -> list[str]:
        """Terminate every instance of the job that is not terminated yet, cancel their
        spot requests and delete the job's detached volumes; return the instance ids."""
        found = self.job_instances(job_id)
        ids = [i["InstanceId"] for i in found]
        if ids:
            self._api("terminate instances", self.ec2.terminate_instances, InstanceIds=ids)
        self._cancel_spot_requests([i["SpotInstanceRequestId"] for i in found
                                    if i.get("SpotInstanceRequestId")])
        try:
            volumes = self.ec2.describe_volumes(Filters=[
                {"Name": f"tag:{TAG_JOB_ID}", "Values": [job_id]},
                {"Name": "status", "Values": ["available"]}])["Volumes"]
            for volume in volumes:
                self.ec2.delete_volume(VolumeId=volume["VolumeId"])
        except (ClientError, BotoCoreError):
            pass  # attached volumes go with their instances (DeleteOnTermination)
        return ids

    def _terminate_attempt(self, spec: LaunchSpec) -> None:
        try:
            for found in self.job_instances(spec.job_id, attempt=spec.attempt):
                self._terminate_quietly(found["InstanceId"], found.get("SpotInstanceRequestId"))
        except Exception:  # noqa: BLE001 - best effort; the original error matters more
            pass

    def _terminate_quietly(self, instance_id: str, request_id: str | None = None) -> None:
        try:
            self.ec2.terminate_instances(InstanceIds=[instance_id])
        except Exception:  # noqa: BLE001 - already failing; teardown_job(job_id) finds it
            pass
        if request_id:
            self._cancel_spot_requests([request_id])

    def _cancel_spot_requests(self, request_ids: list[str]) -> None:
        if not request_ids:
            return
        try:
            self.ec2.cancel_spot_instance_requests(SpotInstanceRequestIds=request_ids)
        except (ClientError, BotoCoreError):
            pass  # one-time requests close on their own once the instance is gone


# -- building it from a job ---------------------------------------------------------------

def _provider(job: Any, region: str, user_data: Callable[[LaunchSpec], str]) -> AWSProvider:
    r = job.resources.aws
    return AWSProvider(region, r.instance_type, ami=r.ami, max_price=r.max_price,
                       on_demand_fallback=r.on_demand_fallback,
                       instance_profile=r.instance_profile, user_data=user_data)


def check_submit(job: Any) -> str:
    """Everything ``submit --to aws`` can check before it creates anything (region,
    credentials, instance type, machine image); returns the AMI id."""
    require_bucket(job)
    region = resolve_region(job.resources.aws.region)
    return _provider(job, region, user_data=lambda spec: "").prepare()


def provider_for(job: Any, record: Any) -> AWSProvider:
    """The provider for a submitted job (``runner.job.Job`` and its registry record)."""
    # A record's "region": `submit --region` of releases before it became a --set.
    region = resolve_region(record.details.get("region") or job.resources.aws.region)

    def user_data(spec: LaunchSpec) -> str:
        from runner.provision.cloudinit import render_user_data  # not needed until launch

        # The container's S3 client needs a region; nothing secret goes in user data.
        # max_restarts=0: the VM does not restart a crashed container itself but powers
        # off, so crashes are counted once, by the managed loop (resources.max_restarts).
        return render_user_data(image=spec.image, job_url=spec.job_url or
                                record.details["job_url"], job_id=spec.job_id,
                                env={"AWS_DEFAULT_REGION": region}, max_restarts=0)

    return _provider(job, region, user_data)


class AwsDestination(Destination):
    """``--to aws``: the job YAML goes to the job's bucket, where the instance reads it."""

    def stage(self, job: Any, job_copy: Path, job_id: str, *, check: bool) -> dict[str, Any]:
        """Check what can be checked before anything is created in the cloud (``check``),
        then put the job YAML into its bucket: the s3:// URL the instance runs."""
        from runner.provision.env import upload_job

        if check:
            check_submit(job)
        return {"job_url": upload_job(job, job_copy, job_id)}

    def provider(self, record: Any, job: Callable[[], Any],
                 log: Callable[[str], None]) -> Provider:
        return provider_for(job(), record)


DESTINATION = AwsDestination()
