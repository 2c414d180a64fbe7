"""``ten-runner submit JOB --to ssh://user@host[:port]``: the job's container on a GPU
machine you can ssh into, through the system ``ssh`` (your keys, agent and ssh config).

Every remote command is ONE string in which each word comes from :func:`sh`
(``shlex.join`` of an argv list) and the only raw text is fixed shell syntax (``&&``,
``>``, ``;``, ``$?``). Data never travels inside a command: the job file and the
environment go through ssh's stdin into files created under ``umask 077``. The env
file, which holds the secrets, exists only while ``docker run`` reads it.

On the host (``~`` is the ssh user's home; ``~/.ten-runner`` and below are 0700)::

    ~/.ten-runner/jobs/<job id>/job.yaml   the job file, byte for byte, 0644 so that the
                                           image's non-root user (uid 10001) can read it
                                           at /job/job.yaml
    ~/.ten-runner/jobs/<job id>/env        KEY=VALUE lines, 0600, removed after the start
    docker volume ten-cache                /cache of every job (datasets, shards, HF and
                                           compile caches, the run's working copy): kept
                                           across restarts; a named volume takes the
                                           image's ownership of /cache, a host folder
                                           would need root to chown

The container is ``ten-<job id>``; docker restarts it after a crash (``--restart
on-failure:<resources.max_restarts>``) and gives it 110 s between SIGTERM and SIGKILL,
time for the runner to commit a checkpoint. States (:func:`ssh_status`), from
``docker inspect``:

    created -> STARTING    running, paused -> RUNNING    restarting -> RECOVERING
    exited/dead with 0 -> SUCCEEDED, other -> FAILED     no container -> FAILED
    CANCELLED (set by :func:`ssh_cancel`) is never changed by a later status.

Exit codes: ssh cannot connect (ssh exits 255, or no answer in time) -> HostUnreachable
(7); connected, but no GPU or no usable docker -> UnhealthyHost (5).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.job.secrets import scrub
from runner.provision.base import HostUnreachable, Instance, ProvisionError, UnhealthyHost
from runner.provision.docker_run import (
    CACHE_VOLUME,
    HOST_FAULT,
    RUN_TIMEOUT_S,
    STOP_TIMEOUT_S,
    docker_run_argv,
    image_of,
)
from runner.provision.env import env_file_text, job_env
from runner.provision.registry import JobRecord, new_job_id

FORM = "ssh://user@host[:port]"
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")
REMOTE_ROOT = ".ten-runner"  # relative to the remote home, where ssh commands start
LOG_KEEP_LINES = 100_000  # saved locally on cancel, before the container is removed

STARTING, RUNNING, RECOVERING = "STARTING", "RUNNING", "RECOVERING"
SUCCEEDED, FAILED, CANCELLED = "SUCCEEDED", "FAILED", "CANCELLED"
TERMINAL = frozenset({SUCCEEDED, FAILED, CANCELLED})
_DOCKER_STATES = {"created": STARTING, "running": RUNNING, "paused": RUNNING,
                  "restarting": RECOVERING}
_ENDED = ("exited", "dead")
_INSPECT = "{{.State.Status}} {{.State.ExitCode}} {{.RestartCount}}"

_URL = re.compile(r"^ssh://(?P<user>[^@/?#]*)@(?P<host>\[[^\]/]*\]|[^:/?#@\[\]]*)"
                  r"(?::(?P<port>[^/?#]*))?/?$", re.IGNORECASE)
_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$")
_HOST = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]{0,251}[A-Za-z0-9_])?$")  # name, alias, IPv4


@dataclass(frozen=True)
class SshTarget:
    user: str
    host: str  # a DNS name, an ssh config alias, IPv4 or IPv6 (without brackets)
    port: int = 22

    @property
    def destination(self) -> str:
        return f"{self.user}@{self.host}"

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"ssh://{self.user}@{host}:{self.port}"


def parse_target(text: str) -> SshTarget:
    """``ssh://user@host[:port]`` -> SshTarget. User and host are checked so that neither
    can be read by ssh as an option (``-oProxyCommand=...``)."""

    def bad(why: str) -> ProvisionError:
        return ProvisionError(f"--to: {why}; expected {FORM}, e.g. ssh://ubuntu@gpu-box:2222")

    if not text.lower().startswith("ssh://"):
        raise bad("not an ssh:// target")
    match = _URL.match(text)
    if match is None:  # not echoed: it may hold a password
        raise bad("cannot read the target")
    user, host, port = match.group("user"), match.group("host"), match.group("port")
    if ":" in user:
        raise bad("no password in the target (ssh runs with keys only, BatchMode)")
    if not _USER.match(user):
        raise bad(f"user {user!r} is not a valid user name" if user else "no user given")
    if host.startswith("["):
        import ipaddress

        try:
            host = str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise bad(f"host {host!r} is not an IPv6 address") from None
    elif not _HOST.match(host):
        raise bad(f"host {host!r} is not a host name or address" if host else "no host given")
    if port is None:
        return SshTarget(user, host)
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise bad(f"port {port!r} is not a number from 1 to 65535")
    return SshTarget(user, host, int(port))


# -- running commands on the host ------------------------------------------------------


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str

    @property
    def last_line(self) -> str:
        return last_line(self.stderr) or last_line(self.stdout)


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else ""


def sh(*argv: str) -> str:
    """One simple command with every word quoted: the only way a value enters a remote
    command line."""
    return shlex.join(argv)


def ssh_argv(target: SshTarget, remote: str) -> list[str]:
    """``$TEN_SSH`` (default ``ssh``; may carry options, e.g. ``ssh -i key``), never a
    prompt (BatchMode), ``--`` so nothing after it is read as an option."""
    client = shlex.split(os.environ.get("TEN_SSH") or "ssh")
    return [*client, *SSH_OPTIONS, "-p", str(target.port), "--", target.destination, remote]


def run_remote(target: SshTarget, remote: str, *, doing: str, stdin: bytes | None = None,
               timeout: float = 120) -> Result:
    """Run one remote command string; ssh's own failure (exit 255, no answer in time)
    raises HostUnreachable, the command's exit status is returned."""
    argv = ssh_argv(target, remote)
    io: dict[str, Any] = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
    try:
        proc = subprocess.run(argv, capture_output=True, timeout=timeout, **io)
    except FileNotFoundError:
        raise ProvisionError(f"ssh client {argv[0]!r} not found (hint: install OpenSSH or "
                             "set TEN_SSH)") from None
    except subprocess.TimeoutExpired:
        raise HostUnreachable(f"{target}: no answer within {timeout:.0f} s while {doing}") \
            from None
    result = Result(proc.returncode, proc.stdout.decode(errors="replace"),
                    proc.stderr.decode(errors="replace"))
    if result.returncode == 255:
        why = last_line(result.stderr) or "ssh exited with status 255"
        raise HostUnreachable(f"cannot reach {target} while {doing}: {why} (hint: `ssh -p "
                              f"{target.port} {target.destination} true` must work without "
                              "a prompt)")
    return result


