"""``train.init_from``: a new run starts from a trained run's (or an export's) weights and
tokenizer, with a fresh optimizer and schedule; a model of another shape is refused
before any data is prepared; a resume of the new run never loads the source again.
Whole runs, in-process (tiny models, seconds each)."""

import pytest
import torch
from runhelpers import final_weights, write_job

from runner.exit_codes import ExitCode


def run(job_path, *sets):
    from runner.job import load_job
    from runner.run.jobrun import run_job
    from ten.train.stop import Stop

    with Stop().installed() as stop:
        return run_job(load_job(job_path, sets=list(sets)), stop, sample_prompt=None)


def log_of(tmp_path, name):
    return (tmp_path / "store" / name / "run.log").read_text()


@pytest.fixture
def base(tmp_path, corpus):
    """A trained run to start from: 6 steps of a tiny TEN."""
    assert run(write_job(tmp_path, corpus, name="base", steps=6, every=3)) == ExitCode.OK
    return tmp_path / "store" / "base"


# A learning rate too small to move a weight: the new run's first checkpoint holds the
# weights it started from.
STILL = ("train.lr=1.0e-12", "train.max_steps=1", "checkpoint.every_steps=1")


def test_a_run_starts_from_another_runs_weights_and_tokenizer(tmp_path, corpus, base):
    job = write_job(tmp_path, corpus, name="tuned")
    # vocab 300 asked for: the source's 400-piece tokenizer is used, as its weights need
    code = run(job, f"train.init_from={base}", "data.tokenizer.vocab_size=300", *STILL)
    assert code == ExitCode.OK, log_of(tmp_path, "tuned")
    tuned = tmp_path / "store" / "tuned"
    (step, weights), (_, started_from) = final_weights(tuned), final_weights(base)
    assert step == 1
    for name, tensor in started_from.items():
        assert torch.allclose(weights[name], tensor, atol=1e-6), name
    assert (tuned / "tokenizer.model").read_bytes() == (base / "tokenizer.model").read_bytes()
    said = log_of(tmp_path, "tuned")
    assert f"starting from the weights of {base} step 6: its model, with a fresh optimizer " \
           "and lr schedule (train.init_from)" in said
    # run again with a larger budget: it resumes its own checkpoint, the source stays put
    assert run(job, f"train.init_from={base}", *STILL[:1], "train.max_steps=2") == ExitCode.OK
    said = log_of(tmp_path, "tuned")
    assert f"train.init_from {base}: not loaded, this run resumes its own checkpoint" in said
    assert said.count("starting from the weights of") == 1


def test_a_run_is_named_by_its_name_in_dot_runs(tmp_path, corpus, base, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").symlink_to(base.parent)  # ./runs/base
    job = write_job(tmp_path, corpus, name="tuned")
    assert run(job, "train.init_from=base", *STILL) == ExitCode.OK, log_of(tmp_path, "tuned")
    assert "starting from the weights of base step 6" in log_of(tmp_path, "tuned")


def test_an_exported_folder_is_a_source_too(tmp_path, corpus, base):
    from runner.trained.hf_folder import export_model

    folder = export_model(base, tmp_path / "exported")
    job = write_job(tmp_path, corpus, name="tuned")
    assert run(job, f"train.init_from={folder}", *STILL) == ExitCode.OK
    (_, weights), (_, started_from) = final_weights(tmp_path / "store" / "tuned"), \
        final_weights(base)
    assert all(torch.allclose(weights[k], v, atol=1e-6) for k, v in started_from.items())
    assert f"starting from the weights of {folder} (exported)" in log_of(tmp_path, "tuned")


@pytest.mark.parametrize("setting,differs", [
    ("model.d_model=64", "model.d_model 32 there, 64 here"),  # another shape
    ("model.selective=false", "model.selective True there, False here"),  # same shapes
])
def test_another_model_is_refused_naming_the_setting(tmp_path, corpus, base, setting,
                                                     differs):
    job = write_job(tmp_path, corpus, name="other")
    assert run(job, f"train.init_from={base}", setting) == ExitCode.CONFIG
    said = log_of(tmp_path, "other")
    assert f"config error: train.init_from {base}: its model does not fit this job's " \
           f"({differs}); give the job the model it was trained with" in said
    assert "data ready" not in said  # refused before any data was prepared


def test_settings_the_weights_replace_may_differ(tmp_path, corpus, base):
    """Initialization ranges and the training length: the trained weights stand in for
    what the first would make, and no weight depends on the length."""
    job = write_job(tmp_path, corpus, name="longer")
    assert run(job, f"train.init_from={base}", "model.lambda_min=0.5", "data.seq_len=64",
               "model.init_std=0.05", *STILL) == ExitCode.OK, log_of(tmp_path, "longer")


def test_a_source_that_is_not_there_is_one_line(tmp_path, corpus):
    job = write_job(tmp_path, corpus, name="orphan")
    assert run(job, "train.init_from=runs/no-such-run") == ExitCode.CONFIG
    assert "config error: train.init_from runs/no-such-run: no such run directory or " \
           "exported folder (nor a run of that name in ./runs)" in log_of(tmp_path, "orphan")
