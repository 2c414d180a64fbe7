"""Environment variables in a job: ${VAR} and defaults, hints for the usual mistakes,
and secrets that never reach any output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from jobcli import assert_one_line_per_error, validate
from runhelpers import MINIMAL_JOB

from runner.job import JobError, load_job, parse_job

ROOT = Path(__file__).resolve().parents[3]

MINIMAL = MINIMAL_JOB




# --- environment variables and secrets --------------------------------------------

SECRET = "sk_Very-Secret_value_12345"  # not a valid slug, dataset, url, ...


def test_env_substitution_and_default(tmp_path):
    text = MINIMAL.replace("builtin:botocore-docs", "'${DATASET}'") + \
        "storage: {url: '${RUNS:-./fallback}', endpoint_url: '${ENDPOINT}'}\n"
    job = parse_job(text, env={"DATASET": "imdb", "ENDPOINT": SECRET})
    assert job.data.dataset == "imdb" and job.storage.url == "./fallback"
    assert job.storage.endpoint_url == SECRET
    redacted = job.redacted_dict()
    assert redacted["data"]["dataset"] == "${DATASET}"
    assert redacted["storage"]["endpoint_url"] == "${ENDPOINT}"
    assert SECRET not in json.dumps(redacted) and SECRET not in repr(job)
    # the redacted dict is a job file again
    again = parse_job(yaml.safe_dump(redacted), env={"DATASET": "imdb", "ENDPOINT": SECRET})
    assert again.redacted_dict() == redacted


def test_unquoted_reference_in_flow_mapping_gets_a_hint(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MINIMAL + "storage: {url: ${RUNS}}\n")
    errors = assert_one_line_per_error(validate(str(path)), str(path))
    assert errors[0].startswith(f"{path}:5:") and "quote a ${VAR} value" in errors[0]


def test_dollar_dollar_is_literal():
    job = parse_job(MINIMAL + "storage: {url: './runs/$${HOME}'}\n", env={})
    assert job.storage.url == "./runs/${HOME}"


def test_missing_env_var_names_field_and_variable(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MINIMAL + "storage:\n  endpoint_url: ${S3_ENDPOINT}\n")
    result = validate(str(path), env={"S3_ENDPOINT": None})
    errors = assert_one_line_per_error(result, str(path))
    assert errors == [f"{path}:6 storage.endpoint_url: environment variable S3_ENDPOINT is not "
                      "set (hint: export S3_ENDPOINT=... or write ${S3_ENDPOINT:-default})"]


def test_secret_never_in_validate_output_or_errors(tmp_path):
    path = tmp_path / "job.yaml"
    # The secret lands in fields that are then invalid: errors must not echo it.
    path.write_text("name: ${TOKEN}\nmodel: {preset: tiny, mlp: '${TOKEN}'}\n"
                    "data: {dataset: '${TOKEN}', mode: '${TOKEN}'}\n"
                    "train: {max_steps: '${TOKEN}', lr: 'x${TOKEN}'}\n"
                    "storage: {url: 's3://${TOKEN}'}\n")
    result = validate(str(path), env={"TOKEN": SECRET})
    errors = assert_one_line_per_error(result, str(path))
    assert SECRET not in result.output
    assert any("name: " in e and "a value of type str (from ${TOKEN})" in e for e in errors)
    assert any("train.max_steps: expected an integer, got a value of type str" in e
               for e in errors)
    assert any("model.mlp: expected one of" in e and "(from ${TOKEN})" in e for e in errors)
    assert any("data.dataset: unknown dataset (the value from ${TOKEN})" in e for e in errors)
    with pytest.raises(JobError) as info:
        load_job(path, env={"TOKEN": SECRET})
    assert SECRET not in str(info.value)


def test_secret_valid_job_output_is_clean(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MINIMAL + "storage: {url: ./runs, endpoint_url: '${EP}', region: '${EP}'}\n")
    result = validate(str(path), env={"EP": SECRET})
    assert result.exit_code == 0 and SECRET not in result.output


def test_summary_and_repr_use_references_not_values():
    job = parse_job(MINIMAL.replace("name: t", "name: ${RUN_NAME}"), env={"RUN_NAME": "s3cr3t"})
    assert job.name == "s3cr3t"
    assert "s3cr3t" not in job.summary() and "${RUN_NAME}" in job.summary()
    assert "s3cr3t" not in repr(job) + str(job)


def test_secret_named_fields_redacted_even_when_literal():
    from runner.job.secrets import looks_secret, redact

    data = {"storage": {"secret_access_key": SECRET, "api_token": SECRET},
            "train": {"max_tokens": 5}, "data": {"tokenizer": {"vocab_size": 8}}}
    out = redact(data, {})
    assert SECRET not in json.dumps(out)
    assert out["train"]["max_tokens"] == 5 and out["data"]["tokenizer"]["vocab_size"] == 8
    assert looks_secret("hf_token") and looks_secret("password") and not looks_secret("keep_last")


def test_number_from_env_var_gets_a_hint():
    with pytest.raises(JobError) as info:
        parse_job(MINIMAL + "resources: {gpus: '${GPUS}'}\n", env={"GPUS": "2"})
    assert info.value.errors == ["<job>:5 resources.gpus: expected an integer, got a value of "
                                 "type str (from ${GPUS}) (hint: a ${VAR} is always text; write "
                                 "numbers and true/false in the file)"]


def test_job_module_and_schema_do_not_import_torch():
    code = ("import sys, runner.cli, runner.job; runner.job.json_schema(); "
            "runner.job.load_job('jobs/tiny-cpu.yaml', check_model=False); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, timeout=60)
