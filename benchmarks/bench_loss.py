"""The training loss without B×T×V fp32 logits: plain vs chunked vs fused vs a compiled
chunked cross-entropy (vs Liger on CUDA).

For one (rows N = B·T, d_model, vocab V) it runs forward + backward of each loss on the
same hidden states and head weight and prints peak memory, time, and the ratios against
the plain loss measured in the same run. ``compiled`` is the public recipe that has
beaten Liger's kernel in published comparisons: each chunk's logits, log-softmax and both
gradients one ``torch.compile``d function (Inductor writes the row math; cuBLAS or its
templates the matmuls), run in the loss's forward, as ``ten.kernels.loss`` runs its chunks.

    python benchmarks/bench_loss.py                              # CPU: N 4096, d 256, V 32000
    python benchmarks/bench_loss.py --device cuda --rows 32768 --d 1024 --vocab 32000 --dtype bf16

Peak memory: on CUDA ``torch.cuda.max_memory_allocated``; on CPU the peak of torch's
memory-profiler timeline (allocations made by torch, which is what the logits are).
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from ten.kernels.loss import (
    FUSED_CHUNK_ELEMENTS,
    add_weight_grad,
    chunked_linear_cross_entropy,
    default_chunk_rows,
    fused_linear_cross_entropy,
    liger_linear_cross_entropy,
    reference_linear_cross_entropy,
    resolve_loss_backend,
    weight_grad_path,
)


def _chunk_loss_and_grads(h, w, t, grad_w, scale):
    """One chunk: (sum of its rows' losses, d loss / d h); adds d loss / d W to grad_w
    (fp32). ``scale`` is 1/N, the mean's weight. Compiled whole (``_compiled_chunk``)."""
    logits = (h @ w.t()).float()  # (R, V)
    lse = logits.logsumexp(-1)  # (R,)
    loss = (lse - logits.gather(1, t[:, None]).squeeze(1)).sum()
    d = (((logits - lse[:, None]).exp() - F.one_hot(t, logits.shape[1])) * scale).to(h.dtype)
    grad_w.add_((d.t() @ h).float())
    return loss, d @ w


@functools.cache
def _compiled_chunk():
    return torch.compile(_chunk_loss_and_grads, dynamic=False)


class _CompiledChunkedCE(torch.autograd.Function):
    """Forward runs the compiled chunks and keeps both gradients; backward scales them."""

    @staticmethod
    def forward(ctx, hidden, weight, targets, rows):
        dev = hidden.device.type
        compute = (torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev)
                   else hidden.dtype)
        grad_h = torch.empty(hidden.shape, dtype=compute, device=hidden.device)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        loss = torch.zeros((), dtype=torch.float32, device=hidden.device)
        scale = 1.0 / hidden.shape[0]
        chunk = _compiled_chunk()
        with torch.autocast(dev, enabled=False):
            w = weight.to(compute)
            for start in range(0, hidden.shape[0], rows):
                sl = slice(start, start + rows)
                part, grad_h[sl] = chunk(hidden[sl].to(compute), w, targets[sl], grad_w, scale)
                loss += part
        ctx.weight_dtype, ctx.hidden_dtype = weight.dtype, hidden.dtype
        ctx.save_for_backward(grad_h, grad_w)
        return loss * scale

    @staticmethod
    def backward(ctx, grad_out):
        grad_h, grad_w = ctx.saved_tensors
        return ((grad_h * grad_out).to(ctx.hidden_dtype),
                (grad_w * grad_out).to(ctx.weight_dtype), None, None)


def compiled_chunked_linear_cross_entropy(hidden, weight, targets):
    """The mean loss over (N, d) hidden states (no ignored targets: the benchmark's data
    has none), in chunks of the fused kernel's size."""
    rows = default_chunk_rows(*hidden.shape, weight.shape[0], FUSED_CHUNK_ELEMENTS)
    return _CompiledChunkedCE.apply(hidden, weight, targets, rows)


