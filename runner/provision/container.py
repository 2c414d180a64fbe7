"""``submit --to local`` with Docker: each attempt is the job's container on this machine,
``docker run -d --name ten-<job id>-<attempt> ... <resources.image> run /job/job.yaml``,
the same image ``--to ssh`` and ``--to aws`` run, so a job that works here works there.

The command line, the container names and the reading of ``docker inspect`` are the ones
``--to ssh`` uses (:mod:`runner.provision.docker_run`). Each attempt is removed at
teardown after its output is saved to ``<job dir>/attempt-<n>.log``. Here:

* the job file is ``<job dir>/container-job.yaml``, a 0644 copy (the image's user,
  uid 10001, is not its owner) in the job's directory, which is made 0700 so nobody
  else on this machine can read it; the record's own copy stays 0600;
* the environment (:func:`runner.provision.env.job_env` plus the attempt's own
  variables) goes through ``<job dir>/attempt-<n>.env``, written 0600 and removed as
  soon as ``docker run`` returns, whatever it did.

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
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from runner.job.secrets import scrub
from runner.provision.base import (
    Instance,
    InstanceStatus,
    LaunchSpec,
    Phase,
    Provider,
    ProvisionError,
    UnhealthyHost,
)
from runner.provision.docker_run import (
    HOST_FAULT,
    INSPECT,
    RUN_TIMEOUT_S,
    STOP_TIMEOUT_S,
    container_name,
    docker_run_argv,
    inspected,
    no_such,
)
from runner.provision.env import env_file_text, job_env
from runner.provision.registry import job_dir

PROCESS, CONTAINER = "process", "container"
MODE_ENV = "TEN_LOCAL_MODE"
CALL_TIMEOUT_S = 60
INFO_TIMEOUT_S = 20
ZONE = "local"  # what a failed health gate blocks: this machine
JOB_COPY = "container-job.yaml"


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
        return f"docker info failed: {_last_line(proc.stderr.decode(errors='replace'))}"
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


# -- the provider ---------------------------------------------------------------------------
class ContainerAttempts(Provider):
    """launch/poll/terminate/logs of container attempts (see the module doc). ``job``
    (the loaded job) is needed to launch only; ``environ``: where the job's variables
    are taken from (default ``os.environ``)."""

    name = "local"

    def __init__(self, job: Any = None, environ: Mapping[str, str] | None = None) -> None:
        self.job, self.environ = job, environ

    def launch(self, spec: LaunchSpec) -> Instance:
        job = self.job
        if not job.storage.is_remote:
            raise ProvisionError("storage.url is a local path, which the job's container "
                                 "cannot write to: use an s3:// storage.url, or "
                                 f"{MODE_ENV}=process to run a plain process")
        values = {**job_env(job, self.environ, spec.job_file), **spec.env}
        env_text = env_file_text(values)
        directory = job_dir(spec.job_id)
        directory.mkdir(parents=True, exist_ok=True)
        directory.chmod(0o700)
        copy = directory / JOB_COPY
        shutil.copyfile(spec.job_file, copy)
        copy.chmod(0o644)
        name = container_name(spec.job_id, spec.attempt)
        env_path = directory / f"attempt-{spec.attempt}.env"
        argv = docker_run_argv(job, name, str(env_path), str(copy))
        launched_at = time.time()  # before the start: any status it writes is newer
        with contextlib.suppress(FileNotFoundError):
            env_path.unlink()  # a leftover of a controller killed mid-launch
        fd = os.open(env_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(env_text)
            code, out = _docker(argv, RUN_TIMEOUT_S)
        finally:
            env_path.unlink(missing_ok=True)
        if code:
            _docker(["docker", "rm", "-f", name], CALL_TIMEOUT_S)  # a created one, if any
            why = scrub(_last_line(out), list(values.values()))
            if HOST_FAULT.search(why):
                raise UnhealthyHost(f"docker cannot start the job's container here: {why} "
                                    "(hint: install the NVIDIA container toolkit and restart "
                                    f"docker, or {MODE_ENV}=process)")
            raise ProvisionError(f"docker cannot start the job's container: {why} (hint: "
                                 "check resources.image)")
        return Instance(provider=self.name, id=name, zone=ZONE, spot=False,
                        launched_at=launched_at,
                        details={"mode": CONTAINER, "container": name,
                                 "container_id": _last_line(out)[:64],
                                 "log": str(directory / f"attempt-{spec.attempt}.log")})

    def poll(self, instance: Instance) -> InstanceStatus:
        name = instance.details["container"]
        code, out = _docker(["docker", *INSPECT, name], CALL_TIMEOUT_S)
        if code:
            if no_such(out):
                return InstanceStatus(Phase.GONE, None, f"container {name} is gone")
            raise ProvisionError(f"docker cannot inspect {name}: {_last_line(out)}")
        return inspected(out, name)

    def terminate(self, instance: Instance) -> None:
        """``docker stop -t 110`` (SIGTERM: the runner commits a checkpoint and exits
        75), keep the output in the attempt's log file, ``docker rm -f``. Idempotent."""
        name = instance.details["container"]
        code, out = _docker(["docker", "stop", "-t", str(STOP_TIMEOUT_S), name],
                            STOP_TIMEOUT_S + 60)
        if code and no_such(out):
            return  # already removed (by an earlier teardown)
        if code:
            raise ProvisionError(f"docker cannot stop {name}: {_last_line(out)}")
        code, out = _docker(["docker", "logs", name], CALL_TIMEOUT_S * 5)
        if code == 0 and instance.details.get("log"):
            Path(instance.details["log"]).write_text(out)
        code, out = _docker(["docker", "rm", "-f", name], CALL_TIMEOUT_S)
        if code and not no_such(out):
            raise ProvisionError(f"docker cannot remove {name}: {_last_line(out)}")

    def logs(self, instance: Instance) -> str:
        """What the container printed; once it is removed, the copy saved then."""
        code, out = _docker(["docker", "logs", instance.details["container"]],
                            CALL_TIMEOUT_S * 5)
        if code == 0:
            return out
        try:
            return Path(instance.details["log"]).read_text(encoding="utf-8", errors="replace")
        except (OSError, KeyError):
            return ""


def _docker(argv: list[str], timeout: float) -> tuple[int, str]:
    """(exit status, stdout and stderr together); a docker that cannot be run or does
    not answer in time raises ProvisionError (the loop reads a poll error as "cannot
    observe the attempt for now")."""
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout)
    except FileNotFoundError:
        raise ProvisionError(f"docker is not on PATH (hint: {MODE_ENV}=process)") from None
    except subprocess.TimeoutExpired:
        raise ProvisionError(f"`docker {argv[1]}` gave no answer within {timeout:.0f} s") \
            from None
    return proc.returncode, proc.stdout.decode(errors="replace")


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""
