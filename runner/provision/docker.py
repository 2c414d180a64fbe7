"""The job's container on a host with Docker: one provider, :class:`DockerProvider`, over
a :class:`Host` that runs the commands, this machine (``submit --to local`` with Docker:
:class:`runner.provision.container.LocalHost`) or an ssh host (``--to ssh``:
:class:`runner.provision.ssh.SshHost`). So a job that runs on one runs on the others:
one ``docker run`` command line, one reading of ``docker inspect``, one teardown.

Each attempt is the container ``ten-<job id>-<attempt>`` of ``resources.image`` running
``run /job/job.yaml``:

* the job file is a 0644 copy, ``container-job.yaml``, in the job's folder on the host
  (a folder only its user can enter): the image's user (uid 10001) must read it;
* the environment (the job's ``${VAR}`` references and the standard credentials:
  :func:`runner.provision.env.job_env`) goes through ``attempt-<n>.env`` in that
  folder, written 0600 and removed as soon as ``docker run`` returns, whatever it did;
* no ``--restart``: the managed loop owns relaunches (and counts them);
* ``docker stop`` gives it 110 s between SIGTERM and SIGKILL, time for the runner to
  commit a checkpoint; its output is saved to ``<job dir>/attempt-<n>.log`` on this
  machine before the container is removed.

Phases from ``docker inspect``: created -> PENDING; running, paused, restarting ->
RUNNING; exited/dead -> EXITED(code), except 128+N for a reclaim-like signal N (137:
SIGKILL, also what the kernel's OOM killer sends; 143: SIGTERM), which reads as
PREEMPTED like a plain process killed by that signal; no such container -> GONE.

The store must be a bucket: the heartbeat, the log and the checkpoints are read from
there, and a container cannot share this machine's folders.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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
from runner.provision.env import env_file_text, job_env
from runner.provision.policy import PREEMPT_SIGNALS, signal_of
from runner.provision.registry import job_dir

CACHE_VOLUME = "ten-cache"  # mounted at /cache (the image's TEN_CACHE_DIR, HF_HOME, ...)
STOP_TIMEOUT_S = 110  # SIGTERM -> SIGKILL: the runner commits a checkpoint inside this
SHM_SIZE = "16g"  # docker's default 64 MB /dev/shm kills DataLoader workers
RUN_TIMEOUT_S = 1800  # `docker run` pulls the image first: a CUDA image takes minutes
CALL_TIMEOUT_S = 60
LOG_KEEP_LINES = 100_000  # saved on this machine at teardown, before the container goes
JOB_IN_CONTAINER = "/job/job.yaml"
JOB_FILE = "container-job.yaml"  # in the job's folder on the host
# `docker run` failures that are the host's fault (no GPU runtime, no daemon, no docker).
HOST_FAULT = re.compile(r"device driver|nvidia|gpu|cannot connect to the docker daemon|"
                        r"command not found|permission denied", re.IGNORECASE)
INSPECT = ["inspect", "--type", "container", "--format",
           "{{.State.Status}} {{.State.ExitCode}} {{.State.OOMKilled}}"]  # + the name
_IMAGE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/:@-]{0,511}$")
_STATE = re.compile(r"^([a-z]+) (-?\d+) (true|false)$", re.MULTILINE)  # INSPECT's answer


@dataclass(frozen=True)
class Result:
    code: int
    output: str  # stdout and stderr together

    @property
    def last_line(self) -> str:
        lines = [line.strip() for line in self.output.splitlines() if line.strip()]
        return lines[-1][:300] if lines else ""


class Host(Protocol):
    """Where the docker commands run: all that differs between this machine and an ssh
    host. Paths are the host's own, absolute."""

    name: str  # the provider's name in records and logs
    zone: str  # what a failed health gate blocks
    on: str  # in messages after "docker": "" here, " on <host>" elsewhere
    fault: type[ProvisionError]  # what a docker command that fails here raises
    hint: str  # more to say when docker cannot start a container here ("" or ", or ...")
    details: Mapping[str, Any]  # kept in each instance (how to find it again)

    def refused(self) -> str:
        """Why a job is not launched here once this host failed its health gate."""

    def docker(self, *args: str, doing: str, timeout: float) -> Result:
        """Run ``docker ARGS``; a host that cannot be reached raises (HostUnreachable,
        or ProvisionError when docker itself cannot be run)."""

    def put_job(self, job_id: str, job_file: Path) -> str:
        """Copy the job file to ``<folder>/JOB_FILE`` (0644) in a folder only this user
        can enter; the folder."""

    def start(self, env_path: str, env: bytes, args: list[str], timeout: float) -> Result:
        """Write ``env`` to ``env_path`` (0600), run ``docker ARGS``, remove the file
        whatever happened."""

    def clean(self, folder: str, container: str | None) -> None:
        """Best effort, errors ignored: remove the container (if given), the job's files
        in ``folder``, and the folder when nothing else is in it."""


def image_of(job: Any) -> str:
    image = job.resources.image
    if not _IMAGE.match(image):
        raise ProvisionError("resources.image is not a container image reference "
                             "(e.g. ghcr.io/ten-runner/ten-runner:latest)")
    return image


def container_name(job_id: str, attempt: int) -> str:
    return f"ten-{job_id}-{attempt}"


