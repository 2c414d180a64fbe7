"""``ten-runner export-model``: a trained run becomes a folder that Hugging Face
transformers loads (trust_remote_code), with the same logits, the same token ids and the
same greedy text as the runner's own model, and generation that carries its state."""

import json
import os

import pytest
import torch
from click.testing import CliRunner
from runhelpers import run_to_end, write_job

from runner.cli import cli
from runner.exit_codes import ExitCode
from runner.trained.hf_folder import load_exported
from ten.data import Tokenizer
from ten.train import checkpoint as ckpt
from ten.train.trainstate import load_model

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here reaches a hub
transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.slow  # a whole training run in a subprocess (the module's fixture)

TEXTS = ["a checkpoint", "The line\nand the next one\n\n  indented\tand tabbed",
         "naïve café — ünïcödé", ""]


@pytest.fixture(scope="module")
def run(tmp_path_factory, corpus):
    """A real run of the tiny preset (selective, with a convolution): two checkpoints."""
    tmp = tmp_path_factory.mktemp("export")
    job = write_job(tmp, corpus, steps=12, every=6)
    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    return tmp / "store" / "t"


@pytest.fixture(scope="module")
def folder(run, tmp_path_factory):
    out = tmp_path_factory.mktemp("exported") / "t-hf"
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"exported to {out}" in result.output
    return out


def hf_model(folder):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    return model.eval()


def test_the_folder_holds_safetensors_config_code_tokenizer_and_card(folder, run):
    from safetensors.torch import load_file

    names = {p.name for p in folder.iterdir()}
    # the mode the user's umask gives every other file (safetensors' own writer: 0600)
    mask = os.umask(0)
    os.umask(mask)
    assert (folder / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask
    assert {"model.safetensors", "config.json", "configuration_ten.py", "modeling_ten.py",
            "tokenization_ten.py", "tokenizer.model", "tokenizer_config.json",
            "generation_config.json", "README.md"} <= names
    weights = load_file(folder / "model.safetensors")  # plain tensors: no code runs
    mine = load_model(ckpt.latest_valid(run / "checkpoints").path)
    assert set(weights) == set(mine.state_dict())
    config = json.loads((folder / "config.json").read_text())
    assert config["model_type"] == "ten" and config["architectures"] == ["TENForCausalLM"]
    assert config["selective"] is True and config["conv_width"] > 0  # the tiny preset
    card = (folder / "README.md").read_text()
    assert "exported at step 12" in card and "held-out loss" in card
    assert "| tokens seen | 1,536 |" in card  # 12 steps x batch 4 x seq_len 32


def test_transformers_gives_the_runners_logits(folder, run):
    mine = load_model(ckpt.latest_valid(run / "checkpoints").path)
    theirs = hf_model(folder)
    ids = torch.randint(0, mine.config.vocab_size, (2, 45), generator=torch.Generator()
                        .manual_seed(0))  # 45: chunks of 16, the last one short
    with torch.no_grad():
        want, _ = mine(ids)
        got = theirs(ids).logits
        # and continuing from the carried state is the same as reading it all at once
        first = theirs(ids[:, :20])
        rest = theirs(ids[:, 20:], state=first.state).logits
    assert got.shape == want.shape
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert torch.allclose(torch.cat([first.logits, rest], 1), got, atol=1e-5, rtol=0)


def test_a_matrix_state_exports_with_the_runners_logits_and_carried_state(tmp_path, corpus):
    """A run with value-vector eigenstates (model.state: matrix): the folder's own code
    computes them as the trainer does, read at once or continued from its state."""
    job = write_job(tmp_path, corpus, name="m", steps=2, every=2)
    code, _, err = run_to_end("run", job, "--no-sample", "--set", "model.state=matrix")
    assert code == 0, err
    run, out = tmp_path / "store" / "m", tmp_path / "m-hf"
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["state"] == "matrix"
    mine, theirs = load_model(ckpt.latest_valid(run / "checkpoints").path), hf_model(out)
    ids = torch.randint(0, mine.config.vocab_size, (2, 37), generator=torch.Generator()
                        .manual_seed(0))  # chunks of 16, the last one short
    with torch.no_grad():
        want, _ = mine(ids)
        got = theirs(ids).logits
        first = theirs(ids[:, :20])
        rest = theirs(ids[:, 20:], state=first.state).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()
    assert torch.allclose(torch.cat([first.logits, rest], 1), got, atol=1e-5, rtol=0)


def test_auto_tokenizer_encodes_as_the_run_did(folder, run):
    tok = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    mine = Tokenizer(run / "tokenizer.model")
    for text in TEXTS:
        ids = tok(text).input_ids
        assert ids == mine.encode(text), text
        assert tok.decode(ids) == mine.decode(ids)
    assert tok.eos_token_id == mine.eos_id


def test_greedy_generate_is_ten_runner_sample(folder, run):
    tok = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    model = hf_model(folder)
    ids = tok("a checkpoint", return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    code, printed, err = run_to_end("sample", run, "--prompt", "a checkpoint",
                                    "--temperature", "0", "--max-new-tokens", "12")
    assert code == 0, err
    assert printed.strip() == f"[t step 12] {tok.decode(out[0])}"


def test_generation_reads_each_new_token_alone(folder):
    """The carried state: after the prompt, every forward call sees one token, so a
    token costs the same however long the text before it (not the prefix again)."""
    model = hf_model(folder)
    lengths = []
    model.register_forward_pre_hook(lambda m, args, kw: lengths.append(
        kw["input_ids"].shape[1]), with_kwargs=True)
    model.generate(torch.tensor([[5, 6, 7, 8, 9]]), max_new_tokens=6, do_sample=False,
                   min_new_tokens=6)
    assert lengths[0] == 5 and lengths[1:] == [1] * (len(lengths) - 1) and len(lengths) >= 5


def test_an_older_step_exports_and_a_missing_one_is_named(run, tmp_path):
    out = tmp_path / "step6"
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out),
                                      "--step", "6"])
    assert result.exit_code == 0, result.output
    assert "exported at step 6" in (out / "README.md").read_text()
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(tmp_path / "x"),
                                      "--step", "5"])
    assert result.exit_code == ExitCode.CONFIG
    assert result.output.count("\n") == 1 and "no valid checkpoint of step 5" in result.output
    assert not (tmp_path / "x").exists()


