"""The fused loss (one Triton kernel per chunk, ten.loss_fused) must equal the plain loss,
in values and gradients, as the chunked one does.

Without CUDA the kernel runs under Triton's interpreter on CPU tensors: like
tests/ten/test_scan_fused.py, this module sets ``TRITON_INTERPRET=1`` for the pytest
process when it is collected, before anything imported triton.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys

import pytest
import torch

HAVE_TRITON = importlib.util.find_spec("triton") is not None
if HAVE_TRITON and not torch.cuda.is_available() and "triton" not in sys.modules:
    os.environ["TRITON_INTERPRET"] = "1"  # process-wide, see the module docstring

pytestmark = [pytest.mark.cuda_kernels, pytest.mark.skipif(
    not HAVE_TRITON, reason="triton is not installed (pip install -e '.[test]' does, on Linux)"
)]

from ten.loss import (  # noqa: E402
    chunked_linear_cross_entropy,
    fused_linear_cross_entropy,
    reference_linear_cross_entropy,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(scope="module", autouse=True)
def kernel():
    mod = importlib.import_module("ten.loss_fused")
    if not mod.INTERPRETED and os.environ.get("TRITON_INTERPRET") == "1":
        mod = importlib.reload(mod)  # imported before the variable was set
    if not mod.INTERPRETED and DEVICE == "cpu":
        pytest.skip("triton was imported compiled before this module could interpret it: "
                    "run TRITON_INTERPRET=1 python -m pytest tests/ten/test_loss_fused.py")
    return mod


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
