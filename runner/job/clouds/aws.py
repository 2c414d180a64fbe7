"""Amazon EC2: ``submit --to aws`` starts a (spot) GPU instance that runs the job's
container (runner/provision/aws.py); ``resources.aws`` is what it asks EC2 for."""

from __future__ import annotations

from pydantic import Field

from runner.job.clouds import Cloud
from runner.job.fields import Bool, Section, Str, bounded


class AwsSection(Section):
    """What ``submit --to aws`` asks EC2 for; nothing else reads it."""

    instance_type: Str = Field("g6e.xlarge", description="EC2 instance type (g6e.xlarge: "
                               "one L40S)")
    region: Str | None = Field(None, description="AWS region; null: the AWS default chain "
                               "(AWS_REGION, profile)")
    max_price: bounded(float, gt=0.0) | None = Field(None, description="spot bid, USD per hour; "
                                    "null: up to the on-demand price")
    on_demand_fallback: Bool = Field(False, description="launch on-demand when no spot "
                                     "capacity is found")
    ami: Str | None = Field(None, description="machine image with docker and the NVIDIA "
                            "container toolkit; null: the AWS Deep Learning Base GPU AMI "
                            "(Ubuntu 22.04) of the region")
    instance_profile: Str | None = Field(None, description="IAM instance profile giving the "
                                         "machine its bucket access")


CLOUD = Cloud("aws", form="aws", summary="an EC2 (spot) instance",
              destination="runner.provision.aws", section=AwsSection, order=1)
