"""A scripted cloud for the managed-loop tests: zones, capacity refusals, preemptions,
exits with given codes, final heartbeats, and a ledger of every launch and termination
so each test can assert that nothing was left running."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from runner.provision.base import (
    Instance,
    InstanceStatus,
    LaunchSpec,
    NoCapacity,
    Phase,
    Provider,
    ProvisionError,
)

RUNNING = InstanceStatus(Phase.RUNNING)
PENDING = InstanceStatus(Phase.PENDING)
PREEMPTED = InstanceStatus(Phase.PREEMPTED, reason="spot instance reclaimed")
GONE = InstanceStatus(Phase.GONE, reason="terminated by someone else")


def exited(code: int | None) -> InstanceStatus:
    return InstanceStatus(Phase.EXITED, code)


@dataclass
class Script:
    """One attempt: the statuses its successive polls report (the last one repeats),
    and the final heartbeat the job writes when the last status is reached."""

    polls: list[InstanceStatus]
    final: dict[str, Any] | None = None  # e.g. {"state": "failed", "exit_code": 3}

    @classmethod
    def runs(cls, n: int, then: InstanceStatus, final: dict[str, Any] | None = None):
        return cls([PENDING] + [RUNNING] * n + [then], final)


@dataclass
class VM:
    instance: Instance
    script: Script
    polls: int = 0
    terminated: bool = False
    final_written: float | None = None


@dataclass
class FakeCloud(Provider):
    """``scripts[i]`` drives attempt i+1 (the last repeats). ``refuse``: launches
    refused for lack of capacity before one succeeds (-1: forever). ``launch_errors``:
    errors the next launches raise, in order."""

    scripts: list[Script]
    zones: tuple[str, ...] = ("z1", "z2", "z3")
    refuse: int = 0
    launch_errors: list[Exception] = field(default_factory=list)
    poll_errors: int = 0  # the next polls raise (a network outage)
    terminate_errors: int = 0  # the next terminations raise
    name: str = "fake"
    vms: list[VM] = field(default_factory=list)
    launches: list[tuple[LaunchSpec, frozenset[str]]] = field(default_factory=list)
    refusals: int = 0
    terminations: list[str] = field(default_factory=list)  # every call, repeats included
    status_reads: int = 0  # final_status() calls (each a GET on the bucket for real)

    # -- the Provider interface -----------------------------------------------------------
    def launch(self, spec: LaunchSpec, avoid: frozenset[str] = frozenset()) -> Instance:
        self.launches.append((spec, avoid))
        if self.launch_errors:
            raise self.launch_errors.pop(0)
        if self.refuse:
            self.refuse -= 1 if self.refuse > 0 else 0
            self.refusals += 1
            raise NoCapacity("fake: no capacity for the instance type in any zone")
        zones = [z for z in self.zones if z not in avoid]
        if not zones:
            raise NoCapacity(f"fake: every zone is blocked ({', '.join(sorted(avoid))})")
        n = len(self.vms)
        instance = Instance(provider=self.name, id=f"i-{n + 1:04d}", zone=zones[0],
                            launched_at=time.time(), details={"attempt": spec.attempt})
        self.vms.append(VM(instance, self.scripts[min(n, len(self.scripts) - 1)]))
        return instance

    def poll(self, instance: Instance) -> InstanceStatus:
        if self.poll_errors:
            self.poll_errors -= 1
            raise ConnectionError("fake: the cloud API timed out")
        vm = self.vm(instance.id)
        if vm.terminated:
            return GONE
        status = vm.script.polls[min(vm.polls, len(vm.script.polls) - 1)]
        vm.polls += 1
        if vm.polls >= len(vm.script.polls) and vm.script.final and vm.final_written is None:
            vm.final_written = time.time()
        return status

    def terminate(self, instance: Instance) -> None:
        self.terminations.append(instance.id)
        if self.terminate_errors:
            self.terminate_errors -= 1
            raise ConnectionError("fake: terminate timed out")
        self.vm(instance.id).terminated = True

    def logs(self, instance: Instance) -> str:
        return ""

    # -- what the job wrote / what the test checks ----------------------------------------
    def final_status(self) -> dict[str, Any] | None:
        """The newest final heartbeat in the "bucket" (stale ones included, as in a real
        store: the loop must ignore those older than the attempt)."""
        self.status_reads += 1
        written = [vm for vm in self.vms if vm.final_written is not None]
        if not written:
            return None
        vm = max(written, key=lambda v: v.final_written)
        return {**vm.script.final, "time": vm.final_written}

    def vm(self, instance_id: str) -> VM:
        for vm in self.vms:
            if vm.instance.id == instance_id:
                return vm
        raise ProvisionError(f"fake: no instance {instance_id}")

    def running(self) -> list[str]:
        return [vm.instance.id for vm in self.vms if not vm.terminated]

    def assert_clean(self) -> None:
        assert not self.running(), f"left running: {self.running()}"


class FakeClock:
    """``clock``/``sleep`` for the loop: sleeping advances time at once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.slept: list[float] = []
        self.on_sleep = None  # called after each sleep, e.g. to cancel mid-run

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep is not None:
            self.on_sleep(self)
