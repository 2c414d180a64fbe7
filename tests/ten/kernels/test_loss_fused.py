"""The fused loss (one Triton kernel per chunk, ten.kernels.loss_fused) must equal the plain loss,
in values and gradients, as the chunked one does.

Where it runs: tests/support/triton_mode.py (compiled on CUDA, interpreted on CPU).
"""

from __future__ import annotations

import pytest
import torch
from triton_mode import DEVICE, HAVE_TRITON, NO_TRITON, interpret_without_cuda, kernel_module

from ten.kernels.loss import (
    chunked_linear_cross_entropy,
    fused_linear_cross_entropy,
    reference_linear_cross_entropy,
)

interpret_without_cuda()
pytestmark = [pytest.mark.cuda_kernels, pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)]


@pytest.fixture(scope="module", autouse=True)
def kernel():
    return kernel_module("ten.kernels.loss_fused")


def problem(n, d, v, ignore=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).to(DEVICE).requires_grad_()
    w = (0.3 * torch.randn(v, d, generator=g)).to(DEVICE).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g).to(DEVICE)
    t[:ignore] = -100
    return h, w, t


def loss_and_grads(fn, h, w, t):
    loss = fn(h, w, t)
    return (loss.detach(), *torch.autograd.grad(loss * 3.0, (h, w)))


# V below one block, V spanning blocks with a ragged last one; chunks that do not divide N
@pytest.mark.parametrize("v", [97, 2500])
@pytest.mark.parametrize("rows", [4, 13, None])
@pytest.mark.parametrize("ignore", [0, 3])
def test_fused_equals_the_plain_loss_and_gradients_in_fp32(v, rows, ignore):
    h, w, t = problem(n=13, d=8, v=v, ignore=ignore)
    ref = loss_and_grads(reference_linear_cross_entropy, h, w, t)
    got = loss_and_grads(lambda *a: fused_linear_cross_entropy(*a, chunk_rows=rows), h, w, t)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=2e-5, atol=2e-6)
    if ignore:  # ignored rows get no gradient and do not count in the mean
        assert torch.all(got[1][:ignore] == 0)


def test_bf16_autocast_matches_the_chunked_loss():
    h, w, t = problem(n=24, d=16, v=1500, ignore=2)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        ref = loss_and_grads(chunked_linear_cross_entropy, h, w, t)
        got = loss_and_grads(fused_linear_cross_entropy, h, w, t)
    # the same bf16 logits; the gradient is rounded to bf16 before its matmuls in both
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    for r, g in zip(ref[1:], got[1:], strict=True):
        torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-3)


def test_without_grad_the_logits_are_left_alone():
    h, w, t = problem(n=9, d=8, v=300)
    with torch.no_grad():
        got = fused_linear_cross_entropy(h, w, t, chunk_rows=4)
        ref = reference_linear_cross_entropy(h, w, t)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_a_large_logit_does_not_overflow():
    h, w, t = problem(n=4, d=4, v=200)
    with torch.no_grad():
        w[7] *= 400.0  # logits in the hundreds: exp() of them would overflow fp32
    ref = loss_and_grads(reference_linear_cross_entropy, h, w, t)
    got = loss_and_grads(fused_linear_cross_entropy, h, w, t)
    assert all(torch.isfinite(x).all() for x in got)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-4, atol=1e-4)
