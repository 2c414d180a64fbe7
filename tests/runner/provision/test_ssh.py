"""``submit --to ssh://...`` against a sandbox host: a fake ``ssh`` that runs each remote
command string with a real shell (bash, and dash as a stricter POSIX sh) in a sandbox
home, and fake ``docker`` / ``nvidia-smi`` that record their argv. The remote PATH holds
only those fakes and a few real tools (``touch`` among them, so an injected
``$(touch pwned)`` would really leave a file)."""

import json
import os
import shlex
import shutil
import stat
import sys
from pathlib import Path

import pytest

from runner.exit_codes import ExitCode
from runner.job import load_job
from runner.provision.base import HostUnreachable, ProvisionError, UnhealthyHost
from runner.provision.env import env_file_text, job_env
from runner.provision.registry import load_record
from runner.provision.ssh import (
    CANCELLED,
    FAILED,
    RECOVERING,
    RUNNING,
    SUCCEEDED,
    TERMINAL,
    SshTarget,
    parse_target,
    ssh_cancel,
    ssh_logs,
    ssh_status,
    submit_ssh,
)

FAKES = Path(__file__).parent / "fake_bin"
TOOLS = ("cat", "mkdir", "rm", "rmdir", "touch", "echo", "ls", "true", "pwd", "env", "sh",
         "bash", "sleep", "id", "printf")
TARGET = "ssh://ubuntu@gpu-box:2222"
JOB = """\
# values a careless shell would run; the name itself is a slug
name: tiny-ssh
model: {arch: ten, preset: tiny, d_model: 32}
data:
  dataset: ./data/a b'; rm -rf ~; echo 'c $(touch pwned) `touch pwned` "q" $HOME.jsonl
  text_field: "it's \\"$(touch pwned)\\"  "{trailing spaces}
  cache_dir: /tmp/x $(touch pwned)
train: {max_steps: 5, device: {device}}
storage:
  url: 's3://${TEN_BUCKET}/runs'
  endpoint_url: '${S3_ENDPOINT_URL:-}'
  region: '$${NOT_A_REFERENCE}'
resources:
  image: ghcr.io/ten-runner/ten-runner:0.1
  max_restarts: 2
  instance_type: "x'; touch pwned; '"
"""
ENV = {
    "TEN_BUCKET": "bkt",
    "AWS_ACCESS_KEY_ID": "AKIAFAKEKEYID0000001",
    "AWS_SECRET_ACCESS_KEY": "s3cr3t/'; touch pwned; echo '$(touch pwned)`touch pwned`\"q\" x=y  ",
    "HF_TOKEN": "hf_tok$en with spaces",
    "UNRELATED_SECRET": "do-not-send-me",
    "NOT_A_REFERENCE": "escaped-so-not-sent",
    "HOME": "/home/local-user",
}
SECRETS = [ENV[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN",
                            "UNRELATED_SECRET")]


class Host:
    """The sandbox "remote" machine and what its fakes recorded."""

    def __init__(self, root: Path, monkeypatch):
        self.root, self.mp = root, monkeypatch
        self.fake = root / "fake"
        self.home = root / "remote home $(touch pwned) 'q'"
        self.bin = root / "remote_bin"
        system = root / "sys_bin"
        for d in (self.fake, self.home, self.bin, system):
            d.mkdir()
        for tool in TOOLS:
            (system / tool).symlink_to(shutil.which(tool))
        self.wrap(root / "ssh", "fake_ssh.py")
        self.wrap(self.bin / "docker", "fake_docker.py")
        self.wrap(self.bin / "nvidia-smi", "fake_nvidia_smi.py")
        for key, value in {"TEN_SSH": str(root / "ssh"), "FAKE_DIR": str(self.fake),
                           "FAKE_REMOTE_HOME": str(self.home), "FAKE_SSH_PORT": "2222",
                           "FAKE_SSH_DEST": "ubuntu@gpu-box",
                           "FAKE_REMOTE_PATH": f"{self.bin}:{system}",
                           "TEN_RUNNER_HOME": str(root / "local ten-runner")}.items():
            monkeypatch.setenv(key, value)
        for key in ("FAKE_FAIL", "FAKE_SSH_DOWN", "FAKE_SSH_SHELL"):
            monkeypatch.delenv(key, raising=False)

    @staticmethod
    def wrap(path: Path, script: str) -> None:
        path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                        f"{shlex.quote(str(FAKES / script))} \"$@\"\n")
        path.chmod(0o755)

    def fail(self, *what: str) -> None:
        self.mp.setenv("FAKE_FAIL", ",".join(what))

    def calls(self, tool: str) -> list[dict]:
        path = self.fake / f"{tool}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] \
            if path.exists() else []

    def docker(self, command: str) -> list[dict]:
        return [c for c in self.calls("docker") if c["argv"][0] == command]

    def container(self, name: str) -> Path:
        return self.fake / "containers" / f"{name}.json"

    def set_container(self, name: str, **state) -> None:
        path = self.container(name)
        path.write_text(json.dumps({**json.loads(path.read_text()), **state}))

    def pwned(self) -> list[Path]:
        return [p for p in self.root.rglob("*pwned*") if "pwned" in p.name
                and p.parent != self.root]  # the home's own name holds the word


