"""``ten-runner export JOB.yaml --to skypilot|k8s``: the same job for users who outgrow
one host, as a SkyPilot managed-job task or a Kubernetes Job manifest.

Both run the runner image (``resources.image``, ENTRYPOINT ``tini -- ten-runner``) as
``ten-runner run <job file>``. The job file travels *inside* the export, as written
(``${VAR}`` unresolved), so the output is one self-contained file:

* SkyPilot: the ``run`` script writes it to ``~/ten-job/job.yaml`` with a quoted heredoc
  (no shell expansion) and ``exec``\\ s the runner, so the exit code is the runner's. It
  is rewritten on every recovery. (SkyPilot runs ``run`` as the image's non-root user.)
  The GPU is ``resources.accelerator`` x ``resources.gpus``. A local dataset or
  tokenizer is copied by ``file_mounts`` under ``~/ten-data/`` and the run is pointed at
  it with ``--set`` (:func:`data_mounts`).
* Kubernetes: a ConfigMap in the same multi-document output holds it verbatim, mounted
  read-only at ``/job`` (``ten-runner run /job/job.yaml``).

With ``job_url`` (an ``s3://`` URL, e.g. the copy ``submit`` uploaded) nothing is
embedded and the container runs ``ten-runner run <url>``, which fetches it.

No variable's value enters the output, whatever its name (a password in a URL under a
harmless name was copied in once): each appears only as a name. SkyPilot: ``secrets:
{NAME: null}`` for names that look secret (:func:`runner.job.secrets.looks_secret`, by
the name or the field referencing it), ``envs: {NAME: null}`` for the rest, both
supplied from the launching shell (``sky jobs launch --secret NAME --env NAME``).
Kubernetes: a ``secretKeyRef`` into ``ten-<job>-secrets`` for every one, the header
giving the ``kubectl create secret`` line that fills it from the shell. Variables unset
here with a default in the job stay optional, so the job's ``${VAR:-default}`` applies.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from runner.exit_codes import DETERMINISTIC_FAILURES, ExitCode
from runner.job.load import with_sets
from runner.job.secrets import looks_secret, references, substitute
from runner.job.yamlfile import YamlProblem, parse
from runner.monitor.trackers import tracker_variables
from runner.provision.base import ProvisionError
from ten.cards import CARDS

if TYPE_CHECKING:
    from runner.job import Job

TARGETS = ("skypilot", "k8s")
# SkyPilot: where a local dataset or tokenizer is mounted, under the run user's home.
SKY_DATA_DIR = "ten-data"
JOB_DIR = "/job"  # Kubernetes: the ConfigMap's read-only mount
JOB_PATH = f"{JOB_DIR}/job.yaml"
# SkyPilot runs `run` as the image's user (uid 10001, cannot create /job): its home.
SKY_JOB_DIR = "~/ten-job"
SKY_JOB_PATH = f"{SKY_JOB_DIR}/job.yaml"
CACHE_DIR = "/cache"  # the image's TEN_CACHE_DIR, HF_HOME, ... live under it
CONTAINER = "ten-runner"
GRACE_S = 120  # SIGTERM -> checkpoint -> upload -> exit 75 must fit in here
TTL_S = 7 * 24 * 3600  # finished Jobs (and their pod logs) stay a week
# Read by boto3 itself (not through ${VAR} in the job); not secret, passed when set here.
_AWS_SETTINGS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")


@dataclass(frozen=True)
class Variable:
    """An environment variable the container needs, by name: its value never travels."""

    name: str
    secret: bool  # SkyPilot: a secret rather than an env (redacted in its dashboard)
    required: bool  # no default in the job (or the runner needs it): the run fails without
    local: bool = False  # set in this shell at export time (so `--secret NAME` works)


def export_job(job: Job, job_file: Path, target: str, *, job_url: str | None = None,
               env: Mapping[str, str] | None = None, sets: Sequence[str] = ()) -> str:
    """The job as a SkyPilot task (``target="skypilot"``) or Kubernetes manifests
    (``"k8s"``), YAML text. ``job`` is the loaded job (for its name and resources, with
    ``sets`` applied), ``job_file`` the file it came from (embedded as written, with the
    ``--set`` overrides ``sets`` written into it, unless ``job_url``), ``env`` this
    shell's environment (default ``os.environ``)."""
    if target not in TARGETS:
        raise ProvisionError(f"unknown export target {target!r} (choose one of: "
                             f"{', '.join(TARGETS)})", ExitCode.CONFIG)
    if job_url is not None and not job_url.lower().startswith("s3://"):
        raise ProvisionError(f"job_url must be an s3:// URL, got {job_url!r}", ExitCode.CONFIG)
    if job_url is not None and sets:
        raise ProvisionError("--set cannot change the job read from --job-url; write the "
                             "changes into that file, or export without --job-url",
                             ExitCode.CONFIG)
    try:
        text = Path(job_file).read_text(encoding="utf-8-sig")
    except OSError as err:
        raise ProvisionError(f"{job_file}: cannot read: {err.strerror or err}") from None
    text = with_sets(text, sets, str(job_file))
    variables = needed_variables(job, text, os.environ if env is None else env,
                                 remote_job=job_url is not None)
    if target == "skypilot":
        return skypilot_task(job, text, variables, job_url=job_url)
    return k8s_manifests(job, text, variables, job_url=job_url)


