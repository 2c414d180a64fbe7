"""The trainer in-process: exact resume after a stop signal, corrupt, malformed and
tampered checkpoints, refused unsafe changes, retention, gradient accumulation,
non-finite steps, the ETA, honest throughput (eval left out, HFU beside MFU), the loss
backend, and when DDP ranks agree on stopping."""

import dataclasses
import hashlib
import json
import math
import os
import random
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from runhelpers import losses, train_values

from ten.config import TrainConfig
from ten.data import DataConfig, TokenizerConfig, open_data
from ten.kernels.loss import NextTokenLoss
from ten.model.presets import model_config
from ten.train import checkpoint as ckpt
from ten.train import trainer as trainer_mod
from ten.train.distributed import DistInfo, StopAgreement
from ten.train.metrics import read_metrics
from ten.train.nonfinite import NonFiniteCounter
from ten.train.progress import eta_seconds, progress_line
from ten.train.schedule import lr_multiplier
from ten.train.step import train_step
from ten.train.trainer import Outcome, Trainer
from ten.train.trainstate import (
    DivergedError,
    ResumeError,
    TrainState,
    load_model,
    rng_state,
    set_rng_state,
)

WORDS = ("the eigenstate decays and rotates while tokens arrive one after another in a "
         "long sequence of plain english words").split()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(0)
    with open(root / "corpus.jsonl", "w") as f:
        for _ in range(400):
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
            f.write(json.dumps({"text": text}) + "\n")
    cfg = DataConfig(dataset=str(root / "corpus.jsonl"), seq_len=32,
                     tokenizer=TokenizerConfig(vocab_size=400),
                     cache_dir=str(root / "cache"), num_proc=1, progress=False,
                     val_fraction=0.05)
    return open_data(cfg)


def mcfg(data, **kw):
    return model_config("ten", "tiny", vocab_size=data.tokenizer.vocab_size, d_model=32,
                        n_layers=2, n_eigenstates=8, n_heads=2, seq_len=32, chunk_size=16, **kw)


def tcfg(**kw):
    base = dict(max_steps=12, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=6,
                eval_batches=2, log_every=1, checkpoint_every=4, keep_last=2, num_workers=0,
                seed=7)
    base.update(kw)
    return TrainConfig(**base)


def trainer(data, run_dir, model=None, identity=None, **kw):
    return Trainer(model or mcfg(data), data, tcfg(**kw), run_dir,
                   identity or {"model": "m"}, {"train": kw}, log=lambda s: None)


class SignalAt:
    """Wraps the data so the loader sends SIGTERM to this process at batch ``at``."""

    def __init__(self, data, at):
        self.data, self.at, self.cfg = data, at, data.cfg

    def __getattr__(self, name):
        return getattr(self.data, name)

    def train_loader(self, *a, **kw):
        inner, at = self.data.train_loader(*a, **kw), self.at

        class Loader:
            def __iter__(self):
                for i, batch in enumerate(inner):
                    if i == at:
                        os.kill(os.getpid(), signal.SIGTERM)
                    yield batch

            def state_dict(self):
                return inner.state_dict()

            def load_state_dict(self, s):
                inner.load_state_dict(s)

        return Loader()


def test_a_stop_during_the_final_evaluation_is_said_to_be_there(data, tmp_path):
    """Issue 45, fault 6: SIGTERM while the finished run evaluated was logged "during
    training"; the last step is committed either way, so a rerun only evaluates."""
    from ten.train.stop import Interrupted, Stop

    class SignalAtEval:
        def __init__(self, data):
            self.data, self.cfg = data, data.cfg

        def __getattr__(self, name):
            return getattr(self.data, name)

        def val_batches(self, *a, **kw):
            os.kill(os.getpid(), signal.SIGTERM)
            return self.data.val_batches(*a, **kw)

    with Stop().installed() as stop:
        t = Trainer(mcfg(data), SignalAtEval(data), tcfg(max_steps=4, eval_every=0),
                    tmp_path, {"model": "m"}, {"train": {}}, log=lambda s: None, stop=stop)
        with pytest.raises(Interrupted):
            t.run()
        stop.handled()
    assert stop.phase == "the final evaluation"
    assert ckpt.committed_steps(tmp_path / "checkpoints")[-1] == 4


def final_weights(run_dir):
    found = ckpt.latest_valid(run_dir / "checkpoints")
    return found.step, ckpt.load(found.path, "model.pt")


def test_sigterm_then_resume_is_bit_exact(data, tmp_path):
    assert trainer(data, tmp_path / "a").run().outcome is Outcome.DONE
    t = Trainer(mcfg(data), SignalAt(data, 6), tcfg(), tmp_path / "b", {"model": "m"},
                {"train": {}}, log=lambda s: None)
    assert t.run().outcome is Outcome.PREEMPTED
    # the checkpoint of the step in flight when the signal came is committed
    assert ckpt.committed_steps(tmp_path / "b" / "checkpoints")[-1] == 7
    assert trainer(data, tmp_path / "b").run().outcome is Outcome.DONE
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    (sa, wa), (sb, wb) = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert sa == sb == 12
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_corrupt_newest_checkpoint_falls_back_to_previous(data, tmp_path):
    run = tmp_path / "run"
    assert trainer(data, run, max_steps=8).run().outcome is Outcome.DONE
    newest = run / "checkpoints" / "step-00000008" / "model.pt"
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    newest.write_bytes(bytes(raw))
    (run / "checkpoints" / "step-00000009").mkdir()  # never committed: no manifest
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=10), run, {"model": "m"}, {"train": {}},
                log=notes.append)
    assert t.run().outcome is Outcome.DONE
    assert any("corrupt" in n and "step-00000008" in n for n in notes)
    assert any("resumed from" in n and "step-00000004" in n for n in notes)
    assert any("uncommitted" in n and "step-00000009" in n for n in notes)


def test_unsafe_change_refused_safe_change_allowed(data, tmp_path):
    run = tmp_path / "run"
    trainer(data, run, max_steps=4, identity={"model": {"d_model": 32}}).run()
    with pytest.raises(ResumeError, match=r"unsafe changes \(model.d_model: 32 -> 64\)"):
        trainer(data, run, max_steps=8, identity={"model": {"d_model": 64}}).run()
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=8), run, {"model": {"d_model": 32}},
                {"train": {"max_steps": 8}}, log=notes.append)
    assert t.run().outcome is Outcome.DONE
    assert any("changed settings: train.max_steps: 4 -> 8" in n for n in notes)


