"""benchmarks/bench_recall.py's tasks: each answer is recoverable from the sequence, and
scored only where it is due (so a model can only beat chance by recalling)."""

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_recall as br  # noqa: E402

from ten.kernels.loss import IGNORE_INDEX  # noqa: E402
from ten.train.seqwarmup import length_at  # noqa: E402


def batch(task, T=64, b=8, seed=0):
    return task.make(b, T, torch.Generator().manual_seed(seed))


def test_copy_first_asks_for_the_first_token_at_the_end():
    x, y = batch(br.copy_first())
    due = y != IGNORE_INDEX
    assert due.sum(1).tolist() == [1] * 8 and due[:, -1].all()
    assert torch.equal(y[:, -1], x[:, 0]) and (x[:, -1] == br.QUERY).all()


def test_selective_copy_asks_for_the_data_tokens_in_order():
    task = br.selective_copy(k=4)
    x, y = batch(task, T=32)
    for row_x, row_y in zip(x, y, strict=True):
        data = row_x[:32 - 5][row_x[:32 - 5] != br.BLANK]
        assert torch.equal(row_y[row_y != IGNORE_INDEX], data)


def test_mqar_answers_are_the_values_paired_with_the_queried_keys():
    task = br.mqar(pairs=4)
    x, y = batch(task, T=40)
    for row_x, row_y in zip(x, y, strict=True):
        pairs = dict(zip(row_x[0:8:2].tolist(), row_x[1:8:2].tolist(), strict=True))
        due = (row_y != IGNORE_INDEX).nonzero().flatten().tolist()
        assert len(due) == 4
        for t in due:
            assert row_y[t].item() == pairs[row_x[t].item()]


def test_induction_answer_follows_the_only_earlier_trigger():
    x, y = batch(br.induction(), T=48)
    for row_x, row_y in zip(x, y, strict=True):
        a = row_x[-1].item()
        (p,) = (row_x[:-1] == a).nonzero().flatten().tolist()
        assert row_y[-1].item() == row_x[p + 1].item()
        assert (row_y[:-1] == IGNORE_INDEX).all()


def test_lm_task_scores_the_same_held_out_tokens_at_every_length(corpus, tmp_path, monkeypatch):
    """Length extrapolation compares like with like: the held-out loss at 1x, 4x and 16x
    the training length is over the same tokens, only cut into longer sequences."""
    monkeypatch.setenv("TEN_CACHE_DIR", str(tmp_path / "cache"))
    args = br.parse_args(["--tasks", "lm", "--T", "8", "--steps", "2", "--batch", "2",
                          "--seeds", "0", "--models", "ten", "ten_selective_conv",
                          "--d-model", "16", "--eigenstates", "4", "--lm-vocab", "300",
                          "--lm-eval-tokens", "256", "--lm-dataset", str(corpus / "docs.jsonl")])
    rows = br.run(args)["tasks"]["lm"]
    for model in ("ten", "ten_selective_conv"):
        (run,) = rows[model]["runs"]
        assert list(run["loss"]) == ["8", "32", "128"]
        assert run["tokens"] == {"8": 256, "32": 256, "128": 256}
        assert all(4.0 < v < 7.0 for v in run["loss"].values())  # ~log(300) untrained
    args.lm_eval_tokens = 250  # not a whole number of the longest sequences
    with pytest.raises(SystemExit, match="multiple of 128"):
        br.run(args)


