"""The training loss without B×T×V fp32 logits: plain vs chunked (vs Liger on CUDA).

For one (rows N = B·T, d_model, vocab V) it runs forward + backward of each backend on
the same hidden states and head weight and prints peak memory, time, and the ratios
against the plain loss measured in the same run:

    python benchmarks/bench_loss.py                              # CPU: N 4096, d 256, V 32000
    python benchmarks/bench_loss.py --device cuda --rows 32768 --d 1024 --vocab 32000 --dtype bf16

Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the peak of torch's
memory-profiler timeline (allocations made by torch, which is what the logits are).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from pathlib import Path

import torch

from ten.loss import (
    chunked_linear_cross_entropy,
    liger_available,
    liger_linear_cross_entropy,
    reference_linear_cross_entropy,
)


def _peak_cpu_bytes(fn) -> int | None:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        fn()
    if not hasattr(prof, "export_memory_timeline"):
        return None
    with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        path = Path(tmp) / "timeline.json"
        prof.export_memory_timeline(str(path), device="cpu")
        _, sizes = json.loads(path.read_text())
    return max((sum(s) for s in sizes), default=0)


def measure(loss_fn, hidden, weight, targets, dtype, repeats: int) -> tuple[float, int | None]:
    device = hidden.device

    def step():
        h = hidden.detach().requires_grad_()
        w = weight.detach().requires_grad_()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn(h, w, targets)
        loss.backward()

    step()  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _peak_cpu_bytes(step)
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - t0) / repeats, peak


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", type=int, default=4096, help="N = batch × sequence length")
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--repeats", type=int, default=3)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.rows, args.d, generator=g).to(device)
    weight = (torch.randn(args.vocab, args.d, generator=g) * args.d ** -0.5).to(device)
    targets = torch.randint(0, args.vocab, (args.rows,), generator=g).to(device)
    backends = {"plain": reference_linear_cross_entropy, "chunked": chunked_linear_cross_entropy}
    if device.type == "cuda" and liger_available():
        backends["liger"] = liger_linear_cross_entropy
    logits_mib = args.rows * args.vocab * 4 / 2**20
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {device} ({name}), "
          f"N {args.rows}, d {args.d}, V {args.vocab}, {args.dtype}; the full fp32 logits "
          f"are {logits_mib:.0f} MiB")
    rows = {name: measure(fn, hidden, weight, targets, dtype, args.repeats)
            for name, fn in backends.items()}
    base_s, base_peak = rows["plain"]
    print("| loss | fwd+bwd (s) | peak memory (MiB) | time ÷ plain | memory ÷ plain |")
    print("|---|---|---|---|---|")
    for name, (secs, peak) in rows.items():
        peak_txt = "-" if peak is None else f"{peak / 2**20:.0f}"
        mem_ratio = "-" if peak is None or not base_peak else f"{peak / base_peak:.3f}"
        print(f"| {name} | {secs:.3f} | {peak_txt} | {secs / base_s:.2f} | {mem_ratio} |")
    if "liger" not in rows:
        print("liger: not run (needs CUDA and liger-kernel: pip install -e '.[gpu]')")


if __name__ == "__main__":
    main()
