"""How the job's image runs on a host with Docker (this machine, an ssh host): one
``docker run`` command line for every such host, so a job that runs on one runs on the
others, and one reading of ``docker inspect``. No ``--restart``: the managed loop owns
relaunches (and counts them), so each attempt is its own container,
``ten-<job id>-<attempt>``.

Phases from ``docker inspect``: created -> PENDING; running, paused, restarting ->
RUNNING; exited/dead -> EXITED(code), except 128+N for a reclaim-like signal N (137:
SIGKILL, also what the kernel's OOM killer sends; 143: SIGTERM), which reads as
PREEMPTED like a plain process killed by that signal; no such container -> GONE.
"""

from __future__ import annotations

import re
import signal
from typing import Any

from runner.provision.base import InstanceStatus, Phase, ProvisionError
from runner.provision.policy import PREEMPT_SIGNALS, signal_of

CACHE_VOLUME = "ten-cache"  # mounted at /cache (the image's TEN_CACHE_DIR, HF_HOME, ...)
STOP_TIMEOUT_S = 110  # SIGTERM -> SIGKILL: the runner commits a checkpoint inside this
SHM_SIZE = "16g"  # docker's default 64 MB /dev/shm kills DataLoader workers
RUN_TIMEOUT_S = 1800  # `docker run` pulls the image first: a CUDA image takes minutes
JOB_IN_CONTAINER = "/job/job.yaml"
# `docker run` failures that are the host's fault (no GPU runtime, no daemon, no docker).
HOST_FAULT = re.compile(r"device driver|nvidia|gpu|cannot connect to the docker daemon|"
                        r"command not found|permission denied", re.IGNORECASE)
INSPECT = ["inspect", "--type", "container", "--format",
           "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}"]  # + the name
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}$")


def image_of(job: Any) -> str:
    image = job.resources.image
    if not _IMAGE.match(image):
        raise ProvisionError("resources.image is not a container image reference "
                             "(e.g. ghcr.io/ten-runner/ten-runner:latest)")
    return image


def container_name(job_id: str, attempt: int) -> str:
    return f"ten-{job_id}-{attempt}"


def docker_run_argv(job: Any, container: str, env_path: str, job_path: str) -> list[str]:
    """``docker run -d`` of the job's image running ``job_path`` (mounted read-only),
    the environment from ``env_path``, ``--gpus all`` unless the job trains on the CPU."""
    gpu = job.train.device != "cpu"
    return ["docker", "run", "-d", "--name", container, *(["--gpus", "all"] if gpu else []),
            "--stop-timeout", str(STOP_TIMEOUT_S), "--shm-size", SHM_SIZE,
            "--env-file", env_path, "-v", f"{CACHE_VOLUME}:/cache",
            "-v", f"{job_path}:{JOB_IN_CONTAINER}:ro", image_of(job), "run", JOB_IN_CONTAINER]


def no_such(output: str) -> bool:
    """Docker's answer about a container that does not exist."""
    return "no such" in output.lower()


def inspected(output: str, name: str) -> InstanceStatus:
    """The phase of container ``name`` from what ``docker`` + :data:`INSPECT` printed
    when it succeeded (see the module doc)."""
    status, exit_code, oom = (output.split() + ["", "", ""])[:3]
    if status == "created":
        return InstanceStatus(Phase.PENDING)
    if status in ("running", "paused", "restarting"):
        return InstanceStatus(Phase.RUNNING)
    if status in ("exited", "dead") and exit_code.lstrip("-").isdigit():
        return _ended(int(exit_code), oom.lower() == "true")
    if status == "removing":
        return InstanceStatus(Phase.GONE, None, f"container {name} is being removed")
    last = output.strip().splitlines()[-1:] or [""]
    raise ProvisionError(f"unexpected answer from docker inspect {name}: {last[0][:300]!r}")


def _ended(code: int, oom: bool) -> InstanceStatus:
    sig = signal_of(code)
    if sig is not None and sig in PREEMPT_SIGNALS:
        why = f"killed by {signal.Signals(sig).name}"
        if oom:
            why += " (out of memory: the kernel's OOM killer)"
        return InstanceStatus(Phase.PREEMPTED, code, why)
    return InstanceStatus(Phase.EXITED, code, "out of memory" if oom else "")
