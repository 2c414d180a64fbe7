"""Can the model recall a token it has seen? Synthetic diagnostics from the literature,
fixed TEN vs selective TEN vs the transformer at equal size, budget and data.

Models: ``ten`` (fixed eigenvalues), ``ten_conv`` (with the short convolution),
``ten_selective`` (the input-dependent step), ``ten_selective_conv`` (both),
``ten_matrix`` (both, with eigenstates that hold value vectors read by a query:
``state: matrix``), and the transformer matched to the fixed TEN's parameter count (the
convolution and the step add ~5% at the default size, the matrix state's query and
values more: the table prints each model's parameters).

Tasks (each a stream of fresh random sequences; loss and accuracy only where an answer
is due, every other position is ignored):

    copy_first      x0, then T-2 noise tokens, then a query marker: answer x0.
    selective_copy  k data tokens scattered among blanks, then k query markers: the data
                    tokens in order (Jing et al.; Mamba's selective copying).
    mqar            n key-value pairs, then the keys again in random order: each key's
                    value (multi-query associative recall, Zoology).
    induction       random tokens with one pair "A B" inside; A again at the end: answer B.

    lm              held-out loss on the default job's corpus (builtin botocore docs, its
                    fixed held-out services) at 1x, 4x and 16x the training length, over
                    the same held-out tokens at every length: does the model still
                    model language, and does it extrapolate?

Every model trains on the same batches (per seed) for the same steps, then is scored on
held-out sequences at the training length and, for copy_first, mqar and induction, at
longer ones (does recall survive lengths it never saw? in mqar the blanks between the
pairs and their queries grow with the length). Chance is printed beside each score.

    python benchmarks/bench_recall.py                          # CPU: every task, 2 seeds
    python benchmarks/bench_recall.py --tasks copy_first --lengths 256 1024 4096
    python benchmarks/bench_recall.py --tasks copy_first --seq-warmup 64   # 64 -> 128 -> 256
    python benchmarks/bench_recall.py --tasks mqar --schedule cosine      # the trainer's decay
    python benchmarks/bench_recall.py --device cuda --steps 2000 --d-model 128
    # Zoology's MQAR protocol: pairs and key/value vocabularies of its small settings,
    # each model at several learning rates, its best reported (recurrent models train in
    # a narrow lr window)
    python benchmarks/bench_recall.py --tasks mqar --T 64 --mqar-pairs 4 8 \
        --mqar-keys 2048 --mqar-values 2048 --lrs 1e-3 3e-3 1e-2 \
        --models ten_selective_conv transformer

The tables print accuracies measured in this one run; --out writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from ten.config import TrainConfig
from ten.kernels.loss import IGNORE_INDEX, NextTokenLoss
from ten.model.presets import build_model, ten_config, transformer_config
from ten.train.schedule import lr_multiplier
from ten.train.seqwarmup import length_at, lengths, split_rows

# Token layout shared by the tasks: 0 blank/noise filler, 1 query marker, 2 separator,
# then the value tokens (VALUES of them), then the key tokens (KEYS of them).
BLANK, QUERY, SEP, FIRST_VALUE = 0, 1, 2, 3


@dataclass(frozen=True)
class Task:
    """``make(batch, T, generator) -> (inputs (B, T), targets (B, T))``: targets hold
    IGNORE_INDEX except where an answer is due; ``chance`` is random guessing's accuracy."""

    name: str
    make: Callable[[int, int, torch.Generator], tuple[torch.Tensor, torch.Tensor]]
    chance: float
    vocab: int
    extrapolates: bool  # meaningful at lengths other than the training one


def copy_first(values: int = 32) -> Task:
    vocab = FIRST_VALUE + values

    def make(b: int, T: int, g: torch.Generator):
        x = torch.randint(FIRST_VALUE, vocab, (b, T), generator=g)  # noise: any value
        x[:, -1] = QUERY
        y = torch.full((b, T), IGNORE_INDEX)
        y[:, -1] = x[:, 0]
        return x, y

    return Task("copy_first", make, 1 / values, vocab, True)


