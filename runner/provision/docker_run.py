"""How the job's image runs on a host with Docker (an ssh host, this machine): one
``docker run`` command line for every such host, so a job that runs on one runs on the
others. The callers differ only in who restarts a failed container: docker on an ssh
host (``restart``), the managed loop here (no ``--restart``).
"""

from __future__ import annotations

import re
from typing import Any

from runner.provision.base import ProvisionError

CACHE_VOLUME = "ten-cache"  # mounted at /cache (the image's TEN_CACHE_DIR, HF_HOME, ...)
STOP_TIMEOUT_S = 110  # SIGTERM -> SIGKILL: the runner commits a checkpoint inside this
SHM_SIZE = "16g"  # docker's default 64 MB /dev/shm kills DataLoader workers
RUN_TIMEOUT_S = 1800  # `docker run` pulls the image first: a CUDA image takes minutes
JOB_IN_CONTAINER = "/job/job.yaml"
# `docker run` failures that are the host's fault (no GPU runtime, no daemon, no docker).
HOST_FAULT = re.compile(r"device driver|nvidia|gpu|cannot connect to the docker daemon|"
                        r"command not found|permission denied", re.IGNORECASE)
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}$")


def image_of(job: Any) -> str:
    image = job.resources.image
    if not _IMAGE.match(image):
        raise ProvisionError("resources.image is not a container image reference "
                             "(e.g. ghcr.io/ten-runner/ten-runner:latest)")
    return image


def docker_run_argv(job: Any, container: str, env_path: str, job_path: str,
                    restart: str | None = None) -> list[str]:
    """``docker run -d`` of the job's image running ``job_path`` (mounted read-only),
    the environment from ``env_path``, ``--gpus all`` unless the job trains on the CPU,
    and ``--restart restart`` when given."""
    gpu = job.train.device != "cpu"
    return ["docker", "run", "-d", "--name", container, *(["--gpus", "all"] if gpu else []),
            *(["--restart", restart] if restart else []),
            "--stop-timeout", str(STOP_TIMEOUT_S), "--shm-size", SHM_SIZE,
            "--env-file", env_path, "-v", f"{CACHE_VOLUME}:/cache",
            "-v", f"{job_path}:{JOB_IN_CONTAINER}:ro", image_of(job), "run", JOB_IN_CONTAINER]