def check_host(target: SshTarget, gpu: bool = True) -> list[str]:
    """Reachable, at least one GPU (unless ``gpu`` is false: a CPU job), docker usable by
    the ssh user. Returns the ``nvidia-smi -L`` lines (empty for a CPU check)."""
    r = run_remote(target, sh("true"), doing="checking the connection")
    if r.returncode:
        raise UnhealthyHost(f"{target}: a plain command fails on the host: {r.last_line}")
    gpus: list[str] = []
    if gpu:
        r = run_remote(target, sh("nvidia-smi", "-L"), doing="looking for a GPU")
        gpus = [line.strip() for line in r.stdout.splitlines() if line.startswith("GPU ")]
        if r.returncode or not gpus:
            why = f"nvidia-smi failed: {r.last_line}" if r.returncode \
                else "nvidia-smi -L lists none"
            raise UnhealthyHost(f"no GPU on host {target.host} ({why}); pick a GPU machine "
                                "or set train.device: cpu")
    r = run_remote(target, sh("docker", "info", "--format", "{{.ServerVersion}}"),
                   doing="checking docker")
    if r.returncode:
        needs = "docker and the NVIDIA container toolkit" if gpu else "docker"
        raise UnhealthyHost(f"docker is not usable on host {target.host} (docker info failed: "
                            f"{r.last_line}); install {needs} and let {target.user} use it "
                            "(the docker group)")
    return gpus


# -- submit ------------------------------------------------------------------------------


