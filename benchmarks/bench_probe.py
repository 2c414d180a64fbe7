"""What the evaluation's extras add to a run: the recall probe (ten.model.probes.repeat_recall)
and the state's health (ten.model.statehealth), both on by default: their time against a
training step and an evaluation, measured in this run, and their share of a whole run at
the job's cadence.

    python benchmarks/bench_probe.py                       # the default job's shapes
    python benchmarks/bench_probe.py --preset small --seq-len 1024 --batch 4

Prints one JSON object; the ratios are the result (seconds depend on the machine).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from ten.kernels.loss import NextTokenLoss
from ten.model.presets import build_model, model_config
from ten.model.probes import repeat_recall
from ten.model.statehealth import state_health
from ten.train.step import evaluate


def timed(fn, repeats: int) -> float:
    fn()  # warm-up (allocator, first call)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq-len", type=int, default=256)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--eval-batches", type=int, default=20)
    p.add_argument("--steps", type=int, default=300, help="the run's budget")
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device("cpu")
    model = build_model(model_config("ten", args.preset, vocab_size=args.vocab,
                                     seq_len=args.seq_len))
    objective = NextTokenLoss(model, "chunked")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, args.vocab, (args.batch, args.seq_len + 1))

    def step() -> None:
        objective(batch[:, :-1], batch[:, 1:]).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    step_s = timed(step, args.repeats)
    eval_s = timed(lambda: evaluate(objective, iter([batch] * args.eval_batches), device,
                                    None), max(1, args.repeats // 2))
    probe_s = timed(lambda: repeat_recall(model, args.seq_len, device), args.repeats)
    health_s = timed(lambda: state_health(model, batch[:, :-1]), args.repeats)
    evals = args.steps // args.eval_every + (args.steps % args.eval_every != 0)
    run_s = args.steps * step_s + evals * (eval_s + probe_s + health_s)
    print(json.dumps({
        "shape": vars(args), "params": model.num_params(), "step_s": step_s,
        "eval_s": eval_s, "probe_s": probe_s, "health_s": health_s,
        "probe_over_eval": probe_s / eval_s, "health_over_eval": health_s / eval_s,
        "extras_share_of_run": evals * (probe_s + health_s) / run_s,
    }, indent=1))


if __name__ == "__main__":
    main()