def test_a_change_known_before_the_data_is_refused_before_it(data, tmp_path):
    """refuse_unsafe_resume compares what the caller knows without the data (no
    fingerprint) against the newest committed checkpoint, so a changed job is refused
    before tokenizing; what it does not know is left to the resume itself."""
    from ten.train.trainstate import refuse_unsafe_resume

    run = tmp_path / "run"
    refuse_unsafe_resume(run, {"model": {"d_model": 64}})  # nothing committed: nothing to say
    saved = {"model": {"d_model": 32, "scan_backend": "chunked"},
             "data": {"seq_len": 32, "fingerprint": "f1"}}
    trainer(data, run, max_steps=4, identity=saved).run()
    refuse_unsafe_resume(run, {"model": {"d_model": 32}, "data": {"seq_len": 32}})
    refuse_unsafe_resume(run, {"model": {"d_model": 32, "scan_backend": "fused"}})
    with pytest.raises(ResumeError, match=r"from step-00000004: unsafe changes "
                       r"\(data.seq_len: 32 -> 64; model.d_model: 32 -> 48\)"):
        refuse_unsafe_resume(run, {"model": {"d_model": 48}, "data": {"seq_len": 64}})


def test_how_the_model_computes_may_change_on_resume(data, tmp_path):
    """Chunk size, scan backend, checkpointing and the residual stream's dtype are not the
    model's identity: a relaunch on a smaller GPU may turn checkpointing on or lower the
    chunk size and resume (and a checkpoint from before residual_dtype existed resumes)."""
    run = tmp_path / "run"
    trainer(data, run, max_steps=4, identity={"model": {"d_model": 32, "chunk_size": 16,
                                                        "grad_checkpointing": False}}).run()
    notes = []
    t = Trainer(mcfg(data, grad_checkpointing=True, scan_backend="ref",
                     residual_dtype="bf16"), data, tcfg(max_steps=8), run,
                {"model": {"d_model": 32, "chunk_size": 8, "grad_checkpointing": True,
                           "scan_backend": "ref", "residual_dtype": "bf16"}}, {},
                log=notes.append)
    assert t.run().outcome is Outcome.DONE
    assert any("resumed from" in n and "step 4" in n for n in notes)