def test_an_existing_folder_is_never_overwritten(run, folder):
    before = sorted(p.name for p in folder.iterdir())
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(folder)])
    assert result.exit_code == ExitCode.CONFIG
    assert result.output.count("\n") == 1 and "already exists and is not empty" in result.output
    assert "--overwrite" in result.output
    assert sorted(p.name for p in folder.iterdir()) == before


def test_overwrite_replaces_an_earlier_export_and_nothing_else(run, tmp_path):
    out = tmp_path / "hf"
    assert CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out),
                                    "--step", "6"]).exit_code == 0
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out),
                                      "--overwrite"])
    assert result.exit_code == 0, result.output
    assert "exported at step 12" in (out / "README.md").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]  # no temporary left
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(mine),
                                      "--overwrite"])
    assert result.exit_code == ExitCode.CONFIG and "not a folder export-model wrote" in \
        result.output
    assert (mine / "notes.txt").read_text() == "keep me"


def test_a_full_disk_is_one_line_exit_4_and_leaves_nothing(run, small_disk):
    """Was a safetensors traceback, exit 1 (issue 45)."""
    disk = small_disk(64)  # the weights alone need more
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(disk / "hf")])
    assert result.exit_code == ExitCode.STORAGE, result.output
    assert result.output.count("\n") == 1, result.output
    assert "No space left on device" in result.output and "free on" in result.output
    assert str(disk / "hf") in result.output and "Traceback" not in result.output
    assert list(disk.iterdir()) == []


