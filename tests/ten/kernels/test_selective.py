"""ten.kernels.selective: selective mode's eigenvalues and drive as one operator equal the plain
formula (EigenstateMixer.eigenvalues), in values and gradients, and its Triton kernels
(ten.kernels.selective_kernels) equal the operator.

Where they run: tests/support/triton_mode.py (compiled on CUDA, interpreted on CPU).
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_mode import DEVICE, HAVE_TRITON, NO_TRITON, cpu, interpret_without_cuda, kernel_module

from ten.kernels.selective import DELTA_BIAS, selective_drive
from ten.model.presets import ten_config
from ten.model.ten import EigenstateMixer

interpret_without_cuda()
pytestmark = pytest.mark.cuda_kernels


def inputs(shape=(2, 5), K=6, dtype=torch.float64, seed=0, z_shift=0.0):
    """(pz, b_Δ, ν, θ): pz = [p | z - b_Δ] with z spread around the step's start."""
    g = torch.Generator().manual_seed(seed)
    bias = DELTA_BIAS + z_shift + torch.randn(K, generator=g, dtype=dtype)
    z = torch.randn(*shape, K, generator=g, dtype=dtype) * 3
    p = torch.randn(*shape, 2 * K, generator=g, dtype=dtype)
    mag = 0.9 + 0.099 * torch.rand(K, generator=g, dtype=dtype)
    nu = torch.log(-torch.log(mag))
    theta = math.pi / 10 * torch.rand(K, generator=g, dtype=dtype)
    return [t.to(DEVICE).requires_grad_() for t in (torch.cat([p, z], -1), bias, nu, theta)]


class _Eigenvalues(torch.nn.Module):
    """EigenstateMixer.eigenvalues as a module's forward, for torch.func.functional_call."""

    def __init__(self, mixer):
        super().__init__()
        self.mixer = mixer

    def forward(self, xn):
        return self.mixer.eigenvalues(xn)


def plain(pz, bias, nu, theta):
    """The formula as EigenstateMixer.eigenvalues writes it, in autograd's hands: the
    mixer's ν, θ and step bias replaced by these, its step weight by the identity (so the
    step's pre-activation is pz's z part plus the bias)."""
    K = bias.shape[0]
    cfg = ten_config("tiny", d_model=K, n_eigenstates=K, n_heads=1, selective=True)
    mixer = EigenstateMixer(cfg).to(device=pz.device, dtype=pz.dtype)
    params = {"mixer.nu": nu, "mixer.theta": theta,
              "mixer.delta.weight": torch.eye(K).to(pz), "mixer.delta.bias": bias}
    log_lam, gamma = torch.func.functional_call(_Eigenvalues(mixer), params,
                                                (pz[..., 2 * K:],))
    return log_lam, pz[..., :2 * K] * gamma


# z_shift -60: steps so small that 1 - |λ|² sits on its floor (no gradient through γ)
@pytest.mark.parametrize("z_shift", [0.0, 6.0, -60.0])
def test_the_operator_is_the_formula_with_its_gradients(z_shift):
    pz, bias, nu, theta = inputs(z_shift=z_shift)
    g = torch.Generator().manual_seed(1)
    d_ll, d_beta = (torch.randn(*pz.shape[:-1], 2 * bias.shape[0], generator=g,
                                dtype=pz.dtype).to(DEVICE) for _ in range(2))
    want = plain(pz, bias, nu, theta)
    got = selective_drive(pz, bias, nu, theta)
    for w, o in zip(want, got, strict=True):
        torch.testing.assert_close(o, w, rtol=1e-12, atol=1e-12)
    grads_want = torch.autograd.grad(want, (pz, bias, nu, theta), (d_ll, d_beta))
    grads_got = torch.autograd.grad(got, (pz, bias, nu, theta), (d_ll, d_beta))
    for w, o in zip(grads_want, grads_got, strict=True):
        torch.testing.assert_close(o, w, rtol=1e-10, atol=1e-12)


def test_gradcheck_in_fp64():
    assert torch.autograd.gradcheck(selective_drive, tuple(inputs(shape=(1, 3), K=3)))


def test_the_drive_names_the_shapes_it_takes():
    pz, bias, nu, theta = (t.detach() for t in inputs(K=4))
    with pytest.raises(ValueError, match=r"pz \(\.\.\., 3K\).*got pz \(2, 5, 12\), b_Δ \(3,\)"):
        selective_drive(pz, bias[:3], nu, theta)