def test_retention_and_metrics(data, tmp_path):
    run = tmp_path / "run"
    trainer(data, run, max_steps=12, keep_last=2).run()
    assert ckpt.committed_steps(run / "checkpoints") == [8, 12]
    records = read_metrics(run / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "hfu", "data_wait_frac",
                "checkpoint_frac", "step_time_s"):
        assert key in train[-1]
    evals = [r for r in records if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [6, 12] and evals[-1]["perplexity"] > 1
    assert train[-1]["loss"] < train[0]["loss"]
    model = load_model(run / "checkpoints" / "step-00000012")
    assert model.config.d_model == 32


def test_grad_accumulation_matches_a_bigger_batch(data, tmp_path):
    trainer(data, tmp_path / "big", max_steps=3, batch_size=8).run()
    trainer(data, tmp_path / "acc", max_steps=3, batch_size=4, grad_accum=2).run()
    big, acc = losses(tmp_path / "big"), losses(tmp_path / "acc")
    assert big.keys() == acc.keys()
    for step in big:
        assert abs(big[step] - acc[step]) < 1e-5


def test_adamw8bit_and_bf16_run(data, tmp_path):
    t = trainer(data, tmp_path / "q", max_steps=3, optimizer="adamw8bit", precision="bf16")
    assert t.run().outcome is Outcome.DONE
    assert all(v == v for v in losses(tmp_path / "q").values())  # finite, not NaN


def test_max_tokens_budget(data, tmp_path):
    t = trainer(data, tmp_path / "tok", max_steps=None, max_tokens=4 * 32 * 5 + 1)
    assert t.total_steps == 6


def test_transformer_trains_with_the_same_trainer(data, tmp_path):
    cfg = model_config("transformer", "tiny", vocab_size=data.tokenizer.vocab_size,
                       d_model=32, n_layers=2, seq_len=32)
    assert trainer(data, tmp_path / "gpt", model=cfg, max_steps=4).run().outcome is Outcome.DONE
    assert isinstance(load_model(tmp_path / "gpt" / "checkpoints" / "step-00000004"),
                      torch.nn.Module)


def test_the_resume_state_is_a_file_of_the_committed_checkpoint(data, tmp_path):
    # The trainer's state (schedule, scaler, RNGs, data position, step, tokens) is one of
    # the files the manifest lists, so it commits with the weights or not at all; the
    # commit itself is ten.train.checkpoint.save's, held to every crash point in test_checkpoint.
    run = tmp_path / "run"
    trainer(data, run, max_steps=4).run()
    manifest = json.loads((run / "checkpoints" / "step-00000004" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pt", "optimizer.pt", "trainer.pt", "config.json"}
    state = ckpt.load(run / "checkpoints" / "step-00000004", "trainer.pt")
    assert {"scheduler", "scaler", "rng", "data", "step", "tokens"} <= set(state)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert Path(run / "metrics.jsonl").exists()


def test_adamw8bit_checkpoint_loads_with_weights_only_and_resumes(data, tmp_path):
    run = tmp_path / "q8"
    assert trainer(data, run, max_steps=4, optimizer="adamw8bit").run().outcome is Outcome.DONE
    path = run / "checkpoints" / "step-00000004"
    for name in ("model.pt", "optimizer.pt", "trainer.pt"):
        ckpt.load(path, name)  # weights_only=True: plain tensors and containers only
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=6, optimizer="adamw8bit"), run,
                {"model": "m"}, {"train": {}}, log=notes.append)
    assert t.run().outcome is Outcome.DONE
    assert any("resumed from" in n and "step-00000004" in n for n in notes)


@pytest.mark.parametrize("first, then", [("adamw8bit", "adamw"), ("adamw", "adamw8bit")])
def test_a_run_resumes_under_the_other_optimizer_on_its_schedule(data, tmp_path, first, then):
    """train.optimizer changed at a resume loaded the checkpoint and then died at the first
    step with a bare KeyError ('exp_avg' or 'state1'): the moments now carry over
    (ten.train.optimizer_state) and the lr goes on as a resume under the same one does."""
    same, run = tmp_path / "same", tmp_path / "run"
    for path, resumed_with in ((same, first), (run, then)):
        trainer(data, path, max_steps=4, eval_every=0, optimizer=first).run()
        resumed = trainer(data, path, max_steps=8, eval_every=0, optimizer=resumed_with)
        assert resumed.run().outcome is Outcome.DONE
    assert lrs(run) == lrs(same) and set(lrs(run)) == set(range(1, 9))
    assert all(math.isfinite(v) for v in losses(run).values())


def test_rng_state_round_trips_through_weights_only(tmp_path):
    random.seed(3), np.random.seed(4), torch.manual_seed(5)
    np.random.standard_normal()  # leaves a cached gaussian in numpy's legacy state
    state = rng_state()
    torch.save(state, tmp_path / "rng.pt")
    expect = (random.random(), np.random.standard_normal(), np.random.randint(1 << 30),
              torch.rand(3))
    set_rng_state(torch.load(tmp_path / "rng.pt", weights_only=True))
    got = (random.random(), np.random.standard_normal(), np.random.randint(1 << 30),
           torch.rand(3))
    assert got[:3] == expect[:3] and torch.equal(got[3], expect[3])


# --- damaged, malformed and tampered checkpoints on resume ------------------------------

def reseal(path):
    """Recompute the manifest's sizes and sha256s, as whoever changed a file could."""
    manifest = json.loads((path / "manifest.json").read_text())
    for name in manifest["files"]:
        raw = (path / name).read_bytes()
        manifest["files"][name] = {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    (path / "manifest.json").write_text(json.dumps(manifest))


class Marker:
    """Unpickling this creates a file: the code an attacker would plant."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def resume_notes(data, run, max_steps=10):
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=max_steps), run, {"model": "m"},
                {"train": {}}, log=notes.append)
    return t, notes


def test_config_json_without_a_key_counts_as_corrupt(data, tmp_path):
    run = tmp_path / "run"
    assert trainer(data, run, max_steps=8).run().outcome is Outcome.DONE
    newest = run / "checkpoints" / "step-00000008"
    config = json.loads((newest / "config.json").read_text())
    del config["identity"]
    (newest / "config.json").write_text(json.dumps(config))
    reseal(newest)
    t, notes = resume_notes(data, run)
    assert t.run().outcome is Outcome.DONE
    skipped = [n for n in notes if "step-00000008" in n and "skipping" in n]
    assert len(skipped) == 1 and "config.json lacks identity" in skipped[0]
    assert any("resumed from" in n and "step-00000004" in n for n in notes)


def test_a_resume_says_which_software_changed_since_the_checkpoint(data, tmp_path):
    """Each checkpoint records the versions it was made with (python, CUDA, torch, ...);
    a resume on another stack says what moved (a step may round differently)."""
    from ten.train.trainstate import stack_versions

    run = tmp_path / "run"
    assert trainer(data, run, max_steps=4).run().outcome is Outcome.DONE
    newest = run / "checkpoints" / "step-00000004"
    config = json.loads((newest / "config.json").read_text())
    now = stack_versions()
    assert config["versions"] == now and now["torch"] == torch.__version__
    config["versions"]["torch"] = "2.11.0"  # made on the lent GPU machines' stack
    (newest / "config.json").write_text(json.dumps(config))
    reseal(newest)
    t, notes = resume_notes(data, run, max_steps=6)
    assert t.run().outcome is Outcome.DONE
    assert f"resuming on other software than step-00000004 was made with: torch 2.11.0 -> " \
           f"{torch.__version__} (a step may then round differently)" in notes
    t, notes = resume_notes(data, run, max_steps=8)  # step 6 was made here: nothing said
    assert t.run().outcome is Outcome.DONE
    assert not any("other software" in n for n in notes)


def test_a_resume_onto_weights_far_from_what_was_trained_is_warned_about(data, tmp_path):
    """Issue 45, fault 6: weights replaced by finite garbage and the manifest re-hashed
    loaded silently (held-out loss 6.25 -> 24.0). The first loss after the resume is
    compared with the one the checkpoint recorded; an honest resume says nothing."""
    run = tmp_path / "run"
    assert trainer(data, run, max_steps=8).run().outcome is Outcome.DONE
    t, notes = resume_notes(data, run, max_steps=10)
    assert t.run().outcome is Outcome.DONE
    assert not any("far above" in n for n in notes)
    newest = run / "checkpoints" / "step-00000010"
    weights = ckpt.load(newest, "model.pt")
    gen = torch.Generator().manual_seed(0)
    torch.save({k: torch.randn(v.shape, generator=gen) * 3 for k, v in weights.items()},
               newest / "model.pt")
    reseal(newest)
    t, notes = resume_notes(data, run, max_steps=12)
    assert t.run().outcome is Outcome.DONE
    (warned,) = [n for n in notes if "far above" in n]
    assert warned.startswith("warning: the first loss after the resume, ")
    assert "step 10 recorded: its weights may not be what was trained" in warned


def test_trainer_state_without_a_field_counts_as_corrupt(data, tmp_path):
    run = tmp_path / "run"
    assert trainer(data, run, max_steps=8).run().outcome is Outcome.DONE
    newest = run / "checkpoints" / "step-00000008"
    state = ckpt.load(newest, "trainer.pt")
    del state["scheduler"]
    state["rng"]["numpy"] = [1, 2]
    torch.save(state, newest / "trainer.pt")
    reseal(newest)
    t, notes = resume_notes(data, run)
    assert t.run().outcome is Outcome.DONE
    assert any("trainer.pt lacks scheduler" in n for n in notes)
    assert any("resumed from" in n and "step-00000004" in n for n in notes)


def test_a_renamed_files_key_falls_back_to_the_previous_step(data, tmp_path):
    run = tmp_path / "run"
    assert trainer(data, run, max_steps=8).run().outcome is Outcome.DONE
    manifest_path = run / "checkpoints" / "step-00000008" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["entries"] = manifest.pop("files")
    manifest_path.write_text(json.dumps(manifest))
    t, notes = resume_notes(data, run)
    assert t.run().outcome is Outcome.DONE
    assert any("skipping corrupt" in n and 'no "files" object' in n for n in notes)
    assert any("resumed from" in n and "step-00000004" in n for n in notes)


def test_a_tampered_pickle_never_runs_and_the_previous_step_is_used(data, tmp_path):
    run, marker = tmp_path / "run", tmp_path / "pwned"
    assert trainer(data, run, max_steps=8).run().outcome is Outcome.DONE
    newest = run / "checkpoints" / "step-00000008"
    weights = ckpt.load(newest, "model.pt")
    weights["_extra"] = Marker(marker)
    torch.save(weights, newest / "model.pt")
    reseal(newest)  # an attacker with write access to the bucket rewrites the manifest too
    t, notes = resume_notes(data, run)
    assert t.run().outcome is Outcome.DONE
    assert not marker.exists()
    refused = [n for n in notes if "refuses to load" in n]
    assert len(refused) == 1 and "step-00000008" in refused[0] and "\n" not in refused[0]
    assert "not plain tensors (possibly tampered)" in refused[0]
    assert any("resumed from" in n and "step-00000004" in n for n in notes)


def test_a_run_whose_only_checkpoint_is_tampered_stops_with_one_line(data, tmp_path):
    run, marker = tmp_path / "run", tmp_path / "pwned"
    assert trainer(data, run, max_steps=4).run().outcome is Outcome.DONE
    only = run / "checkpoints" / "step-00000004"
    state = ckpt.load(only, "trainer.pt")
    state["rng"]["evil"] = Marker(marker)
    torch.save(state, only / "trainer.pt")
    weights = ckpt.load(only, "model.pt")
    weights["_extra"] = Marker(marker)
    torch.save(weights, only / "model.pt")
    reseal(only)
    t, _ = resume_notes(data, run)
    with pytest.raises(ResumeError, match="none of its 1 committed checkpoint") as e:
        t.run()
    assert "\n" not in str(e.value) and not marker.exists()
    with pytest.raises(ckpt.CheckpointError, match="refuses to load"):
        load_model(only)  # what `ten-runner sample` uses
    assert not marker.exists()


def test_load_model_with_a_damaged_config_is_a_checkpoint_error(data, tmp_path):
    run = tmp_path / "run"
    trainer(data, run, max_steps=4).run()
    path = run / "checkpoints" / "step-00000004"
    (path / "config.json").write_text('{"model_class": "TENLM"}')
    with pytest.raises(ckpt.CheckpointError, match="config.json lacks"):
        load_model(path)


def test_load_run_gives_a_runs_model_and_tokenizer_at_any_kept_step(data, tmp_path):
    """``ten.load_run``: what a user loads in Python after ``ten-runner run``."""
    import shutil

    import ten

    run = tmp_path / "run"
    trainer(data, run).run()  # 12 steps, checkpoints every 4, the last 2 kept: 8 and 12
    with pytest.raises(ckpt.CheckpointError, match="tokenizer.model is missing"):
        ten.load_run(run)
    shutil.copyfile(data.tokenizer.path, run / "tokenizer.model")  # as the runner does
    newest = ten.load_run(run)
    assert newest.step == 12 and not newest.model.training
    assert newest.tokenizer.encode("the eigenstate") == data.tokenizer.encode("the eigenstate")
    assert same_state(newest.model, load_model(run / "checkpoints" / "step-00000012"))
    assert ten.load_run(run, step=8).step == 8
    with pytest.raises(ckpt.CheckpointError, match=r"step 4 .*committed steps: 8, 12\)"):
        ten.load_run(run, step=4)
    with pytest.raises(ckpt.CheckpointError, match="committed steps: none"):
        ten.load_run(tmp_path / "nothing-here")


def same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# --- non-finite steps ---------------------------------------------------------------------

class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(50, 16)
        self.out = torch.nn.Linear(16, 50)

    def forward(self, x):
        return self.out(self.emb(x)), None


@pytest.mark.parametrize("fused", [False, True], ids=["host-check", "fused-found-inf"])
@pytest.mark.parametrize("poison", ["grad", "loss"])
def test_a_non_finite_step_leaves_weights_and_optimizer_untouched(fused, poison):
    model = Tiny()
    objective = NextTokenLoss(model, "reference")  # Tiny has logits, no hidden states
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    batch = torch.randint(0, 50, (2, 9))
    train_step(objective, opt, scaler, [batch], None, 1.0)  # a normal step: the state exists
    params = {k: v.clone() for k, v in model.state_dict().items()}
    state = {k: {n: t.clone() for n, t in v.items()} for k, v in opt.state.items()}
    if poison == "grad":
        handle = model.out.weight.register_hook(lambda g: g * math.nan)
    else:
        handle = model.out.register_forward_hook(lambda m, i, o: o * math.inf)
    loss, norm, flags = train_step(objective, opt, scaler, [batch], None, 1.0)
    handle.remove()
    assert flags.tolist() == ([0, 1] if poison == "grad" else [1, 1])
    assert all(torch.equal(params[k], v) for k, v in model.state_dict().items())
    assert all(torch.equal(state[k][n], opt.state[k][n]) for k in state for n in state[k])
    _, _, flags = train_step(objective, opt, scaler, [batch], None, 1.0)
    assert flags.tolist() == [0, 0]
    assert not torch.equal(params["out.weight"], model.out.weight)  # updates again


def test_a_step_casts_each_weight_once_for_all_its_micro_batches():
    """Under autocast the step's forwards share one region, so the micro-batches after
    the first cast no weight again (a flagship step cast every weight 8 times); the update
    is the one the micro-batches give each in its own region, bit for bit."""
    from torch.utils._python_dispatch import TorchDispatchMode

    batches = [torch.randint(0, 50, (2, 9), generator=torch.Generator().manual_seed(i))
               for i in range(3)]

    def fresh():
        torch.manual_seed(1)
        model = Tiny()
        return model, NextTokenLoss(model, "reference"), torch.optim.SGD(model.parameters(), 0.1)

    model, objective, opt = fresh()  # each micro-batch in its own autocast region
    for batch in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = objective(batch[:, :-1], batch[:, 1:]) / len(batches)
        loss.backward()
    opt.step()
    want = model.state_dict()

    class WeightCasts(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.__name__.startswith("_to_copy") and args[0].shape == (50, 16) \
                    and out.dtype == torch.bfloat16:
                WeightCasts.count += 1
            return out

    model, objective, opt = fresh()
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    with WeightCasts():
        train_step(objective, opt, scaler, batches, torch.bfloat16, 0.0)
    assert WeightCasts.count == 1  # the output layer's weight, once for three forwards
    assert all(torch.equal(want[k], v) for k, v in model.state_dict().items())


def poison_steps(monkeypatch, steps):
    """Make the trainer's model give a non-finite loss at these (1-based) train steps: its
    final norm's output (the hidden states the loss reads) goes NaN."""
    real = trainer_mod.build_model
    calls = {"n": 0}

    def build(cfg, device=None):
        model = real(cfg, device)
        add = model.norm.add  # the final norm: the last residual sum and its norm

        def poisoned(x, r):
            h, y = add(x, r)
            if not model.training:
                return h, y
            calls["n"] += 1
            return h, (y * math.nan if calls["n"] in steps else y)
        model.norm.add = poisoned
        return model
    monkeypatch.setattr(trainer_mod, "build_model", build)


def test_skipped_steps_are_logged_recorded_and_never_committed(data, tmp_path, monkeypatch):
    poison_steps(monkeypatch, {3, 4})
    run, notes = tmp_path / "run", []
    t = Trainer(mcfg(data), data, tcfg(max_steps=8), run, {"model": "m"}, {"train": {}},
                log=notes.append)
    assert t.run().outcome is Outcome.DONE
    train = {r["step"]: r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"}
    assert {s: r["skipped_steps"] for s, r in train.items() if r["skipped_steps"]} == {3: 1, 4: 1}
    assert all(math.isfinite(r["loss"]) for s, r in train.items() if s not in (3, 4))
    assert any(n.startswith("skipped 1 of steps 3-3: non-finite loss") for n in notes)
    # step 4 ended a streak of non-finite steps: not committed; step 8 is
    assert any("not committing a checkpoint at step 4" in n for n in notes)
    assert ckpt.committed_steps(run / "checkpoints") == [8]
    state = ckpt.load(run / "checkpoints" / "step-00000008", "trainer.pt")
    assert state["nonfinite_streak"] == 0


def test_a_diverging_run_stops_with_one_line_and_commits_nothing_non_finite(data, tmp_path):
    run = tmp_path / "run"
    t = trainer(data, run, max_steps=30, lr=1e10, warmup_steps=0, eval_every=0,
                log_every=10, max_nonfinite_steps=3)
    with pytest.raises(DivergedError) as e:
        t.run()
    message = str(e.value)
    assert "\n" not in message and "lower TrainConfig.lr (now 1e+10)" in message
    assert "non-finite loss" in message and "TrainConfig.max_nonfinite_steps is 3" in message
    for step in ckpt.committed_steps(run / "checkpoints"):
        weights = ckpt.load(run / "checkpoints" / ckpt.step_name(step), "model.pt")
        assert all(torch.isfinite(w).all() for w in weights.values())


def test_non_finite_weights_are_never_committed(data, tmp_path):
    t = trainer(data, tmp_path / "run", max_steps=4)
    model = Tiny()
    with torch.no_grad():
        model.out.bias[3] = math.inf
    state = TrainState(model=model, optimizer=None, schedule=None, scaler=None, loader=None,
                       nonfinite=NonFiniteCounter(torch.device("cpu")), step=4)
    with pytest.raises(DivergedError,
                       match="weights are not finite at step 4.*lower TrainConfig.lr"):
        t.checkpoints.save(state, None)
    assert ckpt.committed_steps(tmp_path / "run" / "checkpoints") == []


def test_on_log_gets_each_train_record(data, tmp_path):
    seen = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=4, log_every=2), tmp_path / "run",
                {"model": "m"}, {"train": {}}, log=lambda s: None, on_log=seen.append)
    t.run()
    train = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(seen) == len(train) == 2
    assert [r["step_time_s"] for r in seen] == [r["step_time_s"] for r in train]


# --- the ETA ------------------------------------------------------------------------------

@pytest.mark.parametrize("left,done,busy,first,eta", [
    (100, 0, 0.0, 0.0, None),  # nothing timed yet
    (100, 1, 30.0, 30.0, 3000.0),  # only the first step: it is all there is
    (100, 11, 40.0, 30.0, 100.0),  # the slow first step (compilation) is left out
    (0, 50, 99.0, 1.0, 0.0),
    # a checkpoint of 10 s every 10 steps of 1 s: spread over them, 2 s a step
    (100, 21, 1.0 + 20 * 1.0 + 2 * 10.0, 1.0, 200.0),
])
def test_eta_table(left, done, busy, first, eta):
    assert eta_seconds(left, done, busy, first) == eta


def test_eta_is_steady_when_one_window_holds_a_checkpoint():
    # 1 s steps, a 60 s checkpoint at step 100: the old window ETA jumped 7x (10 steps
    # of 1 s + 60 s); the run average moves by the checkpoint's share only.
    before = eta_seconds(900, 100, 100.0, 1.0)
    after = eta_seconds(890, 110, 110.0 + 60.0, 1.0)
    assert before == pytest.approx(900.0)
    assert after / before < 1.6


def test_progress_line_shows_the_eta():
    rec = {"loss": 2.5, "lr": 1e-3, "tokens_per_s": 1000.0, "mfu": None,
           "data_wait_frac": 0.01, "eta_s": 3725.0}
    assert progress_line(5, 100, rec).endswith("| ETA 1:02:05")
    assert progress_line(5, 100, {**rec, "eta_s": None}).endswith("| ETA -")


# --- honest throughput, HFU, the loss backend, stop agreement ------------------------------

def test_tokens_per_s_leaves_evaluation_out(data, tmp_path, monkeypatch):
    # The trainer's clock jumps 1000 s during each evaluation (a virtual slow eval, so the
    # test holds however loaded the machine is). Eval every 3 steps, log every 4: the
    # evaluations fall inside logging windows.
    import time as real_time
    from types import SimpleNamespace

    skew = {"s": 0.0}
    monkeypatch.setattr(trainer_mod, "time", SimpleNamespace(
        perf_counter=lambda: real_time.perf_counter() + skew["s"]))
    real_eval = Trainer._eval

    def slow_eval(self, step):
        skew["s"] += 1000.0
        return real_eval(self, step)

    monkeypatch.setattr(Trainer, "_eval", slow_eval)
    run = tmp_path / "run"
    trainer(data, run, max_steps=8, eval_every=3, log_every=4, checkpoint_every=100).run()
    train = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["step"] for r in train] == [4, 8]
    for r in train:
        # the evaluation's 1000 s are not in the window's time per step ...
        assert r["step_time_s"] < 100, r
        # ... nor is the window cut short at the evaluation (its fractions would pass 1)
        busy = r["compute_frac"] + r["data_wait_frac"] + r["checkpoint_frac"]
        assert busy <= 1.0 + 1e-6, r
        assert r["tokens_per_s"] == pytest.approx(4 * 32 / r["step_time_s"])


