"""The ssh provider (``submit --to ssh://...``, under the managed loop) against the
sandbox host of tests/support/fakessh.py: each remote command string runs in a real
shell (bash, and dash as a stricter POSIX sh) in a sandbox home, the fake ``docker`` and
``nvidia-smi`` record their argv, and an injected ``$(touch pwned)`` would really leave
a file. ``submit`` through the CLI, with its background controller: tests/e2e."""

import json
import os
import shutil
import stat
from pathlib import Path

import pytest
from fakessh import (
    ENV,
    TARGET,
    load,
    no_secret_in,
    write_job,
)

from runner.exit_codes import ExitCode
from runner.provision.base import (
    HostUnreachable,
    Instance,
    LaunchSpec,
    Phase,
    ProvisionError,
    UnhealthyHost,
)
from runner.provision.docker import DockerProvider
from runner.provision.env import env_file_text, job_env
from runner.provision.jobs import spec_factory
from runner.provision.managed import ManagedJob
from runner.provision.policy import State
from runner.provision.registry import JobRecord
from runner.provision.ssh import SshHost, SshTarget, check_submit, parse_target

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


def test_a_job_reporting_to_wandb_takes_its_key_and_no_other_job_does(tmp_path):
    env = {**ENV, "WANDB_API_KEY": "wandb-key-Zq81", "WANDB_PROJECT": "mine"}
    plain = load(write_job(tmp_path))
    assert not any(name.startswith("WANDB_") for name in job_env(plain, env))
    tracked = load(write_job(tmp_path, **{"\nstorage:": "\nmonitor: {report_to: [wandb]}"
                                                       "\nstorage:"}))
    sent = job_env(tracked, env)
    assert sent["WANDB_API_KEY"] == "wandb-key-Zq81" and sent["WANDB_PROJECT"] == "mine"


def test_env_file_is_verbatim_and_refuses_what_docker_cannot_read():
    value = ENV["AWS_SECRET_ACCESS_KEY"]
    assert env_file_text({"A": value, "B": "", "C": " lead # x"}) == \
        f"A={value}\nB=\nC= lead # x\n".encode()
    for bad in ("line1\nsecretvalue", "cr\rsecretvalue", "nul\0secretvalue",
                "bad\udcffsecretvalue"):
        with pytest.raises(ProvisionError) as e:
            env_file_text({"MY_TOKEN": bad})
        assert "MY_TOKEN" in e.value.message and "secretvalue" not in e.value.message


def spec(path: Path, attempt: int = 1, job_id: str = "tiny-ssh-0a1b2c") -> LaunchSpec:
    return LaunchSpec(job_id=job_id, job_name="tiny-ssh", job_file=path, job_url=None,
                      image="ghcr.io/ten-runner/ten-runner:0.1", attempt=attempt,
                      env={"TEN_RUNNER_JOB_ID": job_id, "TEN_RUNNER_ATTEMPT": str(attempt)})


def launched(tmp_path: Path, device: str = "cuda") -> tuple[DockerProvider, Instance]:
    path = write_job(tmp_path, device=device)
    provider = DockerProvider(SshHost(TARGET), load(path), ENV)
    return provider, provider.launch(spec(path))


# -- before anything is recorded ----------------------------------------------------------


def test_local_storage_is_refused_before_anything_runs(tmp_path, host):
    path = write_job(tmp_path, **{"url: 's3://${TEN_BUCKET}/runs'": "url: ./runs"})
    with pytest.raises(ProvisionError) as e:
        check_submit(load(path), TARGET, ENV)
    assert "s3://" in e.value.message and e.value.exit_code == ExitCode.CONFIG
    assert host.calls("ssh") == []


def test_unsendable_value_is_refused_before_anything_runs(tmp_path, host):
    path = write_job(tmp_path)
    with pytest.raises(ProvisionError) as e:
        check_submit(load(path), TARGET, {**ENV, "HF_TOKEN": "two\nlines-secret"})
    assert "HF_TOKEN" in e.value.message and "lines-secret" not in e.value.message
    assert host.calls("ssh") == []


def test_the_host_check_passes_a_healthy_host(tmp_path, host):
    assert check_submit(load(write_job(tmp_path)), TARGET, ENV) == parse_target(TARGET)
    assert [c["argv"] for c in host.calls("nvidia-smi")] == [["-L"]]
    assert host.docker("info") and host.docker("run") == []


def test_cpu_job_needs_no_gpu(tmp_path, host):
    host.fail("nvidia")
    check_submit(load(write_job(tmp_path, device="cpu")), TARGET, ENV)
    assert host.calls("nvidia-smi") == []
    launched(tmp_path, device="cpu")
    assert "--gpus" not in host.docker("run")[0]["argv"]


