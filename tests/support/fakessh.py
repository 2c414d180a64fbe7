"""A sandbox "remote" host for the ssh provider's tests: a fake ``ssh`` that runs each
remote command string with a real shell in a sandbox home, and fake ``docker`` /
``nvidia-smi`` that record their argv (tests/runner/provision/fake_bin). The remote PATH
holds only those fakes and a few real tools (``touch`` among them, so an injected
``$(touch pwned)`` would really leave a file). Used by tests/runner/provision/test_ssh.py
and, for ``submit`` through the CLI, tests/e2e/test_submit_ssh.py."""

import json
import shlex
import shutil
import sys
from pathlib import Path

import pytest

from runner.job import load_job

FAKES = Path(__file__).resolve().parents[1] / "runner" / "provision" / "fake_bin"
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
  aws: {instance_type: "x'; touch pwned; '"}
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