def test_hfu_counts_recomputation_and_an_unknown_peak_is_said_once(data, tmp_path,
                                                                    monkeypatch):
    monkeypatch.setattr(trainer_mod, "peak_flops", lambda device: 1e12)
    notes = []
    cfg = mcfg(data, grad_checkpointing=True)
    t = Trainer(cfg, data, tcfg(max_steps=2, eval_every=0), tmp_path / "ckpt", {"model": "m"},
                {"train": {}}, log=notes.append)
    t.run()
    model = t.raw_model
    flops, recompute = model.flops_per_token(32), model.recompute_flops_per_token(32)
    assert recompute > 0
    for r in (r for r in read_metrics(tmp_path / "ckpt" / "metrics.jsonl")
              if r["kind"] == "train"):
        assert r["hfu"] / r["mfu"] == pytest.approx((flops + recompute) / flops)
    assert any("MFU" in n and "(HFU " in n for n in notes)

    monkeypatch.setattr(trainer_mod, "peak_flops", lambda device: None)
    monkeypatch.setattr(trainer_mod, "peak_note",
                        lambda device: "MFU omitted: unknown peak for NVIDIA Imaginary")
    notes.clear()
    Trainer(mcfg(data), data, tcfg(max_steps=3, eval_every=0), tmp_path / "unknown",
            {"model": "m"}, {"train": {}}, log=notes.append).run()
    assert notes.count("MFU omitted: unknown peak for NVIDIA Imaginary") == 1
    train = [r for r in read_metrics(tmp_path / "unknown" / "metrics.jsonl")
             if r["kind"] == "train"]
    assert len(train) == 3 and all(r["mfu"] is None and r["hfu"] is None for r in train)


