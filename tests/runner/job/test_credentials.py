"""`validate` says when a job's store is a bucket this machine holds no S3 credentials
for (a warning: the machine that runs it may have an instance role), and only then."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.storage.s3 import credentials_here
from tests.support.jobcli import validate

ROOT = Path(__file__).resolve().parents[3]
GOOD = ROOT / "jobs" / "tiny-cpu.yaml"
BUCKET = ["--set", "storage.url=s3://some-bucket/runs"]
KEYS = {"AWS_ACCESS_KEY_ID": "AKIAEXAMPLEKEY00", "AWS_SECRET_ACCESS_KEY": "s3cr3t-value-x"}


@pytest.fixture
def bare(tmp_path, monkeypatch):
    """An environment without AWS credentials: no variables, empty shared files."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    return tmp_path


def test_credentials_are_found_in_the_environment_and_in_a_profile(bare, monkeypatch):
    assert not credentials_here()
    (bare / "credentials").write_text("[work]\naws_access_key_id = AKIAEXAMPLEKEY00\n"
                                      "aws_secret_access_key = s3cr3t-value-x\n")
    monkeypatch.setenv("AWS_PROFILE", "work")
    assert credentials_here()
    monkeypatch.delenv("AWS_PROFILE")
    for name, value in KEYS.items():
        monkeypatch.setenv(name, value)
    assert credentials_here()


def test_validate_warns_about_a_bucket_without_credentials(bare):
    result = validate(str(GOOD), *BUCKET)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"ok: {GOOD}")
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"warning: {GOOD}: storage.url is a bucket and this machine has "
                           "no S3 credentials")


def test_validate_json_carries_the_warning(bare):
    result = validate("--json", str(GOOD), *BUCKET)
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)
    assert entry["ok"] and len(entry["warnings"]) == 1
    assert "AWS_ACCESS_KEY_ID" in entry["warnings"][0]


@pytest.mark.parametrize("case", ["credentials set", "local store", "--no-path-checks"])
def test_no_warning_when_credentials_are_not_needed_or_present(bare, monkeypatch, case):
    args = [str(GOOD), *BUCKET]
    if case == "credentials set":
        for name, value in KEYS.items():
            monkeypatch.setenv(name, value)
    elif case == "local store":
        args = [str(GOOD)]
    else:
        args.append("--no-path-checks")
    result = validate(*args)
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert "s3cr3t" not in result.output
