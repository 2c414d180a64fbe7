"""Whatever the values, validate answers in a screenful: no traceback, values
cut to ~80 characters, at most 20 problems listed and then a count."""

from __future__ import annotations

import re

import pytest
from click.testing import CliRunner
from runhelpers import MINIMAL_JOB

from runner.cli import cli
from runner.exit_codes import ExitCode
from runner.job import JobError, parse_job
from runner.job.errors import MAX_PROBLEMS

MINIMAL = MINIMAL_JOB
BIG = "a" * 1_000_000  # the file stays under the 1 MiB limit
BIG_FILES = {
    "data.dataset": MINIMAL.replace("builtin:botocore-docs", BIG),
    "data.dataset-path": MINIMAL.replace("builtin:botocore-docs", "./" + BIG),
    "data.tokenizer.path": MINIMAL.replace(
        "builtin:botocore-docs}", f"builtin:botocore-docs, tokenizer: {{path: {BIG}}}}}"),
    "storage.url": MINIMAL + f"storage: {{url: ./{BIG}}}\n",
    "storage.url-s3": MINIMAL + f"storage: {{url: 's3://b/{BIG}'}}\n",
    "name": MINIMAL.replace("name: t", f"name: {BIG}"),
    "data.text_field-and-mode": MINIMAL.replace(
        "builtin:botocore-docs}", f"builtin:botocore-docs, mode: {BIG}}}"),
    "model-field": MINIMAL.replace("preset: tiny}", f"preset: tiny, {BIG}: 1}}"),
    "model.mlp": MINIMAL.replace("preset: tiny}", f"preset: tiny, mlp: {BIG}}}"),
    "model.scan_backend": MINIMAL.replace("preset: tiny}", f"preset: tiny, scan_backend: {BIG}}}"),
    "model.pos": MINIMAL.replace("arch: ten, preset: tiny}",
                                 f"arch: transformer, preset: tiny, pos: {BIG}}}"),
    "unknown-key": MINIMAL + f"{BIG}: 1\n",
}


def check_screenful(result, path) -> list[str]:
    assert result.exit_code == ExitCode.CONFIG, result.output[:2000]
    assert result.exception is None or isinstance(result.exception, SystemExit), \
        repr(result.exception)[:2000]
    assert "Traceback" not in result.output
    lines = result.output.splitlines()
    assert len(lines) <= MAX_PROBLEMS + 5, len(lines)
    for line in lines:
        # The file name is the caller's, and "(allowed: ...)" lists the schema's keys
        # (a fixed size); everything that comes from the input is bounded.
        bounded = re.sub(r" \((allowed|known): [^)]*\)$", "", line.replace(str(path), ""))
        assert len(bounded) <= 200, line[:300]
    return lines


@pytest.mark.parametrize("text", BIG_FILES.values(), ids=BIG_FILES.keys())
def test_a_one_megabyte_value_gives_one_short_line(tmp_path, text):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    lines = check_screenful(CliRunner().invoke(cli, ["validate", str(path)]), path)
    assert len(lines) == 2 and lines[-1].startswith("Error: ")


@pytest.mark.parametrize("key", ["data.dataset", "data.tokenizer.path", "storage.url", "name",
                                 "data.text_field", "data.cache_dir", "train.lr"])
def test_a_one_megabyte_set_or_variable(tmp_path, key):
    path = tmp_path / "job.yaml"
    path.write_text(MINIMAL)
    value = "./" + BIG if key != "name" else BIG
    result = CliRunner().invoke(cli, ["validate", str(path), "--set", f"{key}={value}",
                                      "--set", f"train.{BIG}=1", "--set", f"{BIG}"])
    check_screenful(result, path)
    with pytest.raises(JobError) as info:  # from the environment: hidden, still bounded
        parse_job(MINIMAL + "x: 1\n", sets=[f"{key}=${{BIG}}"], env={"BIG": value},
                  check_paths=True)
    assert all(len(e) <= 200 for e in info.value.errors), info.value.errors


@pytest.mark.slow
def test_twenty_thousand_unknown_keys(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MINIMAL + "".join(f"key{i}: 1\n" for i in range(20_000)))
    lines = check_screenful(CliRunner().invoke(cli, ["validate", str(path)]), path)
    assert len(lines) == MAX_PROBLEMS + 2  # 20 problems, the count, click's Error: line
    assert lines[0].startswith(f"{path}:5 key0: unknown key 'key0'")
    # (a long path is shortened in the middle to keep the line on the screen)
    assert lines[MAX_PROBLEMS].endswith(": ... and 19,980 more problems (fix the ones above, "
                                        "then validate again)")


