"""What EC2's answers mean and what we do about them: the rules behind ``--to aws``.

Pure decisions, tested from tables: :func:`launch_step` (what an EC2 error code from
``run_instances`` means for the next try), :func:`plan_attempts` (which market and zone
next), :func:`classify` (what a ``describe_instances`` record means for the managed
loop), :func:`aws_error` (a failed call as a one-line, secret-free error with the right
exit code). Then the checks run before anything is created (region, instance type),
so a mistake costs one API call, not a half-launched machine. The provider that acts on
these answers is :class:`runner.provision.aws.AWSProvider`.
"""

from __future__ import annotations

import base64
import binascii
import difflib
import functools
import os
from collections.abc import Sequence
from enum import Enum
from typing import Any

import boto3
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
)

from runner.exit_codes import ExitCode
from runner.provision.base import CloudCredentials, InstanceStatus, Phase, ProvisionError

# The AWS Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04): NVIDIA driver,
# docker and the NVIDIA container toolkit preinstalled; AWS publishes the newest id per
# region under this public SSM parameter.
DLAMI_PARAMETER = ("/aws/service/deeplearning/ami/x86_64/"
                   "base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id")
USER_DATA_LIMIT = 16 * 1024  # bytes, before base64: EC2's limit
GPU_TYPES = ("g6e.xlarge", "g6e.2xlarge", "g6e.4xlarge", "g6e.12xlarge", "g6.xlarge",
             "g5.xlarge", "g5.2xlarge", "g4dn.xlarge", "p4d.24xlarge", "p5.48xlarge")
# Not found right after run_instances is EC2's eventual consistency, not a vanished VM.
VISIBILITY_GRACE_S = 120.0
LIVE_STATES = ("pending", "running", "stopping", "stopped", "shutting-down")

_CREDENTIAL_HINT = ("set AWS_PROFILE (a profile in ~/.aws/config) or AWS_ACCESS_KEY_ID and "
                    "AWS_SECRET_ACCESS_KEY, or run where an instance role is attached")
CREDENTIAL_CODES = {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId",
                    "SignatureDoesNotMatch", "ExpiredToken", "ExpiredTokenException",
                    "RequestExpired", "AccessDenied", "AccessDeniedException",
                    "UnrecognizedClientException", "InvalidAccessKeyId"}


# -- pure decisions ----------------------------------------------------------------------

class Step(str, Enum):
    """What a failed ``run_instances`` means for the next try."""

    NEXT_ZONE = "next-zone"  # no capacity / price / type here: another zone may have it
    NEXT_MARKET = "next-market"  # a quota of this market (spot or on-demand): skip its zones
    CREDENTIALS = "credentials"  # the caller's credentials are missing or not allowed
    CONFIG = "config"  # the request is wrong (AMI, profile, parameters): the user fixes it
    FAIL = "fail"  # anything else: stop and report


# The EC2 error codes behind each Step (FAIL: every other code).
STEPS = {
    Step.NEXT_ZONE: {"InsufficientInstanceCapacity", "InsufficientCapacity",
                     "InsufficientHostCapacity", "SpotMaxPriceTooLow", "Unsupported",
                     "InsufficientFreeAddressesInSubnet"},
    Step.NEXT_MARKET: {"MaxSpotInstanceCountExceeded", "VcpuLimitExceeded",
                       "InstanceLimitExceeded", "SpotInstanceCountExceeded"},
    Step.CREDENTIALS: CREDENTIAL_CODES,
    Step.CONFIG: {"InvalidAMIID.NotFound", "InvalidAMIID.Malformed", "InvalidAMIID.Unavailable",
                  "InvalidParameterValue", "InvalidParameterCombination", "InvalidParameter",
                  "MissingParameter", "NoSuchEntity", "InvalidInstanceType",
                  "InvalidSubnetID.NotFound", "InvalidUserData.Malformed", "OptInRequired",
                  "InvalidBlockDeviceMapping", "InvalidGroup.NotFound"},
}