def test_unreachable_host(tmp_path, host):
    host.mp.setenv("FAKE_SSH_DOWN", "1")
    with pytest.raises(HostUnreachable) as e:
        check_submit(load(write_job(tmp_path)), TARGET, ENV)
    assert e.value.exit_code == ExitCode.HOST_UNREACHABLE == 7
    assert "No route to host" in e.value.message and "\n" not in e.value.message


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
    with pytest.raises(UnhealthyHost) as e:
        check_submit(load(write_job(tmp_path)), TARGET, ENV)
    assert e.value.exit_code == ExitCode.UNHEALTHY_HOST == 5
    assert all(s in e.value.message for s in says) and "\n" not in e.value.message
    if "docker" in broken:
        assert "NVIDIA container toolkit" in e.value.message
    assert not (host.home / ".ten-runner").exists() and host.docker("run") == []


# -- one attempt ----------------------------------------------------------------------------


@pytest.mark.parametrize("shell", ["bash", "dash"])
def test_launch_starts_the_container_without_exposing_secrets(tmp_path, host, shell):
    if shutil.which(shell) is None:
        pytest.skip(f"no {shell}")
    host.mp.setenv("FAKE_SSH_SHELL", shutil.which(shell))
    path = write_job(tmp_path)
    _, instance = launched(tmp_path)

    container = "ten-tiny-ssh-0a1b2c-1"
    remote_dir = host.home / ".ten-runner" / "jobs" / "tiny-ssh-0a1b2c"
    assert (instance.provider, instance.id, instance.zone) == ("ssh", container, "gpu-box")
    assert instance.details["folder"] == str(remote_dir)

    # The job file arrived byte for byte, readable by the image's user, in folders only
    # the ssh user can enter; the env file is gone.
    assert (remote_dir / "container-job.yaml").read_bytes() == path.read_bytes()
    for folder in (host.home / ".ten-runner", remote_dir.parent, remote_dir):
        assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert not (remote_dir / "attempt-1.env").exists()

    run = host.docker("run")
    assert len(run) == 1 and run[0]["job_yaml_mode"] == 0o644
    assert run[0]["argv"] == [
        "run", "-d", "--name", container, "--gpus", "all",
        "--stop-timeout", "110", "--shm-size", "16g", "--env-file",
        f"{remote_dir}/attempt-1.env", "-v", "ten-cache:/cache",
        "-v", f"{remote_dir}/container-job.yaml:/job/job.yaml:ro",
        "ghcr.io/ten-runner/ten-runner:0.1", "run", "/job/job.yaml"]
    # While docker read it, the env file was 0600 and held the values verbatim.
    assert run[0]["env_file_mode"] == 0o600
    assert run[0]["env_file"] == "".join(f"{k}={v}\n" for k, v in (
        *((k, ENV[k]) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "HF_TOKEN",
                                "TEN_BUCKET")),
        ("TEN_RUNNER_JOB_ID", "tiny-ssh-0a1b2c"), ("TEN_RUNNER_ATTEMPT", "1")))

    # No secret on any command line (ssh's, and everything the host ran) or in the
    # instance the record keeps.
    ssh_calls = host.calls("ssh")
    assert ssh_calls and all(c["argv"][:2] == ["-o", "BatchMode=yes"] for c in ssh_calls)
    no_secret_in(*(json.dumps(c["argv"]) for tool in ("ssh", "docker", "nvidia-smi")
                   for c in host.calls(tool)), json.dumps(instance.to_dict()))
    assert host.pwned() == []


@pytest.mark.parametrize("broken, error, code", [
    ("docker-run-gpu", UnhealthyHost, ExitCode.UNHEALTHY_HOST),
    ("docker-run-image", ProvisionError, ExitCode.CONFIG),
])
def test_failed_docker_run_leaves_nothing_behind(tmp_path, host, broken, error, code):
    host.fail(broken)
    with pytest.raises(error) as e:
        launched(tmp_path)
    assert e.value.exit_code == code and "cannot start the container" in e.value.message
    run = host.docker("run")
    assert len(run) == 1 and run[0]["env_file_mode"] == 0o600
    assert list((host.home / ".ten-runner" / "jobs").iterdir()) == []  # no env file, no job
    assert list((host.fake / "containers").iterdir()) == []  # the created container removed
    no_secret_in(e.value.message)


def test_start_command_removes_the_env_file_itself(tmp_path, host):
    """Even when the cleanup after a failed start cannot reach the host any more."""
    host.fail("docker-run-gpu")
    host.mp.setenv("FAKE_SSH_MAX_CALLS", "2")  # upload, start
    with pytest.raises(UnhealthyHost):
        launched(tmp_path)
    assert len(host.calls("ssh")) == 3  # the cleanup was tried
    (job_dir,) = (host.home / ".ten-runner" / "jobs").iterdir()
    assert [p.name for p in job_dir.iterdir()] == ["container-job.yaml"]