def restart_policy(job: Any) -> str:
    """On an ssh host nothing but docker restarts a crashed container (on-failure:0
    would mean "no limit" to docker, hence "no")."""
    restarts = job.resources.max_restarts
    return f"on-failure:{restarts}" if restarts > 0 else "no"


def _remote_home(result: Result, target: SshTarget) -> str:
    lines = result.stdout.strip().splitlines()
    home = lines[-1] if lines else ""
    if not home.startswith("/") or ":" in home:
        raise UnhealthyHost(f"the home directory of {target.user} on {target.host} "
                            f"({home!r}) cannot be mounted by docker (needs an absolute path "
                            "without ':')")
    return home.rstrip("/")  # "" for "/": paths below are built as f"{home}/..."


def _remove_files(target: SshTarget, remote_dir: str, container: str | None) -> None:
    """Best effort, errors ignored: the container (if given), the job's files, its folder
    (only when empty)."""
    steps = [sh("rm", "-f", "--", f"{remote_dir}/env", f"{remote_dir}/job.yaml"),
             sh("rmdir", "--", remote_dir) + " 2>/dev/null", "true"]
    if container:
        steps.insert(0, sh("docker", "rm", "-f", container) + " >/dev/null 2>&1")
    try:
        run_remote(target, "; ".join(steps), doing="cleaning up", timeout=60)
    except ProvisionError:
        pass


def submit_ssh(job: Any, job_file: Path, target: str | SshTarget, *,
               env: dict[str, str] | None = None, check: bool = True) -> JobRecord:
    """Check the host, upload the job file, start the container, record the job.

    ``env`` is the environment to take the job's variables from (default ``os.environ``;
    see :func:`runner.provision.env.job_env`); ``check=False`` skips :func:`check_host`.
    Leaves nothing running and no env file behind when it raises."""
    t = parse_target(target) if isinstance(target, str) else target
    gpu = job.train.device != "cpu"
    image_of(job)
    values = job_env(job, env, Path(job_file))
    env_text = env_file_text(values)
    secrets = list(values.values())
    body = Path(job_file).read_bytes()
    if check:
        check_host(t, gpu=gpu)

    job_id = new_job_id(job.name)
    rel = f"{REMOTE_ROOT}/jobs/{job_id}"
    upload = " && ".join([sh("umask", "077"), sh("mkdir", "-p", "--", rel),
                          sh("umask", "022"),  # no secret in it; the container reads it
                          sh("cat") + " > " + shlex.quote(f"{rel}/job.yaml"), sh("pwd")])
    r = run_remote(t, upload, stdin=body, doing="uploading the job")
    if r.returncode:
        _remove_files(t, rel, None)  # relative to the home, where ssh commands start
        raise UnhealthyHost(f"cannot write the job to ~/{rel} on {t.host}: {r.last_line}")
    home = _remote_home(r, t)
    remote_dir = f"{home}/{rel}"
    env_path, container = f"{remote_dir}/env", f"ten-{job_id}"
    docker = docker_run_argv(job, container, env_path, f"{remote_dir}/job.yaml",
                             restart=restart_policy(job))
    # The env file is removed whatever docker run did; its status is the command's.
    start = (f"{sh('umask', '077')} && {sh('cat')} > {shlex.quote(env_path)} && {sh(*docker)}"
             f"; s=$?; {sh('rm', '-f', '--', env_path)}; exit $s")
    try:
        r = run_remote(t, start, stdin=env_text, doing="starting the container",
                       timeout=RUN_TIMEOUT_S)
    except ProvisionError:
        _remove_files(t, remote_dir, container)
        raise
    if r.returncode:
        _remove_files(t, remote_dir, container)
        why = scrub(r.last_line, secrets)
        if HOST_FAULT.search(why):
            raise UnhealthyHost(f"docker on {t.host} cannot start the container: {why} (hint: "
                                "install the NVIDIA container toolkit and restart docker)")
        raise ProvisionError(f"docker on {t.host} cannot start the container: {why} (hint: "
                             "check resources.image)")

    now = time.time()
    record = JobRecord(job_id=job_id, job_name=job.name, target=str(t), state=STARTING,
                       attempt=1)
    record.instance = Instance(provider="ssh", id=container, zone=t.host, launched_at=now,
                               details={"container_id": r.stdout.strip()[:64]}).to_dict()
    record.details = {"host": t.host, "port": t.port, "user": t.user, "container": container,
                      "remote_dir": remote_dir, "image": job.resources.image, "gpu": gpu,
                      "cache_volume": CACHE_VOLUME}
    record.transition(RUNNING, f"container {container} started on {t.host}")
    record.save()
    shutil.copyfile(job_file, record.dir / "job.yaml")
    return record