def laptop_values(job: Job, target: str = "k8s") -> list[str]:
    """Warnings for values that work on this machine but not in the exported container:
    a local store, an endpoint on this machine's loopback, local data or tokenizer
    paths (the container has its own disk; a SkyPilot task mounts those it can,
    :func:`data_mounts`). Values as the job shows them (a ``${VAR}`` stays a reference)."""
    from ipaddress import ip_address
    from urllib.parse import urlsplit

    from ten.data.sources import is_local

    shown = job.redacted_dict()
    warnings = []
    if not job.storage.is_remote:
        warnings.append(f"storage.url {shown['storage']['url']!r} is a path on the "
                        "container's own disk: checkpoints go when it goes, and a relaunch "
                        "cannot resume; use an s3:// storage.url")
    host = urlsplit(job.storage.endpoint_url or "").hostname or ""
    try:
        loopback = host == "localhost" or ip_address(host).is_loopback \
            or ip_address(host).is_unspecified
    except ValueError:
        loopback = False
    if loopback:
        warnings.append(f"storage.endpoint_url {shown['storage']['endpoint_url']!r} is the "
                        "container's own loopback, not this machine: give an address the "
                        "cluster reaches")
    d = job.data
    mounted = {m.key for m in data_mounts(job)} if target == "skypilot" else set()
    if is_local(d.dataset) and "data.dataset" not in mounted:
        warnings.append(f"data.dataset {shown['data']['dataset']!r} is a local path: the "
                        "container must have it (bake it into the image or mount it)")
    if d.tokenizer.path is not None and "data.tokenizer.path" not in mounted:
        warnings.append(f"data.tokenizer.path {shown['data']['tokenizer']['path']!r} is a "
                        "local path: the container must have it")
    return warnings


# -- which variables ---------------------------------------------------------------------

class _Everything(Mapping[str, str]):
    """An environment holding every name (as "") but ``missing``: run through
    :func:`substitute`, it tells which fields hold a reference, and whether ``missing``
    has a default there, without a second parser."""

    def __init__(self, missing: str | None = None):
        self.missing = missing

    def __contains__(self, name: object) -> bool:
        return name != self.missing

    def __getitem__(self, name: str) -> str:
        if name == self.missing:
            raise KeyError(name)
        return ""

    def __iter__(self) -> Iterator[str]:
        return iter(())

    def __len__(self) -> int:
        return 0


