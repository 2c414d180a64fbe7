"""``submit --to local`` in container mode against a fake ``docker`` (fake_bin/
fake_docker.py: records every argv, the env file's mode and content while ``run`` reads
it, and keeps container state in files), and how the mode is chosen."""

import json
import os
import shlex
import stat
import sys
from pathlib import Path

import pytest

from runner.exit_codes import ExitCode
from runner.job import load_job
from runner.provision.base import Instance, Phase, ProvisionError, UnhealthyHost
from runner.provision.container import LocalHost, choose_mode
from runner.provision.docker import DockerProvider
from runner.provision.jobs import make_provider, spec_factory
from runner.provision.local import LocalProvider
from runner.provision.managed import ManagedJob
from runner.provision.policy import Cause, Observation, State, attempt_end
from runner.provision.registry import JobRecord, job_dir, load_record

FAKES = Path(__file__).parent / "fake_bin"
IMAGE = "ghcr.io/ten-runner/ten-runner:0.1"
JOB = f"""\
name: tiny-box
model: {{arch: ten, preset: tiny, d_model: 32}}
data: {{dataset: ./data/x.jsonl}}
train: {{max_steps: 5, device: DEVICE}}
storage:
  url: 's3://${{TEN_BUCKET}}/runs'
  endpoint_url: ENDPOINT
resources: {{image: {IMAGE}, max_restarts: 2}}
"""
ENV = {"TEN_BUCKET": "bkt", "AWS_ACCESS_KEY_ID": "AKIAFAKEKEYID0000001",
       "AWS_SECRET_ACCESS_KEY": "s3cr3t value with spaces", "HF_TOKEN": "hf_tok3n",
       "UNRELATED_SECRET": "do-not-send-me"}
SECRETS = [ENV[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN",
                            "UNRELATED_SECRET")]


class Docker:
    """The fake docker on PATH and what it recorded."""

    def __init__(self, root: Path, monkeypatch):
        self.mp, self.fake, self.bin = monkeypatch, root / "fake", root / "bin"
        self.fake.mkdir()
        self.bin.mkdir()
        (self.bin / "docker").write_text(
            f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
            f"{shlex.quote(str(FAKES / 'fake_docker.py'))} \"$@\"\n")
        (self.bin / "docker").chmod(0o755)
        monkeypatch.setenv("PATH", f"{self.bin}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("FAKE_DIR", str(self.fake))
        for key in ("FAKE_FAIL", "FAKE_RUN_EXITS", "TEN_LOCAL_MODE"):
            monkeypatch.delenv(key, raising=False)

    def calls(self, command: str | None = None) -> list[dict]:
        path = self.fake / "docker.jsonl"
        rows = [json.loads(line) for line in path.read_text().splitlines()] \
            if path.exists() else []
        return [r for r in rows if command is None or r["argv"][0] == command]

    def container(self, name: str) -> Path:
        return self.fake / "containers" / f"{name}.json"

    def set(self, name: str, **state) -> None:
        path = self.container(name)
        path.write_text(json.dumps({**json.loads(path.read_text()), **state}))


@pytest.fixture
def docker(tmp_path, monkeypatch):
    monkeypatch.setenv("TEN_RUNNER_HOME", str(tmp_path / "home"))
    return Docker(tmp_path, monkeypatch)


def submitted(tmp_path: Path, device="cuda", endpoint="''", url=None,
              job_id="tiny-box-0a1b2c") -> tuple[JobRecord, object]:
    """A job record and its 0600 copy, as submit_managed leaves them."""
    text = JOB.replace("DEVICE", device).replace("ENDPOINT", endpoint)
    if url:
        text = text.replace("'s3://${TEN_BUCKET}/runs'", url)
    directory = job_dir(job_id)
    directory.mkdir(parents=True)
    copy = directory / "job.yaml"
    copy.write_text(text)
    copy.chmod(0o600)
    record = JobRecord(job_id=job_id, job_name="tiny-box", target="local",
                       state=State.PENDING.value,
                       details={"job_file": str(copy), "cwd": str(tmp_path), "max_restarts": 2})
    record.save()
    return record, load_job(copy, env=ENV, check_model=False)


def launch(tmp_path, device="cuda", attempt=1):
    record, job = submitted(tmp_path, device)
    provider = DockerProvider(LocalHost(), job, ENV)
    return provider, provider.launch(spec_factory(record, job)(attempt)), record


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_launch_runs_the_image_with_the_env_file_and_the_job_copy(tmp_path, docker, device):
    provider, inst, record = launch(tmp_path, device)
    name = "ten-tiny-box-0a1b2c-1"
    env_path = record.dir / "attempt-1.env"
    (run,) = docker.calls("run")
    gpus = ["--gpus", "all"] if device == "cuda" else []
    assert run["argv"] == ["run", "-d", "--name", name, *gpus, "--stop-timeout", "110",
                           "--shm-size", "16g", "--env-file", str(env_path),
                           "-v", "ten-cache:/cache",
                           "-v", f"{record.dir / 'container-job.yaml'}:/job/job.yaml:ro",
                           IMAGE, "run", "/job/job.yaml"]
    assert "--restart" not in run["argv"]
    assert run["env_file_mode"] == 0o600 and not env_path.exists()
    assert run["env_file"].splitlines() == [
        f"{k}={ENV[k]}" for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN",
                                  "TEN_BUCKET")] + [
        "TEN_RUNNER_JOB_ID=tiny-box-0a1b2c", "TEN_RUNNER_ATTEMPT=1"]
    assert run["job_yaml_mode"] == 0o644  # the image's user can read it ...
    assert stat.S_IMODE(record.dir.stat().st_mode) == 0o700  # ... nobody else can
    assert stat.S_IMODE((record.dir / "job.yaml").stat().st_mode) == 0o600
    assert (record.dir / "container-job.yaml").read_bytes() == \
        (record.dir / "job.yaml").read_bytes()
    for call in docker.calls():
        for secret in SECRETS:
            assert secret not in " ".join(call["argv"])
    assert (inst.id, inst.zone, inst.details["mode"], inst.details["container"]) == \
        (name, "local", "container", name)
    assert inst.details["container_id"] == "4f" * 32
    assert json.loads(json.dumps(inst.to_dict())) == inst.to_dict()  # the record keeps it
    for secret in SECRETS:
        assert secret not in json.dumps(inst.to_dict())