@pytest.mark.parametrize("T", [3, 5], ids=["few-tokens", "stacked-weights"])
def test_one_projection_is_the_two_linears_it_replaces(T):
    """The mixer's drive: [W_in; W_Δ]·u as one matmul (or, for fewer tokens than d, the
    two projections stacked), then the operator, equals the formula on the two linears'
    outputs (W_in·u, W_Δ·u + b_Δ), with u's gradient."""
    cfg = ten_config("tiny", d_model=8, n_eigenstates=4, n_heads=1, selective=True)
    mixer = EigenstateMixer(cfg).double()
    u = torch.randn(2, T, 8, dtype=torch.float64, requires_grad=True)
    assert mixer.many_tokens(u) == (2 * T >= 8)
    got = mixer.drive(u)
    log_lam, gamma = mixer.eigenvalues(u)
    want = (log_lam, mixer.in_proj(u) * gamma)
    for w, o in zip(want, got, strict=True):
        torch.testing.assert_close(o, w, rtol=1e-12, atol=1e-12)
    dy = [torch.randn_like(t) for t in want]
    torch.testing.assert_close(torch.autograd.grad(got, u, dy)[0],
                               torch.autograd.grad(want, u, dy)[0], rtol=1e-10, atol=1e-12)


def test_under_autocast_the_outputs_are_fp32_and_the_gradients_bf16():
    pz, bias, nu, theta = (t.detach() for t in inputs(dtype=torch.float32))
    pzb = pz.bfloat16().requires_grad_()
    log_lam, beta = selective_drive(pzb, bias, nu, theta)
    assert log_lam.dtype == beta.dtype == torch.float32  # the scan runs in fp32
    (log_lam.sum() + beta.sum()).backward()
    assert pzb.grad.dtype == torch.bfloat16


@pytest.fixture(scope="module")
def kernels():
    if not HAVE_TRITON:
        pytest.skip(NO_TRITON)
    return kernel_module("ten.kernels.selective_kernels")


def incoming(pz, bias, seed=2):
    """Gradients arriving at (log λ, β)."""
    g = torch.Generator().manual_seed(seed)
    shape = (*pz.shape[:-1], 2 * bias.shape[0])
    return [torch.randn(shape, generator=g, dtype=pz.dtype).to(DEVICE) for _ in range(2)]


# K not a power of two; rows not a multiple of a program's; tiny and large steps
@pytest.mark.parametrize("shape, K", [((1, 1), 4), ((3, 7), 6), ((2, 17), 32)])
@pytest.mark.parametrize("z_shift", [0.0, 8.0, -60.0])
def test_the_kernels_equal_the_operator(kernels, shape, K, z_shift):
    pz, bias, nu, theta = (t.detach().float() for t in inputs(shape, K, z_shift=z_shift))
    d_ll, d_beta = incoming(pz, bias)
    # the operator's torch implementation, on the CPU (on CUDA the operator is the kernel)
    ref = torch.ops.ten.selective_drive.default(*cpu(pz, bias, nu, theta))
    got = kernels.drive(pz, bias, nu, theta)
    for r, o in zip(ref, got, strict=True):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-5, atol=1e-6)
    ref_b = torch.ops.ten.selective_drive_backward.default(*cpu(d_ll, d_beta, pz, bias, nu,
                                                                theta))
    got_b = kernels.drive_backward(d_ll, d_beta, pz, bias, nu, theta)
    for r, o in zip(ref_b, got_b, strict=True):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-4, atol=1e-5)


def test_the_kernels_keep_bf16_inputs_bf16_gradients(kernels):
    pz, bias, nu, theta = (t.detach().float() for t in inputs((2, 3), 8))
    pzb = pz.bfloat16()
    log_lam, beta = kernels.drive(pzb, bias, nu, theta)
    assert log_lam.dtype == beta.dtype == torch.float32
    ref = torch.ops.ten.selective_drive.default(*cpu(pzb, bias, nu, theta))
    torch.testing.assert_close(beta.cpu(), ref[1], rtol=1e-5, atol=1e-6)
    d_pz, d_bias, _, _ = kernels.drive_backward(log_lam, beta, pzb, bias, nu, theta)
    assert (d_pz.dtype, d_bias.dtype) == (torch.bfloat16, torch.float32)


def test_in_fp64_the_kernels_compute_in_fp64(kernels):
    """A float64 model and the gradient checks run the kernels in fp64 on a GPU: they
    must not round through fp32 (the first H200 run failed the checks above on that)."""
    pz, bias, nu, theta = (t.detach() for t in inputs((3, 7), 6))
    d_ll, d_beta = incoming(pz, bias)
    ref = torch.ops.ten.selective_drive.default(*cpu(pz, bias, nu, theta))
    got = kernels.drive(pz, bias, nu, theta)
    ref_b = torch.ops.ten.selective_drive_backward.default(*cpu(d_ll, d_beta, pz, bias, nu,
                                                                theta))
    got_b = kernels.drive_backward(d_ll, d_beta, pz, bias, nu, theta)
    for r, o in zip((*ref, *ref_b), (*got, *got_b), strict=True):
        assert o.dtype == torch.float64
        torch.testing.assert_close(o.cpu(), r, rtol=1e-12, atol=1e-12)