def selective_copy(values: int = 16, k: int = 8) -> Task:
    vocab = FIRST_VALUE + values

    def make(b: int, T: int, g: torch.Generator):
        if T < 2 * k + 1:
            raise ValueError(f"selective_copy needs T >= {2 * k + 1}")
        x = torch.full((b, T), BLANK)
        y = torch.full((b, T), IGNORE_INDEX)
        data = torch.randint(FIRST_VALUE, vocab, (b, k), generator=g)
        for i in range(b):
            pos = torch.randperm(T - k - 1, generator=g)[:k].sort().values
            x[i, pos] = data[i]
        x[:, T - k - 1] = SEP
        x[:, T - k:] = QUERY
        y[:, T - k - 1:T - 1] = data  # predicted at the separator and the first k-1 queries
        return x, y

    return Task(f"selective_copy_{k}", make, 1 / values, vocab, False)


def mqar(pairs: int = 8, values: int = 32, keys: int = 32) -> Task:
    first_key = FIRST_VALUE + values
    vocab = first_key + keys

    def make(b: int, T: int, g: torch.Generator):
        if T < 4 * pairs + 1:
            raise ValueError(f"mqar with {pairs} pairs needs T >= {4 * pairs + 1}")
        x = torch.full((b, T), BLANK)
        y = torch.full((b, T), IGNORE_INDEX)
        for i in range(b):
            k = first_key + torch.randperm(keys, generator=g)[:pairs]
            v = torch.randint(FIRST_VALUE, first_key, (pairs,), generator=g)
            x[i, 0:2 * pairs:2], x[i, 1:2 * pairs:2] = k, v
            order = torch.randperm(pairs, generator=g)
            start = T - 2 * pairs  # queries at the end: blanks between (the gap grows with T)
            x[i, start::2] = k[order]
            x[i, start + 1::2] = QUERY
            y[i, start::2] = v[order]  # predicted right after seeing the key
        return x, y

    return Task(f"mqar_{pairs}", make, 1 / values, vocab, True)


def induction(values: int = 32) -> Task:
    vocab = FIRST_VALUE + values

    def make(b: int, T: int, g: torch.Generator):
        x = torch.randint(FIRST_VALUE, vocab, (b, T), generator=g)
        y = torch.full((b, T), IGNORE_INDEX)
        for i in range(b):
            a = x[i, -1].item()
            # the trigger occurs once before the end, followed by its answer
            x[i, :-1][x[i, :-1] == a] = FIRST_VALUE + (a - FIRST_VALUE + 1) % values
            p = int(torch.randint(0, T - 3, (1,), generator=g))
            x[i, p] = a
            y[i, -1] = x[i, p + 1]
        return x, y

    return Task("induction", make, 1 / values, vocab, True)


TASKS = {"copy_first": copy_first, "selective_copy": selective_copy, "mqar": mqar,
         "induction": induction}


MIN_LR_RATIO = TrainConfig.min_lr_ratio  # the cosine schedule's floor, as in a job

MODELS = ["ten", "ten_conv", "ten_selective", "ten_selective_conv", "ten_matrix",
          "transformer"]


# --- models, training, scoring --------------------------------------------------------------

def model_configs(args: argparse.Namespace, vocab: int, T: int) -> dict[str, object]:
    """Fixed TEN, its convolution / selective / both variants, and the transformer matched
    to the fixed TEN's parameters (see MODELS)."""
    shape = dict(vocab_size=vocab, d_model=args.d_model, n_layers=args.layers, seq_len=T)
    ten = dict(shape, n_eigenstates=args.eigenstates, n_heads=2, chunk_size=min(64, T),
               selective=False, conv_width=0)  # the fixed TEN; the variants switch these on
    conv = args.conv_width
    return {"ten": ten_config("tiny", **ten),
            "ten_conv": ten_config("tiny", **{**ten, "conv_width": conv}),
            "ten_selective": ten_config("tiny", **{**ten, "selective": True}),
            "ten_selective_conv": ten_config("tiny", **{**ten, "selective": True,
                                                        "conv_width": conv}),
            # the presets' mode with value-vector eigenstates (docs/model.md), at the
            # matrix scan's fastest chunk on a CPU
            "ten_matrix": ten_config("tiny", **{**ten, "selective": True, "conv_width": conv,
                                                "state": "matrix",
                                                "chunk_size": min(16, T)}),
            "transformer": transformer_config("tiny", **ten)}


