"""benchmarks/bench_matrix_scratch.py runs the matrix scan's fused backward kernel by kernel
to round its scratch states: with them as written it must give the scan's own gradients,
or its bf16 figures would measure some other backward."""

import sys
from pathlib import Path

import pytest
import torch
from triton_mode import HAVE_TRITON, NO_TRITON, interpret_without_cuda, kernel_module

interpret_without_cuda()
pytestmark = [pytest.mark.cuda_kernels, pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))


@pytest.fixture(scope="module")
def bench():
    import bench_matrix_scratch

    bench_matrix_scratch.fused = kernel_module("ten.kernels.matrix_scan_fused")
    return bench_matrix_scratch


def test_the_benchmarks_backward_is_the_scans_and_bf16_scratch_moves_it(bench):
    from ten.kernels.matrix_scan import matrix_scan

    seed = 3
    print(f"seed {seed}")
    heads, T, P = 2, 37, 5
    inputs = bench.make_inputs(T, heads, 4, P, seed)
    dy = torch.randn(1, T, heads * P, generator=torch.Generator().manual_seed(seed),
                     dtype=torch.float64)
    leaves = [x.float().to(bench.DEVICE).requires_grad_() for x in inputs]
    y, _ = matrix_scan(*leaves, None, heads=heads, backend="fused")
    scans = torch.autograd.grad((y * dy.float().to(y.device)).sum(), leaves)

    as_written = bench.fused_grads(inputs, dy, heads, torch.float32)
    for name, got, want in zip(bench.NAMES, as_written, scans, strict=True):
        assert torch.equal(got, want.double().cpu()), name
    exact = bench.exact_grads(inputs, dy, heads)
    rounded = bench.fused_grads(inputs, dy, heads, torch.bfloat16)
    for name, a, r, e in zip(bench.NAMES, as_written, rounded, exact, strict=True):
        assert bench.relative(a, e) < 1e-5 < bench.relative(r, e) < 3e-2, name