def test_the_loss_backend_is_said_used_and_matches_the_plain_loss(data, tmp_path):
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=3), tmp_path / "auto", {"model": "m"},
                {"train": {}}, log=notes.append)
    t.run()
    assert "loss: chunked linear cross-entropy (auto: cpu)" in notes
    start = next(r for r in read_metrics(tmp_path / "auto" / "metrics.jsonl")
                 if r["kind"] == "start")
    assert start["loss_backend"] == "chunked"
    trainer(data, tmp_path / "plain", max_steps=3, loss="reference").run()
    auto, plain = losses(tmp_path / "auto"), losses(tmp_path / "plain")
    assert auto.keys() == plain.keys() == {1, 2, 3}
    assert all(abs(auto[s] - plain[s]) < 1e-5 for s in auto)
    with pytest.raises(ValueError, match="needs a CUDA device"):
        trainer(data, tmp_path / "liger", loss="liger")


class FakeBroadcast:
    def __init__(self):
        self.calls = []

    def __call__(self, flag, info, device):
        self.calls.append(flag)
        return flag


@pytest.mark.parametrize("world,every,steps,forced,stop_at,agreed,stopped_at", [
    # one process: no sync at all, a stop is taken after the step it came in
    (1, 8, 20, set(), 5, 0, 5),
    # DDP: agreement every 8 steps (and where forced), so a stop at 5 is taken at 8 ...
    (2, 8, 20, set(), 5, 1, 8),
    # ... or earlier at a forced point (a log or checkpoint step)
    (2, 8, 20, {6}, 5, 1, 6),
    (2, 8, 20, {3}, 5, 2, 8),
    (2, 4, 20, set(), 1, 1, 4),
])
def test_ddp_ranks_agree_on_stopping_only_at_agreement_points(
        monkeypatch, world, every, steps, forced, stop_at, agreed, stopped_at):
    import ten.train.distributed as dist_mod

    fake = FakeBroadcast()
    monkeypatch.setattr(dist_mod, "broadcast_flag", fake)
    agree = StopAgreement(DistInfo(rank=0, world_size=world), torch.device("cpu"), every)
    for step in range(1, steps + 1):
        if agree(step, step >= stop_at, force=step in forced):
            break
    assert step == stopped_at
    assert step - stop_at <= every - 1  # the documented bound
    if world > 1:
        assert len(fake.calls) == agreed  # host syncs: only at agreement points