def backends(device: torch.device) -> dict:
    """Every loss that runs on ``device``: what a job can choose, and the compiled recipe."""
    out = {"plain": reference_linear_cross_entropy, "chunked": chunked_linear_cross_entropy,
           "compiled": compiled_chunked_linear_cross_entropy}
    for name, fn in (("fused", fused_linear_cross_entropy),
                     ("liger", liger_linear_cross_entropy)):
        try:
            resolve_loss_backend(name, device)  # raises where it cannot run
        except ValueError:
            continue
        out[name] = fn
    return out


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


def measure(loss_fn, hidden, weight, targets, dtype, repeats: int, cpu_memory: bool = True
            ) -> tuple[float, int | None, list[torch.Tensor]]:
    """(seconds per forward + backward, peak bytes above the inputs, [loss, d hidden,
    d weight]). On a CPU the peak comes from the profiler's memory timeline, which takes
    seconds per loss; ``cpu_memory=False`` skips it there (peak None)."""
    device = hidden.device

    def step():
        h = hidden.detach().requires_grad_()
        w = weight.detach().requires_grad_()
        with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
            loss = loss_fn(h, w, targets)
        loss.backward()
        return [loss.detach().float(), h.grad.float(), w.grad.float()]

    out = step()  # warm-up (and compiles)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = _peak_cpu_bytes(step) if cpu_memory else None
    t0 = time.perf_counter()
    for _ in range(repeats):
        step()
    _sync(device)
    return (time.perf_counter() - t0) / repeats, peak, out


def compare(rows: int, d: int, vocab: int, dtype: torch.dtype, device: torch.device,
            repeats: int, seed: int = 0, cpu_memory: bool = True) -> dict:
    """Each loss of :func:`backends` on the same inputs: ms, peak MiB, and its largest
    differences from the plain loss (the loss; d hidden and d weight relative to their
    largest value). A loss that fails is recorded as its error."""
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(rows, d, generator=g).to(device)
    weight = (torch.randn(vocab, d, generator=g) * d ** -0.5).to(device)
    targets = torch.randint(0, vocab, (rows,), generator=g).to(device)
    result = {"rows": rows, "d": d, "vocab": vocab, "dtype": str(dtype).removeprefix("torch."),
              "seed": seed, "losses": {}}
    want = None
    for name, fn in backends(device).items():
        try:
            secs, peak, got = measure(fn, hidden, weight, targets, dtype, repeats,
                                      cpu_memory)
        except Exception as e:  # a candidate that fails here is a finding, not the end
            result["losses"][name] = {"error": f"{type(e).__name__}: {e}"[:500]}
            continue
        want = want or got  # the plain loss comes first
        result["losses"][name] = {
            "ms": 1e3 * secs, "peak_mib": None if peak is None else peak / 2**20,
            "loss_error": float((got[0] - want[0]).abs()),
            "grad_rel_error": [float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                               for a, b in zip(got[1:], want[1:], strict=True)]}
        del got
    return result


