"""`ten-runner export`: SkyPilot task and Kubernetes manifests from a job file.

Checked by structure against the documented field names everywhere, and against the real
schemas where the packages are importable (skypilot, kubernetes-validate: neither is a
project dependency, so those two tests skip when the import fails)."""

import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml

from runner.exit_codes import ExitCode
from runner.job import load_job
from runner.provision.base import ProvisionError
from runner.provision.manifests import _heredoc, export_job, job_references

ROOT = Path(__file__).resolve().parents[3]
EXAMPLES = ["l40s-small-32k", "tiny-cpu"]
SECRET = "some-value-Zq81"  # an AWS_SECRET_ACCESS_KEY that must appear nowhere

# SkyPilot's task and resources fields (docs: reference/yaml-spec; sky.utils.schemas).
SKY_TASK = {"name", "workdir", "num_nodes", "resources", "envs", "secrets", "file_mounts",
            "setup", "run", "config", "volumes", "service", "pool", "event_callback"}
SKY_RESOURCES = {"infra", "cloud", "region", "zone", "accelerators", "accelerator_args", "cpus",
                 "memory", "instance_type", "use_spot", "disk_size", "disk_tier",
                 "network_tier", "image_id", "ports", "labels", "autostop", "any_of",
                 "ordered", "job_recovery"}
SKY_RECOVERY = {"strategy", "max_restarts_on_errors", "recover_on_exit_codes"}
# Kubernetes field names (API reference, batch/v1 Job and core/v1 PodSpec/Container).
K8S_JOB_SPEC = {"activeDeadlineSeconds", "backoffLimit", "backoffLimitPerIndex",
                "completionMode", "completions", "managedBy", "manualSelector",
                "maxFailedIndexes", "parallelism", "podFailurePolicy", "podReplacementPolicy",
                "selector", "successPolicy", "suspend", "template", "ttlSecondsAfterFinished"}
K8S_POD_SPEC = {"restartPolicy", "terminationGracePeriodSeconds", "containers", "volumes",
                "nodeSelector", "tolerations", "affinity", "serviceAccountName",
                "imagePullSecrets", "securityContext", "priorityClassName"}
K8S_CONTAINER = {"name", "image", "command", "args", "env", "envFrom", "resources",
                 "volumeMounts", "workingDir", "imagePullPolicy", "ports", "securityContext",
                 "lifecycle", "livenessProbe", "readinessProbe", "startupProbe", "stdin",
                 "tty", "terminationMessagePath", "terminationMessagePolicy", "volumeDevices",
                 "resizePolicy", "restartPolicy"}


def job_path(name: str) -> Path:
    return ROOT / "jobs" / f"{name}.yaml"


def export(path: Path, target: str, **kw) -> str:
    return export_job(load_job(path, check_model=False), path, target, **kw)


def sky(path: Path, **kw) -> dict:
    return yaml.safe_load(export(path, "skypilot", **kw))


def k8s(path: Path, **kw) -> tuple[dict | None, dict]:
    docs = list(yaml.safe_load_all(export(path, "k8s", **kw)))
    by_kind = {d["kind"]: d for d in docs}
    assert set(by_kind) <= {"ConfigMap", "Job"} and len(by_kind) == len(docs)
    return by_kind.get("ConfigMap"), by_kind["Job"]


def variant(tmp_path: Path, name: str, replace: dict[str, str]) -> Path:
    """An example job with some lines changed (the file is what gets embedded)."""
    text = job_path(name).read_text()
    for old, new in replace.items():
        assert old in text
        text = text.replace(old, new)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


@pytest.fixture(autouse=True)
def shell(monkeypatch):
    """This shell has the AWS keys (one a secret value) and no job variables."""
    for name in ("TEN_BUCKET", "S3_ENDPOINT_URL", "AWS_SESSION_TOKEN", "HF_TOKEN",
                 "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_S3", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAEXAMPLEKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)


# -- both targets, both example jobs -------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_skypilot_task_has_the_documented_shape(name):
    path = job_path(name)
    job = load_job(path, check_model=False)
    task = sky(path)
    assert set(task) <= SKY_TASK and set(task["resources"]) <= SKY_RESOURCES
    res = task["resources"]
    assert task["name"] == job.name
    assert res["use_spot"] is job.resources.spot
    assert res["image_id"] == f"docker:{job.resources.image}"
    assert res["job_recovery"] == {"strategy": "FAILOVER",
                                   "max_restarts_on_errors": job.resources.max_restarts,
                                   "recover_on_exit_codes": [75]}
    assert set(res["job_recovery"]) <= SKY_RECOVERY
    assert task["run"].rstrip().endswith("exec ten-runner run ~/ten-job/job.yaml")
    for section in ("envs", "secrets"):
        for key, value in task.get(section, {}).items():
            assert key.isidentifier() and (value is None or isinstance(value, str))