@pytest.mark.slow  # ~60 s: inductor compiles the blocks (cold cache)
def test_compile_trains_the_same_model_with_compiled_blocks(data, tmp_path):
    """train.compile: true compiles every block in place (regional): one graph for the
    blocks' training step and one for evaluation, the first step's loss is the eager one,
    evaluation and checkpoints work, and the saved weights load into a plain model
    (state_dict keys unchanged)."""
    eager, compiled = tmp_path / "eager", tmp_path / "compiled"
    notes = []
    kw = dict(max_steps=2, eval_every=1, checkpoint_every=2)
    trainer(data, eager, **kw).run()
    graphs = torch._dynamo.utils.counters["stats"]
    before = graphs["unique_graphs"]  # this process's earlier tests'
    t = Trainer(mcfg(data), data, tcfg(compile=True, **kw), compiled, {"model": "m"}, {},
                log=notes.append)
    assert t.run().outcome is Outcome.DONE
    assert "compile: every block with torch.compile (TrainConfig.compile)" in notes
    assert all(b._compiled_call_impl is not None for b in t.raw_model.blocks)
    assert graphs["unique_graphs"] - before == 2  # the blocks' one for training, one for eval
    first = {c: [r["loss"] for r in read_metrics(c / "metrics.jsonl") if r["kind"] == "train"]
             for c in (eager, compiled)}
    assert first[compiled][0] == pytest.approx(first[eager][0], rel=1e-5)
    evals = [r for r in read_metrics(compiled / "metrics.jsonl") if r["kind"] == "eval"]
    assert evals and all(math.isfinite(r["loss"]) for r in evals)
    loaded = load_model(compiled / "checkpoints" / "step-00000002")
    assert loaded.state_dict().keys() == t.raw_model.state_dict().keys()


