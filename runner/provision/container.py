"""``submit --to local`` with Docker: each attempt is the job's container on this machine,
the same image, command line and teardown ``--to ssh`` and ``--to aws`` use, so a job that
works here works there. :class:`LocalHost` is what :class:`runner.provision.docker.
DockerProvider` needs of this machine: docker run as a plain subprocess, the job's folder
``<job dir>`` (made 0700: nobody else on this machine can read the job's files; the
record's own copy of the job stays 0600 beside the container's 0644 one).

The store must be a bucket (``s3://``) that the container can reach. A local
``storage.url`` would need the image's user to write to this user's directories, and
the run directory, heartbeat and dataset paths would differ between the container and
this machine; a plain process (:mod:`runner.provision.local`) does local stores right,
so :func:`choose_mode` picks it for them (and for a loopback ``endpoint_url``, which a
container cannot reach). ``TEN_LOCAL_MODE=process|container`` forces the mode.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from runner.provision.base import LOCAL_REFUSED, LOCAL_ZONE, ProvisionError
from runner.provision.docker import JOB_FILE, Result
from runner.provision.registry import job_dir

PROCESS, CONTAINER = "process", "container"
MODE_ENV = "TEN_LOCAL_MODE"
INFO_TIMEOUT_S = 20


# -- which mode ---------------------------------------------------------------------------
def docker_usable(docker: str = "docker") -> str | None:
    """None when ``docker`` is on PATH and its daemon answers ``docker info``; else why
    not, in a few words."""
    if shutil.which(docker) is None:
        return "docker is not on PATH"
    try:
        proc = subprocess.run([docker, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, stdin=subprocess.DEVNULL,
                              timeout=INFO_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"docker info failed ({type(e).__name__})"
    if proc.returncode:
        return f"docker info failed: {Result(1, proc.stderr.decode(errors='replace')).last_line}"
    return None


def _loopback(endpoint: str | None) -> bool:
    host = urlparse(endpoint or "").hostname or ""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def choose_mode(job: Any, environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(``process`` or ``container``, why) for a ``--to local`` job: ``$TEN_LOCAL_MODE``
    when set, else the container when Docker is usable and the job's store is a bucket
    it can reach."""
    environ = os.environ if environ is None else environ
    forced = environ.get(MODE_ENV, "").strip().lower()
    if forced:
        if forced not in (PROCESS, CONTAINER):
            raise ProvisionError(f"{MODE_ENV} must be {PROCESS} or {CONTAINER}, not "
                                 f"{forced!r}")
        return forced, f"{MODE_ENV}={forced}"
    if not job.storage.is_remote:
        return PROCESS, "storage.url is a local path (the container mode needs a bucket)"
    if _loopback(job.storage.endpoint_url):
        return PROCESS, ("storage.endpoint_url is this machine's loopback, which a "
                         "container cannot reach")
    why = docker_usable()
    if why:
        return PROCESS, why
    return CONTAINER, "docker is usable"


# -- this machine as a docker host ---------------------------------------------------------
class LocalHost:
    """This machine, for :class:`runner.provision.docker.DockerProvider`."""

    name, zone, on, fault = "local", LOCAL_ZONE, "", ProvisionError
    hint = f", or {MODE_ENV}=process to run a plain process"
    details = {"mode": CONTAINER}  # how LocalDestination tells the attempt's kind

    def refused(self) -> str:
        return LOCAL_REFUSED

    def docker(self, *args: str, doing: str, timeout: float) -> Result:
        try:
            proc = subprocess.run(["docker", *args], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  timeout=timeout)
        except FileNotFoundError:
            raise ProvisionError(f"docker is not on PATH (hint: {MODE_ENV}=process)") from None
        except subprocess.TimeoutExpired:
            raise ProvisionError(f"docker gave no answer within {timeout:.0f} s while "
                                 f"{doing}") from None
        return Result(proc.returncode, proc.stdout.decode(errors="replace"))

    def put_job(self, job_id: str, job_file: Path) -> str:
        folder = job_dir(job_id)
        folder.mkdir(parents=True, exist_ok=True)
        folder.chmod(0o700)
        shutil.copyfile(job_file, folder / JOB_FILE)
        (folder / JOB_FILE).chmod(0o644)
        return str(folder)

    def start(self, env_path: str, env: bytes, args: list[str], timeout: float) -> Result:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(env_path)  # a leftover of a controller killed mid-launch
        fd = os.open(env_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(env)
            return self.docker(*args, doing="starting the container", timeout=timeout)
        finally:
            Path(env_path).unlink(missing_ok=True)

    def clean(self, folder: str, container: str | None) -> None:
        """The container and the container's copy of the job; the folder is the job's
        record's and stays."""
        if container:
            with contextlib.suppress(ProvisionError):
                self.docker("rm", "-f", container, doing="cleaning up", timeout=60)
        for path in (Path(folder) / JOB_FILE, *Path(folder).glob("attempt-*.env")):
            path.unlink(missing_ok=True)