def test_a_host_that_failed_the_health_gate_is_not_launched_on(tmp_path, host):
    path = write_job(tmp_path)
    with pytest.raises(UnhealthyHost) as e:
        DockerProvider(SshHost(TARGET), load(path), ENV).launch(spec(path),
                                                                frozenset({"gpu-box"}))
    assert e.value.exit_code == ExitCode.UNHEALTHY_HOST and host.calls("ssh") == []


@pytest.mark.parametrize("docker_state, phase, code", [
    ({"status": "running"}, Phase.RUNNING, None),
    ({"status": "created"}, Phase.PENDING, None),
    ({"status": "restarting"}, Phase.RUNNING, None),
    ({"status": "exited", "exit_code": 0}, Phase.EXITED, 0),
    ({"status": "exited", "exit_code": 3}, Phase.EXITED, 3),
    ({"status": "exited", "exit_code": 137}, Phase.PREEMPTED, 137),
    (None, Phase.GONE, None),
])
def test_poll_reads_docker(tmp_path, host, docker_state, phase, code):
    provider, instance = launched(tmp_path)
    if docker_state is None:
        os.remove(host.container(instance.id))
    else:
        host.set_container(instance.id, **docker_state)
    status = provider.poll(instance)
    assert (status.phase, status.exit_code) == (phase, code)


def test_poll_of_an_unreachable_host_raises_for_the_loop_to_wait(tmp_path, host):
    provider, instance = launched(tmp_path)
    host.mp.setenv("FAKE_SSH_DOWN", "1")
    with pytest.raises(HostUnreachable):
        provider.poll(instance)


def test_terminate_keeps_the_logs_removes_everything_and_is_idempotent(tmp_path, host):
    provider, instance = launched(tmp_path)
    lines = "".join(f"step {i} loss {10 - i}\n" for i in range(5))
    (host.fake / "containers" / f"{instance.id}.log").write_text(lines)
    assert provider.logs(instance) == lines

    provider.terminate(instance)
    assert [c["argv"] for c in host.docker("stop")] == [["stop", "-t", "110", instance.id]]
    assert not host.container(instance.id).exists()
    assert not Path(instance.details["folder"]).exists()
    assert Path(instance.details["log"]).read_text() == lines  # kept on this machine
    assert provider.logs(instance) == lines  # the logs outlive the container
    provider.terminate(instance)  # again: nothing left to do, no error
    assert len(host.docker("stop")) == 2 and len(host.docker("rm")) == 1


# -- the managed loop -----------------------------------------------------------------------


def test_the_managed_loop_relaunches_a_killed_container_on_the_host(tmp_path, host):
    """A container SIGKILLed (137: a reboot, the OOM killer) is a preemption: relaunched
    as attempt 2, not charged as a restart; attempt 2 finishes and the job succeeds."""
    host.mp.setenv("FAKE_RUN_EXITS", "137,0")
    path = write_job(tmp_path)
    job = load(path)
    record = JobRecord(job_id="tiny-ssh-0a1b2c", job_name="tiny-ssh", target=TARGET,
                       state=State.PENDING.value,
                       details={"job_file": str(path), "max_restarts": 2})
    record.save()
    lines: list[str] = []
    record = ManagedJob(record, DockerProvider(SshHost(TARGET), job, ENV),
                        spec_factory(record, job),
                        lambda: None, poll_s=0.01, log=lines.append).run()
    assert (record.state, record.exit_code) == ("SUCCEEDED", 0), lines
    assert (record.attempt, record.preemptions, record.restarts) == (2, 1, 0)
    names = [c["argv"][3] for c in host.docker("run")]
    assert names == ["ten-tiny-ssh-0a1b2c-1", "ten-tiny-ssh-0a1b2c-2"]
    assert [c["argv"][-1] for c in host.docker("rm")] == names
    assert record.instance is None and not list((host.fake / "containers").glob("*.json"))
    assert list((host.home / ".ten-runner" / "jobs").iterdir()) == []


def test_a_submit_without_bucket_credentials_says_what_the_container_will_use(tmp_path):
    from runner.provision.env import credential_warning

    job = load(write_job(tmp_path))
    assert credential_warning(job_env(job, ENV, tmp_path / "job.yaml")) is None
    bare = {k: v for k, v in ENV.items() if not k.startswith("AWS_")}
    warning = credential_warning(job_env(job, bare, tmp_path / "job.yaml"))
    assert "instance role" in warning and "export-credentials" in warning