def test_exactly_the_limit_has_no_count_line():
    with pytest.raises(JobError) as info:
        parse_job(MINIMAL + "".join(f"key{i}: 1\n" for i in range(MAX_PROBLEMS)))
    assert len(info.value.errors) == MAX_PROBLEMS and "more problem" not in info.value.errors[-1]


def test_validate_on_a_huge_dataset_path_is_one_line_not_a_traceback(tmp_path):
    """The original crash: an OSError (File name too long) escaping as a traceback."""
    path = tmp_path / "job.yaml"
    path.write_text(BIG_FILES["data.dataset"].replace(BIG, "x" * 5000))
    out = CliRunner().invoke(cli, ["validate", str(path)])
    assert out.exit_code == ExitCode.CONFIG, out.stderr[-2000:]
    assert not isinstance(out.exception, OSError), out.exception
    assert "Traceback" not in out.stderr and len(out.stderr.splitlines()) == 2
    assert "data.dataset: too long for a dataset name or path (5,000 characters)" in out.stderr


HOSTILE_NUMBERS = {  # issue 23, faults 12-14: each passed validate and crashed run
    "train.seed=99999999999999999999": "train.seed: is too large: at most 9,223,372,036",
    "train.max_steps=1e100": "train.max_steps: is too large",
    "train.lr=1e300": "train.lr: is too large: at most 1e+15",
    "train.max_steps=" + "9" * 5000: "a number of 5000 characters: no job value needs one",
    "data.val_fraction=0": "data.val_fraction: must be > 0",
    "storage.endpoint_url=http://[::1": "storage.endpoint_url: is not a URL (Invalid IPv6 URL)",
    "resources.price_per_hour=1e300": "is too large: at most 1e+15",
    # issue 23, fault 20: kept verbatim in job.json and every checkpoint's config.json
    "storage.endpoint_url=http://minio:s3cr3tpass@host:9000":
        "storage.endpoint_url: carries credentials (user:password@host)",
}


@pytest.mark.parametrize("assignment", HOSTILE_NUMBERS, ids=lambda s: s[:40])
def test_numbers_a_run_cannot_use_are_refused_by_validate(assignment):
    with pytest.raises(JobError) as err:
        parse_job(MINIMAL, sets=[assignment], check_model=False)
    assert len(err.value.errors) == 1
    assert HOSTILE_NUMBERS[assignment] in err.value.errors[0], err.value.errors
    assert "s3cr3t" not in err.value.errors[0]  # a credential is never printed


def test_a_5000_digit_integer_in_a_file_is_one_line_with_its_place(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(MINIMAL.replace("max_steps: 10", "max_steps: " + "9" * 5000))
    result = CliRunner().invoke(cli, ["validate", str(path)])
    assert result.exit_code == ExitCode.CONFIG and "Traceback" not in result.output
    assert f"{path}:" in result.output and "a number of 5000 characters" in result.output


# issue 23, fault 15: validate accepted these, and a run wrote (or failed to write) there
SYSTEM_DIRECTORIES = {"/": "the file system's root", "/etc": "/etc", "/proc/self": "under /proc",
                      "/dev/null": "under /dev", "file:///sys/kernel": "under /sys",
                      "//usr/": "/usr", "/boot/../etc/runs": "under /etc",
                      "file://localhost/etc": "/etc"}  # its path, not "localhost/etc"


@pytest.mark.parametrize("url", SYSTEM_DIRECTORIES)
def test_a_system_directory_as_the_store_is_refused_by_validate(url):
    with pytest.raises(JobError) as err:
        parse_job(MINIMAL, sets=[f"storage.url={url}"], check_model=False)
    (line,) = err.value.errors
    assert f"storage.url: is {SYSTEM_DIRECTORIES[url]}: runs would be written among" in line


@pytest.mark.parametrize("url", ["./runs", "/data/runs", "/usr/local/runs", "/var/runs",
                                 "file:///mnt/runs", "runs/etc"])
def test_a_folder_of_its_own_is_accepted_as_the_store(url):
    assert parse_job(MINIMAL, sets=[f"storage.url={url}"], check_model=False).storage.url == url