def job_references(text: str) -> dict[str, Variable]:
    """Every ``${VAR}`` of a job file as written: required when some reference has no
    default, secret when the name or the field holding it looks secret."""
    try:
        data, _ = parse(text)
    except YamlProblem as p:
        raise ProvisionError(f"the job file does not parse: line {p.line}: {p.message}") \
            from None
    _, written, _, _ = substitute(data, _Everything())  # every field holding a reference
    found: dict[str, Variable] = {}
    for path, value in written.items():
        for name in references(value):
            required = bool(substitute(value, _Everything(missing=name))[3])
            secret = looks_secret(name) or any(looks_secret(p) for p in path)
            found[name] = _merge(found.get(name), Variable(name, secret, required))
    return found


def needed_variables(job: Job, text: str, env: Mapping[str, str], *,
                     remote_job: bool = False) -> list[Variable]:
    """The job's references plus what the runner reads on its own: the AWS credentials
    and endpoint settings when the job or its checkpoints live in S3, HF_TOKEN always
    (optional: gated hub datasets), the trackers' key and those of their settings set
    here (monitor.report_to)."""
    found = job_references(text)

    def add(name: str, secret: bool, required: bool) -> None:
        found[name] = _merge(found.get(name), Variable(name, secret, required))

    if job.storage.is_remote or remote_job:
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            add(name, True, True)
        add("AWS_SESSION_TOKEN", True, False)
        for name in _AWS_SETTINGS:
            if name in env:
                add(name, False, False)
    add("HF_TOKEN", True, False)
    for name in tracker_variables(job):  # monitor.report_to: WANDB_API_KEY, ...
        if name in env or looks_secret(name):
            add(name, looks_secret(name), False)
    return [Variable(name, found[name].secret, found[name].required, local=name in env)
            for name in sorted(found)]


def _merge(a: Variable | None, b: Variable) -> Variable:
    if a is None:
        return b
    return Variable(b.name, a.secret or b.secret, a.required or b.required)


# -- SkyPilot ----------------------------------------------------------------------------

def skypilot_task(job: Job, text: str, variables: list[Variable], *,
                  job_url: str | None = None) -> str:
    """A SkyPilot task YAML for ``sky jobs launch`` (managed job: recovery on
    preemption, ``max_restarts`` relaunches after a crash)."""
    res = job.resources
    resources: dict[str, Any] = {}
    if res.gpus:
        resources["accelerators"] = f"{res.accelerator}:{res.gpus}"
    else:
        resources["cpus"] = "2+"
    resources["use_spot"] = bool(res.spot)
    resources["image_id"] = f"docker:{res.image}"
    # FAILOVER retries the same region first: the bucket (and its egress) usually is there.
    # Exit 75 = preempted after a committed checkpoint: recover without spending a restart.
    resources["job_recovery"] = {"strategy": "FAILOVER",
                                 "max_restarts_on_errors": res.max_restarts,
                                 "recover_on_exit_codes": [int(ExitCode.PREEMPTED)]}
    given = [v for v in variables if v.required or v.local]  # supplied at launch, by name
    envs = {v.name: None for v in given if not v.secret}
    secrets = {v.name: None for v in given if v.secret}
    task: dict[str, Any] = {"name": job.name, "resources": resources}
    if envs:
        task["envs"] = envs
    if secrets:
        task["secrets"] = secrets
    mounts = data_mounts(job)
    if mounts:
        task["file_mounts"] = {f"~/{m.remote}": m.local for m in mounts}
    target = shlex.quote(job_url) if job_url else SKY_JOB_PATH
    lines = [] if job_url else [f"mkdir -p {SKY_JOB_DIR}", *_heredoc(text, SKY_JOB_PATH)]
    sets = "".join(f' --set "{m.key}=$HOME/{m.remote}{m.pattern}"' for m in mounts)
    task["run"] = "\n".join([*lines, f"exec ten-runner run {target}{sets}"]) + "\n"

    header = [f"SkyPilot managed job for {job.name!r}, exported by ten-runner. Launch:",
              *_continued(["sky jobs launch", f"-n {job.name}", "THIS_FILE",
                           *(f"--env {name}" for name in envs),
                           *(f"--secret {name}" for name in secrets)])]
    if given:
        header.append("(--env NAME and --secret NAME read NAME from your shell: this file "
                      "holds no values)")
    header += _optional_lines(variables, lambda v: v.secret and v not in given,
                              "--secret NAME")
    header += _optional_lines(variables, lambda v: not v.secret and v not in given,
                              "--env NAME")
    if not res.gpus:
        header.append(f"CPU only: set resources.gpus in the job for {res.accelerator} GPUs.")
    for m in mounts:
        header.append(f"{m.key} is mounted from this machine ({m.local}).")
    header.append("Pin a cloud/region with resources.infra (e.g. aws/us-east-1) if needed.")
    header += _local_storage_warning(job)
    return _comment(header) + dump([task])