@pytest.fixture
def host(tmp_path, monkeypatch):
    return Host(tmp_path, monkeypatch)


def write_job(tmp_path: Path, device="cuda", **changes) -> Path:
    text = JOB.replace("{device}", device).replace("{trailing spaces}", "   ")
    for old, new in changes.items():
        text = text.replace(old, new)
    path = tmp_path / "job.yaml"
    path.write_bytes(text.encode())
    return path


def load(path: Path):
    return load_job(path, env=ENV, check_model=False)


def no_secret_in(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


# -- the target ---------------------------------------------------------------------------


@pytest.mark.parametrize("text, want", [
    ("ssh://ubuntu@gpu-box", SshTarget("ubuntu", "gpu-box", 22)),
    ("ssh://ubuntu@10.0.0.5:2222", SshTarget("ubuntu", "10.0.0.5", 2222)),
    ("SSH://a.b_c@host.example.com:22/", SshTarget("a.b_c", "host.example.com", 22)),
    ("ssh://root@[2001:db8::1]:2200", SshTarget("root", "2001:db8::1", 2200)),
])
def test_parse_target(text, want):
    got = parse_target(text)
    assert got == want
    assert parse_target(str(got)) == got


@pytest.mark.parametrize("text, says", [
    ("gpu-box", "not an ssh:// target"),
    ("http://ubuntu@gpu-box", "not an ssh:// target"),
    ("ssh://gpu-box", "cannot read"),
    ("ssh://@gpu-box", "no user"),
    ("ssh://-oProxyCommand=touch@gpu-box", "not a valid user"),
    ("ssh://ubuntu@-oProxyCommand=x", "not a host name"),
    ("ssh://ubuntu@gpu box", "not a host name"),
    ("ssh://ubuntu@host;id", "not a host name"),
    ("ssh://ubuntu@[not:v6:zz]", "not an IPv6"),
    ("ssh://ubuntu@gpu-box:0", "port"),
    ("ssh://ubuntu@gpu-box:70000", "port"),
    ("ssh://ubuntu@gpu-box:22x", "port"),
    ("ssh://ubuntu@gpu-box/path", "cannot read"),
    ("ssh://ubuntu:hunter2pw@gpu-box", "no password"),
])
def test_parse_target_rejects(text, says):
    with pytest.raises(ProvisionError) as e:
        parse_target(text)
    message = e.value.message
    assert says in message and "ssh://user@host[:port]" in message
    assert "hunter2pw" not in message and e.value.exit_code == ExitCode.CONFIG


# -- what goes to the container -----------------------------------------------------------


def test_job_env_takes_references_and_standard_credentials(tmp_path):
    job = load(write_job(tmp_path))
    assert job_env(job, ENV) == {k: ENV[k] for k in ("AWS_ACCESS_KEY_ID",
                                                     "AWS_SECRET_ACCESS_KEY", "HF_TOKEN",
                                                     "TEN_BUCKET")}
    with_endpoint = {**ENV, "S3_ENDPOINT_URL": "http://minio:9000", "AWS_REGION": "eu-west-1"}
    assert set(job_env(job, with_endpoint)) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                                                "AWS_REGION", "HF_TOKEN", "S3_ENDPOINT_URL",
                                                "TEN_BUCKET"}