def test_the_linear_write_variant_starts_as_the_model_and_writes_in_proportion_to_the_step():
    import bench_recall_write as bw

    from ten.kernels.selective import DELTA_BIAS, STEP_UNIT
    from ten.model.presets import ten_config
    from ten.model.ten import EigenstateMixer

    cfg = ten_config("tiny", d_model=16, n_eigenstates=8, n_heads=2, selective=True)
    mixer = EigenstateMixer(cfg).double()
    xn = torch.zeros(1, 3, 16, dtype=torch.float64)
    with torch.no_grad():  # steps 1, then 1e-3 and 1e-4 by the bias alone (xn = 0)
        mixer.delta.bias.fill_(DELTA_BIAS)
        ours, theirs = mixer.eigenvalues(xn), bw.linear_write_eigenvalues(mixer, xn)
        assert torch.allclose(ours[0], theirs[0]) and torch.allclose(ours[1], theirs[1])
        # what the forward runs: the variant's drive at step 1 is the model's operator's
        for got, want in zip(bw.linear_write_drive(mixer, xn), mixer.drive(xn), strict=True):
            assert torch.allclose(got, want)
        small = []
        for step in (1e-3, 1e-4):
            mixer.delta.bias.fill_(math.log(math.expm1(step * STEP_UNIT)))
            small.append(bw.linear_write_eigenvalues(mixer, xn)[1][0, 0])
        assert torch.allclose(small[0] / small[1], torch.full_like(small[0], 10.0), rtol=1e-3)
    bw.main(["--tasks", "copy_first", "--T", "16", "--lengths", "16", "--steps", "1",
             "--seeds", "0", "--models", "ten_selective_conv", "--batch", "2",
             "--eval-batches", "1"])
    assert EigenstateMixer.eigenvalues is bw._model_eigenvalues  # put back after the run
    assert EigenstateMixer.drive is bw._model_drive


def test_curriculum_doubles_up_to_the_training_length_over_the_first_half():
    args = br.parse_args(["--T", "256", "--curriculum", "64", "--steps", "1000",
                          "--tasks", "copy_first"])
    shapes = [br.train_shape(s, args) for s in range(1000)]
    assert shapes[:250] == [(32, 64)] * 250 and shapes[250:500] == [(32, 128)] * 250
    assert shapes[500:] == [(32, 256)] * 500  # the second half, and so the end, at --T
    off = br.parse_args(["--T", "256", "--steps", "10"])
    assert [br.train_shape(s, off) for s in range(10)] == [(32, 256)] * 10
    odd = br.parse_args(["--T", "100", "--curriculum", "32", "--steps", "9",
                         "--tasks", "copy_first"])
    assert [br.train_shape(s, odd)[1] for s in range(9)] == [32, 32, 32, 64, 64, 100, 100,
                                                              100, 100]
    with pytest.raises(SystemExit):
        br.parse_args(["--curriculum", "-1"])
    with pytest.raises(SystemExit):  # lm warms up as the trainer does, with --seq-warmup
        br.parse_args(["--curriculum", "64", "--tasks", "lm"])


def test_seq_warmup_is_the_trainers_schedule_with_the_same_tokens_per_step():
    args = br.parse_args(["--T", "256", "--seq-warmup", "64", "--steps", "100",
                          "--seq-warmup-steps", "40", "--batch", "8", "--tasks", "mqar"])
    shapes = [br.train_shape(s, args) for s in range(100)]
    trainer = [length_at(s + 1, 256, 64, 40) for s in range(100)]  # what a job trains on
    assert [length for _, length in shapes] == trainer
    assert shapes[0] == (32, 64) and shapes[20] == (16, 128) and shapes[40] == (8, 256)
    assert {rows * length for rows, length in shapes} == {8 * 256}
    assert br.parse_args(["--seq-warmup", "64", "--steps", "10"]).seq_warmup_steps == 5
    for bad in (["--seq-warmup", "100"],  # 256 is not 100 times a power of two
                ["--seq-warmup", "64", "--seq-warmup-steps", "0"],
                ["--seq-warmup", "64", "--curriculum", "64", "--tasks", "mqar"]):
        with pytest.raises(SystemExit):
            br.parse_args(bad)


def test_the_lm_warm_up_is_the_trainers_same_tokens_in_shorter_rows(monkeypatch):
    """With --seq-warmup the lm task trains on the trainer's warm-up rows: every batch
    of the warm-up is cut by ten.train.seqwarmup.split_rows at the trainer's length."""
    seen = []
    real = br.split_rows

    def spy(batch, length):
        seen.append(length)
        return real(batch, length)
    monkeypatch.setattr(br, "split_rows", spy)
    args = br.parse_args(["--T", "64", "--seq-warmup", "16", "--steps", "8", "--tasks", "lm"])

    class Data:
        def train_loader(self, batch):
            while True:
                yield torch.randint(0, 50, (batch, 65))
    model = br.build_model(br.model_configs(args, 50, 64)["ten"])
    br.train_lm(model, br.NextTokenLoss(model, "chunked"), Data(), args, torch.device("cpu"))
    assert seen == [16, 16, 32, 32, 64, 64, 64, 64]