@dataclass(frozen=True)
class Mount:
    """A local path of the job that a SkyPilot task copies to the machine: the job key
    (given to the run with --set), this machine's folder or file, where it lands under
    the run user's home, and the glob after the folder (``/*.txt``), if any."""

    key: str
    local: str
    remote: str
    pattern: str = ""


def data_mounts(job: Job) -> list[Mount]:
    """A local data.dataset and data.tokenizer.path, written as paths (one from a
    ${VAR} is left to the variable): each mounted under ~/ten-data/. A glob mounts the
    folder before its first wildcard."""
    from ten.data.sources import is_local

    written = getattr(job, "_written", {})
    wanted = []
    if is_local(job.data.dataset) and ("data", "dataset") not in written:
        wanted.append(("data.dataset", job.data.dataset))
    if job.data.tokenizer.path is not None and ("data", "tokenizer", "path") not in written:
        wanted.append(("data.tokenizer.path", job.data.tokenizer.path))
    mounts = []
    for i, (key, value) in enumerate(wanted):
        parts = Path(value).expanduser().parts
        plain = next((n for n, part in enumerate(parts) if any(c in part for c in "*?[")),
                     len(parts))
        local = Path(*parts[:plain]).resolve()
        pattern = "".join("/" + part for part in parts[plain:])
        mounts.append(Mount(key, str(local), f"{SKY_DATA_DIR}/{i}-{local.name}", pattern))
    return mounts


def _heredoc(text: str, path: str) -> list[str]:
    """Shell lines writing ``text`` to ``path`` byte for byte (plus a final newline if it
    had none): a quoted delimiter, so ``$`` and backslashes stay as written."""
    end = "END_OF_JOB_YAML"
    lines = (text[:-1] if text.endswith("\n") else text).split("\n")  # \n only, as bash
    while end in lines:
        end += "_"
    return [f"cat > {path} <<'{end}'", *lines, end]


# -- Kubernetes --------------------------------------------------------------------------

def _k8s_env(variables: list[Variable], secret_name: str) -> list[dict[str, Any]]:
    """The container's env: every variable from the Secret, by name (optional where the
    job file has a default)."""
    env: list[dict[str, Any]] = []
    for v in variables:
        ref: dict[str, Any] = {"name": secret_name, "key": v.name}
        if not v.required:
            ref["optional"] = True
        env.append({"name": v.name, "valueFrom": {"secretKeyRef": ref}})
    return env