def train_shape(step: int, args: argparse.Namespace) -> tuple[int, int]:
    """(rows, length) of training batch ``step`` (0-based). Every model gets the same
    shapes and the same batches; only training changes, the scoring lengths do not.

    - neither flag: ``--batch`` rows of ``--T``;
    - ``--seq-warmup START``: the trainer's warm-up (``train.seq_warmup_start``; lengths
      from ten.train.seqwarmup over ``--seq-warmup-steps``) with its rule of the same tokens per
      step: ``--batch`` x ``--T`` / L rows of L. The tasks make fresh sequences of L
      (each with its answer), where a job cuts its windows into rows;
    - ``--curriculum START``: the earlier recipe of this benchmark only: START doubling up
      to --T over the first half of the steps, ``--batch`` rows at every length (fewer
      tokens per step while short)."""
    if args.seq_warmup:
        length = length_at(step + 1, args.T, args.seq_warmup, args.seq_warmup_steps)
        return args.batch * args.T // length, length
    if not args.curriculum or args.curriculum >= args.T:
        return args.batch, args.T
    stages = []
    L = args.curriculum
    while L < args.T:
        stages.append(L)
        L *= 2
    stage = step * 2 * len(stages) // max(1, args.steps)  # first half: the short stages
    return args.batch, (stages[stage] if stage < len(stages) else args.T)


