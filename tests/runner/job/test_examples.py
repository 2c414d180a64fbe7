"""The example jobs validate, the defaults are the documented ones, and the JSON
schema is what `ten-runner schema` prints."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from jobcli import validate
from runhelpers import MINIMAL_JOB

from runner.cli import cli
from runner.job import PRESETS, JobError, json_schema, load_job, parse_job
from runner.job.library import data_config

ROOT = Path(__file__).resolve().parents[3]
JOBS = sorted((ROOT / "jobs").glob("*.yaml"))

MINIMAL = MINIMAL_JOB




# --- the examples -----------------------------------------------------------------


def test_there_are_example_jobs():
    names = {p.name for p in JOBS}
    assert {"tiny-cpu.yaml", "tiny-cpu-transformer.yaml", "tiny-cpu-streaming.yaml",
            "l40s-small-32k.yaml"} <= names


@pytest.mark.parametrize("path", JOBS, ids=lambda p: p.name)
def test_every_example_job_validates(path):
    job = load_job(path)
    assert job.name == path.stem
    assert job.source_path == path
    result = validate(str(path))
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"ok: {path} (name={job.name}, ")


def test_default_job_fields():
    job = load_job(ROOT / "jobs/tiny-cpu.yaml", sets=["train.max_steps=20"])
    assert (job.model.arch, job.model.preset, job.model.overrides) == ("ten", "tiny", {})
    assert (job.data.dataset, job.data.mode, job.data.seq_len) == \
        ("builtin:botocore-docs", "pretokenized", 256)
    assert job.data.tokenizer.vocab_size == 4096 and job.data.tokenizer.type == "bpe"
    assert job.data.tokenizer.path is None and job.data.tokenizer.byte_fallback is True
    assert job.data.num_workers == 0 and job.data.val_fraction == 0.01 and job.data.shuffle
    t = job.train
    assert (t.max_steps, t.max_tokens, t.batch_size, t.grad_accum) == (20, None, 8, 1)
    assert (t.lr, t.warmup_steps, t.schedule, t.precision, t.optimizer) == \
        (3e-3, 30, "cosine", "auto", "adamw")
    # the sequence-length warm-up the copy task needed (BENCHMARKS.md), over half the steps
    assert (t.seq_warmup_start, t.seq_warmup_steps) == (64, 150)
    assert t.betas == (0.9, 0.95) and t.eval_every == 100 and t.device == "auto"
    assert (job.checkpoint.every_steps, job.checkpoint.keep_last) == (100, 3)
    assert job.storage.local_path() == Path("runs")
    assert (job.resources.gpus, job.resources.spot, job.resources.price_per_hour) == \
        (0, False, None)
    assert data_config(job).tokenizer.vocab_size == 4096
    assert json.loads(json.dumps(job.redacted_dict()))["train"]["max_steps"] == 20


def test_l40s_job_uses_model_override_and_token_budget():
    job = load_job(ROOT / "jobs/l40s-small-32k.yaml")
    assert job.model.overrides == {"grad_checkpointing": False, "residual_dtype": "bf16"}
    settings = job.model_settings()
    assert settings.grad_checkpointing is False and settings.residual_dtype == "bf16"
    # the fused scan on the GPU it is written for: auto picks it on CUDA (ten.kernels.scan)
    assert job.model_settings().scan_backend == "auto"
    assert job.model_settings(32000).seq_len == job.data.seq_len == 32768
    assert job.train.max_tokens and job.train.max_steps is None
    assert job.train.precision == "bf16" and job.train.optimizer == "adamw8bit"
    assert job.resources.gpus == 1 and job.resources.spot is True


def test_the_l40s_job_fits_an_l40s_by_the_trainers_check():
    """Micro-batches of 4 (for speed) must still fit the card the job is named for, by the
    estimate the trainer checks there (the fused scan and loss, 8-bit AdamW, bf16)."""
    import torch

    from runner.job.library import train_config
    from ten.train.memory import MemoryEstimate, estimate_training_memory, fit_problem

    job = load_job(ROOT / "jobs/l40s-small-32k.yaml")
    cfg, train = job.model_settings(job.data.tokenizer.vocab_size), train_config(job)
    assert (train.batch_size, train.grad_accum) == (4, 2)  # 262k tokens a step
    est = estimate_training_memory(cfg, train.batch_size, cfg.seq_len, torch.bfloat16,
                                   train.optimizer, scan_backend="fused", loss_backend="fused")
    l40s = 46068 * 2**20  # what nvidia-smi reports of an L40S
    assert fit_problem(est, l40s, "NVIDIA L40S", cfg) is None, est.describe()
    assert est.total > 30e9  # 33.6 GB measured on an H100: the check is not vacuous
    twice = MemoryEstimate(**{**est.__dict__, "activations": 2 * est.activations})
    assert fit_problem(twice, l40s, "NVIDIA L40S", cfg) is not None  # batch 8 would not fit


def test_presets_match_ten_presets():
    import ten.model.presets
    from runner.job import ARCHS

    assert tuple(ten.model.presets.PRESETS) == PRESETS, "update Preset in runner/job/schema.py"
    assert ten.model.presets.ARCHS == ARCHS


def test_defaults_for_everything_but_the_required(tmp_path):
    job = parse_job(MINIMAL)
    assert job.data.mode == "pretokenized" and job.train.batch_size >= 1
    assert job.storage.url and job.checkpoint.keep_last >= 1


# --- schema -----------------------------------------------------------------------


def test_schema_command_prints_json_schema():
    result = CliRunner().invoke(cli, ["schema"])
    assert result.exit_code == 0, result.output
    schema = json.loads(result.output)
    assert schema == json.loads(json.dumps(json_schema()))
    assert schema["additionalProperties"] is False
    assert set(schema["required"]) == {"name", "model", "data", "train"}
    train = schema["$defs"]["TrainSection"]
    assert train["additionalProperties"] is False
    assert train["properties"]["schedule"]["enum"] == ["cosine", "onecycle", "constant", "wsd"]
    model = schema["$defs"]["ModelSection"]
    assert "pos" in model["then"]["properties"] and "pos" not in model["else"]["properties"]


@pytest.mark.parametrize("model,ok", [
    ({"preset": "tiny", "n_eigenstates": 32}, True),
    ({"arch": "transformer", "preset": "tiny", "pos": "learned"}, True),
    ({"arch": "transformer", "preset": "tiny", "n_eigenstates": 32}, True),  # the matched TEN
    ({"preset": "tiny", "pos": "learned"}, False),
    ({"preset": "tiny", "n_layer": 2}, False),
    ({"preset": "tiny", "d_model": "wide"}, False),
    ({"preset": "tiny", "scan_backend": "fusd"}, False),
    ({"preset": "tiny", "checkpoint_blocks": -1}, False),
    ({"preset": "tiny", "checkpoint_blocks": None}, True),
])
def test_the_editor_schema_takes_the_model_keys_validate_takes(model, ok):
    """An editor completing from `ten-runner schema` offers an arch's own model fields,
    and flags what `validate` refuses."""
    assert_editor_agrees({"model": model}, ok)


@pytest.mark.parametrize("section,ok", [
    ({"train": {"max_steps": 0}}, False),  # an optional number's bound
    ({"train": {"max_tokens": 10**6}}, True),
    ({"checkpoint": {"milestone_every": 0}}, False),
    ({"resources": {"max_preemptions": -1}}, False),
    ({"resources": {"aws": {"max_price": 0}}}, False),
    ({"resources": {"price_per_hour": 1.5}}, True),
])
def test_the_editor_schema_bounds_optional_numbers_as_validate_does(section, ok):
    """A bound on a number that may be null is a standard JSON Schema bound (minimum,
    exclusiveMinimum), which an editor applies, not a keyword it ignores."""
    assert_editor_agrees(section, ok)


def assert_editor_agrees(change: dict, ok: bool) -> None:
    import jsonschema

    job = {"name": "t", "model": {"preset": "tiny"}, "data": {"dataset": "imdb"},
           "train": {"max_steps": 1}}
    job.update(change)  # whole sections
    editor = not list(jsonschema.Draft202012Validator(json_schema()).iter_errors(job))
    try:
        parse_job(json.dumps(job))
        accepted, why = True, ""
    except JobError as e:
        accepted, why = False, str(e)
    assert (editor, accepted) == (ok, ok), why


def test_the_schema_describes_every_key():
    """`ten-runner schema` is editor completion: every key says what it is for."""
    schema = json_schema()

    def undescribed(node: dict, prefix: str) -> list[str]:
        out = []
        for key, prop in node.get("properties", {}).items():
            ref = prop.get("$ref") or next((a["$ref"] for a in prop.get("anyOf", [])
                                            if "$ref" in a), None)
            if ref:
                section = schema["$defs"][ref.split("/")[-1]]
                if not (prop.get("description") or section.get("description")):
                    out.append(prefix + key)
                out += undescribed(section, f"{prefix}{key}.")
            elif not prop.get("description"):
                out.append(prefix + key)
        return out

    assert undescribed(schema, "") == []