def k8s_manifests(job: Job, text: str, variables: list[Variable], *,
                  job_url: str | None = None) -> str:
    """A ConfigMap with the job file (unless ``job_url``) and a ``batch/v1`` Job."""
    res = job.resources
    base = f"ten-{job.name}"[:63].rstrip("-")
    secret_name = f"ten-{job.name}-secrets"
    labels = {"app.kubernetes.io/name": "ten-runner", "ten-runner/job": job.name}

    env = _k8s_env(variables, secret_name)
    mounts = [{"name": "cache", "mountPath": CACHE_DIR},
              {"name": "dshm", "mountPath": "/dev/shm"}]  # DataLoader workers need > 64 MiB
    volumes: list[dict[str, Any]] = [{"name": "cache", "emptyDir": {}},
                                     {"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    docs: list[dict[str, Any]] = []
    if job_url is None:
        config_map = f"{base[:59].rstrip('-')}-job"
        docs.append({"apiVersion": "v1", "kind": "ConfigMap",
                     "metadata": {"name": config_map, "labels": labels},
                     "data": {"job.yaml": text}})
        mounts.insert(0, {"name": "job", "mountPath": JOB_DIR, "readOnly": True})
        volumes.insert(0, {"name": "job", "configMap": {"name": config_map}})

    container: dict[str, Any] = {
        "name": CONTAINER, "image": res.image,
        "args": ["run", job_url or JOB_PATH],  # the image's ENTRYPOINT is tini -- ten-runner
        "env": env, "volumeMounts": mounts}
    if res.gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": res.gpus}}
    pod = {"restartPolicy": "Never",  # required by podFailurePolicy; the Job relaunches
           "terminationGracePeriodSeconds": GRACE_S,
           "containers": [container], "volumes": volumes}
    docs.append({
        "apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": base, "labels": labels},
        "spec": {
            "backoffLimit": res.max_restarts,
            "podFailurePolicy": {"rules": [
                # Node drained / preempted / evicted: not the job's fault, not counted.
                {"action": "Ignore",
                 "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
                # The job file, the data or the lr is wrong: retrying cannot help.
                {"action": "FailJob", "onExitCodes": {
                    "containerName": CONTAINER, "operator": "In",
                    "values": sorted(int(c) for c in DETERMINISTIC_FAILURES)}},
                # Stopped by SIGTERM after committing a checkpoint: resume, not counted.
                {"action": "Ignore", "onExitCodes": {
                    "containerName": CONTAINER, "operator": "In",
                    "values": [int(ExitCode.PREEMPTED)]}},
            ]},
            "ttlSecondsAfterFinished": TTL_S,
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    })

    # Keys for the Secret: what must be there, and the optional ones this shell has (an
    # empty value is not a missing one: ${VAR:-default} would see "" and not the default).
    keys = [v.name for v in variables if v.required or v.local]
    header = [f"Kubernetes Job for {job.name!r}, exported by ten-runner. This file holds no "
              "values of variables, only their names."]
    if keys:
        header.append("Create the Secret it reads them from (from your shell):")
        header += _continued([f"kubectl create secret generic {secret_name}",
                              *(f'--from-literal={k}="${k}"' for k in keys)])
    header += _optional_lines(variables, lambda v: v.name not in keys,
                              f"keys of {secret_name}")
    header.append("Apply: kubectl apply -f THIS_FILE")
    if res.spot:
        header.append("Spot is a node-pool matter here: add a nodeSelector/toleration for "
                      "your spot pool (e.g. eks.amazonaws.com/capacityType: SPOT).")
    if res.gpus:
        product = CARDS[res.accelerator].cuda_name.replace(" ", "-")
        header.append(f"Pin the GPU model with a nodeSelector such as "
                      f"nvidia.com/gpu.product: {product}.")
    header += _local_storage_warning(job)
    return _comment(header) + dump(docs)


# -- YAML out ----------------------------------------------------------------------------

class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the run script, the embedded job) as readable ``|`` blocks;
    no anchors/aliases (the job loader refuses them, and people read this)."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)


_Dumper.add_representer(str, _str)


def dump(docs: list[dict[str, Any]]) -> str:
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                         allow_unicode=True, width=100)


def _comment(lines: list[str]) -> str:
    return "".join(f"# {line}\n" for line in lines)


def _optional_lines(variables: list[Variable], pick, how: str) -> list[str]:
    names = [v.name for v in variables if pick(v)]
    if not names:
        return []
    return [f"Optional ({how}), may be left out: " + ", ".join(names)]


def _continued(parts: list[str]) -> list[str]:
    """A shell command as comment lines, continued with backslashes when long."""
    if len(" ".join(parts)) <= 90:
        return ["  " + " ".join(parts)]
    return [("  " if i == 0 else "      ") + part + (" \\" if i < len(parts) - 1 else "")
            for i, part in enumerate(parts)]


def _local_storage_warning(job: Job) -> list[str]:
    if job.storage.is_remote:
        return []
    return [f"storage.url is local ({job.storage.url}): checkpoints die with the machine; "
            "use s3://... to resume after a preemption."]