def test_a_stop_while_writing_exports_nothing_and_one_in_the_rename_finishes(
        run, tmp_path, monkeypatch):
    """SIGTERM after the last write exited -15 with the folder in place, and a rerun was
    refused (issue 45): a stop while writing leaves nothing (75); one during the rename
    is noted and the export completes (0)."""
    import signal

    from runner.trained import hf_folder as export_mod

    real_write, real_replace = export_mod._write_folder, os.replace

    def write_then_stop(folder, *a):
        real_write(folder, *a)
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(export_mod, "_write_folder", write_then_stop)
    out = tmp_path / "stopped"
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out)])
    assert result.exit_code == ExitCode.PREEMPTED, result.output
    assert "stopped by SIGTERM: nothing was written" in result.output
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setattr(export_mod, "_write_folder", real_write)

    def stop_then_replace(src, dst):
        os.kill(os.getpid(), signal.SIGTERM)
        real_replace(src, dst)

    monkeypatch.setattr(export_mod.os, "replace", stop_then_replace)
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out)])
    monkeypatch.setattr(export_mod.os, "replace", real_replace)
    assert result.exit_code == 0, result.output
    assert "exported to" in result.output and (out / "model.safetensors").is_file()


def test_eval_scores_any_text_at_three_lengths_the_same_for_run_and_folder(run, folder,
                                                                            corpus, tmp_path):
    """`ten-runner eval`: a run and its exported folder are the same model, so the same
    numbers; bits per byte is the summed loss in bits over the bytes predicted."""
    text = tmp_path / "held-out.txt"
    docs = [json.loads(line)["text"] for line in
            (corpus / "docs.jsonl").read_text().splitlines()[:60]]
    text.write_text("\n\n".join(docs))
    outs = []
    for target in (str(run), str(folder)):
        result = CliRunner().invoke(cli, ["eval", target, "--data", str(text), "--json",
                                          "--max-tokens", "2048"])
        assert result.exit_code == 0, result.output
        outs.append(json.loads(result.output))
    by_run, by_folder = outs
    assert [s["length"] for s in by_run["by_length"]] == [32, 128, 512]  # seq_len 32
    for a, b in zip(by_run["by_length"], by_folder["by_length"], strict=True):
        assert a["tokens"] == b["tokens"] and a["loss"] == pytest.approx(b["loss"], abs=1e-6)
    first = by_run["by_length"][0]
    assert by_run["loss"] == first["loss"] and 0 < first["loss"] < 8
    assert first["bits_per_byte"] == pytest.approx(
        first["loss"] * first["tokens"] / 0.6931471805599453 / first["bytes"])
    plain = CliRunner().invoke(cli, ["eval", str(folder), "--data", str(text),
                                     "--max-tokens", "2048"])
    assert "bits per byte compares models across tokenizers" in plain.output
    assert plain.output.count("length") == 3
    # it says when --max-tokens cut the text (was silent about scoring only its start)
    assert f"the first 2,048 of {first['available']:,} tokens" in plain.output
    assert "--max-tokens scores more" in plain.output
    whole = CliRunner().invoke(cli, ["eval", str(folder), "--data", str(text),
                                     "--max-tokens", str(first["available"])])
    assert "--max-tokens scores more" not in whole.output.split("length    128")[0]
    assert "all of the text" in whole.output


def test_eval_of_text_too_short_or_not_text_is_one_line(folder, tmp_path):
    short = tmp_path / "short.txt"
    short.write_text("a checkpoint")
    result = CliRunner().invoke(cli, ["eval", str(folder), "--data", str(short)])
    assert result.exit_code == ExitCode.CONFIG
    assert result.output.count("\n") == 1 and "too short for one window" in result.output
    medium = tmp_path / "medium.txt"  # fills windows of 32 and 128 tokens, not 512
    medium.write_text(" ".join(["a checkpoint is committed when its manifest is written"] * 20))
    result = CliRunner().invoke(cli, ["eval", str(folder), "--data", str(medium)])
    assert result.exit_code == 0, result.output
    assert "length    128: loss" in result.output
    assert "length    512: the text is too short for one window" in result.output
    result = CliRunner().invoke(cli, ["eval", str(folder), "--data", str(medium), "--json"])
    assert json.loads(result.output)["too_short_for"] == [512]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n[1, 2]\n')
    result = CliRunner().invoke(cli, ["eval", str(folder), "--data", str(bad)])
    assert result.exit_code == ExitCode.CONFIG and f"{bad}:2:" in result.output


