"""Speed of the scan backends alone: forward + backward of ``ten.kernels.scan.scan`` per T
(``--state matrix``: of ``ten.kernels.matrix_scan.matrix_scan``, eigenstates that hold values).

Every backend runs on the same inputs in this one process; the table gives the median
time of a forward+backward, its throughput, the peak memory (CUDA) and the ratio to
``chunked`` measured in the same run. ``ref`` is a Python loop over time: it is timed
only up to --ref-max-T. ``fused`` needs CUDA (on CPU Triton can only interpret it, which
times numpy, not the kernel): on a machine without CUDA the table says so and skips it.

    python benchmarks/bench_scan.py                                  # CPU: ref vs chunked
    python benchmarks/bench_scan.py --device cuda --batch 8 --eigenstates 128 \\
        --lengths 1024 4096 16384 32768 --selective                  # the GPU table
    python benchmarks/bench_scan.py --device cuda --sweep            # fused launch plans
    python benchmarks/bench_scan.py --device cuda --state matrix --selective --batch 4 \\
        --eigenstates 128 --heads 4 --value-dim 256 --lengths 4096 32768  # small_32k's heads
    python benchmarks/bench_scan.py --device cuda --state matrix --selective --batch 4 \\
        --eigenstates 128 --heads 4 --value-dim 256 --lengths 32768 --sweep  # its blocks
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import math
import statistics
import time

import torch

from ten.kernels.matrix_scan import matrix_scan
from ten.kernels.scan import ScanBackendError, resolve_backend, scan


def _eigenvalues(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    """|λ| in [0.9, 0.999] as the model initialises it; angles in [0, π/10]."""
    log_mag = torch.log(0.9 + 0.099 * torch.rand(shape, generator=g))
    return torch.cat([log_mag, math.pi / 10 * torch.rand(shape, generator=g)], dim=-1)


def make_inputs(B: int, T: int, K: int, selective: bool, device: torch.device):
    """The vector scan's (β, log λ, state)."""
    g = torch.Generator().manual_seed(0)
    log_lam = _eigenvalues((B, T, K) if selective else (K,), g)
    beta = torch.randn(B, T, 2 * K, generator=g)
    state = torch.randn(B, 2 * K, generator=g)
    return [t.to(device) for t in (beta, log_lam, state)]


