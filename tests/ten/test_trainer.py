"""The trainer in-process: exact resume after a stop signal, corrupt checkpoints,
refused unsafe changes, retention, gradient accumulation."""

import json
import os
import random
import signal
from pathlib import Path

import pytest
import torch

from ten import checkpoint as ckpt
from ten.data import DataConfig, open_data
from ten.metrics import read_metrics
from ten.presets import model_config
from ten.trainer import Outcome, ResumeError, TrainConfig, Trainer, load_model

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
    cfg = DataConfig(dataset=str(root / "corpus.jsonl"), seq_len=32, vocab_size=400,
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


def losses(run_dir):
    by_step = {}
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r["kind"] == "train":
            by_step[r["step"]] = r["loss"]  # a resumed run rewrites redone steps
    return by_step


def final_weights(run_dir):
    found = ckpt.latest_valid(run_dir / "checkpoints")
    return found.step, ckpt.load(found.path, "model.pt")


def test_sigterm_then_resume_is_bit_exact(data, tmp_path):
    assert trainer(data, tmp_path / "a").run() is Outcome.DONE
    t = Trainer(mcfg(data), SignalAt(data, 6), tcfg(), tmp_path / "b", {"model": "m"},
                {"train": {}}, log=lambda s: None)
    assert t.run() is Outcome.PREEMPTED
    # the checkpoint of the step in flight when the signal came is committed
    assert ckpt.committed_steps(tmp_path / "b" / "checkpoints")[-1] == 7
    assert trainer(data, tmp_path / "b").run() is Outcome.DONE
    assert losses(tmp_path / "a") == losses(tmp_path / "b")
    (sa, wa), (sb, wb) = final_weights(tmp_path / "a"), final_weights(tmp_path / "b")
    assert sa == sb == 12
    assert all(torch.equal(wa[k], wb[k]) for k in wa)


def test_corrupt_newest_checkpoint_falls_back_to_previous(data, tmp_path):
    run = tmp_path / "run"
    assert trainer(data, run, max_steps=8).run() is Outcome.DONE
    newest = run / "checkpoints" / "step-00000008" / "model.pt"
    raw = bytearray(newest.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    newest.write_bytes(bytes(raw))
    (run / "checkpoints" / "step-00000009").mkdir()  # never committed: no manifest
    notes = []
    t = Trainer(mcfg(data), data, tcfg(max_steps=10), run, {"model": "m"}, {"train": {}},
                log=notes.append)
    assert t.run() is Outcome.DONE
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
    assert t.run() is Outcome.DONE
    assert any("changed settings: train.max_steps: 4 -> 8" in n for n in notes)


def test_retention_and_metrics(data, tmp_path):
    run = tmp_path / "run"
    trainer(data, run, max_steps=12, keep_last=2).run()
    assert ckpt.committed_steps(run / "checkpoints") == [8, 12]
    records = read_metrics(run / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "mfu", "data_wait_frac",
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
    assert t.run() is Outcome.DONE
    assert all(v == v for v in losses(tmp_path / "q").values())  # finite, not NaN


def test_max_tokens_budget(data, tmp_path):
    t = trainer(data, tmp_path / "tok", max_steps=None, max_tokens=4 * 32 * 5 + 1)
    assert t.total_steps == 6


def test_transformer_trains_with_the_same_trainer(data, tmp_path):
    cfg = model_config("transformer", "tiny", vocab_size=data.tokenizer.vocab_size,
                       d_model=32, n_layers=2, seq_len=32)
    assert trainer(data, tmp_path / "gpt", model=cfg, max_steps=4).run() is Outcome.DONE
    assert isinstance(load_model(tmp_path / "gpt" / "checkpoints" / "step-00000004"),
                      torch.nn.Module)


def test_resume_state_is_written_atomically(data, tmp_path):
    run = tmp_path / "run"
    trainer(data, run, max_steps=4).run()
    manifest = json.loads((run / "checkpoints" / "step-00000004" / "manifest.json").read_text())
    assert set(manifest["files"]) == {"model.pt", "optimizer.pt", "trainer.pt", "config.json"}
    state = ckpt.load(run / "checkpoints" / "step-00000004", "trainer.pt")
    assert {"scheduler", "scaler", "rng", "data", "step", "tokens"} <= set(state)
    assert not [p for p in (run / "checkpoints").iterdir() if p.name.startswith(".tmp")]
    assert Path(run / "metrics.jsonl").exists()
