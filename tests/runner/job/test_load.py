"""Loading a job: every mistake is one line naming file:line and field, all at once;
--set overrides are type-checked."""

from __future__ import annotations

from pathlib import Path

import pytest
from jobcli import assert_one_line_per_error, validate
from runhelpers import MINIMAL_JOB

from runner.exit_codes import ExitCode
from runner.job import JobError, load_job, parse_job

ROOT = Path(__file__).resolve().parents[3]

MINIMAL = MINIMAL_JOB




# --- malformed jobs ---------------------------------------------------------------

# (id, YAML text, [(line, "dotted.path: message fragment"), ...])
BAD = [
    ("yaml-syntax", "name: t\nmodel: {arch: ten, preset: tiny\ndata: x\n",
     [(3, "YAML syntax error")]),
    ("tabs", "name: t\nmodel:\n\tarch: ten\n", [(3, "not tabs")]),
    ("unknown-top-level", MINIMAL + "colour: blue\n",
     [(5, "colour: unknown key 'colour' (allowed: name, model")]),
    ("typo-suggestion", MINIMAL.replace("max_steps", "max_step"),
     [(4, "train.max_step: unknown key 'max_step' (did you mean 'max_steps'?)"),
      (4, "train: no budget")]),
    ("typo-section", MINIMAL + "chekpoint: {keep_last: 2}\n",
     [(5, "chekpoint: unknown key 'chekpoint' (did you mean 'checkpoint'?)")]),
    ("typo-substring", MINIMAL.replace("builtin:botocore-docs}",
                                       "builtin:botocore-docs, tokenizer: {vocab: 512}}"),
     [(3, "data.tokenizer.vocab: unknown key 'vocab' (did you mean 'vocab_size'?)")]),
    ("key-of-a-sub-section", MINIMAL + "resources: {spot: true, instance_type: g5.xlarge}\n",
     [(5, "resources.instance_type: unknown key 'instance_type' here (it belongs in "
          "resources.aws: {instance_type: ...})")]),
    ("wrong-type", MINIMAL.replace("{max_steps: 10}", "\n  max_steps: 10\n  lr: fast"),
     [(6, "train.lr: expected a number, got 'fast'")]),
    ("wrong-type-int", MINIMAL.replace("max_steps: 10", "max_steps: 2.5"),
     [(4, "train.max_steps: expected an integer, got 2.5")]),
    ("wrong-type-bool", MINIMAL.replace("max_steps: 10", "max_steps: 10, compile: maybe"),
     [(4, "train.compile: expected true or false, got 'maybe'")]),
    ("bool-is-not-int", MINIMAL.replace("max_steps: 10", "max_steps: true"),
     [(4, "train.max_steps: expected an integer, got true")]),
    ("section-not-mapping", MINIMAL + "checkpoint: 5\n",
     [(5, "checkpoint: expected a mapping, got 5")]),
    ("batch-size-0", MINIMAL.replace("max_steps: 10", "max_steps: 10, batch_size: 0"),
     [(4, "train.batch_size: must be >= 1, got 0")]),
    ("val-fraction", MINIMAL.replace("builtin:botocore-docs}",
                                     "builtin:botocore-docs, val_fraction: 1.5}"),
     [(3, "data.val_fraction: must be < 1.0, got 1.5")]),
    ("lr-zero", MINIMAL.replace("max_steps: 10", "max_steps: 10, lr: 0"),
     [(4, "train.lr: must be > 0.0, got 0")]),
    ("keep-last-0", MINIMAL + "checkpoint: {keep_last: 0}\n",
     [(5, "checkpoint.keep_last: must be >= 1, got 0")]),
    ("betas-short", MINIMAL.replace("max_steps: 10", "max_steps: 10, betas: [0.9]"),
     [(4, "train.betas: expected 2 numbers")]),
    ("betas-range", "name: t\nmodel: {preset: tiny}\ndata: {dataset: imdb}\ntrain:\n"
                    "  max_steps: 1\n  betas:\n  - 0.9\n  - 1.5\n",
     [(8, "train.betas[1]: must be < 1.0, got 1.5")]),
    ("bad-enum", MINIMAL.replace("builtin:botocore-docs}", "builtin:botocore-docs, mode: fast}"),
     [(3, "data.mode: expected one of pretokenized, streaming, download, got 'fast'")]),
    ("enum-suggestion", MINIMAL.replace("max_steps: 10", "max_steps: 10, schedule: cosin"),
     [(4, "train.schedule: expected one of cosine, onecycle, constant, wsd, got 'cosin' "
          "(did you mean 'cosine'?)")]),
    ("enum-synonym", MINIMAL.replace("max_steps: 10", "max_steps: 10, device: gpu"),
     [(4, "train.device: expected one of auto, cpu, cuda, got 'gpu' (did you mean 'cuda'?)")]),
    ("unsafe-name-shell", MINIMAL.replace("name: t", 'name: "a; rm -rf /"'),
     [(1, "name: must be 1-63 characters of a-z, 0-9 and '-'")]),
    ("unsafe-name-dotdot", MINIMAL.replace("name: t", "name: ../etc"),
     [(1, "name: must be 1-63 characters")]),
    ("unsafe-name-upper", MINIMAL.replace("name: t", "name: UPPER"),
     [(1, "name: must be 1-63 characters of a-z, 0-9 and '-', starting with a letter or "
          "digit (it is used in paths), got 'UPPER' (hint: try 'upper')")]),
    ("empty-name", MINIMAL.replace("name: t", "name: ''"), [(1, "name: must not be empty")]),
    ("long-name", MINIMAL.replace("name: t", "name: " + "a" * 64),
     [(1, "name: must be at most 63 characters")]),
    ("missing-name", MINIMAL.replace("name: t\n", ""),
     [(1, "name: required field is missing (hint: a slug")]),
    ("duplicate-key", MINIMAL + "name: u\n", [(5, "duplicate key 'name' (first given on line 1)")]),
    ("duplicate-nested", "name: t\nmodel: {preset: tiny}\ndata: {dataset: imdb}\ntrain:\n"
                         "  max_steps: 1\n  lr: 0.1\n  lr: 0.2\n",
     [(7, "duplicate key 'train.lr' (first given on line 6)")]),
    ("billion-laughs", 'a: &a ["lol","lol"]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a]\n'
                       'c: &c [*b,*b,*b,*b,*b,*b,*b,*b]\nd: [*c,*c,*c,*c,*c,*c,*c,*c,*c]\n',
     [(1, "YAML anchors and aliases are not allowed")]),
    ("both-budgets", MINIMAL.replace("max_steps: 10", "max_steps: 10, max_tokens: 100000"),
     [(4, "train.max_tokens: give either max_steps or max_tokens, not both")]),
    ("no-budget", MINIMAL.replace("max_steps: 10", "lr: 0.1"),
     [(4, "train: no budget: set max_steps or max_tokens")]),
    ("tiny-token-budget", MINIMAL.replace("max_steps: 10", "max_tokens: 100"),
     [(4, "train.max_tokens: 100 is less than one optimizer step")]),
    ("unknown-model-field", MINIMAL.replace("preset: tiny}", "preset: tiny, n_layer: 3}"),
     [(2, "model.n_layer: unknown model field 'n_layer' for arch ten "
          "(did you mean 'n_layers'?)")]),
    ("model-field-type", MINIMAL.replace("preset: tiny}", "preset: tiny, selective: 'yes'}"),
     [(2, "model.selective: expected true or false, got 'yes'")]),
    ("model-invariant", "name: t\nmodel:\n  preset: tiny\n  n_heads: 3\n"
                        "data: {dataset: imdb}\ntrain: {max_steps: 1}\n",
     [(4, "model.n_heads: must divide n_eigenstates=64, got 3")]),
    ("bad-preset", MINIMAL.replace("preset: tiny", "preset: huge"),
     [(2, "model.preset: expected one of tiny, small, small_32k, medium, large, got 'huge'")]),
    ("bad-arch", MINIMAL.replace("arch: ten", "arch: rnn"),
     [(2, "model.arch: expected one of ten, transformer, got 'rnn'")]),
    ("missing-preset", MINIMAL.replace("arch: ten, preset: tiny", "arch: ten"),
     [(2, "model.preset: required field is missing")]),
    ("unknown-dataset", MINIMAL.replace("builtin:botocore-docs", "finewebed"),
     [(3, "data.dataset: unknown dataset 'finewebed' (did you mean 'finewebedu'?)")]),
    ("non-mapping", "- a\n- b\n", [(1, "(top level): expected a mapping of sections")]),
    ("scalar-top", "just text\n", [(1, "(top level): expected a mapping")]),
    ("empty-file", "", [(1, "(top level): the file is empty")]),
    ("comments-only", "# nothing\n", [(1, "(top level): the file is empty")]),
    ("s3-url-no-bucket", MINIMAL + "storage: {url: 's3://'}\n",
     [(5, "storage.url: needs a bucket: s3://bucket/prefix")]),
    ("s3-url-credentials", MINIMAL + "storage: {url: 's3://key:secret@bucket/runs'}\n",
     [(5, "storage.url: needs a bucket: s3://bucket/prefix (hint: credentials go in the")]),
    ("other-scheme", MINIMAL + "storage: {url: 'gs://bucket'}\n",
     [(5, "storage.url: unsupported scheme 'gs://'")]),
    # issue 44: one slash trained into a local folder named "s3:", lost with the machine
    ("s3-one-slash", MINIMAL + "storage: {url: 's3:/my-bucket/runs'}\n",
     [(5, "storage.url: 's3:/my-bucket/runs' looks like a URL but is not one (a scheme takes "
          "'://') (hint: did you mean s3://my-bucket/runs?; a local folder named so: "
          "./s3:/my-bucket/runs)")]),
    # issue 45: accepted, then a warning every 2 s and no notice ever seen
    ("metadata-endpoint-torn", MINIMAL + "resources: {metadata_endpoint: 'http://[::1'}\n",
     [(5, "resources.metadata_endpoint: is not a URL (Invalid IPv6 URL), got 'http://[::1' "
          "(hint: the metadata service's base URL, e.g. http://169.254.169.254)")]),
    ("metadata-endpoint-scheme", MINIMAL + "resources: {metadata_endpoint: '169.254.169.254'}\n",
     [(5, "resources.metadata_endpoint: must be an http:// or https:// URL with a host")]),
    ("scheme-no-slash", MINIMAL + "storage: {url: 'gs:bucket/runs'}\n",
     [(5, "storage.url: 'gs:bucket/runs' looks like a URL but is not one")]),
    ("python-tag", MINIMAL + "x: !!python/object/apply:os.system ['echo hi']\n",
     [(5, "is not allowed (plain lists and mappings only)")]),
    ("python-tag-scalar", MINIMAL + "x: !!python/name:os.system\n",
     [(5, "YAML syntax error: could not determine a constructor")]),
    ("merge-key", MINIMAL + "<<: {name: u}\n", [(5, "keys must be plain names")]),
    ("deep-nesting", "a: " + "[" * 200 + "]" * 200 + "\n", [(1, "nesting deeper than")]),
    ("lr-inf", MINIMAL.replace("max_steps: 10", "max_steps: 10, lr: .inf"),
     [(4, "train.lr: expected a finite number, got inf")]),
    ("model-not-mapping", MINIMAL.replace("{arch: ten, preset: tiny}", "tiny"),
     [(2, "model: expected a mapping, got 'tiny' (hint: e.g. model: {arch: ten, preset: tiny})")]),
    ("every-unknown-model-field", "name: t\nmodel:\n  preset: tiny\n  n_layer: 1\n"
                                  "  dmodel: 2\ndata: {dataset: imdb}\ntrain: {max_steps: 1}\n",
     [(4, "model.n_layer: unknown model field"), (5, "model.dmodel: unknown model field "
                                                    "'dmodel' for arch ten (did you mean")]),
    ("scan-backend", MINIMAL.replace("preset: tiny}", "preset: tiny, scan_backend: nope}"),
     [(2, "model.scan_backend: expected one of auto, chunked, fused, ref, got 'nope'")]),
    ("transformer-learned-pos", MINIMAL.replace(
        "arch: ten, preset: tiny}", "arch: transformer, preset: tiny, pos: learned, seq_len: 64}"),
     [(3, "data.seq_len: 256 is longer than the model's learned positions (64)")]),
    ("tokenizer-path-and-vocab", MINIMAL.replace(
        "builtin:botocore-docs}", "builtin:botocore-docs, tokenizer: {path: a.model, "
        "vocab_size: 100}}"),
     [(3, "data.tokenizer.vocab_size: give either tokenizer.path or tokenizer.vocab_size")]),
    ("data-files-local", MINIMAL.replace("builtin:botocore-docs}", "./x.txt, data_files: y}"),
     [(3, "data.data_files: only applies to a known hub dataset")]),
    ("model-errors-together", MINIMAL.replace(
        "preset: tiny}", "preset: tiny, n_layer: 3, selective: 'yes', chunk_size: 0}"),
     [(2, "model.n_layer: unknown model field 'n_layer'"),
      (2, "model.selective: expected true or false, got 'yes'"),
      (2, "model.chunk_size: must be >= 1, got 0")]),
    ("transformer-field-on-ten", MINIMAL.replace("preset: tiny}", "preset: tiny, pos: rope}"),
     [(2, "model.pos: unknown model field 'pos' for arch ten")]),
    ("adamw8bit-cpu", MINIMAL.replace("max_steps: 10",
                                      "max_steps: 10, optimizer: adamw8bit, device: cpu"),
     [(4, "train.optimizer: adamw8bit needs a CUDA device")]),
    ("fp8-head-liger", MINIMAL.replace("preset: tiny}", "preset: tiny, fp8: tensor, "
                                       "fp8_head: true}").replace("max_steps: 10",
                                                                  "max_steps: 10, loss: liger"),
     [(4, "train.loss: liger runs the head in the autocast dtype; model.fp8_head needs loss "
          "chunked, fused or auto")]),
    ("fp8-head-without-fp8", MINIMAL.replace("preset: tiny}", "preset: tiny, fp8_head: true}"),
     [(2, "model.fp8_head: needs fp8 set to tensor or row")]),
]