def make_matrix_inputs(B: int, T: int, K: int, heads: int, P: int, selective: bool,
                       device: torch.device):
    """The matrix scan's (k, v, q, log λ, state (B, H, K/H, P) complex)."""
    g = torch.Generator().manual_seed(0)
    log_lam = _eigenvalues((B, T, K) if selective else (K,), g)
    k, q = (torch.randn(B, T, 2 * K, generator=g) for _ in range(2))
    v = torch.randn(B, T, heads * P, generator=g)
    state = torch.complex(*(torch.randn(B, heads, K // heads, P, generator=g) for _ in range(2)))
    return [t.to(device) for t in (k, v, q, log_lam, state)]


def time_backend(fn, inputs, dtype: str, device: torch.device, repeat: int) -> dict:
    """``fn(*inputs) -> (out, last state)`` forward + backward. With ``dtype`` bf16 the
    activations (every input but the last two, the eigenvalues and the state) enter in
    bf16 under autocast, as the model's do."""
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    amp = dtype == "bf16"
    args = [t.bfloat16().detach().requires_grad_() if amp and i < len(leaves) - 2 else t
            for i, t in enumerate(leaves)]
    weight = None

    def step():
        nonlocal weight
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            c, last = fn(*args)
        if weight is None:
            weight = torch.randn(c.shape, device=device)
        last = torch.view_as_real(last) if last.is_complex() else last
        ((c * weight).sum() + last.sum()).backward()
        return c

    def clear():
        for t in (*leaves, *args):
            t.grad = None

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    for _ in range(2):  # warm-up: compiles the kernels, sizes the allocator
        out = step()
        clear()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeat):
        clear()
        t0 = time.perf_counter()
        step()
        sync()
        times.append(time.perf_counter() - t0)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device.type == "cuda" else float("nan")
    # back to back, one sync at the end: a call's cost when the host stays ahead of the
    # device, as in a training step ("sec" is one call's latency, launches included)
    t0 = time.perf_counter()
    for _ in range(repeat):
        clear()
        step()
    sync()
    queued = (time.perf_counter() - t0) / repeat
    return {"sec": statistics.median(times), "queued_sec": queued, "peak_mb": peak,
            "out": out.detach()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 4096])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--eigenstates", type=int, default=64, help="K, complex lanes")
    p.add_argument("--state", choices=["vector", "matrix"], default="vector",
                   help="what an eigenstate holds (TENConfig.state)")
    p.add_argument("--heads", type=int, default=4, help="matrix: heads of K/H eigenstates")
    p.add_argument("--value-dim", type=int, default=64, help="matrix: P values per head")
    p.add_argument("--selective", action="store_true", help="per-token eigenvalues")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: the drive arrives in bf16 under autocast")
    p.add_argument("--chunk-size", type=int, default=64)
    p.add_argument("--backends", nargs="+", default=["ref", "chunked", "fused"])
    p.add_argument("--ref-max-T", type=int, default=1024)
    p.add_argument("--repeat", type=int, default=10)
    p.add_argument("--sweep", action="store_true",
                   help="time fused launch plans instead (block_t x block_k x groups; "
                        "--state matrix: value columns x warps)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}")
    else:
        print(f"device: {device.type} ({torch.get_num_threads()} threads)")
    matrix = args.state == "matrix"
    shape = f" H={args.heads} P={args.value_dim}" if matrix else ""
    print(f"state={args.state} B={args.batch} K={args.eigenstates}{shape} "
          f"selective={args.selective} dtype={args.dtype} chunk_size={args.chunk_size}; "
          f"time = median forward+backward of {args.repeat}")

    usable = []
    for name in args.backends:
        try:
            resolve_backend(name, device)
            usable.append(name)
        except ScanBackendError as err:
            print(f"{name}: skipped ({err})")
    if args.sweep:
        return matrix_sweep(args, device) if matrix else sweep(args, device)
    if matrix and "fused" in usable:  # the fused matrix scan needs triton as the vector's
        try:
            import ten.kernels.matrix_scan_fused  # noqa: F401
        except ImportError as err:
            print(f"fused: skipped ({err})")
            usable.remove("fused")

    header = f"{'backend':8} {'T':>6} {'ms':>9} {'Mtok/s':>8} {'peak MB':>8} " \
             f"{'vs chunked':>10} {'max|c-chunked|':>15}"
    print(header)
    print("-" * len(header))
    for T in args.lengths:
        if matrix:
            inputs = make_matrix_inputs(args.batch, T, args.eigenstates, args.heads,
                                        args.value_dim, args.selective, device)
        else:
            inputs = make_inputs(args.batch, T, args.eigenstates, args.selective, device)
        rows = {}
        for name in usable:
            if name == "ref" and T > args.ref_max_T:
                print(f"{'ref':8} {T:>6} {'(skipped: T > --ref-max-T)':>40}")
                continue

            def fn(*x, name=name):
                if matrix:
                    return matrix_scan(*x, heads=args.heads, backend=name,
                                       chunk_size=args.chunk_size)
                return scan(*x, backend=name, chunk_size=args.chunk_size)

            rows[name] = time_backend(fn, inputs, args.dtype, device, args.repeat)
        base = rows.get("chunked")
        for name, r in rows.items():
            ratio = base["sec"] / r["sec"] if base else float("nan")
            diff = (r["out"] - base["out"]).abs().max().item() if base else float("nan")
            toks = args.batch * T / r["sec"] / 1e6
            print(f"{name:8} {T:>6} {1e3 * r['sec']:>9.3f} {toks:>8.2f} {r['peak_mb']:>8.1f} "
                  f"{ratio:>9.2f}x {diff:>15.2e}")
    print("vs chunked: chunked's time / this backend's (above 1 = faster than chunked)")


def sweep(args: argparse.Namespace, device: torch.device) -> None:
    """Fused launch plans, to pick the defaults in ten.kernels.scan_fused.plan by measurement."""
    if device.type != "cuda":
        print("--sweep times the compiled fused kernels: it needs --device cuda")
        return
    from ten.kernels.scan_fused import plan, scan_fused

    print(f"{'T':>6} {'block_t':>7} {'block_k':>7} {'groups':>6} {'ms':>9} {'vs default':>10}")
    for T in args.lengths:
        inputs = make_inputs(args.batch, T, args.eigenstates, args.selective, device)
        default = plan(args.batch, T, args.eigenstates, device)
        base = time_backend(scan_fused, inputs, "fp32", device, args.repeat)["sec"]
        n_tiles_of = {bt: math.ceil(T / bt) for bt in (16, 32, 64, 128)}
        print(f"{T:>6} {default.block_t:>7} {default.block_k:>7} "
              f"{math.ceil(math.ceil(T / default.block_t) / default.group_tiles):>6} "
              f"{1e3 * base:>9.3f} {'default':>10}")
        for bt, bk, groups in itertools.product((16, 32, 64, 128), (16, 32, 64), (1, 4, 16, 64)):
            if groups > n_tiles_of[bt]:
                continue
            kw = dict(block_t=bt, block_k=bk, group_tiles=math.ceil(n_tiles_of[bt] / groups))

            def fn(b, ll, s, kw=kw):
                return scan_fused(b, ll, s, **kw)

            sec = time_backend(fn, inputs, "fp32", device, args.repeat)["sec"]
            print(f"{T:>6} {bt:>7} {bk:>7} {groups:>6} {1e3 * sec:>9.3f} {base / sec:>9.2f}x")


# (value columns, warps) a program of the fused matrix scan's chunk-walking kernels (the
# forward, states and dstates passes) may take. At the job's micro-batch they run fewer
# programs than an H100 has SMs, so which is fastest is for a GPU to say (BENCHMARKS.md).
MATRIX_PLANS = ((32, 4), (32, 8), (16, 4), (16, 8), (64, 4))


@contextlib.contextmanager
def matrix_blocks(plan: tuple[int, int]):
    """ten.kernels.matrix_scan_fused's FORWARD_BLOCK and DSTATES_BLOCK set to ``plan`` for
    the time of the block (the kernels read them at each launch), then put back."""
    import ten.kernels.matrix_scan_fused as fused

    kept = fused.FORWARD_BLOCK, fused.DSTATES_BLOCK
    fused.FORWARD_BLOCK = fused.DSTATES_BLOCK = plan
    try:
        yield
    finally:
        fused.FORWARD_BLOCK, fused.DSTATES_BLOCK = kept


def time_matrix_plans(inputs: list[torch.Tensor], heads: int, dtype: str,
                      device: torch.device, repeat: int) -> dict[str, dict]:
    """The fused matrix scan's forward + backward with its blocks as they are ("default"),
    then under each other plan of MATRIX_PLANS (keyed "columns x warps"): ms, and the
    default's time over this plan's (above 1: faster than the default)."""
    import ten.kernels.matrix_scan_fused as fused

    def fn(*x):
        return matrix_scan(*x, heads=heads, backend="fused")

    defaults = {fused.FORWARD_BLOCK, fused.DSTATES_BLOCK}
    runs = {"default": contextlib.nullcontext()}
    runs.update({f"{c}x{w}": matrix_blocks((c, w)) for c, w in MATRIX_PLANS
                 if {(c, w)} != defaults})
    ms = {}
    for name, blocks in runs.items():
        with blocks:
            ms[name] = 1e3 * time_backend(fn, inputs, dtype, device, repeat)["sec"]
    return {name: {"ms": t, "vs_default": ms["default"] / t} for name, t in ms.items()}


def matrix_sweep(args: argparse.Namespace, device: torch.device) -> None:
    """The fused matrix scan's launch plans, to pick FORWARD_BLOCK and DSTATES_BLOCK in
    ten.kernels.matrix_scan_fused by measurement."""
    if device.type != "cuda":
        print("--sweep times the compiled fused kernels: it needs --device cuda")
        return
    import ten.kernels.matrix_scan_fused as fused

    print(f"default: forward and states {fused.FORWARD_BLOCK}, dstates "
          f"{fused.DSTATES_BLOCK} (value columns, warps)")
    print(f"{'T':>6} {'columns x warps':>15} {'ms':>9} {'vs default':>10}")
    for T in args.lengths:
        inputs = make_matrix_inputs(args.batch, T, args.eigenstates, args.heads,
                                    args.value_dim, args.selective, device)
        plans = time_matrix_plans(inputs, args.heads, args.dtype, device, args.repeat)
        for name, r in plans.items():
            print(f"{T:>6} {name:>15} {r['ms']:>9.3f} {r['vs_default']:>9.2f}x")


if __name__ == "__main__":
    main()
