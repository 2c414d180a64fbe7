"""The head's GEMMs in float8 (ten.kernels.loss_float8, a model's ``fp8_head``): the
softmax's gradient is written in e5m2 by its own pass, in both layouts, with a scale
bounded before it is computed; the loss and its gradients stay within float8's rounding
of the float64 loss; the kernel writes the torch version's bytes.

Where the kernel runs: tests/support/triton_mode.py (compiled on CUDA, interpreted on
CPU); the loss itself runs on the CPU by torch's _scaled_mm emulation."""

from __future__ import annotations

import pytest
import torch
from triton_mode import DEVICE, HAVE_TRITON, NO_TRITON, interpret_without_cuda, kernel_module

from ten.kernels.fp8 import E5M2
from ten.kernels.loss import (
    NextTokenLoss,
    chunked_linear_cross_entropy,
    linear_cross_entropy,
    reference_linear_cross_entropy,
)
from ten.kernels.loss_float8 import gradient_scale, rows_float8_reference

interpret_without_cuda()
SEED = 0
E5M2_MAX = torch.finfo(E5M2).max


def problem(n, d, v, ignore=0, seed=SEED):
    print(f"seed {seed}")
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g).requires_grad_()
    w = (0.3 * torch.randn(v, d, generator=g)).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[:ignore] = -100
    return h, w, t


def loss_and_grads(fn, h, w, t):
    loss = fn(h, w, t)
    return (loss.detach(), *torch.autograd.grad(loss * 3.0, (h, w)))


def relative(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def rows_inputs(R, V, dtype, seed=SEED):
    g = torch.Generator().manual_seed(seed)
    logits = (3 * torch.randn(R, V, generator=g)).to(dtype)
    targets = torch.randint(0, V, (R,), generator=g)
    scale = torch.full((R,), 1.0 / R)
    scale[1] = 0.0  # an ignored row
    return logits, targets, scale, gradient_scale(scale)


# rows that are and are not a multiple of 16 (zero columns in the transpose); V inside one
# block and across several with a ragged last one; bf16 and fp32 logits
@pytest.mark.cuda_kernels
@pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)
@pytest.mark.parametrize("R, V", [(5, 16), (37, 300), (64, 1000)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_kernel_writes_the_torch_versions_bytes_in_both_layouts(R, V, dtype):
    kernel = kernel_module("ten.kernels.loss_fused")
    logits, targets, scale, g_scale = rows_inputs(R, V, dtype)
    loss, g, g_t = kernel.cross_entropy_rows_float8(logits.to(DEVICE), targets.to(DEVICE),
                                                    scale.to(DEVICE), g_scale.to(DEVICE), 16)
    ref_loss, ref_g, ref_g_t = rows_float8_reference(logits, targets, scale, g_scale, 16)
    Rp = R + (-R % 16)
    assert g.dtype == g_t.dtype == E5M2 and g.shape == (R, V) and g_t.shape == (V, Rp)
    torch.testing.assert_close(loss.cpu(), ref_loss, rtol=1e-6, atol=1e-5)
    assert torch.equal(g.cpu().view(torch.uint8), ref_g.view(torch.uint8))
    assert torch.equal(g_t.cpu().view(torch.uint8), ref_g_t.view(torch.uint8))
    assert torch.equal(g_t[:, :R].t().cpu().view(torch.uint8), g.cpu().view(torch.uint8))
    assert not g_t[:, R:].float().any()  # the rows d W's sum pads with are zeros
    assert not g[1].float().any()  # an ignored row's weight is 0


def test_the_gradients_scale_is_its_bound_and_the_bound_is_met():
    """|softmax - onehot| <= 1, so |g| <= the largest row weight: a row sure of the wrong
    token meets it, and its gradient lands on e5m2's largest value, none beyond."""
    R, V = 4, 64
    logits = torch.zeros(R, V)
    logits[0, 5] = 40.0  # row 0: all its mass on token 5; its target is 7
    targets = torch.tensor([7, 1, 2, 3])
    scale = torch.full((R,), 1.0 / R)
    _, g, _ = rows_float8_reference(logits, targets, scale, gradient_scale(scale), 16)
    assert g[0].float().abs().max().item() == E5M2_MAX  # |g| reaches the bound
    assert g[0, 5].float().item() == E5M2_MAX and g[0, 7].float().item() == -E5M2_MAX
    ignored = torch.zeros(R)  # every row ignored: a zero bound, floored, zero gradients
    _, g0, g0_t = rows_float8_reference(logits, targets, ignored, gradient_scale(ignored), 16)
    assert not g0.float().isnan().any() and not g0.float().any() and not g0_t.float().any()


@pytest.mark.parametrize("rows", [16, 24, None])
@pytest.mark.parametrize("ignore", [0, 5])
def test_the_float8_head_stays_within_float8s_rounding_of_the_exact_loss(rows, ignore):
    h, w, t = problem(70, 64, 256, ignore)
    want = loss_and_grads(reference_linear_cross_entropy,
                          h.detach().double().requires_grad_(),
                          w.detach().double().requires_grad_(), t)
    got = loss_and_grads(lambda *a: chunked_linear_cross_entropy(*a, chunk_rows=rows, fp8=True),
                         h, w, t)
    bf16 = loss_and_grads(lambda *a: chunked_linear_cross_entropy(*a, chunk_rows=rows), h, w, t)
    assert relative(got[0], want[0]) < 5e-3  # seen: 1.4e-3 to 1.8e-3
    for mine, exact, plain in zip(got[1:], want[1:], bf16[1:], strict=True):
        assert relative(plain, exact) < 1e-5  # the same chunks without float8: fp32's
        assert 1e-3 < relative(mine, exact) < 0.06  # float8's, not fp32's (seen: 0.041-0.042)


def test_a_float8_head_without_gradients_gives_the_same_loss():
    h, w, t = problem(40, 64, 128)
    with torch.no_grad():
        evaluated = chunked_linear_cross_entropy(h, w, t, chunk_rows=16, fp8=True)
    trained = chunked_linear_cross_entropy(h, w, t, chunk_rows=16, fp8=True)
    torch.testing.assert_close(evaluated, trained.detach(), rtol=1e-6, atol=1e-6)


def test_backends_that_run_the_head_in_bf16_refuse_fp8_naming_the_fix():
    from ten.model.config import TENConfig
    from ten.model.presets import build_model

    h, w, t = problem(8, 16, 32)
    with pytest.raises(ValueError, match="loss 'reference' runs the head in the autocast "
                                         "dtype; the model's fp8_head needs loss chunked"):
        linear_cross_entropy(h, w, t, backend="reference", fp8=True)
    model = build_model(TENConfig(vocab_size=64, d_model=32, n_layers=1, n_eigenstates=8,
                                  n_heads=2, fp8="tensor", fp8_head=True), "cpu")
    with pytest.raises(ValueError, match="loss 'liger' runs the head in the autocast dtype"):
        NextTokenLoss(model, "liger")
    assert NextTokenLoss(model, "chunked").fp8_head
