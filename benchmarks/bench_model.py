"""Training-step speed and memory of TEN vs the matched transformer, at equal tokens/step.

Each (arch, backend, T) point runs in a fresh subprocess so peak memory is its own. A
step is forward + backward + AdamW, the batch shrinks as T grows so every step sees the
same number of tokens. Ratios in the printed table come from this one run.

    python benchmarks/bench_model.py                      # CPU: tiny preset, T 256..16384
    python benchmarks/bench_model.py --device cuda --preset small_32k --dtype bf16 \\
        --lengths 2048 8192 32768 --tokens 65536          # GPU: plain loss, no checkpointing

The step here is the bare model with the plain fp32-logits loss (the CPU baseline these
ratios have always used). The flagship as training runs it on a GPU (the fused loss,
checkpointing, 8-bit AdamW, the largest batch that fits) is benchmarks/gpu_suite.py.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time


def run_point(args: argparse.Namespace) -> dict:
    import torch

    from ten.model.presets import build_model, model_config
    from ten.train.mfu import mfu, peak_flops

    torch.manual_seed(0)
    device = torch.device(args.device)
    overrides = {"vocab_size": args.vocab, "seq_len": args.T}
    if args.arch == "ten":
        overrides["scan_backend"] = args.backend
    cfg = model_config(args.arch, args.preset, **overrides)
    model = build_model(cfg, device)
    opt = torch.optim.AdamW(model.optimizer_groups(0.1), lr=1e-4,
                            fused=device.type == "cuda")
    B = max(1, args.tokens // args.T)
    ids = torch.randint(0, args.vocab, (B, args.T + 1), device=device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]

    def step():
        with torch.autocast(device.type, dtype=dtype, enabled=args.dtype != "fp32"):
            logits, _ = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), ids[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
        mem0 = torch.cuda.memory_allocated()
    for _ in range(2):  # warm-up (allocator, kernels)
        step()
    sync()
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    sec = statistics.median(times)
    tokens = B * args.T
    if device.type == "cuda":
        peak_mem = torch.cuda.max_memory_allocated() - mem0
    else:  # ru_maxrss is KiB on Linux: growth of the peak over the set-up state
        peak_mem = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) * 1024
    fpt = model.flops_per_token(args.T)
    util = mfu(fpt, tokens / sec, peak_flops(device))
    result = {"arch": args.arch, "backend": args.backend if args.arch == "ten" else "sdpa",
              "T": args.T, "B": B, "sec_per_step": sec, "us_per_token": 1e6 * sec / tokens,
              "tokens_per_s": tokens / sec, "peak_mem_mb": peak_mem / 2**20,
              "params": model.num_params(), "flops_per_token": fpt, "mfu": util}
    if args.profile:
        from torch.profiler import ProfilerActivity, profile
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
        with profile(activities=acts) as prof:
            step()
            sync()
        key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(prof.key_averages().table(sort_by=key, row_limit=15), file=sys.stderr)
    return result


def scan_only(T: int, tokens: int, K: int, chunk: int, device: str) -> dict:
    """Forward + backward of the scan alone (B·T = tokens, K eigenstates): ref vs chunked."""
    import torch

    from ten.kernels.scan import scan

    torch.manual_seed(0)
    B = max(1, tokens // T)
    beta = torch.randn(B, T, 2 * K, device=device, requires_grad=True)
    log_lam = torch.cat([-torch.rand(K) * 0.1, torch.rand(K) * 0.3]).to(device).requires_grad_()

    def once(backend: str) -> float:
        t0 = time.perf_counter()
        c, _ = scan(beta, log_lam, backend=backend, chunk_size=chunk)
        c.square().sum().backward()
        if device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    once("chunked")
    chunked = statistics.median(once("chunked") for _ in range(5))
    ref = once("ref")
    return {"T": T, "B": B, "chunked_s": chunked, "ref_s": ref}


def spawn(base: list[str], arch: str, backend: str, T: int) -> dict:
    cmd = [sys.executable, __file__, *base, "--one", "--arch", arch, "--backend", backend,
           "--T", str(T)]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        return {"arch": arch, "backend": backend, "T": T, "error": out.stderr.strip()[-300:]}
    if out.stderr.strip():
        print(out.stderr, file=sys.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--dtype", choices=["bf16", "fp32"], default="fp32")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096, 16384])
    p.add_argument("--tokens", type=int, default=16384, help="tokens per step (B x T)")
    p.add_argument("--steps", type=int, default=3, help="timed steps per point")
    p.add_argument("--ref-T", type=int, default=4096, help="T for the chunked-vs-ref row (0: skip)")
    p.add_argument("--profile", action="store_true", help="print op profile of each point")
    # internal: one point in this process
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arch", default="ten", help=argparse.SUPPRESS)
    p.add_argument("--backend", default="chunked", help=argparse.SUPPRESS)
    p.add_argument("--T", type=int, default=256, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(run_point(args)))
        return

    base = ["--device", args.device, "--preset", args.preset, "--vocab", str(args.vocab),
            "--dtype", args.dtype, "--tokens", str(args.tokens), "--steps", str(args.steps)]
    if args.profile:
        base.append("--profile")
    rows = []
    for T in args.lengths:
        for arch in ("ten", "transformer"):
            rows.append(spawn(base, arch, "chunked", T))
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)

    print(f"\n## {args.preset}, {args.dtype}, {args.tokens} tokens/step, device={args.device}")
    print("| T | B | TEN us/tok | GPT us/tok | TEN tok/s | GPT tok/s | TEN/GPT speed "
          "| TEN MFU | GPT MFU | TEN mem MB | GPT mem MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    by = {(r["arch"], r["T"]): r for r in rows}

    def pct(x):
        return "-" if x is None else f"{100 * x:.1f}%"

    for T in args.lengths:
        t, g = by[("ten", T)], by[("transformer", T)]
        if "error" in t or "error" in g:
            print(f"| {T} | error: {t.get('error') or g.get('error')} |")
            continue
        print(f"| {T} | {t['B']} | {t['us_per_token']:.2f} | {g['us_per_token']:.2f} "
              f"| {t['tokens_per_s']:,.0f} | {g['tokens_per_s']:,.0f} "
              f"| {g['us_per_token'] / t['us_per_token']:.2f}x | {pct(t['mfu'])} "
              f"| {pct(g['mfu'])} | {t['peak_mem_mb']:.0f} | {g['peak_mem_mb']:.0f} |")
    ten_t = [by[("ten", T)] for T in args.lengths if "error" not in by[("ten", T)]]
    if len(ten_t) > 1:
        ratio = ten_t[-1]["us_per_token"] / ten_t[1 if len(ten_t) > 2 else 0]["us_per_token"]
        lo = ten_t[1 if len(ten_t) > 2 else 0]["T"]
        print(f"\nTEN time/token growth T={lo} -> T={ten_t[-1]['T']}: {ratio:.2f}x "
              "(target < 1.5x)")

    if args.ref_T:
        from ten.model.presets import model_config

        cfg = model_config("ten", args.preset)
        r = scan_only(args.ref_T, args.tokens, cfg.n_eigenstates, cfg.chunk_size, args.device)
        print(f"chunked vs ref, scan alone (fwd+bwd, B={r['B']}, T={r['T']}, "
              f"K={cfg.n_eigenstates}): chunked {r['chunked_s'] * 1e3:.1f} ms, ref "
              f"{r['ref_s'] * 1e3:.0f} ms, speed-up {r['ref_s'] / r['chunked_s']:.1f}x "
              "(target >= 20x)")
        chunked = spawn(base, "ten", "chunked", args.ref_T)
        ref = spawn(base[:-2] + ["--steps", "1"], "ten", "ref", args.ref_T)
        print(f"chunked vs ref scan, full training step at T={args.ref_T}: "
              f"chunked {chunked['sec_per_step']:.3f} s, ref {ref['sec_per_step']:.3f} s, "
              f"speed-up {ref['sec_per_step'] / chunked['sec_per_step']:.1f}x (target >= 20x)")


if __name__ == "__main__":
    main()