def test_the_first_screen_says_what_is_trained_and_the_first_step_is_heard_from(data,
                                                                                tmp_path):
    """Before the first step: the size, the tokens a step and in all, the device, and ln V
    to read the first losses by; after it, a line, not silence until log_every."""
    import math

    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=6, log_every=5), tmp_path / "run",
                {"model": "m"}, {}, log=notes.append)
    t.run()
    vocab = data.tokenizer.vocab_size
    [what] = [n for n in notes if n.startswith("training ")]
    assert f"on cpu ({torch.get_num_threads()} threads): 4 x 32 = 128 tokens a step, " \
        f"6 steps, 768 tokens in all; a uniform guess scores loss ln {vocab} = " \
        f"{math.log(vocab):.2f}" in what
    assert f"training {t.raw_model.num_params() / 1e3:,.1f}K parameters" in what
    first = next(i for i, n in enumerate(notes) if n.startswith("first step done in "))
    assert "a line every 5 steps from here" in notes[first]
    assert first < next(i for i, n in enumerate(notes) if n.startswith("step 5/6"))


def test_a_resume_in_the_middle_of_the_sequence_warm_up_is_bit_exact(data, tmp_path):
    """The trainer's sequence-length warm-up: the records say each step's length, and a
    run stopped at step 4 of 8 warm-up steps resumes to the same losses and weights."""
    from ten.train.metrics import read_metrics

    warm = dict(seq_warmup_start=8, seq_warmup_steps=8)

    def run(where, data_, **kw):
        return Trainer(mcfg(data_), data_, tcfg(**warm, **kw), tmp_path / where,
                       {"model": "m"}, {"train": {}}, log=lambda s: None).run()
    assert run("a", data).outcome is Outcome.DONE
    records = [r for r in read_metrics(tmp_path / "a" / "metrics.jsonl")
               if r["kind"] == "train"]
    assert [r["seq_len"] for r in records] == [8] * 4 + [16] * 4 + [32] * 4
    assert run("b", SignalAt(data, 3)).outcome is Outcome.PREEMPTED
    assert run("b", data).outcome is Outcome.DONE
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    (sa, wa), (sb, wb) = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert sa == sb == 12 and all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_start_that_does_not_divide_the_length_is_a_field_error(data, tmp_path):
    from ten.config import FieldError
    with pytest.raises(FieldError, match=r"seq_warmup_start: must be DataConfig.seq_len "
                       r"\(32\) over a power of two \(e.g. 8\), got 12"):
        Trainer(mcfg(data), data, tcfg(seq_warmup_start=12, seq_warmup_steps=4),
                tmp_path / "r", {}, {}, log=lambda s: None)


def test_every_evaluation_scores_recall_unless_turned_off(data, tmp_path):
    from ten.train.metrics import read_metrics

    notes = []
    Trainer(mcfg(data), data, tcfg(max_steps=6), tmp_path / "on", {"model": "m"}, {},
            log=notes.append).run()
    evals = [r for r in read_metrics(tmp_path / "on" / "metrics.jsonl") if r["kind"] == "eval"]
    assert [r["step"] for r in evals] == [6] and 0.0 <= evals[0]["recall_repeat"] <= 1.0
    assert any(n.startswith("eval step 6:") and "% of a repeat" in n for n in notes)
    trainer(data, tmp_path / "off", max_steps=6, recall_probe=False).run()
    evals = [r for r in read_metrics(tmp_path / "off" / "metrics.jsonl") if r["kind"] == "eval"]
    assert "recall_repeat" not in evals[0]


def test_every_evaluation_logs_the_state_per_layer_unless_turned_off(data, tmp_path):
    """Decay and step spread and the imaginary share, per layer: the figures that show a
    state collapsing to its real part while the run trains (in TensorBoard too)."""
    from ten.train.metrics import read_metrics

    trainer(data, tmp_path / "on", max_steps=6).run()
    [state] = [r for r in read_metrics(tmp_path / "on" / "metrics.jsonl")
               if r["kind"] == "state"]
    assert state["step"] == 6
    for layer in ("L0", "L1"):  # mcfg: 2 layers, selective
        p10, p50, p90 = (state[f"{layer}/decay_p{q}"] for q in (10, 50, 90))
        assert 0.0 < p10 <= p50 <= p90 < 1.0
        assert state[f"{layer}/step_p10"] <= state[f"{layer}/step_p90"]
        assert 0.0 < state[f"{layer}/imag_share"] < 1.0
    assert list((tmp_path / "on" / "tensorboard").iterdir())
    trainer(data, tmp_path / "off", max_steps=6, state_health=False).run()
    kinds = {r["kind"] for r in read_metrics(tmp_path / "off" / "metrics.jsonl")}
    assert "state" not in kinds


def test_the_trainer_applies_its_executions_torch_flags_before_any_work(data, tmp_path,
                                                                      monkeypatch, tf32_off):
    """TF32 for fp32 matmuls on a GPU, from ten.train.execution (the GPU suite's step takes the
    same): forced here on a CPU, set by the time the trainer exists."""
    import ten.train.trainer

    real = ten.train.trainer.resolve_execution
    monkeypatch.setattr(ten.train.trainer, "resolve_execution",
                        lambda *a: dataclasses.replace(real(*a), tf32=True))
    t = trainer(data, tmp_path / "run")
    assert t.execution.tf32 and torch.backends.cuda.matmul.allow_tf32