def launch_step(code: str) -> Step:
    """The decision for an EC2 error code returned by ``run_instances``."""
    for step, codes in STEPS.items():
        if code in codes:
            return step
    return Step.FAIL


def plan_attempts(zones: Sequence[str], spot: bool, on_demand_fallback: bool
                  ) -> list[tuple[str, str]]:
    """``(market, zone)`` pairs in the order to try: every zone on spot, then (when
    allowed) every zone on-demand; on-demand only when the job does not ask for spot."""
    markets = (["spot", "on-demand"] if on_demand_fallback else ["spot"]) if spot \
        else ["on-demand"]
    return [(market, zone) for market in markets for zone in zones]


# Spot request status codes that mean EC2 took the instance back (not the user).
_INTERRUPTED = {"instance-terminated-by-price", "instance-terminated-no-capacity",
                "instance-terminated-capacity-oversubscribed",
                "instance-terminated-launch-group-constraint", "instance-terminated-by-experiment",
                "instance-stopped-by-price", "instance-stopped-no-capacity",
                "instance-stopped-capacity-oversubscribed",
                "instance-stopped-launch-group-constraint", "marked-for-termination",
                "marked-for-stop"}


def classify(instance: dict[str, Any], spot_request: dict[str, Any] | None) -> InstanceStatus:
    """What one ``describe_instances`` record (plus its spot request, if any) means.

    EXITED carries no exit code: the VM shut itself down when the job ended, and the job's
    own code is in the heartbeat in the bucket, which the managed loop reads.
    """
    state = (instance.get("State") or {}).get("Name", "")
    reason = instance.get("StateReason") or {}
    code = reason.get("Code") or ""
    transition = instance.get("StateTransitionReason") or ""
    request_code = ((spot_request or {}).get("Status") or {}).get("Code", "")
    if state == "pending":
        return InstanceStatus(Phase.PENDING, reason="instance pending")
    if state == "running":
        notice = " (spot interruption notice)" if request_code.startswith("marked-for-") else ""
        return InstanceStatus(Phase.RUNNING, reason=f"instance running{notice}")
    said = code or request_code or transition or "no reason given"
    if (code.startswith("Server.SpotInstance") or "Server.SpotInstance" in transition
            or request_code in _INTERRUPTED):
        return InstanceStatus(Phase.PREEMPTED, reason=f"spot interruption: {said}")
    if code == "Server.InsufficientInstanceCapacity":
        return InstanceStatus(Phase.PREEMPTED, reason=f"no capacity at start: {said}")
    if code == "Client.InstanceInitiatedShutdown":
        return InstanceStatus(Phase.EXITED, None, reason="the instance shut itself down")
    if code.startswith("Client.UserInitiated") or request_code.endswith("-by-user"):
        return InstanceStatus(Phase.GONE, reason=f"instance {state} by a user or the API: "
                              f"{said}")
    return InstanceStatus(Phase.GONE, reason=f"instance {state}: {said}")


def error_code(e: ClientError) -> str:
    return str((e.response.get("Error") or {}).get("Code") or "")


def aws_message(e: ClientError, limit: int = 200) -> str:
    """The error's message from AWS on one line, cut to ``limit`` characters."""
    text = " ".join(str((e.response.get("Error") or {}).get("Message") or "").split())
    return text if len(text) <= limit else text[:limit] + "..."


