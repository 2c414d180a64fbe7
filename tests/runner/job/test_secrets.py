"""No resolved ${VAR} value leaves the process. The job exposes what to scrub
(:meth:`Job.secret_values`, :meth:`Job.scrub`); dumps, summaries and validate show the
text as written."""

from __future__ import annotations

import json
import types
import typing
from typing import Literal, get_args, get_origin

import pytest
from click.testing import CliRunner
from pydantic import BaseModel
from runhelpers import MINIMAL_JOB

from runner.cli import cli
from runner.job import JobError, parse_job
from runner.job.schema import JobSchema
from runner.job.secrets import MIN_SECRET_CHARS, literal_secrets, scrub, secret_forms

SECRET = "zq9-s3cr3t-pw7"  # a valid slug, so it can sit in `name` too
MINIMAL = MINIMAL_JOB


def test_secret_embedded_in_dataset_is_listed_and_scrubbed():
    job = parse_job(MINIMAL.replace("builtin:botocore-docs", "'/data/x-${MY_SECRET}/c.txt'"),
                    env={"MY_SECRET": SECRET})
    assert job.data.dataset == f"/data/x-{SECRET}/c.txt"
    assert job.secret_values() == [SECRET]
    # the data layer's own error, as the runner would log it
    message = f"no .txt files match data.dataset={job.data.dataset!r}"
    assert job.scrub(message) == "no .txt files match data.dataset='/data/x-***/c.txt'"
    assert SECRET not in json.dumps(job.redacted_dict())
    assert job.redacted_dict()["data"]["dataset"] == "/data/x-${MY_SECRET}/c.txt"
    assert SECRET not in job.summary() + repr(job)


def test_scrub_catches_the_json_repr_url_and_yaml_forms():
    value = 'p@ss "w/rd" \\ é'
    job = parse_job(MINIMAL + "storage: {endpoint_url: '${EP}'}\n", env={"EP": value})
    texts = [value, json.dumps({"url": value}), json.dumps({"url": value}, ensure_ascii=False),
             repr(value), f"https://h/{__import__('urllib.parse').parse.quote(value, safe='')}",
             "url: '" + value.replace("'", "''") + "'"]
    for text in texts:
        assert "***" in job.scrub(text), text
        assert "rd" not in job.scrub(text).replace("url", ""), job.scrub(text)


def test_longest_value_wins_and_every_occurrence_goes():
    assert scrub("abc abcdef abc", ["abc", "abcdef"]) == "*** *** ***"
    assert scrub("xabcx", ["abc"]) == "x***x"  # inside a longer word, too


def test_short_values_are_listed_but_not_scrubbed_and_common_words_are():
    job = parse_job(MINIMAL + "storage: {region: '${R}', endpoint_url: '${E}'}\n",
                    env={"R": "eu", "E": "runs"})
    assert job.secret_values() == ["eu", "runs"]  # everything, for callers with other rules
    assert MIN_SECRET_CHARS == 3
    # "eu" would wipe every e-u pair from every log; "runs" is over-redacted on purpose
    assert job.scrub("europe: 2 runs") == "europe: 2 ***"
    assert secret_forms(["eu"]) == []


def test_a_longer_secret_overlapping_a_shorter_one_is_hidden_whole():
    """Longest first over the whole text: "bcdefg" inside "abcdefg" goes before "abcd"
    can claim its start (one regex pass took "abcd" at the first position and left
    "efg" of the longer secret in the line)."""
    assert scrub("key=abcdefg;", ["abcd", "bcdefg"]) == "key=a***;"
    assert scrub("abcd and bcdefg", ["abcd", "bcdefg"]) == "*** and ***"


def test_defaults_and_escapes_are_not_secrets():
    job = parse_job(MINIMAL + "storage: {url: '${RUNS:-./fallback}', region: '$${LIT}'}\n",
                    env={"LIT": "never-read"})
    assert job.secret_values() == []
    assert job.scrub("./fallback ${LIT}") == "./fallback ${LIT}"


def test_literal_values_under_secret_names_are_secrets():
    data = {"model": {"api_token": "tok-123", "n": 1}, "x": [{"password": "pw-456"}],
            "train": {"max_tokens": 5}}
    assert literal_secrets(data) == ["tok-123", "pw-456"]


