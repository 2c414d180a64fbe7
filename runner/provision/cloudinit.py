"""The cloud-init user data that turns a fresh GPU VM into one attempt of one job.

The VM image must already have Docker and the NVIDIA container toolkit (e.g. an AWS Deep
Learning Base GPU AMI). At first boot the user data

1. gives Docker's own stop time the notice window (a drop-in for docker.service), and
   makes the host cache directory the image's user (uid 10001) can write;
2. pulls the image (with retries) and starts the container detached with
   ``--restart on-failure:N`` and ``--stop-timeout`` matched to the notice window,
   ``--network host`` (instance-role credentials and the spot notice come from the
   metadata service, which a bridged container cannot reach with an IMDSv2 hop limit
   of 1), ``--ipc host`` (DataLoader workers share memory), the caches on a host
   directory, and the job URL as the command;
3. runs a watcher (a transient systemd unit) that powers the VM off once the container
   has ended for good: an exit code after which this machine has nothing more to do
   (:data:`FINAL_EXIT_CODES`), or Docker giving up restarting it. The launcher sets
   ``InstanceInitiatedShutdownBehavior=terminate``, so the power-off deletes the VM.

Every value lands in a shell line through :func:`shlex.quote` and in the YAML through
PyYAML's emitter, so any string round-trips exactly. User data is readable by anyone
allowed ``ec2:DescribeInstanceAttribute``: only non-secret variables may be passed
(bucket credentials come from the instance profile); names that look secret, URLs with
credentials and presigned URLs are refused with a :class:`ProvisionError`.

``python -m runner.provision.cloudinit JOB_URL IMAGE JOB_ID`` prints it;
infra/cloud-init/user-data.yaml is such a rendering, kept current by a test.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import yaml

from runner.exit_codes import DETERMINISTIC_FAILURES, ExitCode
from runner.provision.base import ProvisionError

CONTAINER = "ten-runner"
IMAGE_UID = 10001  # the image's user (Dockerfile: useradd --uid 10001)
CACHE_HOST_DIR = "/var/lib/ten-runner/cache"
CACHE_MOUNT = "/cache"  # the image's VOLUME
WATCHER = "/usr/local/lib/ten-runner/watch-exit"
DOCKER_DROPIN = "/etc/systemd/system/docker.service.d/ten-runner-stop-timeout.conf"
USER_DATA_LIMIT = 16384  # bytes EC2 accepts (before base64)
PULL_ATTEMPTS = 5
# Exit codes after which this VM powers off instead of letting Docker restart the job:
# done; a config or data error a restart cannot fix; a bad GPU (the launcher relaunches
# elsewhere); preempted (the machine is being reclaimed, the launcher resumes elsewhere).
FINAL_EXIT_CODES = (ExitCode.OK, *sorted(DETERMINISTIC_FAILURES), ExitCode.UNHEALTHY_HOST,
                    ExitCode.PREEMPTED)

_ECR = re.compile(r"^([0-9]{12}\.dkr\.ecr(?:-fips)?\.([a-z0-9-]+)\.amazonaws\.com(?:\.cn)?)/")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")
_PRESIGNED = {"x-amz-signature", "x-amz-credential", "x-amz-security-token", "signature",
              "awsaccesskeyid"}

WATCH_SCRIPT = """\
#!/bin/bash
# Powers this VM off once the job container has ended for good.
# Usage: watch-exit CONTAINER MAX_RESTARTS STOP_TIMEOUT_S
# Docker restarts the container on failure (--restart on-failure:MAX_RESTARTS); this
# follows its exits ("die" events) and powers off on an exit code in FINAL_CODES, or
# once Docker has stopped restarting it (more than MAX_RESTARTS exits).
set -u
name=$1 max_restarts=$2 stop_timeout=$3
final_codes=" @FINAL_CODES@ "
exits=0 last=0
since=$(date +%s)
while true; do
  while read -r when code; do
    (( when > last )) || continue
    last=$when
    exits=$((exits + 1))
    echo "ten-runner-watch: $name exited with code $code (exit $exits)"
    if [[ $final_codes == *" $code "* ]] || (( exits > max_restarts )); then
      docker update --restart=no "$name" >/dev/null 2>&1 || true
      docker stop -t "$stop_timeout" "$name" >/dev/null 2>&1 || true
      echo "ten-runner-watch: the job is over on this machine (code $code); powering off"
      systemctl poweroff
      exit 0
    fi
  done < <(docker events --since "$since" --filter "container=$name" --filter event=die \\
             --format '{{.TimeNano}} {{index .Actor.Attributes "exitCode"}}')
  sleep 5  # the event stream ended (dockerd restarted): listen again from the last exit
  since=$(( last > 0 ? last / 1000000000 : since ))
