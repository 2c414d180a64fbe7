"""What a job's container needs from this machine's environment, and how it travels
(its variables in an env-file; the job file itself through the bucket: ``upload_job``).

A job submitted to another machine loads the *same job file* there, so every
``${VAR}`` the file refers to must be set in the container as it is here; so must the
credentials the storage, the hub client and the job's trackers read on their own
(AWS_*, HF_TOKEN, WANDB_*). The values are secrets: they go into a docker
``--env-file`` (written 0600, removed once the container has started), never onto a
command line, into a record or into a message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from runner.job.secrets import references
from runner.job.yamlfile import parse
from runner.monitor.trackers import tracker_variables
from runner.provision.base import ProvisionError

# Read by boto3 and huggingface_hub inside the container without the job naming them.
STANDARD = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
            "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "HF_TOKEN")
# docker reads an env file with a line scanner whose longest line is 64 KiB.
MAX_LINE = 60_000


def require_bucket(job: Any) -> None:
    """A remote machine cannot write to this machine's disk: its checkpoints must go to a
    bucket, which is also what lets a relaunch elsewhere resume."""
    if not job.storage.is_remote:
        shown = job.redacted_dict()["storage"]["url"]
        raise ProvisionError(f"storage.url {shown!r} is a local path, but the job runs on "
                             "another machine whose disk is not this one's: use an s3:// "
                             "storage.url (with storage.endpoint_url for MinIO, R2, ...)")


def job_env(job: Any, environ: Mapping[str, str] | None = None,
            job_file: Path | None = None) -> dict[str, str]:
    """The variables to set in the job's container: those the job file refers to with
    ``${VAR}`` and the standard credentials, each only if set here. A reference that is
    unset here has a default (else the job would not have loaded) and gets it there too.

    ``environ`` defaults to ``os.environ``; ``job_file`` to the file the job was loaded
    from (the one that is uploaded)."""
    require_bucket(job)
    environ = os.environ if environ is None else environ
    path = job_file if job_file is not None else job.source_path
    names = set(STANDARD) | set(tracker_variables(job))  # monitor.report_to's keys
    if path is not None:
        data, _ = parse(Path(path).read_bytes().decode("utf-8-sig"))
        names.update(references(data))
    return {name: environ[name] for name in sorted(names) if name in environ}


def credential_warning(env: Mapping[str, str]) -> str | None:
    """A line for the user when no bucket credentials travel with the job: the container
    then relies on the host's own (an instance role), and credentials this machine gets
    from a profile or SSO are not forwarded (they live in files, and often expire)."""
    if "AWS_ACCESS_KEY_ID" in env:
        return None
    return ("warning: no AWS_ACCESS_KEY_ID in this environment, so the container uses the "
            "host's own bucket credentials (an instance role); if the host has none, "
            "export yours first, e.g. eval \"$(aws configure export-credentials --format "
            "env)\"")


def env_file_text(env: Mapping[str, str]) -> bytes:
    """docker's ``--env-file`` format: ``KEY=VALUE`` per line, the value taken verbatim
    (no quoting, no expansion). A value docker cannot read back exactly (a line break,
    a NUL, bytes that are not UTF-8, a huge value) is refused, naming the variable only."""
    lines = []
    for name, value in env.items():
        if not name.isidentifier() or not name.isascii():
            raise ProvisionError(f"cannot pass environment variable {name!r} to the container: "
                                 "not a valid name")
        why = None
        if any(c in value for c in "\n\r\0"):
            why = "it contains a line break or NUL, which docker's --env-file cannot hold"
        else:
            try:
                encoded = value.encode("utf-8")
            except UnicodeEncodeError:
                why = "it is not valid UTF-8"
            else:
                if len(encoded) + len(name) + 1 > MAX_LINE:
                    why = f"it is longer than {MAX_LINE:,} bytes"
        if why:
            raise ProvisionError(f"cannot pass environment variable {name} to the container: "
                                 f"{why} (the value is not shown)")
        lines.append(f"{name}={value}\n")
    return "".join(lines).encode("utf-8")


def upload_job(job: Any, job_file: Path | str, job_id: str) -> str:
    """Put the job YAML, as written, into the job's store and return its ``s3://`` URL
    (the instance runs ``ten-runner run <url>``). ``${VAR}`` references stay unresolved:
    secrets are never uploaded by us."""
    require_bucket(job)

    store = job.storage.open()
    key = f"{job.name}/submitted/{job_id}.yaml"
    store.put_bytes(key, Path(job_file).read_bytes())
    return f"{store.url}/{key}"