@pytest.fixture(scope="module")
def baseline(tmp_path_factory, corpus):
    """A real run of the transformer baseline (swiglu, rope) and its exported folder."""
    tmp = tmp_path_factory.mktemp("baseline")
    code, _, err = run_to_end("run", write_job(tmp, corpus, name="b", arch="transformer",
                                               steps=8, every=8), "--no-sample")
    assert code == 0, err
    run, out = tmp / "store" / "b", tmp / "b-hf"
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out)])
    assert result.exit_code == 0, result.output
    return run, out


def test_the_transformer_baseline_exports_as_a_stablelm_without_model_code(baseline):
    """No code from the folder loads the model; it gives the runner's logits and greedy
    text, and `ten-runner eval` reads the folder back as the same model."""
    run, folder = baseline
    assert not (folder / "modeling_ten.py").exists()
    assert json.loads((folder / "config.json").read_text())["architectures"] == \
        ["StableLmForCausalLM"]
    assert "as StableLM" in (folder / "README.md").read_text()
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    mine = load_model(ckpt.latest_valid(run / "checkpoints").path)
    ids = torch.randint(0, mine.config.vocab_size, (2, 40),
                        generator=torch.Generator().manual_seed(1))
    read_back, _ = load_exported(folder)  # what `ten-runner eval FOLDER` scores
    with torch.no_grad():
        assert torch.allclose(theirs(ids).logits, mine(ids)[0], atol=1e-5, rtol=0)
        assert torch.equal(read_back(ids)[0], mine(ids)[0])
    tok = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    out = theirs.generate(tok("a checkpoint", return_tensors="pt").input_ids,
                          max_new_tokens=10, do_sample=False)
    code, printed, err = run_to_end("sample", run, "--prompt", "a checkpoint",
                                    "--temperature", "0", "--max-new-tokens", "10")
    assert code == 0, err
    assert printed.strip() == f"[b step 8] {tok.decode(out[0])}"