done
"""


def render_user_data(*, image: str, job_url: str, job_id: str, stop_timeout_s: int = 110,
                     env: Mapping[str, str] | None = None, max_restarts: int = 3) -> str:
    """The ``#cloud-config`` document for one attempt of ``job_id`` (see module doc).

    ``env``: NON-secret variables for the container (AWS_REGION, an S3 endpoint).
    ``max_restarts``: crashes (exit 1, 4) Docker restarts on this VM before giving up.
    """
    env = dict(env or {})
    _check(image, job_url, job_id, stop_timeout_s, env, max_restarts)
    doc = {
        "write_files": [
            {"path": WATCHER, "owner": "root:root", "permissions": "0755",
             "content": watch_script()},
            # docker.service's default 90 s stop timeout would cut the container's own
            # short when the VM shuts down; give it the notice window plus a margin.
            {"path": DOCKER_DROPIN, "owner": "root:root", "permissions": "0644",
             "content": f"[Service]\nTimeoutStopSec={stop_timeout_s + 20}\n"},
        ],
        "runcmd": [
            _Argv(["systemctl", "daemon-reload"]),
            _Argv(["systemctl", "enable", "--now", "docker"]),
            _Argv(["install", "-d", "-o", str(IMAGE_UID), "-g", str(IMAGE_UID), "-m", "0755",
                   CACHE_HOST_DIR]),
            pull_line(image),
            _Argv(["systemd-run", "--unit=ten-runner-watch",
                   "--description=ten-runner job watcher", WATCHER, CONTAINER,
                   str(max_restarts), str(stop_timeout_s)]),
            shlex.join(docker_run_args(image=image, job_url=job_url, job_id=job_id,
                                       stop_timeout_s=stop_timeout_s, env=env,
                                       max_restarts=max_restarts)) + " || systemctl poweroff",
        ],
    }
    args = cli_args(image=image, job_url=job_url, job_id=job_id,
                    stop_timeout_s=stop_timeout_s, env=env, max_restarts=max_restarts)
    command = shlex.join(["python", "-m", "runner.provision.cloudinit", *args])
    shown_id = json.dumps(job_id)
    header = ["#cloud-config",
              f"# ten-runner: one attempt of job {shown_id if _comment_safe(shown_id) else '?'}"
              " (generated; do not edit).", "# Rendered by:"]
    header += [f"#   {command}" if _comment_safe(command)
               else "#   (arguments not printable in a comment; see runcmd)"]
    text = "\n".join(header) + "\n" + yaml.dump(doc, Dumper=_Dumper, sort_keys=False,
                                                 width=1_000_000, allow_unicode=False)
    size = len(text.encode())
    if size > USER_DATA_LIMIT:
        raise ProvisionError(f"the user data is {size} bytes; EC2 allows {USER_DATA_LIMIT}: "
                             "shorten the image name, the job URL or the environment")
    parse_user_data(text)  # what leaves is what cloud-init will read as ours (a bug if not)
    return text


def docker_run_args(*, image: str, job_url: str, job_id: str, stop_timeout_s: int,
                    env: Mapping[str, str], max_restarts: int) -> list[str]:
    """The ``docker run`` argv that starts the job (detached; the watcher follows it)."""
    args = ["docker", "run", "--detach", "--name", CONTAINER,
            "--label", f"ten.job-id={job_id}",
            # on-failure:0 would mean "restart forever" to docker
            f"--restart=on-failure:{max_restarts}" if max_restarts > 0 else "--restart=no",
            "--stop-timeout", str(stop_timeout_s),
            "--gpus", "all", "--network", "host", "--ipc", "host",
            "--log-opt", "max-size=100m", "--log-opt", "max-file=3",
            "--volume", f"{CACHE_HOST_DIR}:{CACHE_MOUNT}"]
    for name in sorted(env):
        args += ["--env", f"{name}={env[name]}"]
    return [*args, image, "run", job_url]


def pull_line(image: str) -> str:
    """Pull with retries (a registry hiccup must not cost the VM); ``docker run`` pulls
    once more and powers the VM off if the image still cannot be had. An ECR image is
    pulled after a login with the instance profile's credentials (the AWS CLI of the
    GPU AMI)."""
    pull = f"docker pull {shlex.quote(image)}"
    ecr = _ECR.match(image)
    if ecr:
        registry, region = ecr.group(1), ecr.group(2)
        pull = (f"aws ecr get-login-password --region {shlex.quote(region)} | docker login "
                f"--username AWS --password-stdin {shlex.quote(registry)} && {pull}")
    return f"for _ in $(seq {PULL_ATTEMPTS}); do {pull} && break; sleep 20; done"


def watch_script() -> str:
    return WATCH_SCRIPT.replace("@FINAL_CODES@", " ".join(str(int(c)) for c in
                                                          FINAL_EXIT_CODES))


def cli_args(*, image: str, job_url: str, job_id: str, stop_timeout_s: int = 110,
             env: Mapping[str, str] | None = None, max_restarts: int = 3) -> list[str]:
    """The ``python -m runner.provision.cloudinit`` arguments that render the same."""
    args = [job_url, image, job_id]
    if stop_timeout_s != 110:
        args += ["--stop-timeout", str(stop_timeout_s)]
    if max_restarts != 3:
        args += ["--max-restarts", str(max_restarts)]
    for name in sorted(env or {}):
        args += ["--env", f"{name}={(env or {})[name]}"]
    return args


def parse_user_data(text: str) -> dict[str, Any]:
    """Check a rendering is ``#cloud-config`` YAML with the parts we write; returns it
    parsed. Raises ValueError naming what is wrong."""
    if not text.startswith("#cloud-config\n"):
        raise ValueError("user data must start with '#cloud-config'")
    doc = yaml.safe_load(text)
    if not isinstance(doc, dict) or set(doc) != {"write_files", "runcmd"}:
        raise ValueError(f"expected the keys write_files and runcmd, got {doc!r:.200}")
    for entry in doc["write_files"]:
        if not {"path", "content", "permissions"} <= set(entry):
            raise ValueError(f"write_files entry without path/content/permissions: {entry}")
    for line in doc["runcmd"]:
        if not (isinstance(line, str) or (isinstance(line, list)
                                          and all(isinstance(a, str) for a in line))):
            raise ValueError(f"runcmd entries must be strings or lists of strings: {line!r}")
    return doc


# -- checks -------------------------------------------------------------------------------

def _check(image: str, job_url: str, job_id: str, stop_timeout_s: int,
           env: Mapping[str, str], max_restarts: int) -> None:
    for what, value in (("image", image), ("job URL", job_url), ("job id", job_id)):
        if not isinstance(value, str) or not value.strip():
            raise ProvisionError(f"the {what} is empty")
        if "\0" in value:
            raise ProvisionError(f"the {what} contains a NUL character")
    for what, value in (("image", image), ("job URL", job_url)):
        if value.startswith("-"):  # would be read as an option by docker / ten-runner
            raise ProvisionError(f"the {what} must not start with '-'")
    _refuse_credentials("the job URL", job_url)
    for what, value, low, high in (("stop timeout", stop_timeout_s, 1, 3600),
                                   ("max restarts", max_restarts, 0, 100)):
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ProvisionError(f"the {what} must be a whole number from {low} to {high}, "
                                 f"not {value!r}")
    for name, value in env.items():
        _check_env(name, value)


def _check_env(name: str, value: str) -> None:
    """One variable for the instance's environment: a plain name, no secret, no NUL."""
    from runner.job.secrets import looks_secret

    if not isinstance(name, str) or not _ENV_NAME.match(name):
        raise ProvisionError(f"invalid environment variable name {name!r}")
    if looks_secret(name):
        raise ProvisionError(
            f"{name} looks like a secret; user data is readable by anyone allowed "
            "ec2:DescribeInstanceAttribute: give the instance an instance profile for "
            "the bucket instead of passing credentials")
    if not isinstance(value, str) or "\0" in value:
        raise ProvisionError(f"the value of {name} must be a string without NUL")
    _refuse_credentials(name, value)


