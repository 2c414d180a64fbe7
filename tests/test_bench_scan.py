"""benchmarks/bench_scan.py's sweep of the fused matrix scan's blocks (value columns x
warps a program; the GPU suite's matrix section runs it to choose them): whichever plan
a GPU finds fastest must give the reference's outputs and gradients, and the sweep must
leave the kernels' blocks as it found them."""

import sys
from pathlib import Path

import pytest
import torch
from matrix_grads import outputs_and_grads, relative_error
from triton_mode import HAVE_TRITON, NO_TRITON, interpret_without_cuda, kernel_module

interpret_without_cuda()
pytestmark = [pytest.mark.cuda_kernels, pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)]

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

SEED = 11


@pytest.fixture(scope="module")
def fused():
    return kernel_module("ten.kernels.matrix_scan_fused")


def _plans():
    import bench_scan

    return bench_scan.MATRIX_PLANS


@pytest.mark.parametrize("plan", _plans(), ids=lambda p: f"{p[0]}x{p[1]}")
def test_every_swept_plan_gives_the_references_outputs_and_gradients(fused, plan):
    from bench_scan import make_matrix_inputs, matrix_blocks

    print(f"inputs: make_matrix_inputs' seed 0; the loss's weights: seed {SEED + 1}")
    device = torch.device("cpu" if fused.INTERPRETED else "cuda")
    # 70 values a head: several blocks of 16 and 32 columns, one masked block of 64
    inputs = [t.double() if not t.is_complex() else t.to(torch.complex128)
              for t in make_matrix_inputs(1, 21, 8, 2, 70, True, device)]
    *tensors, state = [t.requires_grad_() for t in inputs]
    want = outputs_and_grads(tensors, state, 2, "ref", SEED + 1)
    kept = fused.FORWARD_BLOCK, fused.DSTATES_BLOCK
    with matrix_blocks(plan):
        assert (fused.FORWARD_BLOCK, fused.DSTATES_BLOCK) == (plan, plan)
        got = outputs_and_grads(tensors, state, 2, "fused", SEED + 1)
    assert (fused.FORWARD_BLOCK, fused.DSTATES_BLOCK) == kept  # put back
    names = ["y", "last state", "dk", "dv", "dq", "d log λ", "d state"]
    for name, a, b in zip(names, want, got, strict=True):
        err = relative_error(a, b)
        assert err < 1e-10, f"{name} under {plan}: {err:.2e}"