@pytest.mark.parametrize("state, phase, code, why", [
    ({"status": "created"}, Phase.PENDING, None, ""),
    ({"status": "running"}, Phase.RUNNING, None, ""),
    ({"status": "exited", "exit_code": 0}, Phase.EXITED, 0, ""),
    ({"status": "exited", "exit_code": 2}, Phase.EXITED, 2, ""),
    ({"status": "exited", "exit_code": 75}, Phase.EXITED, 75, ""),
    ({"status": "exited", "exit_code": 1, "oom_killed": True}, Phase.EXITED, 1,
     "out of memory"),
    ({"status": "exited", "exit_code": 137}, Phase.PREEMPTED, 137, "SIGKILL"),
    ({"status": "exited", "exit_code": 137, "oom_killed": True}, Phase.PREEMPTED, 137,
     "OOM"),
    ({"status": "exited", "exit_code": 143}, Phase.PREEMPTED, 143, "SIGTERM"),
    ({"status": "dead", "exit_code": 139}, Phase.EXITED, 139, ""),  # SIGSEGV: a crash
])
def test_poll_maps_the_container_state(tmp_path, docker, state, phase, code, why):
    provider, inst, _ = launch(tmp_path)
    docker.set(inst.id, **state)
    status = provider.poll(inst)
    assert (status.phase, status.exit_code) == (phase, code) and why in status.reason


@pytest.mark.parametrize("code, cause", [(0, Cause.DONE), (2, Cause.FATAL),
                                         (75, Cause.PREEMPTED), (137, Cause.PREEMPTED),
                                         (1, Cause.RETRY)])
def test_the_policy_reads_the_polled_exit(tmp_path, docker, code, cause):
    provider, inst, _ = launch(tmp_path)
    docker.set(inst.id, status="exited", exit_code=code)
    status = provider.poll(inst)
    assert attempt_end(Observation.polled(status.phase, status.exit_code, None))[:2] == \
        (cause, code)


def test_poll_of_a_removed_container_is_gone_and_a_broken_docker_raises(tmp_path, docker):
    provider, inst, _ = launch(tmp_path)
    docker.container(inst.id).unlink()
    assert provider.poll(inst).phase == Phase.GONE
    docker.mp.setenv("PATH", str(tmp_path / "empty"))
    with pytest.raises(ProvisionError, match="not on PATH"):
        provider.poll(inst)  # the loop reads this as "cannot observe it for now"


def test_terminate_stops_keeps_the_logs_removes_and_is_idempotent(tmp_path, docker):
    provider, inst, record = launch(tmp_path)
    (docker.fake / "containers" / f"{inst.id}.log").write_text("step 1\nstep 2\n")
    assert provider.logs(inst) == "step 1\nstep 2\n"
    provider.terminate(inst)
    assert [c["argv"] for c in docker.calls() if c["argv"][0] in ("stop", "rm")] == [
        ["stop", "-t", "110", inst.id], ["rm", "-f", inst.id]]
    assert not docker.container(inst.id).exists()
    assert (record.dir / "attempt-1.log").read_text() == "step 1\nstep 2\n"
    assert provider.logs(inst) == "step 1\nstep 2\n"  # the saved copy
    provider.terminate(inst)  # again: nothing left, no error
    assert len(docker.calls("rm")) == 1
    # a restarted controller builds the same provider from the record and tears it down
    record.details["local_mode"] = "container"
    docker.mp.setenv("TEN_BUCKET", "bkt")
    make_provider(record, log=lambda line: None).terminate(Instance.from_dict(inst.to_dict()))