@pytest.mark.parametrize("name", EXAMPLES)
def test_k8s_job_has_the_documented_shape(name):
    path = job_path(name)
    job = load_job(path, check_model=False)
    config_map, kjob = k8s(path)
    assert kjob["apiVersion"] == "batch/v1" and config_map["apiVersion"] == "v1"
    assert kjob["metadata"]["labels"]["ten-runner/job"] == job.name
    spec = kjob["spec"]
    assert set(spec) <= K8S_JOB_SPEC
    assert spec["backoffLimit"] == job.resources.max_restarts
    assert spec["ttlSecondsAfterFinished"] > 0
    rules = spec["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [
        {"type": "DisruptionTarget", "status": "True"}]}  # preemption is not counted
    fail_fast = [r for r in rules if r["action"] == "FailJob"]
    assert fail_fast[0]["onExitCodes"]["values"] == [2, 3, 9, 10]
    assert fail_fast[0]["onExitCodes"]["operator"] == "In"

    template = spec["template"]
    assert template["metadata"]["labels"]["ten-runner/job"] == job.name
    pod = template["spec"]
    assert set(pod) <= K8S_POD_SPEC
    assert pod["restartPolicy"] == "Never"  # required with a podFailurePolicy
    assert pod["terminationGracePeriodSeconds"] == 120
    (container,) = pod["containers"]
    assert set(container) <= K8S_CONTAINER
    assert container["image"] == job.resources.image
    assert "command" not in container  # the image's ENTRYPOINT: tini -- ten-runner
    assert container["args"] == ["run", "/job/job.yaml"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes[mounts["/cache"]]["emptyDir"] == {}
    assert volumes[mounts["/job"]]["configMap"]["name"] == config_map["metadata"]["name"]
    for var in container["env"]:
        assert set(var) in ({"name", "value"}, {"name", "valueFrom"})
        if "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            assert ref["name"] == f"ten-{job.name}-secrets" and ref["key"] == var["name"]
            assert set(ref) <= {"name", "key", "optional"}


def test_gpu_count_spot_and_restarts_map_to_each_target(tmp_path):
    path = variant(tmp_path, "l40s-small-32k", {"gpus: 1": "gpus: 4\n  max_restarts: 7"})
    res = sky(path)["resources"]
    assert res["accelerators"] == "L40S:4" and res["use_spot"] is True
    assert res["job_recovery"]["max_restarts_on_errors"] == 7
    _, kjob = k8s(path)
    (container,) = kjob["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"limits": {"nvidia.com/gpu": 4}}
    assert kjob["spec"]["backoffLimit"] == 7
    assert "spot" not in yaml.safe_dump(kjob).lower()  # a node-pool concern, see the header


def test_the_accelerator_is_the_jobs(tmp_path):
    """SkyPilot's accelerator was fixed to L40S (issue 44): it is resources.accelerator."""
    path = variant(tmp_path, "l40s-small-32k", {"gpus: 1": "gpus: 2\n  accelerator: H100"})
    assert sky(path)["resources"]["accelerators"] == "H100:2"
    assert "nvidia.com/gpu.product: NVIDIA-H100-80GB-HBM3" in export(path, "k8s")


def test_a_local_dataset_is_mounted_and_the_run_pointed_at_it(tmp_path, monkeypatch):
    """A local dataset got no file_mounts (issue 44): the task copies it (a glob: its
    folder) and the tokenizer under ~/ten-data/, and the run script's --set points the
    embedded job there, the job file itself unchanged."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "a.txt").write_text("text")
    (tmp_path / "tok.model").write_bytes(b"x")
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "job.yaml"
    path.write_text("name: mine\nmodel: {preset: tiny}\n"
                    "data: {dataset: 'corpus/*.txt', tokenizer: {path: ./tok.model}}\n"
                    "train: {max_steps: 10}\nresources: {gpus: 1}\n")
    task = sky(path)
    assert task["file_mounts"] == {"~/ten-data/0-corpus": str(corpus),
                                   "~/ten-data/1-tok.model": str(tmp_path / "tok.model")}
    last = task["run"].rstrip().splitlines()[-1]
    assert last == ('exec ten-runner run ~/ten-job/job.yaml'
                    ' --set "data.dataset=$HOME/ten-data/0-corpus/*.txt"'
                    ' --set "data.tokenizer.path=$HOME/ten-data/1-tok.model"')
    assert "file_mounts" not in export(path, "k8s")  # Kubernetes: still warned about
    from runner.provision.manifests import laptop_values

    job = load_job(path, check_model=False)
    assert not [w for w in laptop_values(job, "skypilot") if w.startswith("data.")]
    assert len([w for w in laptop_values(job, "k8s") if w.startswith("data.")]) == 2


def test_a_cpu_job_asks_for_no_gpu():
    task = sky(job_path("tiny-cpu"))
    assert "accelerators" not in task["resources"] and task["resources"]["use_spot"] is False
    _, kjob = k8s(job_path("tiny-cpu"))
    (container,) = kjob["spec"]["template"]["spec"]["containers"]
    assert "resources" not in container and "nvidia.com/gpu" not in yaml.safe_dump(kjob)


# -- the job file travels as written ---------------------------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_the_configmap_holds_the_job_file_verbatim(name):
    config_map, _ = k8s(job_path(name))
    assert config_map["data"]["job.yaml"] == job_path(name).read_text()


@pytest.mark.parametrize("name", EXAMPLES)
def test_the_skypilot_run_script_writes_the_job_file_verbatim(name, tmp_path):
    """Run the task's own script with bash (a stand-in ten-runner prints the file it is
    given): quoting must keep ${VAR}, $HOME and backslashes exactly as written."""
    path = variant(tmp_path, name, {"\nname:": '\n# $HOME `id` \\n "$(x)" ${A:-b} $${C}\nname:'})
    script = sky(path)["run"]  # writes under ~: the image's user cannot create /job
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "ten-runner"
    fake.write_text('#!/bin/sh\n[ "$1" = run ] && cat "$2"\n')
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path / "home")}
    out = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True,
                         check=True).stdout
    assert out == path.read_text()
    assert (tmp_path / "home" / "ten-job" / "job.yaml").read_text() == path.read_text()


def test_the_heredoc_delimiter_never_occurs_in_the_text():
    text = "a: |\n  x\nEND_OF_JOB_YAML\nEND_OF_JOB_YAML_\n"
    lines = _heredoc(text, "/job/job.yaml")
    end = lines[-1]
    assert lines[0] == f"cat > /job/job.yaml <<'{end}'" and end not in text.splitlines()
    assert "\n".join(lines[1:-1]) + "\n" == text


def test_set_overrides_are_written_into_the_embedded_job(tmp_path):
    """``export --set`` as ``run --set``: the job the container runs has the override (the
    option did not exist); a job read from --job-url cannot take one."""
    from click.testing import CliRunner

    from runner.cli import cli

    result = CliRunner().invoke(cli, ["export", str(job_path("tiny-cpu")), "--to", "k8s",
                                      "--set", "train.max_steps=77"])
    assert result.exit_code == 0, result.output
    config_map = next(d for d in yaml.safe_load_all(result.stdout) if d["kind"] == "ConfigMap")
    embedded = tmp_path / "embedded.yaml"
    embedded.write_text(config_map["data"]["job.yaml"])
    assert load_job(embedded, check_model=False).train.max_steps == 77
    result = CliRunner().invoke(cli, ["export", str(job_path("tiny-cpu")), "--to", "k8s",
                                      "--job-url", "s3://b/job.yaml", "--set",
                                      "train.max_steps=77"])
    assert result.exit_code == ExitCode.CONFIG
    assert "--set cannot change the job read from --job-url" in result.output


def test_a_job_url_embeds_nothing_and_runs_the_url():
    url = "s3://my-bucket/jobs/l40s-small-32k-3f9a1c/job.yaml"
    path = job_path("l40s-small-32k")
    assert sky(path, job_url=url)["run"] == f"exec ten-runner run {url}\n"
    config_map, kjob = k8s(path, job_url=url)
    assert config_map is None
    (container,) = kjob["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["run", url]
    assert "/job" not in {m["mountPath"] for m in container["volumeMounts"]}
    # A job with local storage fetched from a bucket still needs the AWS keys to fetch it.
    tiny = sky(job_path("tiny-cpu"), job_url=url)
    assert set(tiny["secrets"]) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}


# -- variables and secrets ----------------------------------------------------------------

# A field referencing a secret-named variable, added to each example job.
WITH_TOKEN = {
    "l40s-small-32k": {"endpoint_url: '${S3_ENDPOINT_URL:-}'":
                       "endpoint_url: '${S3_ENDPOINT_URL:-}'\n  region: '${MY_API_TOKEN:-}'"},
    "tiny-cpu": {"storage: {url: ./runs}": "storage: {url: ./runs, region: '${MY_API_TOKEN:-}'}"},
}


@pytest.mark.parametrize("target", ["skypilot", "k8s"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_no_secret_value_reaches_the_output(name, target, tmp_path, monkeypatch):
    monkeypatch.setenv("AWS_SESSION_TOKEN", "session-" + SECRET)
    monkeypatch.setenv("MY_API_TOKEN", "token-" + SECRET)
    path = variant(tmp_path, name, WITH_TOKEN[name])
    assert load_job(path, check_model=False).storage.region == "token-" + SECRET
    out = export(path, target)
    assert SECRET not in out and "AKIAEXAMPLEKEY" not in out
    assert "'${MY_API_TOKEN:-}'" in out  # the file as written, unresolved
    if target == "skypilot":
        assert yaml.safe_load(out)["secrets"]["MY_API_TOKEN"] is None  # --secret supplies it
    else:
        (container,) = list(yaml.safe_load_all(out))[-1]["spec"]["template"]["spec"][
            "containers"]
        ref = {e["name"]: e for e in container["env"]}["MY_API_TOKEN"]["valueFrom"]
        assert ref["secretKeyRef"]["key"] == "MY_API_TOKEN"


def test_every_variable_travels_by_name_in_skypilot_and_by_ref_in_k8s(monkeypatch):
    monkeypatch.setenv("TEN_BUCKET", "my-bucket")  # set here, not secret: still a name
    path = job_path("l40s-small-32k")
    task = sky(path)
    assert task["secrets"] == {"AWS_ACCESS_KEY_ID": None, "AWS_SECRET_ACCESS_KEY": None}
    assert task["envs"] == {"TEN_BUCKET": None}  # `sky jobs launch --env TEN_BUCKET`
    assert "--env TEN_BUCKET" in export(path, "skypilot")
    _, kjob = k8s(path)
    (container,) = kjob["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e for e in container["env"]}
    assert env["TEN_BUCKET"]["valueFrom"]["secretKeyRef"] == {  # the job has a default
        "name": "ten-l40s-small-32k-secrets", "key": "TEN_BUCKET", "optional": True}
    secret_ref = env["AWS_SECRET_ACCESS_KEY"]["valueFrom"]["secretKeyRef"]
    assert secret_ref == {"name": "ten-l40s-small-32k-secrets", "key": "AWS_SECRET_ACCESS_KEY"}
    # Unset here, with a default in the job: optional, so the job's default applies.
    assert env["S3_ENDPOINT_URL"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert env["AWS_SESSION_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert env["HF_TOKEN"]["valueFrom"]["secretKeyRef"]["optional"] is True
    assert '--from-literal=TEN_BUCKET="$TEN_BUCKET"' in export(path, "k8s")  # set here


def test_a_job_reporting_to_wandb_asks_for_its_key_by_name(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_API_KEY", SECRET)
    path = variant(tmp_path, "l40s-small-32k", {"\nstorage:": "\nmonitor: {report_to: [wandb]}"
                                                              "\nstorage:"})
    task = sky(path)
    assert task["secrets"]["WANDB_API_KEY"] is None and SECRET not in export(path, "skypilot")
    assert "WANDB_API_KEY" not in sky(job_path("l40s-small-32k"))["secrets"]  # not asked


@pytest.mark.parametrize("target", ["skypilot", "k8s"])
def test_a_value_under_a_harmless_name_stays_out_too(target, tmp_path, monkeypatch):
    """A private value under a name no rule calls secret (a password in a URL was the
    case found): it was copied in (issue 23, fault 16). No ${VAR}'s value enters an
    export, whatever its name; nor the endpoint boto3 reads from this shell."""
    monkeypatch.setenv("DATASET_NAME", "private-org/" + SECRET)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://minio.internal:9000")
    path = variant(tmp_path, "l40s-small-32k", {"dataset: finewebedu":
                                                 "dataset: '${DATASET_NAME}'"})
    out = export(path, target)
    assert SECRET not in out and "minio.internal" not in out
    assert "DATASET_NAME" in out and "AWS_ENDPOINT_URL" in out  # by name


def test_a_variable_without_default_is_required(tmp_path, monkeypatch):
    path = variant(tmp_path, "l40s-small-32k", {"${TEN_BUCKET:-ten-runs}": "${TEN_BUCKET}"})
    monkeypatch.setenv("TEN_BUCKET", "b")
    job = load_job(path, check_model=False)
    monkeypatch.delenv("TEN_BUCKET")
    task = yaml.safe_load(export_job(job, path, "skypilot"))
    assert task["envs"] == {"TEN_BUCKET": None}  # sky: "--env TEN_BUCKET" is required
    kjob = list(yaml.safe_load_all(export_job(job, path, "k8s")))[1]
    (container,) = kjob["spec"]["template"]["spec"]["containers"]
    ref = {e["name"]: e for e in container["env"]}["TEN_BUCKET"]["valueFrom"]["secretKeyRef"]
    assert "optional" not in ref


def test_references_are_listed_by_the_job_loaders_own_substitution():
    text = ("name: x\nstorage:\n  url: 's3://${B}/${P:-runs}'\n  endpoint_url: '$${LIT}'\n"
            "data: {dataset: '${DS}', tokenizer: {path: '${HF_TOKEN:-}'}}\n")
    found = job_references(text)
    assert sorted(found) == ["B", "DS", "HF_TOKEN", "P"]  # $${ is a literal, not a reference
    assert (found["B"].required, found["P"].required, found["HF_TOKEN"].required) == \
        (True, False, False)
    assert found["HF_TOKEN"].secret and not found["B"].secret


def test_an_unknown_target_names_the_choices():
    path = job_path("tiny-cpu")
    with pytest.raises(ProvisionError) as err:
        export(path, "nomad")
    assert err.value.exit_code == ExitCode.CONFIG
    assert "'nomad'" in err.value.message and "skypilot, k8s" in err.value.message
    with pytest.raises(ProvisionError, match="s3://"):
        export(path, "k8s", job_url="https://example.com/job.yaml")


# -- the real schemas, where the packages are installed ------------------------------------

@pytest.mark.parametrize("name", EXAMPLES)
def test_skypilot_accepts_the_task(name, tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # sky writes ~/.sky on import
    sky_pkg = pytest.importorskip("sky")
    task = sky_pkg.Task.from_yaml_config(sky(job_path(name)))  # it consumes the dict
    assert task.name == name
    config = sky(job_path(name))
    config["resources"]["usespot"] = True  # and the same check does reject a typo
    with pytest.raises(Exception, match="use_spot"):
        sky_pkg.Task.from_yaml_config(config)


@pytest.mark.parametrize("job_url", [None, "s3://b/job.yaml"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_kubernetes_schema_accepts_the_manifests(name, job_url):
    kv = pytest.importorskip("kubernetes_validate")
    docs = list(yaml.safe_load_all(export(job_path(name), "k8s", job_url=job_url)))
    for version in ("1.29.0", "1.33.0"):  # podFailurePolicy is GA from 1.31, beta before
        for doc in docs:
            kv.validate(doc, version, strict=True)
    docs[-1]["spec"]["template"]["spec"]["containers"][0]["secretRef"] = {"name": "x"}
    with pytest.raises(kv.ValidationError):
        kv.validate(docs[-1], "1.33.0", strict=True)


def test_values_that_only_work_on_this_machine_are_warned_about(tmp_path, monkeypatch):
    """A /tmp dataset, a local store and a 127.0.0.1 endpoint export fine but cannot work
    in the container: `export` says so on stderr, the output stays the same."""
    from click.testing import CliRunner

    from runner.cli import cli
    from runner.provision.manifests import laptop_values

    monkeypatch.setenv("MINIO_URL", "http://127.0.0.1:9000")
    job = tmp_path / "laptop.yaml"
    job.write_text("name: laptop\nmodel: {preset: tiny}\n"
                   "data: {dataset: /tmp/my-docs.jsonl, tokenizer: {path: ./tok.model}}\n"
                   "train: {max_steps: 10}\nstorage: {url: ./runs, endpoint_url: '${MINIO_URL}'}\n")
    warnings = laptop_values(load_job(job, check_model=False))
    assert [w.split(" ", 1)[0] for w in warnings] == [
        "storage.url", "storage.endpoint_url", "data.dataset", "data.tokenizer.path"]
    assert "'${MINIO_URL}'" in warnings[1] and "127.0.0.1" not in warnings[1]
    out = CliRunner().invoke(cli, ["export", str(job), "--to", "k8s"])
    assert out.exit_code == 0, out.output
    assert out.stderr.count("warning: ") == 4
    # the GPU example is ready to export; the CPU one keeps its runs on the local disk
    assert laptop_values(load_job(job_path("l40s-small-32k"), check_model=False)) == []
    [local] = laptop_values(load_job(job_path("tiny-cpu"), check_model=False))
    assert local.startswith("storage.url './runs' is a path on the container's own disk")
