"""What every way of running a submitted job provides: a small provider interface.

A *provider* starts one attempt of a job somewhere (a process on this machine, a
container on an ssh host, an EC2 spot instance), says what became of it, and tears it
down. It knows nothing of retries: the managed loop (:mod:`runner.provision.managed`)
decides from what :meth:`Provider.poll` reports, through the pure policy in
:mod:`runner.provision.policy`.

Everything here imports only the standard library and click (through UserError), so
``ten-runner --help`` stays fast.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode


class ProvisionError(UserError):
    """A one-line, user-fixable provisioning problem with its exit code. Never contains
    a secret."""

    def __init__(self, message: str, exit_code: int = ExitCode.CONFIG):
        super().__init__(" ".join(str(message).split()), exit_code)


class NoCapacity(ProvisionError):
    """The cloud cannot give us the machine right now (spot or on-demand)."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.NO_CAPACITY)


class HostUnreachable(ProvisionError):
    def __init__(self, message: str):
        super().__init__(message, ExitCode.HOST_UNREACHABLE)


class UnhealthyHost(ProvisionError):
    """The host is reachable but cannot run the job (no GPU, no docker, ...)."""

    def __init__(self, message: str):
        super().__init__(message, ExitCode.UNHEALTHY_HOST)


# This machine (--to local), whether the job runs as a process or in its container: the
# zone a failed health gate blocks, and what a relaunch there is told.
LOCAL_ZONE = "local"
LOCAL_REFUSED = ("this machine failed the job's GPU health gate and there is no other to use; "
                 "fix the GPU or submit --to aws")


class CloudCredentials(ProvisionError):
    def __init__(self, message: str):
        super().__init__(message, ExitCode.CLOUD_CREDENTIALS)


@dataclass(frozen=True)
class LaunchSpec:
    """One attempt of a job, as a provider needs it."""

    job_id: str  # e.g. "tiny-cpu-3f9a1c": the registry key, used in names and tags
    job_name: str  # the job's own name (storage prefix)
    job_file: Path  # the job YAML on this machine
    job_url: str | None  # the job YAML in the bucket, for remote machines; None: local only
    image: str  # container image
    attempt: int  # 1 for the first launch, +1 per relaunch
    spot: bool = False
    # Passed to the job's process/container; may hold secrets: never log or persist it.
    env: dict[str, str] = field(default_factory=dict, repr=False)


class Phase(str, enum.Enum):
    PENDING = "pending"  # asked for, not running yet (instance booting, container pulling)
    RUNNING = "running"
    EXITED = "exited"  # the job's process ended; exit_code says how (None: not known here)
    PREEMPTED = "preempted"  # the machine was taken away (spot interruption, killed)
    GONE = "gone"  # the machine disappeared for another reason (terminated by someone)


@dataclass(frozen=True)
class InstanceStatus:
    phase: Phase
    exit_code: int | None = None
    reason: str = ""


@dataclass
class Instance:
    """A launched attempt; JSON-serialisable so the registry can persist it."""

    provider: str
    id: str  # pid, instance id, container name
    zone: str | None = None  # where it runs: what a failed health gate blocks
    spot: bool = False
    launched_at: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Instance:
        return cls(**data)


class Provider:
    """Runs a job's attempts on one kind of machine. Subclasses implement ``launch``,
    ``poll``, ``terminate`` and ``logs``; ``teardown_job`` defaults to nothing to sweep.
    How a ``--to`` target finds its provider: runner.provision.destinations."""

    name: str

    def launch(self, spec: LaunchSpec, avoid: frozenset[str] = frozenset()) -> Instance:
        """Start the attempt, not in any zone/host of ``avoid``. Raises NoCapacity when
        nothing can be had, ProvisionError for anything the user must fix. Must leave
        nothing running when it raises."""
        raise NotImplementedError

    def poll(self, instance: Instance) -> InstanceStatus:
        raise NotImplementedError

    def terminate(self, instance: Instance) -> None:
        """Stop and remove the attempt; idempotent, fine on an attempt already gone."""
        raise NotImplementedError

    def logs(self, instance: Instance) -> str:
        """What the attempt printed so far ('' when the provider cannot tell)."""
        return ""

    def teardown_job(self, job_id: str) -> list[str]:
        """Once the job has ended: terminate what still runs under its name that no record
        knows (a controller killed between the launch call and saving the record); the
        ids. Only a provider that tags what it creates can find such leftovers."""
        return []
