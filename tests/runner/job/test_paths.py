"""`validate` reports a local dataset or tokenizer.path that is not there (with
file:line and a hint) instead of saying ok and letting the run fail later."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from runhelpers import MINIMAL_JOB

from runner.cli import cli
from runner.exit_codes import ExitCode
from runner.job import JobError, load_job, parse_job

MINIMAL = MINIMAL_JOB
HINT = ("(hint: a relative path starts from the working directory; if it exists only where "
        "the job runs, validate with --no-path-checks)")


def job_with(tmp_path, data: str):
    path = tmp_path / "job.yaml"
    path.write_text(MINIMAL.replace("{dataset: builtin:botocore-docs}", data))
    return path


def validate(path, *args):
    return CliRunner().invoke(cli, ["validate", str(path), *args])


@pytest.fixture
def corpus(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # relative paths start from the working directory
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.jsonl").write_text('{"text": "hi"}\n')
    (tmp_path / "empty").mkdir()
    (tmp_path / "notes.csv").write_text("a,b\n")
    (tmp_path / "tok.model").write_bytes(b"\0")
    return tmp_path


@pytest.mark.parametrize("data,message", [
    ("{dataset: ./missing.txt}",
     "3 data.dataset: no such file or directory: './missing.txt' " + HINT),
    ("{dataset: /nowhere/x.jsonl}", "data.dataset: no such file or directory: '/nowhere/x.jsonl'"),
    ("{dataset: 'docs/*.txt'}", "3 data.dataset: no files match the glob: 'docs/*.txt' " + HINT),
    ("{dataset: ./empty}", "data.dataset: no .txt/.jsonl/.parquet files in the directory: "
                           "'./empty'"),
    ("{dataset: notes.csv}", "data.dataset: unsupported file type '.csv', use "
                             ".txt/.jsonl/.parquet: 'notes.csv'"),
    ("{dataset: wikitext-2, data_files: ./gone.parquet}",
     "data.data_files: no such file or directory: './gone.parquet'"),
    ("\n  dataset: builtin:botocore-docs\n  tokenizer: {path: ./no.model}",
     "5 data.tokenizer.path: no such file: './no.model' (hint: an existing sentencepiece "
     ".model file, relative to the working directory; or drop path and set vocab_size to "
     "train one)"),
    ("{dataset: builtin:botocore-docs, tokenizer: {path: docs}}",
     "data.tokenizer.path: a directory, not a file: 'docs'"),
])
def test_missing_local_files_are_reported(corpus, data, message):
    path = job_with(corpus, data)
    result = validate(path)
    assert result.exit_code == ExitCode.CONFIG, result.output
    errors = result.stderr.splitlines()[:-1]
    assert len(errors) == 1 and errors[0].startswith(f"{path}:"), errors
    assert message in errors[0], errors[0]
    load_job(path)  # a job to run elsewhere loads: only validate/run check paths
    validate_again = validate(path, "--no-path-checks")
    assert validate_again.exit_code == 0, validate_again.output


@pytest.mark.parametrize("data", [
    "{dataset: docs}", "{dataset: ./docs/}", "{dataset: 'docs/*.jsonl'}",
    "{dataset: 'docs/**/*.jsonl'}", "{dataset: docs/a.jsonl}", "{dataset: ~/docs}",
    "{dataset: builtin:botocore-docs, tokenizer: {path: tok.model}}",
    "{dataset: imdb}", "{dataset: wikitext-2, data_files: docs/a.jsonl}",
])
def test_present_local_files_pass(corpus, data, monkeypatch):
    """Every way of naming present files passes the path checks. (These few lines could
    not train a tokenizer: what the text holds is test_peek's, here left unread.)"""
    from runner.job import peek

    monkeypatch.setattr(peek, "PEEK_BYTES", 0)
    monkeypatch.setenv("HOME", str(corpus))  # ~ is expanded, as the data layer does
    path = job_with(corpus, data)
    result = validate(path)
    assert result.exit_code == 0, result.output


def test_paths_from_variables_are_shown_as_written(corpus):
    path = job_with(corpus, "{dataset: './${DIR}/x.txt', tokenizer: {path: '${TOK}'}}")
    with pytest.raises(JobError) as info:
        load_job(path, env={"DIR": "hidden-dir", "TOK": "hidden.model"}, check_paths=True)
    text = "\n".join(info.value.errors)
    assert "hidden" not in text
    assert "data.dataset: no such file or directory: the value from ./${DIR}/x.txt" in text
    assert "data.tokenizer.path: no such file: the value from ${TOK}" in text


def test_path_problems_come_with_every_other_problem(corpus):
    with pytest.raises(JobError) as info:
        parse_job(MINIMAL.replace("builtin:botocore-docs", "./gone.txt")
                  .replace("max_steps: 10", "max_steps: 0"), check_paths=True)
    assert [e.split(" ")[1] for e in info.value.errors] == ["data.dataset:", "train.max_steps:"]


def test_an_unknown_name_is_reported_once(corpus):
    """'finewebed' is a typo of a hub name, not a path: one message, from checks.dataset."""
    with pytest.raises(JobError) as info:
        parse_job(MINIMAL.replace("builtin:botocore-docs", "finewebed"), check_paths=True)
    assert len(info.value.errors) == 1 and "did you mean 'finewebedu'" in info.value.errors[0]