def lrs(run_dir):
    return train_values(run_dir, "lr")


def test_extending_a_finished_budget_goes_on_from_its_lr_without_a_jump(data, tmp_path):
    """200 steps done, then max_steps 300 took the lr from 1e-4 back to 4.9e-4 (issue 44):
    now the lr goes on from where the finished schedule left it, and the log says so."""
    run = tmp_path / "run"
    trainer(data, run, max_steps=12, eval_every=0).run()
    before = lrs(run)
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=20, eval_every=0), run, {"model": "m"},
                {"train": {"max_steps": 20}}, log=notes.append)
    assert t.run().outcome is Outcome.DONE
    after = lrs(run)
    assert after[13] <= before[12]
    ordered = [after[s] for s in range(13, 21)]
    assert ordered == sorted(ordered, reverse=True)
    assert math.isclose(after[20], 3e-3 * 0.1, rel_tol=1e-6)  # min_lr_ratio at the new end
    said = [n for n in notes if n.startswith("lr: the budget or schedule changed")]
    assert len(said) == 1 and "at step 20 (cosine), never jumping back up" in said[0]


def test_a_budget_extended_mid_decay_decays_from_there_to_the_new_end(data, tmp_path):
    run = tmp_path / "run"
    stopped = Trainer(mcfg(data), SignalAt(data, 6), tcfg(eval_every=0), run, {"model": "m"},
                      {"train": {}}, log=lambda s: None)
    assert stopped.run().outcome is Outcome.PREEMPTED
    before = lrs(run)
    trainer(data, run, max_steps=24, eval_every=0).run()
    after = lrs(run)
    ordered = [before[7]] + [after[s] for s in range(8, 25)]
    assert ordered == sorted(ordered, reverse=True)
    # step 8 has the lr the 12-step schedule gave it; from there down to the new end
    assert math.isclose(after[8], 3e-3 * lr_multiplier(7, 12, 2, "cosine", 0.1), rel_tol=1e-9)
    assert 3e-4 < after[24] < 3e-4 * 1.05  # the last step's lr, one step before the minimum
    # the anchor is saved: a second resume with the same budget keeps the same lrs
    again = tmp_path / "again"
    stopped = Trainer(mcfg(data), SignalAt(data, 6), tcfg(eval_every=0), again,
                      {"model": "m"}, {"train": {}}, log=lambda s: None)
    stopped.run()
    t = Trainer(mcfg(data), SignalAt(data, 6), tcfg(max_steps=24, eval_every=0), again,
                {"model": "m"}, {"train": {}}, log=lambda s: None)
    assert t.run().outcome is Outcome.PREEMPTED
    trainer(data, again, max_steps=24, eval_every=0).run()
    assert lrs(again) == after


def test_a_wsd_budget_extended_before_its_decay_is_the_longer_run(data, tmp_path):
    """warmup-stable-decay: stopped in the level part and extended, the run's losses and
    weights equal those of a run given the longer budget from the start."""
    wsd = dict(schedule="wsd", eval_every=0, warmup_steps=2)
    trainer(data, tmp_path / "long", max_steps=20, **wsd).run()
    run = tmp_path / "run"
    stopped = Trainer(mcfg(data), SignalAt(data, 6), tcfg(**wsd), run, {"model": "m"},
                      {"train": {}}, log=lambda s: None)
    assert stopped.run().outcome is Outcome.PREEMPTED
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=20, **wsd), run, {"model": "m"},
                {"train": {}}, log=notes.append)
    assert t.run().outcome is Outcome.DONE
    assert not [n for n in notes if n.startswith("lr:")]
    assert losses(run) == losses(tmp_path / "long") and lrs(run) == lrs(tmp_path / "long")
    (_, wa), (_, wb) = final_weights(run), final_weights(tmp_path / "long")
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_a_peak_lr_changed_at_a_resume_takes_effect(data, tmp_path):
    """The saved scheduler kept the old peak, so `--set train.lr=…` at a resume was listed
    as a changed setting and then ignored."""
    run = tmp_path / "run"
    trainer(data, run, max_steps=8, eval_every=0, schedule="constant").run()
    trainer(data, run, max_steps=12, eval_every=0, schedule="constant", lr=1e-3).run()
    assert lrs(run)[8] == 3e-3 and all(lrs(run)[s] == 1e-3 for s in range(9, 13))


def test_a_model_field_added_after_a_checkpoint_resumes_at_its_default(data, tmp_path):
    """A field added to the model's config in a release refused every older run ("unsafe
    changes (model.future_knob: None -> 0.0)", issue 46). At its default it resumes and
    says so; set to another value it is still a change."""
    from ten.train.trainstate import refuse_unsafe_resume

    run = tmp_path / "run"
    trainer(data, run, max_steps=4, identity={"model": {"d_model": 32}}).run()
    newer = {"model": {"d_model": 32, "gate_bias": -2.0}}  # TENConfig's default
    refuse_unsafe_resume(run, newer)
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=8), run, newer, {}, log=notes.append)
    assert t.run().outcome is Outcome.DONE
    assert any("predates model field(s) gate_bias: resuming with their defaults" in n
               for n in notes)
    other = tmp_path / "other"
    trainer(data, other, max_steps=4, identity={"model": {"d_model": 32}}).run()
    with pytest.raises(ResumeError, match=r"model.gate_bias: -2.0 -> 0.5"):
        refuse_unsafe_resume(other, {"model": {"d_model": 32, "gate_bias": 0.5}})


def test_a_held_out_split_too_short_to_evaluate_stops_before_the_first_step(data, tmp_path):
    """A small corpus trained every step and then failed at the final evaluation (issue
    44): the split is checked before any step."""
    from ten.data import DataError

    run = tmp_path / "run"
    with pytest.raises(DataError, match="validation split has .* fewer than one batch of 64"):
        trainer(data, run, batch_size=64).run()
    assert not (run / "metrics.jsonl").exists() or not losses(run)
    assert ckpt.committed_steps(run / "checkpoints") == []