def test_schedule_warms_up_then_holds_or_decays_to_a_tenth():
    def lrs(*flags: str) -> list[float]:
        args = br.parse_args(["--steps", "100", "--lr", "1.0", *flags])
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
        out = []
        for step in range(100):
            br.set_lr(opt, step, args)
            out.append(opt.param_groups[0]["lr"])
        return out

    constant, cosine = lrs(), lrs("--schedule", "cosine")
    assert constant[:10] == cosine[:10] == pytest.approx([(s + 1) / 10 for s in range(10)])
    assert constant[10:] == [1.0] * 90  # the default: what the earlier results used
    assert cosine[10] == pytest.approx(1.0) and cosine[-1] == pytest.approx(0.1, abs=1e-3)
    assert all(a >= b for a, b in zip(cosine[10:-1], cosine[11:], strict=True))


def test_step_init_spreads_each_selective_layers_steps_over_the_range():
    import torch.nn.functional as F

    from ten.kernels.selective import STEP_UNIT
    from ten.model.presets import build_model

    args = br.parse_args(["--tasks", "copy_first", "--d-model", "32", "--eigenstates", "8"])
    cfgs = br.model_configs(args, vocab=64, T=64)
    model = build_model(cfgs["ten_selective_conv"])
    g = torch.Generator().manual_seed(0)
    assert br.spread_steps(model, 0.1, 10.0, g) == cfgs["ten_selective_conv"].n_layers
    for layer in (m for m in model.modules() if isinstance(getattr(m, "delta", None),
                                                           torch.nn.Linear)):
        step0 = F.softplus(layer.delta.bias.double()) / STEP_UNIT
        assert step0.min() >= 0.1 - 1e-6 and step0.max() <= 10.0 + 1e-6
        assert step0.max() / step0.min() > 3  # spread, not one value
    assert br.spread_steps(build_model(cfgs["ten"]), 0.1, 10.0, g) == 0  # fixed: no steps


def test_mqar_runs_one_task_per_pair_count_and_reports_each_models_best_lr(monkeypatch):
    # Zoology's protocol: a model's best learning rate of a sweep is its score
    args = br.parse_args(["--tasks", "mqar", "--T", "24", "--mqar-pairs", "2", "4",
                          "--mqar-keys", "64", "--mqar-values", "16", "--steps", "1",
                          "--batch", "2", "--eval-batches", "1", "--seeds", "0",
                          "--models", "transformer", "--lrs", "1e-3", "1e-2",
                          "--d-model", "16", "--eigenstates", "4"])
    by_lr = {1e-3: 0.25, 1e-2: 0.5}  # what each lr scores here, by construction
    monkeypatch.setattr(br, "train_and_score", lambda cfg, task, at, seed, device: {
        "accuracy": {"24": by_lr[at.lr]}, "final_loss": 1.0, "train_s": 0.1, "params": 1})
    results = br.run(args)
    tasks = results["tasks"]
    assert list(tasks) == ["mqar_2", "mqar_4"]
    row = tasks["mqar_4"]["transformer"]
    assert row["lr"] == 1e-2 and row["by_lr"] == {"0.001": 0.25, "0.01": 0.5}
    assert row["mean"] == {"24": 0.5} and tasks["mqar_4"]["chance"] == 1 / 16
    lines = br.table(results).splitlines()
    assert "params  ms/step" in lines[1]
    row_line = next(line for line in lines if line.strip().startswith("transformer"))
    assert row_line.split()[1:4] == ["50.0%", "0K", "100"]  # 1 parameter, 0.1 s a step
    assert row_line.endswith("lr 0.001: 25.0%, 0.01: 50.0%")


def test_mqar_keys_fewer_than_its_pairs_are_refused():
    with pytest.raises(SystemExit):
        br.parse_args(["--tasks", "mqar", "--mqar-pairs", "16", "--mqar-keys", "8"])