def test_a_push_the_hub_refuses_keeps_the_folder_and_never_shows_the_token(run, tmp_path):
    """Up to the upload call: here the Hub is a port nobody listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: connections are refused
    token = "hf_secretTOKENvalue123"
    out = tmp_path / "pushed"
    result = CliRunner().invoke(cli, ["export-model", str(run), "--out", str(out),
                                      "--push-to-hub", "me/tiny-ten"],
                                env={"HF_TOKEN": token, "HF_ENDPOINT": f"http://127.0.0.1:{port}"})
    assert result.exit_code == ExitCode.STORAGE, result.output
    assert token not in result.output
    assert f"exported to {out}" in result.output
    (last,) = result.stderr.strip().splitlines()
    assert last.startswith("Error: cannot push to the Hub repository me/tiny-ten")
    assert f"the folder is kept at {out}" in last
    assert (out / "model.safetensors").is_file()


def readme_task(data):
    """The local task YAML the README gives, reading ``data``: the one users copy."""
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"```yaml\n(task: held_out\n.*?)```", readme, re.S).group(1)
    return block.replace("/abs/path/held-out.jsonl", str(data))


def test_lm_evaluation_harness_scores_the_folder_as_ten_runner_eval_does(folder, corpus,
                                                                          tmp_path):
    """lm-evaluation-harness's `hf` model on the exported folder, with a local task (a
    JSONL file, no hub), reports the bits per byte `ten-runner eval --per-document` does."""
    import lm_eval  # a test extra
    from lm_eval.tasks import TaskManager

    docs = [json.loads(line)["text"].strip() for line in
            (corpus / "docs.jsonl").read_text().splitlines()[:24]]
    data = tmp_path / "held-out.jsonl"
    data.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs if d))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "held_out.yaml").write_text(readme_task(data))
    results = lm_eval.simple_evaluate(
        # no max_length: the folder's config says it (was 2,048-token windows: 1.5697
        # against eval's 1.5638 bits per byte on longer documents)
        model="hf", model_args=f"pretrained={folder},trust_remote_code=True,dtype=float32",
        tasks=["held_out"], task_manager=TaskManager(include_path=str(tasks)),
        batch_size=1, device="cpu")
    theirs = results["results"]["held_out"]
    result = CliRunner().invoke(cli, ["eval", str(folder), "--data", str(data),
                                      "--per-document", "--json"])
    assert result.exit_code == 0, result.output
    ours = json.loads(result.output)
    assert theirs["bits_per_byte,none"] == pytest.approx(ours["bits_per_byte"], rel=1e-5)
    assert theirs["byte_perplexity,none"] == pytest.approx(2 ** ours["bits_per_byte"],
                                                           rel=1e-5)


def test_tools_size_their_windows_by_the_length_eval_scores(folder):
    """lm-evaluation-harness found no length in the folder and read 2,048-token windows
    (issue 44): a TEN model reads any length, so the folder names eval's default."""
    from lm_eval.models.utils import resolve_max_length

    from runner.trained.evaluate import MAX_TOKENS

    config = transformers.AutoConfig.from_pretrained(folder, trust_remote_code=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
    assert resolve_max_length(config, tokenizer) == MAX_TOKENS == 65536


def test_readers_refuse_another_runs_checkpoint_put_in_as_the_newest(run, baseline,
                                                                     tmp_path):
    """Issue 45, fault 2: `run` refused a foreign newest checkpoint, but `sample` printed
    from it and `export-model` exported it as this run's model."""
    import shutil

    copy = tmp_path / "t"
    shutil.copytree(run, copy)
    shutil.rmtree(copy / "checkpoints" / "step-00000012")
    foreign = copy / "checkpoints" / "step-00000008"  # run b's, newer than t's step 6
    shutil.copytree(baseline[0] / "checkpoints" / "step-00000008", foreign)
    for args in (["sample", str(copy)], ["export-model", str(copy), "--out",
                                          str(tmp_path / "out")]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == ExitCode.CONFIG, (args, result.output)
        assert result.output == f"Error: {foreign} is a checkpoint of run 'b', not of 't': " \
            "it was put there from another run; remove it, or name one of this run's " \
            "steps with --step\n", args
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(cli, ["sample", str(copy), "--step", "6"])
    assert result.exit_code == 0 and result.output.startswith("[t step 6] "), result.output


@pytest.mark.parametrize("swap", ["damaged", "another"])
def test_readers_refuse_a_tokenizer_the_checkpoint_was_not_trained_with(run, tmp_path, corpus,
                                                                        swap):
    """Issue 45, faults 2 and 3: another valid sentencepiece model in the run exported
    and scored (its ids decode to other words) and crashed `sample`; a damaged one was a
    traceback naming a setting these commands do not have. Each reader now checks the
    file against the fingerprint the checkpoint records: one line, exit 3, nothing
    written."""
    import shutil

    import sentencepiece as spm

    copy = tmp_path / "t"
    shutil.copytree(run, copy)
    model = copy / "tokenizer.model"
    if swap == "damaged":
        model.write_bytes(b"not a sentencepiece model" * 10)
    else:
        spm.SentencePieceTrainer.train(input=str(corpus / "docs.jsonl"), vocab_size=60,
                                       hard_vocab_limit=False, eos_id=2, minloglevel=2,
                                       model_prefix=str(tmp_path / "other"))
        shutil.copyfile(tmp_path / "other.model", model)
    why = "is not a sentencepiece model" if swap == "damaged" else "is not the tokenizer step"
    text = tmp_path / "text.txt"
    text.write_text("a checkpoint in the bucket " * 50)
    for args in (["sample", str(copy)], ["eval", str(copy), "--data", str(text)],
                 ["export-model", str(copy), "--out", str(tmp_path / "out")]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == ExitCode.DATA, (args, result.output)
        assert result.output.count("\n") == 1 and f"{model} {why}" in result.output, args
    assert not (tmp_path / "out").exists()