@pytest.mark.parametrize("text,expected", [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_malformed_job(tmp_path, text, expected):
    path = tmp_path / "job.yaml"
    path.write_text(text)
    errors = assert_one_line_per_error(validate(str(path)), str(path))
    for line, fragment in expected:
        prefix = f"{path}:{line}"
        assert any(e.startswith(prefix) and fragment in e for e in errors), \
            f"want {prefix} ... {fragment!r} in:\n" + "\n".join(errors)
    with pytest.raises(JobError) as info:
        load_job(path, check_paths=True)  # what validate checks
    assert info.value.errors == errors


def test_all_errors_reported_at_once(tmp_path):
    path = tmp_path / "x.yaml"
    path.write_text("name: X\nmodel: {preset: tiny}\ndata: {dataset: imdb, mode: fast}\n"
                    "train: {max_steps: 0, lr: fast}\n")
    errors = assert_one_line_per_error(validate(str(path)), str(path))
    assert [e.split(" ")[1] for e in errors] == \
        ["name:", "data.mode:", "train.max_steps:", "train.lr:"]


@pytest.mark.parametrize("kind", ["missing", "directory", "binary", "latin1", "huge"])
def test_unreadable_files(tmp_path, kind):
    path = tmp_path / "job.yaml"
    if kind == "directory":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 4)
    elif kind == "latin1":
        path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    elif kind == "huge":
        path.write_text("# padding\n" * 200_000)
    errors = assert_one_line_per_error(validate(str(path)), str(path))
    assert len(errors) == 1


def test_validate_many_files_reports_each(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(MINIMAL.replace("max_steps: 10", "max_steps: 0"))
    result = validate(str(ROOT / "jobs/tiny-cpu.yaml"), str(bad))
    assert result.exit_code == ExitCode.CONFIG
    assert result.stdout.startswith("ok: ")
    assert "Error: 1 of 2 job files invalid" in result.stderr


# --- --set ------------------------------------------------------------------------


def test_set_overrides_are_typed():
    job = load_job(ROOT / "jobs/tiny-cpu.yaml",
                   sets=["train.lr=1e-3", "train.compile=true", "data.num_proc=null",
                         "model.selective=true", "train.betas=[0.8, 0.9]", "resources.gpus=2"])
    assert job.train.lr == 1e-3 and isinstance(job.train.lr, float)
    assert job.train.compile is True and job.data.num_proc is None
    assert job.model.overrides == {"selective": True}
    assert job.train.betas == (0.8, 0.9) and job.resources.gpus == 2


def test_set_budget_replaces_the_files_budget():
    job = load_job(ROOT / "jobs/l40s-small-32k.yaml", sets=["train.max_steps=5"])
    assert (job.train.max_steps, job.train.max_tokens) == (5, None)


def test_set_accepts_a_single_string():
    assert parse_job(MINIMAL, sets="train.max_steps=3").train.max_steps == 3


def test_set_creates_missing_sections(tmp_path):
    job = parse_job(MINIMAL, sets=["checkpoint.keep_last=7"])
    assert job.checkpoint.keep_last == 7


@pytest.mark.parametrize("setting,message", [
    ("train.lr=fast", "--set train.lr: expected a number, got 'fast'"),
    ("train.max_step=3", "--set train.max_step: unknown key 'max_step' (did you mean "
                         "'max_steps'?)"),
    ("trian.lr=1", "--set trian.lr: unknown key 'trian' (did you mean 'train'?)"),
    ("data.vocab_size=300", "--set data.vocab_size: unknown key 'vocab_size' here (it "
                            "belongs in data.tokenizer: {vocab_size: ...})"),
    ("train.lr.x=1", "--set train.lr.x: train.lr is a value, not a section"),
    ("train.lr", "--set train.lr: expected KEY=VALUE"),
    ("model.n_layer=2", "--set model.n_layer: unknown model field 'n_layer'"),
    ("train.batch_size=0", "--set train.batch_size: must be >= 1, got 0"),
    ("name=Bad Name", "--set name: must be 1-63 characters"),
    ("train.lr=[1", "--set train.lr: cannot parse the value"),
    ("train.lr=*a", "--set train.lr: cannot parse the value: YAML anchors and aliases"),
])
def test_bad_set(setting, message):
    path = ROOT / "jobs/tiny-cpu.yaml"
    result = validate(str(path), "--set", setting)
    errors = assert_one_line_per_error(result, str(path))
    assert any(e.startswith(message) for e in errors), errors


def test_validate_says_which_model_is_trained_and_which_settings_beat_the_preset(tmp_path):
    """`--set model.preset=large` on a file with d_model 128 trained a 24-layer model of
    width 128, and nothing said so (issue 44)."""
    job = tmp_path / "job.yaml"
    job.write_text((ROOT / "jobs/tiny-cpu.yaml").read_text().replace(
        "model: {arch: ten, preset: tiny}", "model: {arch: ten, preset: tiny, d_model: 128}"))
    result = validate(str(job), "--set", "model.preset=large")
    assert result.exit_code == 0, result.output
    line = result.stdout.splitlines()[1]
    assert line.startswith("  model ten/large: n_layers 24, d_model 128, ")
    assert "the job sets " in line and "model.d_model 128 (preset 2048)" in line


def test_validate_refuses_a_job_too_big_for_its_accelerator():
    """A job too big for the card validated ok and `run` refused it on the card (issue
    44): with GPUs asked for, validate runs run's estimate against resources.accelerator."""
    big = ("--set", "resources.gpus=1", "--set", "train.batch_size=1024",
           "--set", "data.seq_len=2048")
    result = validate(str(ROOT / "jobs/tiny-cpu.yaml"), *big,
                      "--set", "resources.accelerator=L4")
    assert result.exit_code == ExitCode.CONFIG
    assert "resources.accelerator: the job does not fit the 22.5 GiB NVIDIA L4" in result.stderr
    assert "lower train.batch_size" in result.stderr
    result = validate(str(ROOT / "jobs/tiny-cpu.yaml"), *big,
                      "--set", "resources.accelerator=H200")
    assert result.exit_code == 0, result.output


def test_a_jobs_model_config_is_built_once_per_vocabulary(monkeypatch):
    # A run asks for its model in several places (identity, the model line, the memory
    # check, the trainer): the config is built once per vocabulary, not at each.
    import ten.model.presets as presets

    built = []
    real = presets.model_config
    monkeypatch.setattr(presets, "model_config", lambda *a, **k: built.append(k) or real(*a, **k))
    job = parse_job(MINIMAL_JOB)
    built.clear()  # the load's own model check
    first = job.model_settings(300)
    assert job.model_settings(300) is first and len(built) == 1
    assert job.model_settings().vocab_size != 300 and len(built) == 2


@pytest.mark.parametrize("setting,given", [
    ("data.tokenizer.path=/models/tok.model", "data.tokenizer.path"),
    ("train.init_from=runs/base", "train.init_from"),
])
def test_the_model_line_names_where_a_given_tokenizers_vocabulary_comes_from(setting, given):
    # it printed the preset's (or the job's unused) vocab_size as the model's, before the
    # tokenizer that decides it was read (issue 44's fine-tuning, left over)
    job = parse_job(MINIMAL_JOB, sets=[setting], check_model=False)
    line = job.model_text()
    assert f"vocab_size from {given}'s tokenizer" in line
    assert "data.tokenizer.vocab_size" not in line, line
