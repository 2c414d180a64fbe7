"""``ten-runner submit JOB --to ssh://user@host[:port]``: the job's container on a GPU
machine you can ssh into, through the system ``ssh`` (your keys, agent and ssh config).
It is a provider like the others (:class:`SshProvider`): the managed loop launches each
attempt, watches it, relaunches after a crash or a kill, and tears it down at the end.

Every remote command is ONE string in which each word comes from :func:`sh`
(``shlex.join`` of an argv list) and the only raw text is fixed shell syntax (``&&``,
``>``, ``;``, ``$?``). Data never travels inside a command: the job file and the
environment go through ssh's stdin into files created under ``umask 077``. The env
file, which holds the secrets, exists only while ``docker run`` reads it.

On the host (``~`` is the ssh user's home; ``~/.ten-runner`` and below are 0700)::

    ~/.ten-runner/jobs/<job id>/job.yaml   the job file, byte for byte, 0644 so that the
                                           image's non-root user (uid 10001) can read it
                                           at /job/job.yaml; removed at each teardown
    ~/.ten-runner/jobs/<job id>/env        KEY=VALUE lines, 0600, removed after the start
    docker volume ten-cache                /cache of every job (datasets, shards, HF and
                                           compile caches, the run's working copy): kept
                                           across attempts; a named volume takes the
                                           image's ownership of /cache, a host folder
                                           would need root to chown

Each attempt is the container ``ten-<job id>-<attempt>``, run, read and stopped as a
local container is (:mod:`runner.provision.docker_run`): ``docker stop`` gives it 110 s
between SIGTERM and SIGKILL, time for the runner to commit a checkpoint; its output is
saved to ``<job dir>/attempt-<n>.log`` on this machine before it is removed. The store
must be a bucket: the heartbeat, the log and the checkpoints are read from there.

Exit codes: ssh cannot connect (ssh exits 255, or no answer in time) -> HostUnreachable
(7); connected, but no GPU or no usable docker -> UnhealthyHost (5). At submit both end
the command (:func:`check_submit`); later the loop reads them as an unobservable
attempt (bounded by ``unreachable_timeout_s``) or a host to avoid.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.job.secrets import scrub
from runner.provision.base import (
    HostUnreachable,
    Instance,
    InstanceStatus,
    LaunchSpec,
    Phase,
    Provider,
    ProvisionError,
    UnhealthyHost,
)
from runner.provision.destinations import Destination
from runner.provision.docker_run import (
    HOST_FAULT,
    INSPECT,
    RUN_TIMEOUT_S,
    STOP_TIMEOUT_S,
    container_name,
    docker_run_argv,
    image_of,
    inspected,
    no_such,
)
from runner.provision.env import env_file_text, job_env
from runner.provision.registry import job_dir

FORM = "ssh://user@host[:port]"
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")
REMOTE_ROOT = ".ten-runner"  # relative to the remote home, where ssh commands start
LOG_KEEP_LINES = 100_000  # saved locally at teardown, before the container is removed

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
    host = _host(host, bad)
    if port is None:
        return SshTarget(user, host)
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise bad(f"port {port!r} is not a number from 1 to 65535")
    return SshTarget(user, host, int(port))


def _host(host: str, bad: Callable[[str], ProvisionError]) -> str:
    """A host name or IPv4 address as given; ``[IPv6]`` as the address inside."""
    if not host.startswith("["):
        if not _HOST.match(host):
            raise bad(f"host {host!r} is not a host name or address" if host
                      else "no host given")
        return host
    import ipaddress

    try:
        return str(ipaddress.IPv6Address(host[1:-1]))
    except ValueError:
        raise bad(f"host {host!r} is not an IPv6 address") from None


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


def check_submit(job: Any, target: str, environ: Mapping[str, str] | None = None, *,
                 check_host_too: bool = True) -> SshTarget:
    """Everything that can be refused before a job is recorded: the target, a bucket
    for storage, the image reference, the environment (a value docker cannot read from
    an env file), and the host itself (:func:`check_host`)."""
    t = parse_target(target)
    if not job.storage.is_remote:
        raise ProvisionError("storage.url is a local path, which a container on another "
                             "machine cannot share with this one: use an s3:// storage.url")
    image_of(job)
    env_file_text(job_env(job, environ))
    if check_host_too:
        check_host(t, gpu=job.train.device != "cpu")
    return t


class SshProvider(Provider):
    """launch/poll/terminate/logs of container attempts on one ssh host (see the module
    doc). ``job`` (the loaded job) is needed to launch only; ``environ``: where the
    job's variables are taken from (default ``os.environ``: a background controller
    inherits the submitting shell's)."""

    name = "ssh"

    def __init__(self, target: SshTarget | str, job: Any = None,
                 environ: Mapping[str, str] | None = None) -> None:
        self.target = parse_target(target) if isinstance(target, str) else target
        self.job, self.environ = job, environ

    def launch(self, spec: LaunchSpec, avoid: frozenset[str] = frozenset()) -> Instance:
        """Upload the job file, start the attempt's container. Leaves nothing running
        and no env file behind when it raises."""
        t, job = self.target, self.job
        if t.host in avoid:
            raise UnhealthyHost(f"{t.host} failed the job's GPU health gate and the job is "
                                "bound to it; fix the host or submit to another one")
        values = {**job_env(job, self.environ, spec.job_file), **spec.env}
        env_text = env_file_text(values)
        rel = f"{REMOTE_ROOT}/jobs/{spec.job_id}"
        upload = " && ".join([sh("umask", "077"), sh("mkdir", "-p", "--", rel),
                              sh("umask", "022"),  # no secret in it; the container reads it
                              sh("cat") + " > " + shlex.quote(f"{rel}/job.yaml"), sh("pwd")])
        r = run_remote(t, upload, stdin=Path(spec.job_file).read_bytes(),
                       doing="uploading the job")
        if r.returncode:
            _remove_files(t, rel, None)  # relative to the home, where ssh commands start
            raise UnhealthyHost(f"cannot write the job to ~/{rel} on {t.host}: {r.last_line}")
        remote_dir = f"{_remote_home(r, t)}/{rel}"
        env_path, name = f"{remote_dir}/env", container_name(spec.job_id, spec.attempt)
        docker = docker_run_argv(job, name, env_path, f"{remote_dir}/job.yaml")
        # The env file is removed whatever docker run did; its status is the command's.
        start = (f"{sh('umask', '077')} && {sh('cat')} > {shlex.quote(env_path)} && "
                 f"{sh(*docker)}; s=$?; {sh('rm', '-f', '--', env_path)}; exit $s")
        launched_at = time.time()  # before the start: any status it writes is newer
        try:
            r = run_remote(t, start, stdin=env_text, doing="starting the container",
                           timeout=RUN_TIMEOUT_S)
        except ProvisionError:
            _remove_files(t, remote_dir, name)
            raise
        if r.returncode:
            _remove_files(t, remote_dir, name)
            why = scrub(r.last_line, list(values.values()))
            if HOST_FAULT.search(why):
                raise UnhealthyHost(f"docker on {t.host} cannot start the container: {why} "
                                    "(hint: install the NVIDIA container toolkit and "
                                    "restart docker)")
            raise ProvisionError(f"docker on {t.host} cannot start the container: {why} "
                                 "(hint: check resources.image)")
        log = job_dir(spec.job_id) / f"attempt-{spec.attempt}.log"
        return Instance(provider=self.name, id=name, zone=t.host, launched_at=launched_at,
                        details={"container": name, "container_id": r.stdout.strip()[:64],
                                 "remote_dir": remote_dir, "log": str(log)})

    def poll(self, instance: Instance) -> InstanceStatus:
        name = instance.id
        r = run_remote(self.target, sh("docker", *INSPECT, name),
                       doing="asking docker about the job")
        if r.returncode:
            if _no_such(r):
                return InstanceStatus(Phase.GONE, None,
                                      f"container {name} is gone from {self.target.host}")
            raise UnhealthyHost(f"docker on {self.target.host} cannot inspect {name}: "
                                f"{r.last_line}")
        return inspected(r.stdout, name)

    def terminate(self, instance: Instance) -> None:
        """``docker stop -t 110`` (SIGTERM: the runner commits a checkpoint and exits
        75), keep the output in the attempt's log file here, ``docker rm -f``, remove
        the job's files on the host. Idempotent."""
        t, name = self.target, instance.id
        r = run_remote(t, sh("docker", "stop", "-t", str(STOP_TIMEOUT_S), name),
                       doing="stopping the container", timeout=STOP_TIMEOUT_S + 60)
        if r.returncode and not _no_such(r):
            raise UnhealthyHost(f"docker on {t.host} cannot stop {name}: {r.last_line}")
        if not r.returncode:
            r = run_remote(t, sh("docker", "logs", "--tail", str(LOG_KEEP_LINES), name)
                           + " 2>&1", doing="saving the logs", timeout=300)
            if r.returncode == 0 and instance.details.get("log"):
                Path(instance.details["log"]).parent.mkdir(parents=True, exist_ok=True)
                Path(instance.details["log"]).write_text(r.stdout)
            r = run_remote(t, sh("docker", "rm", "-f", name), doing="removing the container")
            if r.returncode and not _no_such(r):
                raise UnhealthyHost(f"docker on {t.host} cannot remove {name}: "
                                    f"{r.last_line}")
        if instance.details.get("remote_dir"):
            _remove_files(t, str(instance.details["remote_dir"]), None)

    def logs(self, instance: Instance) -> str:
        """What the container printed (stdout and stderr together); once it is removed,
        the copy saved then."""
        name = instance.id
        r = run_remote(self.target, sh("docker", "logs", name) + " 2>&1",
                       doing="reading the logs", timeout=300)
        if r.returncode == 0:
            return r.stdout
        try:
            return Path(instance.details["log"]).read_text(encoding="utf-8", errors="replace")
        except (OSError, KeyError):
            return ""


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


def _no_such(result: Result) -> bool:
    return no_such(result.stderr + result.stdout)


class SshDestination(Destination):
    """``--to ssh://user@host[:port]``: the host is checked before the job is recorded."""

    takes_url = True

    def preflight(self, job: Any, job_file: Path, target: str, *, check: bool,
                  log: Callable[[str], None]) -> str:
        from runner.provision.env import credential_warning

        normal = str(check_submit(job, target, check_host_too=check))
        warning = credential_warning(job_env(job, job_file=job_file))
        if warning:
            log(warning)
        return normal

    def provider(self, record: Any, job: Callable[[], Any],
                 log: Callable[[str], None]) -> Provider:
        return SshProvider(record.target, job())


DESTINATION = SshDestination()