def test_env_file_is_verbatim_and_refuses_what_docker_cannot_read():
    value = ENV["AWS_SECRET_ACCESS_KEY"]
    assert env_file_text({"A": value, "B": "", "C": " lead # x"}) == \
        f"A={value}\nB=\nC= lead # x\n".encode()
    for bad in ("line1\nsecretvalue", "cr\rsecretvalue", "nul\0secretvalue",
                "bad\udcffsecretvalue"):
        with pytest.raises(ProvisionError) as e:
            env_file_text({"MY_TOKEN": bad})
        assert "MY_TOKEN" in e.value.message and "secretvalue" not in e.value.message


def test_local_storage_is_refused_before_anything_runs(tmp_path, host):
    path = write_job(tmp_path, **{"url: 's3://${TEN_BUCKET}/runs'": "url: ./runs"})
    with pytest.raises(ProvisionError) as e:
        submit_ssh(load(path), path, TARGET, env=ENV)
    assert "s3://" in e.value.message and e.value.exit_code == ExitCode.CONFIG
    assert host.calls("ssh") == []


def test_unsendable_value_is_refused_before_anything_runs(tmp_path, host):
    path = write_job(tmp_path)
    with pytest.raises(ProvisionError) as e:
        submit_ssh(load(path), path, TARGET, env={**ENV, "HF_TOKEN": "two\nlines-secret"})
    assert "HF_TOKEN" in e.value.message and "lines-secret" not in e.value.message
    assert host.calls("ssh") == []