@pytest.mark.parametrize("fail, error, code", [
    ("docker-run-gpu", UnhealthyHost, ExitCode.UNHEALTHY_HOST),
    ("docker-run-image", ProvisionError, ExitCode.CONFIG),
])
def test_a_failed_start_leaves_no_container_and_no_env_file(tmp_path, docker, fail, error,
                                                            code):
    docker.mp.setenv("FAKE_FAIL", fail)
    with pytest.raises(error) as e:
        launch(tmp_path)
    assert e.value.exit_code == code
    assert not list((docker.fake / "containers").glob("*.json"))
    assert not list(job_dir("tiny-box-0a1b2c").glob("*.env"))
    for secret in SECRETS:
        assert secret not in e.value.message


def test_a_local_store_is_refused_in_container_mode(tmp_path, docker):
    record, job = submitted(tmp_path, url=str(tmp_path / "store"))
    with pytest.raises(ProvisionError, match="TEN_LOCAL_MODE=process"):
        DockerProvider(LocalHost(), job, ENV).launch(spec_factory(record, job)(1))
    assert docker.calls("run") == []


def test_managed_loop_relaunches_a_preempted_container(tmp_path, docker):
    docker.mp.setenv("FAKE_RUN_EXITS", "75,0")
    record, job = submitted(tmp_path, device="cpu")
    lines: list[str] = []
    loop = ManagedJob(record, DockerProvider(LocalHost(), job, ENV),
                      spec_factory(record, job), lambda: None, poll_s=0.01,
                      log=lines.append)
    record = loop.run()
    assert (record.state, record.exit_code) == ("SUCCEEDED", 0)
    assert (record.attempt, record.preemptions, record.restarts) == (2, 1, 0)
    names = [c["argv"][3] for c in docker.calls("run")]
    assert names == ["ten-tiny-box-0a1b2c-1", "ten-tiny-box-0a1b2c-2"]
    assert [c["argv"][-1] for c in docker.calls("rm")] == names
    assert not list((docker.fake / "containers").glob("*.json"))
    assert record.instance is None and not list(record.dir.glob("*.env"))


# -- which mode ----------------------------------------------------------------------------
def test_no_docker_on_path_means_a_plain_process(tmp_path, monkeypatch):
    monkeypatch.setenv("TEN_RUNNER_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TEN_LOCAL_MODE", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("TEN_BUCKET", "bkt")
    record, _ = submitted(tmp_path)
    lines: list[str] = []
    provider = make_provider(record, log=lines.append)
    assert isinstance(provider, LocalProvider)
    assert record.details["local_mode"] == "process"
    assert "docker is not on PATH" in lines[0] and "docker is not on PATH" in \
        record.history[-1]["reason"]


def test_usable_docker_means_the_container_and_the_choice_sticks(tmp_path, docker):
    docker.mp.setenv("TEN_BUCKET", "bkt")
    record, _ = submitted(tmp_path)
    lines: list[str] = []
    assert isinstance(make_provider(record, log=lines.append), DockerProvider)
    assert docker.calls("info") and len(lines) == 1
    docker.mp.setenv("FAKE_FAIL", "docker-info")  # a restarted controller: same mode
    again = make_provider(load_record(record.job_id), log=lines.append)
    assert isinstance(again, DockerProvider) and len(lines) == 1


@pytest.mark.parametrize("env, kw, mode, why", [
    ({"FAKE_FAIL": "docker-info"}, {}, "process", "docker info failed"),
    ({}, {"url": "/tmp/store"}, "process", "local path"),
    ({}, {"endpoint": "http://127.0.0.1:9000"}, "process", "loopback"),
    ({}, {"endpoint": "http://localhost:9000"}, "process", "loopback"),
    ({}, {"endpoint": "https://minio.lan:9000"}, "container", "usable"),
    ({"TEN_LOCAL_MODE": "process"}, {}, "process", "TEN_LOCAL_MODE"),
    ({"TEN_LOCAL_MODE": "container", "FAKE_FAIL": "docker-info"}, {"url": "/tmp/s"},
     "container", "TEN_LOCAL_MODE"),
])
def test_choose_mode(tmp_path, docker, env, kw, mode, why):
    for key, value in env.items():
        docker.mp.setenv(key, value)
    _, job = submitted(tmp_path, **kw)
    got, reason = choose_mode(job)
    assert got == mode and why in reason


def test_a_bad_forced_mode_is_refused(tmp_path, docker):
    docker.mp.setenv("TEN_LOCAL_MODE", "vm")
    _, job = submitted(tmp_path)
    with pytest.raises(ProvisionError, match="TEN_LOCAL_MODE must be"):
        choose_mode(job)