def _refuse_credentials(what: str, value: str) -> None:
    """A URL with user:password@, a presigned URL or an AWS key id is a secret."""
    if _AWS_KEY_ID.search(value):
        raise ProvisionError(f"{what} holds what looks like an AWS access key id; user "
                             "data must not carry credentials")
    try:
        parts = urlsplit(value)
        userinfo = parts.netloc.rpartition("@")[0] if "://" in value else ""
        query = {k.lower() for k, _ in parse_qsl(parts.query)}
    except ValueError:
        return
    if userinfo:
        raise ProvisionError(f"{what} carries credentials (user:password@host); user data "
                             "must not")
    if query & _PRESIGNED:
        raise ProvisionError(f"{what} is a presigned URL (a bearer credential); pass the "
                             "s3:// URL and let the instance profile read it")


def _comment_safe(text: str) -> bool:
    return text.isascii() and text.isprintable()


class _Argv(list):
    """A runcmd entry cloud-init runs without a shell, shown as ``[prog, arg, ...]``."""


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the scripts) as readable ``|`` blocks; PyYAML falls back to a
    quoted style by itself whenever a block could not hold the text exactly."""


def _represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _represent_str)
_Dumper.add_representer(_Argv, lambda dumper, value: dumper.represent_sequence(
    "tag:yaml.org,2002:seq", value, flow_style=True))


# -- command line ---------------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m runner.provision.cloudinit",
        description="Print the cloud-init user data that runs one job attempt on a GPU VM.")
    parser.add_argument("job_url", help="the job YAML in the bucket (s3://...)")
    parser.add_argument("image", help="the container image")
    parser.add_argument("job_id", help="the submitted job's id (a label on the container)")
    parser.add_argument("--stop-timeout", type=int, default=110,
                        help="seconds docker stop waits (the notice window; default 110)")
    parser.add_argument("--max-restarts", type=int, default=3,
                        help="crash restarts on this VM before it powers off (default 3)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="a NON-secret variable for the container (repeatable)")
    args = parser.parse_args(argv)
    env = {}
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--env wants NAME=VALUE, got {item!r}")
        env[name] = value
    try:
        text = render_user_data(image=args.image, job_url=args.job_url, job_id=args.job_id,
                                stop_timeout_s=args.stop_timeout, env=env,
                                max_restarts=args.max_restarts)
    except ProvisionError as e:
        print(f"Error: {e.message}", file=sys.stderr)
        return e.exit_code
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