# -- submit -------------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_submit_starts_the_container_without_exposing_secrets(tmp_path, host, shell):
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    host.mp.setenv("FAKE_SSH_SHELL", shutil.which(shell))
    path = write_job(tmp_path)
    record = submit_ssh(load(path), path, TARGET, env=ENV)

    job_id, container = record.job_id, f"ten-{record.job_id}"
    remote_dir = host.home / ".ten-runner" / "jobs" / job_id
    assert record.target == TARGET and record.state == RUNNING and record.attempt == 1
    assert record.details == {"host": "gpu-box", "port": 2222, "user": "ubuntu",
                              "container": container, "remote_dir": str(remote_dir),
                              "image": "ghcr.io/ten-runner/ten-runner:0.1", "gpu": True,
                              "cache_volume": "ten-cache"}
    assert load_record(job_id).details == record.details

    # The job file arrived byte for byte, readable by the image's user, in folders only
    # the ssh user can enter; the env file is gone.
    assert (remote_dir / "job.yaml").read_bytes() == path.read_bytes()
    for folder in (host.home / ".ten-runner", remote_dir.parent, remote_dir):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not (remote_dir / "env").exists()

    assert [c["argv"] for c in host.calls("nvidia-smi")] == [["-L"]]
    run = host.docker("run")
    assert len(run) == 1 and run[0]["job_yaml_mode"] == 0o644
    assert run[0]["argv"] == [
        "run", "-d", "--name", container, "--gpus", "all", "--restart", "on-failure:2",
        "--stop-timeout", "110", "--shm-size", "16g", "--env-file", f"{remote_dir}/env",
        "-v", "ten-cache:/cache", "-v", f"{remote_dir}/job.yaml:/job/job.yaml:ro",
        "ghcr.io/ten-runner/ten-runner:0.1", "run", "/job/job.yaml"]
    # While docker read it, the env file was 0600 and held the values verbatim.
    assert run[0]["env_file_mode"] == 0o600
    assert run[0]["env_file"] == "".join(f"{k}={ENV[k]}\n" for k in (
        "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "TEN_BUCKET"))

    # No secret on any command line (ssh's, and everything the host ran) or in the record.
    ssh_calls = host.calls("ssh")
    assert ssh_calls and all(c["argv"][:2] == ["-o", "BatchMode=yes"] for c in ssh_calls)
    no_secret_in(*(json.dumps(c["argv"]) for tool in ("ssh", "docker", "nvidia-smi")
                   for c in host.calls(tool)))
    no_secret_in(*(p.read_text() for p in record.dir.iterdir()))
    assert host.pwned() == []


def test_cpu_job_needs_no_gpu(tmp_path, host):
    host.fail("nvidia")
    path = write_job(tmp_path, device="cpu", **{"max_restarts: 2": "max_restarts: 0"})
    record = submit_ssh(load(path), path, TARGET, env=ENV)
    assert record.state == RUNNING and host.calls("nvidia-smi") == []
    argv = host.docker("run")[0]["argv"]
    assert "--gpus" not in argv
    assert argv[argv.index("--restart") + 1] == "no"  # on-failure:0 would be unlimited


def test_unreachable_host(tmp_path, host):
    host.mp.setenv("FAKE_SSH_DOWN", "1")
    path = write_job(tmp_path)
    with pytest.raises(HostUnreachable) as e:
        submit_ssh(load(path), path, TARGET, env=ENV)
    assert e.value.exit_code == ExitCode.HOST_UNREACHABLE == 7
    assert "No route to host" in e.value.message and "\n" not in e.value.message
    assert not (host.root / "local ten-runner").exists()


@pytest.mark.parametrize("broken, says", [
    ("nvidia", ["no GPU on host gpu-box (nvidia-smi failed: NVIDIA-SMI has failed"]),
    ("nvidia-none", ["no GPU on host gpu-box (nvidia-smi failed: No devices were found)"]),
    ("no nvidia-smi", ["no GPU on host gpu-box (nvidia-smi failed:", "nvidia-smi: command"]),
    ("docker-info", ["docker is not usable on host gpu-box (docker info failed: Cannot conn"]),
    ("no docker", ["docker is not usable on host gpu-box", "docker: command not found"]),
])
def test_unhealthy_host(tmp_path, host, broken, says):
    if broken.startswith("no "):
        (host.bin / broken[3:]).unlink()
    else:
        host.fail(broken)
    path = write_job(tmp_path)
    with pytest.raises(UnhealthyHost) as e:
        submit_ssh(load(path), path, TARGET, env=ENV)
    assert e.value.exit_code == ExitCode.UNHEALTHY_HOST == 5
    assert all(s in e.value.message for s in says) and "\n" not in e.value.message
    if "docker" in broken:
        assert "NVIDIA container toolkit" in e.value.message
    assert not (host.home / ".ten-runner").exists() and host.docker("run") == []


@pytest.mark.parametrize("broken, error, code", [
    ("docker-run-gpu", UnhealthyHost, ExitCode.UNHEALTHY_HOST),
    ("docker-run-image", ProvisionError, ExitCode.CONFIG),
])
def test_failed_docker_run_leaves_nothing_behind(tmp_path, host, broken, error, code):
    host.fail(broken)
    path = write_job(tmp_path)
    with pytest.raises(error) as e:
        submit_ssh(load(path), path, TARGET, env=ENV)
    assert e.value.exit_code == code and "cannot start the container" in e.value.message
    run = host.docker("run")
    assert len(run) == 1 and run[0]["env_file_mode"] == 0o600
    assert list((host.home / ".ten-runner" / "jobs").iterdir()) == []  # no env file, no job
    assert list((host.fake / "containers").iterdir()) == []  # the created container removed
    assert not (host.root / "local ten-runner").exists()
    no_secret_in(e.value.message)


def test_start_command_removes_the_env_file_itself(tmp_path, host):
    """Even when the cleanup after a failed start cannot reach the host any more."""
    host.fail("docker-run-gpu")
    host.mp.setenv("FAKE_SSH_MAX_CALLS", "5")  # true, nvidia-smi, docker info, upload, start
    path = write_job(tmp_path)
    with pytest.raises(UnhealthyHost):
        submit_ssh(load(path), path, TARGET, env=ENV)
    assert len(host.calls("ssh")) == 6  # the cleanup was tried
    (job_dir,) = (host.home / ".ten-runner" / "jobs").iterdir()
    assert [p.name for p in job_dir.iterdir()] == ["job.yaml"]


# -- status, logs, cancel -----------------------------------------------------------------


def test_status_logs_and_cancel(tmp_path, host):
    path = write_job(tmp_path)
    record = submit_ssh(load(path), path, TARGET, env=ENV)
    container = record.details["container"]
    (host.fake / "containers" / f"{container}.log").write_text(
        "".join(f"step {i} loss {10 - i}\n" for i in range(5)))

    assert ssh_status(record) == (RUNNING, None)
    host.set_container(container, status="restarting", exit_code=1, restarts=1)
    assert ssh_status(record) == (RECOVERING, None) and record.restarts == 1
    host.set_container(container, status="running", exit_code=0)
    assert ssh_status(record) == (RUNNING, None)
    assert ssh_logs(record) == "".join(f"step {i} loss {10 - i}\n" for i in range(5))
    assert ssh_logs(record, tail=2) == "step 3 loss 7\nstep 4 loss 6\n"

    ssh_cancel(record)
    assert record.state == CANCELLED and record.exit_code == 75
    assert [c["argv"] for c in host.docker("stop")] == [["stop", "-t", "110", container]]
    assert not host.container(container).exists()
    assert not Path(record.details["remote_dir"]).exists()
    saved = load_record(record.job_id)
    assert saved.state == CANCELLED
    assert [h["state"] for h in saved.history] == [RUNNING, RECOVERING, RUNNING, CANCELLED]
    # The logs outlive the container; cancel again and status change nothing.
    assert ssh_logs(saved, tail=1) == "step 4 loss 6\n"
    ssh_cancel(saved)
    assert ssh_status(saved) == (CANCELLED, 75)
    assert len(host.docker("stop")) == 1
    assert ssh_logs(saved, tail=1) == "step 4 loss 6\n"


@pytest.mark.parametrize("docker_state, want", [
    ({"status": "exited", "exit_code": 0}, (SUCCEEDED, 0)),
    ({"status": "exited", "exit_code": 3}, (FAILED, 3)),
    ({"status": "created"}, ("STARTING", None)),
    (None, (FAILED, None)),
])
def test_status_from_docker(tmp_path, host, docker_state, want):
    path = write_job(tmp_path)
    record = submit_ssh(load(path), path, TARGET, env=ENV, check=False)
    assert host.calls("nvidia-smi") == [] and host.docker("info") == []
    container = record.details["container"]
    if docker_state is None:
        os.remove(host.container(container))
    else:
        host.set_container(container, **docker_state)
    assert ssh_status(record) == want
    assert load_record(record.job_id).state == want[0]
    ssh_cancel(record)  # a job that ended keeps its state; cancel only cleans up
    assert record.state == (want[0] if want[0] in TERMINAL else CANCELLED)
    assert not host.container(container).exists()


def test_the_cli_submits_and_follows_an_ssh_job(tmp_path, host, monkeypatch):
    """What a user types: submit prints the id alone; status, logs, cancel and jobs take
    it; no secret from the environment appears in anything printed."""
    from click.testing import CliRunner

    from runner.cli import cli

    for key, value in ENV.items():
        if key != "HOME":
            monkeypatch.setenv(key, value)
    path = write_job(tmp_path)
    runner = CliRunner()
    out = runner.invoke(cli, ["submit", str(path), "--to", TARGET])
    assert out.exit_code == 0, out.output
    job_id = out.stdout.strip()
    assert job_id.startswith("tiny-ssh-") and "\n" not in job_id
    (host.fake / "containers" / f"ten-{job_id}.log").write_text("step 4 loss 6\n")
    status = runner.invoke(cli, ["status", job_id])
    assert status.exit_code == 0 and "RUNNING" in status.output
    assert f"ten-{job_id}" in status.output
    logs = runner.invoke(cli, ["logs", job_id])
    assert logs.exit_code == 0 and "step 4 loss 6" in logs.output
    assert job_id in runner.invoke(cli, ["jobs"]).output
    done = runner.invoke(cli, ["cancel", job_id])
    assert done.exit_code == 0 and done.output.strip() == f"{job_id}: CANCELLED"
    no_secret_in(out.output, status.output, logs.output, done.output)
    assert host.pwned() == []


def test_a_submit_without_bucket_credentials_says_what_the_container_will_use(tmp_path):
    from runner.provision.env import credential_warning

    job = load(write_job(tmp_path))
    assert credential_warning(job_env(job, ENV, tmp_path / "job.yaml")) is None
    bare = {k: v for k, v in ENV.items() if not k.startswith("AWS_")}
    warning = credential_warning(job_env(job, bare, tmp_path / "job.yaml"))
    assert "instance role" in warning and "export-credentials" in warning