# -- status, logs, cancel ------------------------------------------------------------------


def _where(record: JobRecord) -> tuple[SshTarget, str]:
    if not record.target.startswith("ssh://") or "container" not in record.details:
        raise ProvisionError(f"job {record.job_id} was not submitted over ssh "
                             f"(target {record.target})")
    return parse_target(record.target), str(record.details["container"])


def _no_such(result: Result) -> bool:
    return "no such" in (result.stderr + result.stdout).lower()


def ssh_status(record: JobRecord) -> tuple[str, int | None]:
    """Ask docker on the host; update and save the record; (state, exit code or None
    while the job has not ended)."""
    t, name = _where(record)
    r = run_remote(t, sh("docker", "inspect", "--type", "container", "--format", _INSPECT,
                         name), doing="asking docker about the job")
    if r.returncode:
        if not _no_such(r):
            raise UnhealthyHost(f"docker on {t.host} cannot inspect {name}: {r.last_line}")
        if record.state not in TERMINAL:
            record.transition(FAILED, f"container {name} is gone from {t.host}")
    else:
        status, code, restarts = (r.stdout.split() + ["", "", ""])[:3]
        if not code.lstrip("-").isdigit() or not restarts.isdigit():
            raise UnhealthyHost(f"unexpected answer from docker inspect on {t.host}: "
                                f"{last_line(r.stdout)!r}")
        record.restarts = int(restarts)
        state = _DOCKER_STATES.get(status, record.state)  # "removing": as it was
        if status in _ENDED:
            record.exit_code = int(code)
            state = SUCCEEDED if record.exit_code == 0 else FAILED
        if record.state != CANCELLED and state != record.state:
            ended = f" with exit code {code}" if state in TERMINAL else ""
            record.transition(state, f"docker: {status}{ended}")
    record.save()
    return record.state, record.exit_code if record.state in TERMINAL else None


def ssh_logs(record: JobRecord, tail: int | None = None) -> str:
    """What the container printed (stdout and stderr together); once it is removed
    (cancel), the copy saved then."""
    t, name = _where(record)
    argv = ["docker", "logs", *(["--tail", str(tail)] if tail is not None else []), name]
    r = run_remote(t, sh(*argv) + " 2>&1", doing="reading the logs", timeout=300)
    if r.returncode == 0:
        return r.stdout
    saved = record.dir / "container.log"
    if _no_such(r) and saved.is_file():
        lines = saved.read_text().splitlines(keepends=True)
        if tail is not None:
            lines = lines[len(lines) - tail:] if tail > 0 else []
        return "".join(lines)
    raise ProvisionError(f"no logs for {record.job_id} on {t.host}: {r.last_line}")


def ssh_cancel(record: JobRecord) -> None:
    """Stop the container (SIGTERM, 110 s to checkpoint, then SIGKILL), keep its logs
    next to the record, remove it and the job's files on the host. Idempotent; a job that
    already ended keeps its state and is only cleaned up."""
    t, name = _where(record)
    ssh_status(record)
    if record.state not in TERMINAL:
        r = run_remote(t, sh("docker", "stop", "-t", str(STOP_TIMEOUT_S), name),
                       doing="stopping the container", timeout=STOP_TIMEOUT_S + 60)
        if r.returncode and not _no_such(r):
            raise UnhealthyHost(f"docker on {t.host} cannot stop {name}: {r.last_line}")
        record.transition(CANCELLED, "cancelled")
        ssh_status(record)  # the exit code: 75 when the runner committed a checkpoint
    r = run_remote(t, sh("docker", "logs", "--tail", str(LOG_KEEP_LINES), name) + " 2>&1",
                   doing="saving the logs", timeout=300)
    if r.returncode == 0:
        (record.dir / "container.log").write_text(r.stdout)
    r = run_remote(t, sh("docker", "rm", "-f", name), doing="removing the container")
    if r.returncode and not _no_such(r):
        raise UnhealthyHost(f"docker on {t.host} cannot remove {name}: {r.last_line}")
    if record.details.get("remote_dir"):
        _remove_files(t, str(record.details["remote_dir"]), None)