def test_the_scrubber_is_built_once_and_a_job_without_secrets_is_untouched():
    job = parse_job(MINIMAL)
    assert job.secret_values() == [] and job.scrub("anything ***") == "anything ***"


# --- every string field of the schema, set from a variable, stays hidden ----------------

# A value for each string field that the schema accepts; "{}" is where the ${VAR} goes.
STRING_FIELDS = {
    ("name",): "{}",
    ("model", "preset"): None,  # Literal: set below from PRESET
    ("model", "arch"): None,
    ("data", "dataset"): "/data/x-{}/c.txt",
    ("data", "mode"): None,
    ("data", "tokenizer", "type"): None,
    ("data", "tokenizer", "path"): "/tok/{}.model",
    ("data", "text_field"): "col_{}",
    ("data", "data_files"): None,  # only with a hub name: covered by test below
    ("data", "cache_dir"): "/cache/{}",
    ("train", "schedule"): None,
    ("train", "precision"): None,
    ("train", "optimizer"): None,
    ("train", "loss"): None,
    ("train", "device"): None,
    ("train", "init_from"): "s3://bucket-{}/runs/base",
    ("storage", "url"): "s3://bucket/{}/runs",
    ("storage", "endpoint_url"): "https://{}.example.com",
    ("storage", "region"): "{}",
    ("resources", "accelerator"): None,  # an enum: a secret cannot be one of its names
    ("resources", "spot_notice"): None,
    ("resources", "metadata_endpoint"): "http://{}",
    ("resources", "image"): "ghcr.io/{}/img:1",
    ("resources", "aws", "instance_type"): "{}",
    ("resources", "aws", "region"): "{}",
    ("resources", "aws", "ami"): "ami-{}",
    ("resources", "aws", "instance_profile"): "{}",
}


def _string_fields(model: type[BaseModel], path: tuple[str, ...] = ()) -> set[tuple[str, ...]]:
    out: set[tuple[str, ...]] = set()
    for name, info in model.model_fields.items():
        args = get_args(info.annotation) if isinstance(info.annotation, types.UnionType) or \
            get_origin(info.annotation) is typing.Union else (info.annotation,)
        for arg in args:
            base = get_args(arg)[0] if get_origin(arg) is typing.Annotated else arg
            if isinstance(base, type) and issubclass(base, BaseModel):
                out |= _string_fields(base, path + (name,))
            elif base is str or get_origin(base) is Literal:
                out.add(path + (name,))
    return out


def test_the_table_covers_every_string_field_of_the_schema():
    assert _string_fields(JobSchema) == set(STRING_FIELDS), \
        "a string field was added or removed: update STRING_FIELDS"


def test_every_string_field_from_a_variable_is_hidden_everywhere(tmp_path):
    import yaml

    data: dict = {"train": {"max_steps": 10}}
    for path, template in STRING_FIELDS.items():
        if template is None:
            continue
        node = data
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = template.format("${S}")
    data["model"] = {"arch": "${ARCH}", "preset": "${PRESET}"}
    env = {"S": SECRET, "ARCH": "transformer", "PRESET": "small_32k"}
    job = parse_job(yaml.safe_dump(data), env=env, check_model=False)
    assert job.storage.url == f"s3://bucket/{SECRET}/runs" and job.model.preset == "small_32k"
    dumped = json.dumps(job.redacted_dict())
    for value in env.values():
        assert value not in dumped and value not in job.summary() and value not in repr(job)
        assert value in job.secret_values()
    assert SECRET not in job.scrub(job.model_dump_json())  # even the raw dump, scrubbed
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(data))
    for extra in ([], ["--json"]):
        result = CliRunner().invoke(cli, ["validate", "--no-path-checks", str(path), *extra],
                                    env=env)
        assert result.exit_code == 0, result.output
        assert SECRET not in result.output and "small_32k" not in result.output


def test_invalid_values_from_variables_never_echo_in_errors():
    text = MINIMAL.replace("builtin:botocore-docs", "'./${S}/missing.txt'") + \
        "storage: {url: 's3://b/${S}/../x'}\n"
    with pytest.raises(JobError) as info:
        parse_job(text, env={"S": SECRET}, check_paths=True)
    errors = "\n".join(info.value.errors)
    assert SECRET not in errors
    assert "no such file or directory: the value from ./${S}/missing.txt (hint: " in errors
    assert "storage.url: the s3 prefix has a '..' segment" in errors
