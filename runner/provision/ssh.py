"""``ten-runner submit JOB --to ssh://user@host[:port]``: the job's container on a GPU
machine you can ssh into, through the system ``ssh`` (your keys, agent and ssh config).
:class:`SshHost` is what :class:`runner.provision.docker.DockerProvider` needs of that
machine (the container, its files, its teardown are the same as on this one); the managed
loop launches each attempt, watches it, relaunches after a crash or a kill, and tears it
down at the end.

Every remote command is ONE string in which each word comes from :func:`sh`
(``shlex.join`` of an argv list) and the only raw text is fixed shell syntax (``&&``,
``>``, ``;``, ``$?``, a ``*`` after a quoted folder). Data never travels inside a
command: the job file and the environment go through ssh's stdin into files created
under ``umask 077``. The env file, which holds the secrets, exists only while ``docker
run`` reads it: the same remote command writes it, runs docker and removes it.

On the host (``~`` is the ssh user's home; ``~/.ten-runner`` and below are 0700)::

    ~/.ten-runner/jobs/<job id>/container-job.yaml   the job file, byte for byte, 0644
                                           so that the image's non-root user (uid
                                           10001) can read it at /job/job.yaml;
                                           removed at each teardown
    ~/.ten-runner/jobs/<job id>/attempt-<n>.env   KEY=VALUE lines, 0600, removed after
                                           the start
    docker volume ten-cache                /cache of every job (datasets, shards, HF and
                                           compile caches, the run's working copy): kept
                                           across attempts; a named volume takes the
                                           image's ownership of /cache, a host folder
                                           would need root to chown

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.provision.base import (
    HostUnreachable,
    Provider,
    ProvisionError,
    UnhealthyHost,
)
from runner.provision.destinations import Destination
from runner.provision.docker import JOB_FILE, DockerProvider, Result, image_of
from runner.provision.env import env_file_text, job_env

FORM = "ssh://user@host[:port]"
SSH_OPTIONS = ("-o", "BatchMode=yes", "-o", "ConnectTimeout=10",
               "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4")
REMOTE_ROOT = ".ten-runner"  # relative to the remote home, where ssh commands start

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
class SshResult:
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
               timeout: float = 120) -> SshResult:
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
    result = SshResult(proc.returncode, proc.stdout.decode(errors="replace"),
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


class SshHost:
    """An ssh host, for :class:`runner.provision.docker.DockerProvider` (see the module
    doc)."""

    name, fault, hint = "ssh", UnhealthyHost, ""
    details: dict[str, Any] = {}

    def __init__(self, target: SshTarget | str) -> None:
        self.target = parse_target(target) if isinstance(target, str) else target
        self.zone, self.on = self.target.host, f" on {self.target.host}"

    def refused(self) -> str:
        return (f"{self.target.host} failed the job's GPU health gate and the job is bound "
                "to it; fix the host or submit to another one")

    def docker(self, *args: str, doing: str, timeout: float) -> Result:
        r = run_remote(self.target, sh("docker", *args) + " 2>&1", doing=doing,
                       timeout=timeout)
        return Result(r.returncode, r.stdout)

    def put_job(self, job_id: str, job_file: Path) -> str:
        t, rel = self.target, f"{REMOTE_ROOT}/jobs/{job_id}"
        upload = " && ".join([sh("umask", "077"), sh("mkdir", "-p", "--", rel),
                              sh("umask", "022"),  # no secret in it; the container reads it
                              sh("cat") + " > " + shlex.quote(f"{rel}/{JOB_FILE}"),
                              sh("pwd")])
        r = run_remote(t, upload, stdin=job_file.read_bytes(), doing="uploading the job")
        if r.returncode:
            self.clean(rel, None)  # relative to the home, where ssh commands start
            raise UnhealthyHost(f"cannot write the job to ~/{rel} on {t.host}: {r.last_line}")
        return f"{_remote_home(r, t)}/{rel}"

    def start(self, env_path: str, env: bytes, args: list[str], timeout: float) -> Result:
        # One command: the env file is removed whatever docker run did (even when this
        # machine loses the connection afterwards); its status is the command's.
        start = (f"{sh('umask', '077')} && {sh('cat')} > {shlex.quote(env_path)} && "
                 f"{sh('docker', *args)} 2>&1; s=$?; {sh('rm', '-f', '--', env_path)}; "
                 "exit $s")
        r = run_remote(self.target, start, stdin=env, doing="starting the container",
                       timeout=timeout)
        return Result(r.returncode, r.stdout)

    def clean(self, folder: str, container: str | None) -> None:
        steps = [sh("rm", "-f", "--", f"{folder}/{JOB_FILE}") + " "
                 + shlex.quote(folder) + "/attempt-*.env",
                 sh("rmdir", "--", folder) + " 2>/dev/null", "true"]
        if container:
            steps.insert(0, sh("docker", "rm", "-f", container) + " >/dev/null 2>&1")
        try:
            run_remote(self.target, "; ".join(steps), doing="cleaning up", timeout=60)
        except ProvisionError:
            pass


def _remote_home(result: SshResult, target: SshTarget) -> str:
    lines = result.stdout.strip().splitlines()
    home = lines[-1] if lines else ""
    if not home.startswith("/") or ":" in home:
        raise UnhealthyHost(f"the home directory of {target.user} on {target.host} "
                            f"({home!r}) cannot be mounted by docker (needs an absolute path "
                            "without ':')")
    return home.rstrip("/")  # "" for "/": paths below are built as f"{home}/..."


class SshDestination(Destination):
    """``--to ssh://user@host[:port]``: the host is checked before the job is recorded."""

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
        return DockerProvider(SshHost(record.target), job())


DESTINATION = SshDestination()