def set_lr(opt: torch.optim.Optimizer, step: int, args: argparse.Namespace) -> None:
    """A linear warm-up over the first 10% of the steps, then ``args.schedule``."""
    scale = lr_multiplier(step, args.steps, max(1, args.steps // 10), args.schedule,
                          MIN_LR_RATIO)
    for group in opt.param_groups:
        group["lr"] = args.lr * scale


def train_and_score(cfg: object, task: Task, args: argparse.Namespace, seed: int,
                    device: torch.device) -> dict[str, object]:
    torch.manual_seed(seed)
    model = build_model(cfg, device)
    if args.step_init:
        spread_steps(model, *args.step_init, torch.Generator().manual_seed(20_000 + seed))
    objective = NextTokenLoss(model, "chunked")
    opt = torch.optim.AdamW(model.optimizer_groups(0.0), lr=args.lr)
    data = torch.Generator().manual_seed(seed)
    t0 = time.perf_counter()
    for step in range(args.steps):
        set_lr(opt, step, args)
        x, y = task.make(*train_shape(step, args), data)
        loss = objective(x.to(device), y.to(device))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    train_s = time.perf_counter() - t0
    held_out = torch.Generator().manual_seed(10_000 + seed)
    lengths = args.lengths if task.extrapolates else [args.T]
    acc = {str(T): accuracy(model, task, T, args.eval_batches, args.batch, held_out, device)
           for T in lengths}
    return {"accuracy": acc, "final_loss": loss.item(), "train_s": train_s,
            "params": model.num_params()}


@torch.no_grad()
def spread_steps(model: torch.nn.Module, lo: float, hi: float, g: torch.Generator) -> int:
    """Selective TEN's steps at initialization log-uniform in [lo, hi] per eigenstate
    (Mamba's Δ initialisation), instead of all at 1: each layer's step bias becomes
    softplus⁻¹(STEP_UNIT · Δ₀). Returns how many layers it changed (0: no selective TEN)."""
    from ten.kernels.selective import STEP_UNIT

    changed = 0
    for module in model.modules():
        delta = getattr(module, "delta", None)
        if not isinstance(delta, torch.nn.Linear):
            continue
        u = torch.rand(delta.bias.shape, generator=g, dtype=torch.float64)
        step0 = torch.exp(math.log(lo) + u * (math.log(hi) - math.log(lo)))
        delta.bias.copy_(torch.log(torch.expm1(STEP_UNIT * step0)).to(delta.bias.dtype))
        changed += 1
    return changed


@torch.no_grad()
def accuracy(model: torch.nn.Module, task: Task, T: int, batches: int, batch: int,
             g: torch.Generator, device: torch.device) -> float:
    model.eval()
    right = total = 0
    for _ in range(batches):
        x, y = task.make(batch, T, g)
        logits, _ = model(x.to(device))
        due = y != IGNORE_INDEX
        right += int((logits.argmax(-1).cpu()[due] == y[due]).sum())
        total += int(due.sum())
    model.train()
    return right / max(total, 1)


# --- held-out language modelling, and length extrapolation --------------------------------

LM_LENGTHS = (1, 4, 16)  # × the training length


def lm_data(args: argparse.Namespace):
    """The default job's corpus (builtin botocore docs, its fixed held-out services) unless
    --lm-dataset names another, its BPE and shards: prepared once into the usual cache."""
    from ten.data.config import DataConfig, TokenizerConfig
    from ten.data.pipeline import open_data
    return open_data(DataConfig(dataset=args.lm_dataset, seq_len=args.T,
                                tokenizer=TokenizerConfig(vocab_size=args.lm_vocab),
                                val_fraction=0.05, progress=False))


def train_and_score_lm(cfg: object, data, args: argparse.Namespace, seed: int,
                       device: torch.device) -> dict[str, object]:
    """Train on the corpus for ``args.steps`` batches, then the held-out loss per token at
    1×, 4× and 16× the training length, over the same held-out tokens at every length."""
    from ten.data.loader import sequential_batches
    torch.manual_seed(seed)
    model = build_model(cfg, device)
    objective = NextTokenLoss(model, "chunked")
    t0 = time.perf_counter()
    loss = train_lm(model, objective, data, args, device)
    train_s = time.perf_counter() - t0
    span = args.lm_eval_tokens  # the same held-out tokens, cut into sequences of each length
    held_out: dict[str, float] = {}
    scored: dict[str, int] = {}
    model.eval()
    with torch.no_grad():
        for factor in LM_LENGTHS:
            L = args.T * factor
            per_batch = max(1, min(span, 8192) // L)
            total, n = 0.0, 0
            for b in sequential_batches(data.val, L, per_batch, span // (L * per_batch)):
                b = b.to(device)
                total += float(objective(b[:, :-1], b[:, 1:])) * b[:, 1:].numel()
                n += b[:, 1:].numel()
            if n != span:
                raise SystemExit(f"the held-out split has {len(data.val)} tokens, fewer than "
                                 f"--lm-eval-tokens {span} in sequences of {L}: lower it")
            held_out[str(L)], scored[str(L)] = total / n, n
    model.train()
    return {"loss": held_out, "tokens": scored, "final_loss": loss.item(), "train_s": train_s,
            "params": model.num_params()}


def train_lm(model: torch.nn.Module, objective: NextTokenLoss, data,
             args: argparse.Namespace, device: torch.device) -> torch.Tensor:
    """``args.steps`` steps on the corpus's training windows; with ``--seq-warmup``, the
    trainer's sequence-length warm-up (ten.train.seqwarmup). The last loss."""
    opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=args.lr)
    batches = iter(data.train_loader(args.batch))
    for step in range(args.steps):
        set_lr(opt, step, args)
        b = next(batches).to(device)
        if args.seq_warmup:  # the trainer's warm-up: shorter rows, the same tokens
            b = split_rows(b, train_shape(step, args)[1])
        loss = objective(b[:, :-1], b[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
    return loss


def run_lm(args: argparse.Namespace, device: torch.device) -> dict[str, object]:
    if args.lm_eval_tokens % (args.T * LM_LENGTHS[-1]):
        raise SystemExit(f"--lm-eval-tokens must be a multiple of {args.T * LM_LENGTHS[-1]}")
    data = lm_data(args)
    rows: dict[str, object] = {"chance": None}
    vocab = data.tokenizer.vocab_size
    for model_name, cfg in model_configs(args, vocab, args.T).items():
        if model_name not in args.models:
            continue
        runs = [train_and_score_lm(cfg, data, args, seed, device) for seed in args.seeds]
        mean = {L: statistics.fmean(r["loss"][L] for r in runs) for L in runs[0]["loss"]}
        rows[model_name] = {"seeds": args.seeds, "runs": runs, "mean": mean}
        step_ms = 1000 * statistics.fmean(r["train_s"] for r in runs) / args.steps
        print(f"  lm {model_name}: " + ", ".join(f"T={L} {v:.4f}" for L, v in mean.items())
              + f" nats ({step_ms:.0f} ms/step)", file=sys.stderr)
    return rows


def tasks_of(args: argparse.Namespace) -> list[Task]:
    """The recall tasks asked for: ``mqar`` once per ``--mqar-pairs``, with its key and
    value vocabularies."""
    found = []
    for name in args.tasks:
        if name == "mqar":
            found += [mqar(n, args.mqar_values, args.mqar_keys) for n in args.mqar_pairs]
        elif name != "lm":
            found.append(TASKS[name]())
    return found


def best_lr(cfg: object, task: Task, args: argparse.Namespace,
            device: torch.device) -> dict[str, object]:
    """Every seed at each of ``--lrs`` (or ``--lr`` alone): the row of the lr with the
    best mean accuracy at the training length, and each lr's mean there (Zoology's
    protocol: a model's best lr, as recurrent models train in a narrow window)."""
    by_lr = {}
    for lr in args.lrs or [args.lr]:
        at = argparse.Namespace(**{**vars(args), "lr": lr})
        runs = [train_and_score(cfg, task, at, seed, device) for seed in args.seeds]
        mean = {T: statistics.fmean(r["accuracy"][T] for r in runs) for T in runs[0]["accuracy"]}
        by_lr[lr] = {"seeds": args.seeds, "runs": runs, "mean": mean, "lr": lr}
    trained = str(args.T)
    best = max(by_lr.values(), key=lambda row: row["mean"][trained])
    return {**best, "by_lr": {str(lr): row["mean"][trained] for lr, row in by_lr.items()}}


def run(args: argparse.Namespace) -> dict[str, object]:
    device = torch.device(args.device)
    results: dict[str, object] = {"args": vars(args), "tasks": {}}
    if "lm" in args.tasks:
        results["tasks"]["lm"] = run_lm(args, device)
    for task in tasks_of(args):
        rows: dict[str, object] = {"chance": task.chance}
        for model_name, cfg in model_configs(args, task.vocab, args.T).items():
            if model_name not in args.models:
                continue
            rows[model_name] = row = best_lr(cfg, task, args, device)
            step_ms = 1000 * statistics.fmean(r["train_s"] for r in row["runs"]) / args.steps
            swept = f", lr {row['lr']:g} best of {len(row['by_lr'])}" if args.lrs else ""
            print(f"  {task.name} {model_name}: " + ", ".join(
                f"T={T} {100 * a:.1f}%" for T, a in row["mean"].items())
                + f" ({step_ms:.0f} ms/step{swept})", file=sys.stderr)
        results["tasks"][task.name] = rows
    return results


def table(results: dict[str, object]) -> str:
    lines = []
    for task, rows in results["tasks"].items():
        models = [m for m in rows if m != "chance"]
        lengths = list(rows[models[0]]["mean"]) if models else []
        if task == "lm":
            lines.append("lm: held-out loss, nats per token (lower is better)")
            lines.append("  model            " + "  ".join(f"T={L:>6}" for L in lengths)
                         + "   16x - 1x   per seed (training T)")
            for m in models:
                r, first, last = rows[m], lengths[0], lengths[-1]
                per_seed = ", ".join(f"{run['loss'][first]:.4f}" for run in r["runs"])
                lines.append(f"  {m:<16} " + "  ".join(f"{r['mean'][L]:8.4f}" for L in lengths)
                             + f"   {r['mean'][last] - r['mean'][first]:+.4f}   [{per_seed}]")
            continue
        lines.append(f"{task} (chance {100 * rows['chance']:.1f}%)")
        lines.append("  model            " + "  ".join(f"T={T:>6}" for T in lengths)
                     + "   params  ms/step   per seed (training T)")
        steps = results["args"]["steps"]
        for m in models:
            r = rows[m]
            per_seed = ", ".join(f"{100 * run['accuracy'][lengths[0]]:.1f}"
                                 for run in r["runs"])
            swept = ("   lr " + ", ".join(f"{lr}: {100 * a:.1f}%" for lr, a in r["by_lr"].items())
                     if len(r["by_lr"]) > 1 else "")
            cost = (f"{r['runs'][0]['params'] / 1e3:6.0f}K  "
                    f"{1e3 * statistics.mean(run['train_s'] for run in r['runs']) / steps:7.0f}")
            lines.append(f"  {m:<16} " + "  ".join(f"{100 * r['mean'][T]:7.1f}%"
                                                   for T in lengths)
                         + f"   {cost}   [{per_seed}]{swept}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", nargs="+", choices=[*TASKS, "lm"], default=[*TASKS, "lm"],
                   help="lm: held-out loss on the builtin corpus at 1x, 4x, 16x the length")
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--T", type=int, default=256, help="training length")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024],
                   help="scoring lengths for the tasks that extrapolate")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--seq-warmup", type=int, default=0, metavar="START",
                   help="the trainer's sequence-length warm-up (train.seq_warmup_start; --T "
                        "over a power of two): START doubling up to --T over "
                        "--seq-warmup-steps, the same tokens per step (more, shorter rows). "
                        "0: off")
    p.add_argument("--seq-warmup-steps", type=int, metavar="N",
                   help="train.seq_warmup_steps (default: half of --steps)")
    p.add_argument("--curriculum", type=int, default=0, metavar="START",
                   help="this benchmark's earlier recipe, synthetic tasks only: START "
                        "doubling up to --T over the first half of the steps, --batch rows "
                        "at every length (0: off)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--lrs", type=float, nargs="+", metavar="LR",
                   help="train each model at each of these and report its best (not --lr)")
    p.add_argument("--mqar-pairs", type=int, nargs="+", default=[8], metavar="N",
                   help="mqar: key-value pairs per sequence (one task each)")
    p.add_argument("--mqar-keys", type=int, default=32, help="mqar: the keys' vocabulary")
    p.add_argument("--mqar-values", type=int, default=32, help="mqar: the values' vocabulary")
    p.add_argument("--schedule", choices=["constant", "cosine"], default="constant",
                   help="after the warm-up: hold the peak lr, or a half cosine down to a tenth "
                        "of it (the trainer's default schedule)")
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--d-model", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--eigenstates", type=int, default=32)
    p.add_argument("--lm-dataset", default="builtin:botocore-docs",
                   help="the lm task's corpus (any data.dataset a job accepts)")
    p.add_argument("--lm-vocab", type=int, default=4096, help="the lm task's BPE vocabulary")
    p.add_argument("--lm-eval-tokens", type=int, default=65536,
                   help="held-out tokens the lm task scores at every length")
    p.add_argument("--conv-width", type=int, default=4,
                   help="the short convolution of the *_conv models")
    p.add_argument("--device", default="cpu")
    p.add_argument("--step-init", type=float, nargs=2, metavar=("LO", "HI"),
                   help="selective TEN's steps at initialization log-uniform in [LO, HI] "
                   "per eigenstate (default: all 1)")
    p.add_argument("--out", type=Path, help="write the results as JSON here")
    args = p.parse_args(argv)
    if args.curriculum < 0 or args.seq_warmup < 0:
        p.error("--curriculum and --seq-warmup must be 0 (off) or a starting length")
    if args.curriculum and args.seq_warmup:
        p.error("--curriculum or --seq-warmup, not both")
    if args.curriculum and "lm" in args.tasks:
        p.error("the lm task warms up as the trainer does: --seq-warmup, not --curriculum")
    if args.seq_warmup:
        try:
            lengths(args.T, args.seq_warmup)
        except ValueError as e:
            p.error(f"--seq-warmup {e}")
        if args.seq_warmup_steps is None:
            args.seq_warmup_steps = args.steps // 2
        if not 1 <= args.seq_warmup_steps <= args.steps:
            p.error("--seq-warmup-steps must be between 1 and --steps")
    if args.step_init and not 0 < args.step_init[0] <= args.step_init[1]:
        p.error("--step-init needs 0 < LO <= HI")
    if "mqar" in args.tasks and args.mqar_keys < max(args.mqar_pairs):
        p.error(f"--mqar-keys must be at least the most pairs ({max(args.mqar_pairs)}): "
                "each sequence's keys are distinct")
    if args.T not in args.lengths:
        args.lengths = [args.T, *args.lengths]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = run(args)
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