def weight_grad(rows: int, d: int, vocab: int, device: torch.device, repeats: int,
                seed: int = 0) -> dict:
    """The fused loss's weight gradient alone at its chunks (bf16 into the fp32 sum): the
    rounded product then an fp32 add (the loss before 2026-12-07) against what
    :func:`ten.kernels.loss.add_weight_grad` does here; ms a call of the whole loss (every
    chunk), and each one's largest error relative to the float64 sum. The chunks all
    reuse one chunk's gradient and hidden states: the float64 sum is that product times
    the number of chunks."""
    chunk = default_chunk_rows(rows, d, vocab, FUSED_CHUNK_ELEMENTS)
    n = -(-rows // chunk)
    g = torch.Generator().manual_seed(seed)
    dlogits = (torch.randn(chunk, vocab, generator=g) / rows).to(device, torch.bfloat16)
    h = torch.randn(chunk, d, generator=g).to(device, torch.bfloat16)
    want = (dlogits.double().t() @ h.double()) * n
    dt, ht = dlogits.t(), h

    def rounded_then_added(total):
        total += dt @ ht

    def as_the_loss_does(total):
        add_weight_grad(total, dlogits, h)

    result = {"rows": rows, "d": d, "vocab": vocab, "chunk_rows": chunk, "chunks": n,
              "seed": seed,
              "path": weight_grad_path(device.type, torch.bfloat16, torch.float32)}
    ways = {"rounded_then_added": rounded_then_added, "as_the_loss_does": as_the_loss_does}
    totals = {}
    for name, add in ways.items():  # both warmed up before either is timed
        totals[name] = total = torch.zeros(vocab, d, device=device)
        for _ in range(n):  # the sum whose error is reported
            add(total)
        result[name] = {"rel_error": float((total.double() - want).abs().max()
                                           / want.abs().max())}
    for name, add in ways.items():
        total = totals[name]
        _sync(device)
        t0 = time.perf_counter()
        for _ in range(repeats):
            for _ in range(n):
                add(total)
        _sync(device)
        result[name]["ms"] = 1e3 * (time.perf_counter() - t0) / repeats
    result["speedup"] = result["rounded_then_added"]["ms"] / result["as_the_loss_does"]["ms"]
    return result


def weight_grad_line(w: dict) -> str:
    """:func:`weight_grad`'s result as one sentence (this script's and the GPU suite's)."""
    before, now = w["rounded_then_added"], w["as_the_loss_does"]
    return (f"The loss's weight gradient into the fp32 sum, {w['chunks']} x {w['chunk_rows']} "
            f"rows: {w['path']} here, {now['ms']:.3g} ms (rel. error {now['rel_error']:.1e}) "
            f"against the rounded product then an add {before['ms']:.3g} ms "
            f"({before['rel_error']:.1e}): {w['speedup']:.3g}×.")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def markdown(r: dict) -> str:
    """The comparison as a table, with ratios against the plain loss."""
    base = r["losses"].get("plain", {})
    lines = ["| loss | fwd+bwd (ms) | peak memory (MiB) | time ÷ plain | memory ÷ plain | "
             "d hidden, d weight rel. error |", "|---|---|---|---|---|---|"]
    for name, x in r["losses"].items():
        if "error" in x:
            lines.append(f"| {name} | failed: {x['error'][:120]} | | | | |")
            continue
        peak, bpeak = x["peak_mib"], base.get("peak_mib")
        mem = "-" if peak is None or not bpeak else f"{peak / bpeak:.3f}"
        errs = ", ".join(f"{e:.1e}" for e in x["grad_rel_error"])
        lines.append(f"| {name} | {x['ms']:.2f} | {'-' if peak is None else f'{peak:.0f}'} | "
                     f"{x['ms'] / base['ms']:.2f} | {mem} | {errs} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cpu")
    p.add_argument("--rows", type=int, default=4096, help="N = batch × sequence length")
    p.add_argument("--d", type=int, default=256)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    device = torch.device(args.device)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"device {device} ({name}), seed {args.seed}, N {args.rows}, d {args.d}, "
          f"V {args.vocab}, {args.dtype}; the full fp32 logits are "
          f"{args.rows * args.vocab * 4 / 2**20:.0f} MiB")
    r = compare(args.rows, args.d, args.vocab, dtype, device, args.repeats, args.seed)
    print(markdown(r))
    print(weight_grad_line(weight_grad(args.rows, args.d, args.vocab, device, args.repeats,
                                       args.seed)))
    for missing in sorted({"fused", "liger"} - set(r["losses"])):
        print(f"{missing}: not run here (needs CUDA; liger also liger-kernel: "
              f"pip install -e '.[gpu]')")


if __name__ == "__main__":
    main()