def docker_run_args(job: Any, container: str, env_path: str, job_path: str) -> list[str]:
    """``docker run -d`` (the words after ``docker``) of the job's image running
    ``job_path`` (mounted read-only), the environment from ``env_path``, ``--gpus all``
    unless the job trains on the CPU."""
    gpu = job.train.device != "cpu"
    return ["run", "-d", "--name", container, *(["--gpus", "all"] if gpu else []),
            "--stop-timeout", str(STOP_TIMEOUT_S), "--shm-size", SHM_SIZE,
            "--env-file", env_path, "-v", f"{CACHE_VOLUME}:/cache",
            "-v", f"{job_path}:{JOB_IN_CONTAINER}:ro", image_of(job), "run", JOB_IN_CONTAINER]


class DockerProvider(Provider):
    """launch/poll/terminate/logs of container attempts on one host (see the module
    doc). ``job`` (the loaded job) is needed to launch only; ``environ``: where the
    job's variables are taken from (default ``os.environ``: a background controller
    inherits the submitting shell's)."""

    def __init__(self, host: Host, job: Any = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.host, self.job, self.environ = host, job, environ
        self.name = host.name

    def launch(self, spec: LaunchSpec, avoid: frozenset[str] = frozenset()) -> Instance:
        """Put the job file on the host, start the attempt's container. Leaves nothing
        running and no env file behind when it raises."""
        host, job = self.host, self.job
        if host.zone in avoid:
            raise UnhealthyHost(host.refused())
        if not job.storage.is_remote:
            raise ProvisionError("storage.url is a local path, which the job's container "
                                 f"cannot write to: use an s3:// storage.url{host.hint}")
        values = {**job_env(job, self.environ, spec.job_file), **spec.env}
        env_text = env_file_text(values)
        folder = host.put_job(spec.job_id, Path(spec.job_file))
        name = container_name(spec.job_id, spec.attempt)
        args = docker_run_args(job, name, f"{folder}/attempt-{spec.attempt}.env",
                               f"{folder}/{JOB_FILE}")
        launched_at = time.time()  # before the start: any status it writes is newer
        try:
            r = host.start(f"{folder}/attempt-{spec.attempt}.env", env_text, args,
                           RUN_TIMEOUT_S)
        except ProvisionError:
            host.clean(folder, name)
            raise
        if r.code:
            host.clean(folder, name)  # a created container, if any
            why = scrub(r.last_line, list(values.values()))
            if HOST_FAULT.search(why):
                raise UnhealthyHost(f"docker{host.on} cannot start the container: {why} "
                                    "(hint: install the NVIDIA container toolkit and "
                                    f"restart docker{host.hint})")
            raise ProvisionError(f"docker{host.on} cannot start the container: {why} "
                                 "(hint: check resources.image)")
        log = job_dir(spec.job_id) / f"attempt-{spec.attempt}.log"
        return Instance(provider=self.name, id=name, zone=host.zone, spot=False,
                        launched_at=launched_at,
                        details={**host.details, "container": name,
                                 "container_id": r.last_line[:64], "folder": folder,
                                 "log": str(log)})

    def poll(self, instance: Instance) -> InstanceStatus:
        name, host = instance.id, self.host
        r = host.docker(*INSPECT, name, doing="asking docker about the job",
                        timeout=CALL_TIMEOUT_S)
        if r.code:
            if no_such(r.output):
                return InstanceStatus(Phase.GONE, None, f"container {name} is gone{host.on}")
            raise host.fault(f"docker{host.on} cannot inspect {name}: {r.last_line}")
        return inspected(r.output, name)

    def terminate(self, instance: Instance) -> None:
        """``docker stop -t 110`` (SIGTERM: the runner commits a checkpoint and exits
        75), keep the output in the attempt's log file on this machine, ``docker rm
        -f``, remove the job's files on the host. Idempotent."""
        host, name = self.host, instance.id
        r = host.docker("stop", "-t", str(STOP_TIMEOUT_S), name,
                        doing="stopping the container", timeout=STOP_TIMEOUT_S + 60)
        if r.code and not no_such(r.output):
            raise host.fault(f"docker{host.on} cannot stop {name}: {r.last_line}")
        if not r.code:
            r = host.docker("logs", "--tail", str(LOG_KEEP_LINES), name,
                            doing="saving the logs", timeout=300)
            if r.code == 0 and instance.details.get("log"):
                log = Path(instance.details["log"])
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text(r.output)
            r = host.docker("rm", "-f", name, doing="removing the container",
                            timeout=CALL_TIMEOUT_S)
            if r.code and not no_such(r.output):
                raise host.fault(f"docker{host.on} cannot remove {name}: {r.last_line}")
        if instance.details.get("folder"):
            host.clean(str(instance.details["folder"]), None)

    def logs(self, instance: Instance) -> str:
        """What the container printed (stdout and stderr together); once it is removed,
        the copy saved then."""
        r = self.host.docker("logs", instance.id, doing="reading the logs", timeout=300)
        if r.code == 0:
            return r.output
        try:
            return Path(instance.details["log"]).read_text(encoding="utf-8", errors="replace")
        except (OSError, KeyError):
            return ""


def no_such(output: str) -> bool:
    """Docker's answer about a container that does not exist."""
    return "no such" in output.lower()


def inspected(output: str, name: str) -> InstanceStatus:
    """The phase of container ``name`` from what ``docker`` + :data:`INSPECT` printed
    when it succeeded (see the module doc): the one line of the format's three words,
    whatever warnings docker printed around it."""
    answer = next((m.groups() for m in _STATE.finditer(output)), None)
    status, exit_code, oom = answer or (output.split() + ["", "", ""])[:3]
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