def aws_error(e: BaseException, what: str, region: str) -> ProvisionError:
    """A one-line, secret-free error for a failed AWS call (``what``: 'describe
    instance types', ...). Credentials problems are exit 8, everything the user must
    change is CONFIG, the rest CRASH (unexpected: the supervisor may retry)."""
    if isinstance(e, (NoCredentialsError, PartialCredentialsError)):
        return CloudCredentials(f"no usable AWS credentials ({type(e).__name__}) for {what}: "
                                f"{_CREDENTIAL_HINT}")
    if isinstance(e, NoRegionError):
        return region_missing()
    if isinstance(e, ClientError):
        code = error_code(e)
        if code in CREDENTIAL_CODES:
            return CloudCredentials(f"AWS refused {what} in {region} ({code}): the credentials "
                                    f"are invalid, expired or not allowed to do it; "
                                    f"{_CREDENTIAL_HINT}, with EC2 permissions")
        if code in STEPS[Step.CONFIG]:
            return ProvisionError(f"AWS rejected {what} in {region}: {code}: {aws_message(e)}")
        return ProvisionError(f"AWS {what} failed in {region}: {code}: {aws_message(e)}",
                              ExitCode.CRASH)
    name = type(e).__name__
    if "Token" in name or "SSO" in name or "Credential" in name:  # expired SSO login & co
        return CloudCredentials(f"cannot load AWS credentials ({name}) for {what}: "
                                f"run `aws sso login` for the profile, or {_CREDENTIAL_HINT}")
    if isinstance(e, EndpointConnectionError):
        return ProvisionError(f"cannot reach the AWS API for {what} in {region} ({name}); "
                              "check the network and resources.aws.region", ExitCode.CRASH)
    return ProvisionError(f"AWS {what} failed in {region}: {name}", ExitCode.CRASH)


# -- validation before anything is created ------------------------------------------------

def region_missing() -> ProvisionError:
    return ProvisionError("no AWS region: set resources.aws.region in the job, or AWS_REGION "
                          "(or a region in your AWS profile)")


@functools.cache
def known_regions() -> tuple[str, ...]:
    """EC2 regions boto3 knows, every partition (aws, aws-cn, aws-us-gov, ...)."""
    session = boto3.session.Session()
    regions: set[str] = set()
    for partition in session.get_available_partitions():
        regions.update(session.get_available_regions("ec2", partition_name=partition))
    return tuple(sorted(regions))


def check_region(region: str) -> str:
    regions = known_regions()
    if region in regions:
        return region
    near = difflib.get_close_matches(region, regions, n=3, cutoff=0.6)
    hint = f" (did you mean {', '.join(near)}?)" if near else \
        " (e.g. us-east-1, us-west-2, eu-west-1)"
    raise ProvisionError(f"resources.aws.region {region!r} is not an AWS EC2 region{hint}")


def resolve_region(region: str | None, session: Any = None) -> str:
    """The job's region, else the AWS default chain (AWS_REGION, AWS_DEFAULT_REGION, the
    profile's region); a clear error when none is set."""
    region = region or os.environ.get("AWS_REGION") or \
        (session or boto3.session.Session()).region_name  # AWS_DEFAULT_REGION, profile
    if not region:
        raise region_missing()
    return check_region(region)


def check_instance_type(client: Any, instance_type: str, region: str = "") -> dict[str, Any]:
    """The type's description (architectures, GPUs); CONFIG naming resources.aws.instance_type
    with a near match when EC2 does not know it."""
    try:
        found = client.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    except ClientError as e:
        if error_code(e) not in ("InvalidInstanceType", "InvalidParameterValue"):
            raise aws_error(e, "describe instance types", region) from None
        found = []
    except BotoCoreError as e:
        raise aws_error(e, "describe instance types", region) from None
    if found:
        return found[0]
    try:
        names = list(client.meta.service_model.shape_for("InstanceType").enum)
    except Exception:  # noqa: BLE001 - suggestions are a nicety
        names = []
    near = difflib.get_close_matches(instance_type, list(GPU_TYPES) + names, n=2, cutoff=0.6)
    hint = f"did you mean {' or '.join(near)}?" if near else \
        f"GPU types: {', '.join(GPU_TYPES[:5])}"
    raise ProvisionError(f"resources.aws.instance_type {instance_type!r} is not an EC2 instance "
                         f"type{' in ' + region if region else ''} ({hint})")


def decode_console(output: str) -> str:
    """EC2 returns the console base64-encoded; some servers (moto) return it plain."""
    try:
        return base64.b64decode(output, validate=True).decode("utf-8", "replace")
    except (binascii.Error, ValueError):
        return output
