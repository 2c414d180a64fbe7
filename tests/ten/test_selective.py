"""ten.selective: selective mode's eigenvalues and drive as one operator equal the plain
formula (EigenstateMixer.eigenvalues), in values and gradients, and its Triton kernels
(ten.selective_kernels) equal the operator.

Where they run: tests/support/triton_mode.py (compiled on CUDA, interpreted on CPU).
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_mode import DEVICE, HAVE_TRITON, NO_TRITON, cpu, interpret_without_cuda, kernel_module

from ten.model import EigenstateMixer
from ten.presets import ten_config
from ten.selective import DELTA_BIAS, selective_drive

interpret_without_cuda()
pytestmark = pytest.mark.cuda_kernels


def inputs(shape=(2, 5), K=6, dtype=torch.float64, seed=0, z_shift=0.0):
    g = torch.Generator().manual_seed(seed)
    z = (torch.randn(*shape, K, generator=g, dtype=dtype) * 3 + DELTA_BIAS + z_shift)
    p = torch.randn(*shape, 2 * K, generator=g, dtype=dtype)
    mag = 0.9 + 0.099 * torch.rand(K, generator=g, dtype=dtype)
    nu = torch.log(-torch.log(mag))
    theta = math.pi / 10 * torch.rand(K, generator=g, dtype=dtype)
    return [t.to(DEVICE).requires_grad_() for t in (z, p, nu, theta)]


class _Eigenvalues(torch.nn.Module):
    """EigenstateMixer.eigenvalues as a module's forward, for torch.func.functional_call."""

    def __init__(self, mixer):
        super().__init__()
        self.mixer = mixer

    def forward(self, xn):
        return self.mixer.eigenvalues(xn)


def plain(z, p, nu, theta):
    """The formula as EigenstateMixer.eigenvalues writes it, in autograd's hands: the
    mixer's ν and θ replaced by these, its step linear by the identity (so the step's
    pre-activation is z)."""
    K = z.shape[-1]
    cfg = ten_config("tiny", d_model=K, n_eigenstates=K, n_heads=1, selective=True)
    mixer = EigenstateMixer(cfg).to(device=z.device, dtype=z.dtype)
    params = {"mixer.nu": nu, "mixer.theta": theta,
              "mixer.delta.weight": torch.eye(K).to(z), "mixer.delta.bias": torch.zeros(K).to(z)}
    log_lam, gamma = torch.func.functional_call(_Eigenvalues(mixer), params, (z,))
    return log_lam, p * gamma


# z_shift -60: steps so small that 1 - |λ|² sits on its floor (no gradient through γ)
@pytest.mark.parametrize("z_shift", [0.0, 6.0, -60.0])
def test_the_operator_is_the_formula_with_its_gradients(z_shift):
    z, p, nu, theta = inputs(z_shift=z_shift)
    g = torch.Generator().manual_seed(1)
    d_ll, d_beta = (torch.randn(p.shape, generator=g, dtype=p.dtype).to(DEVICE)
                    for _ in range(2))
    want = plain(z, p, nu, theta)
    got = selective_drive(z, p, nu, theta)
    for w, o in zip(want, got, strict=True):
        torch.testing.assert_close(o, w, rtol=1e-12, atol=1e-12)
    grads_want = torch.autograd.grad(want, (z, p, nu, theta), (d_ll, d_beta))
    grads_got = torch.autograd.grad(got, (z, p, nu, theta), (d_ll, d_beta))
    for w, o in zip(grads_want, grads_got, strict=True):
        torch.testing.assert_close(o, w, rtol=1e-10, atol=1e-12)


def test_gradcheck_in_fp64():
    assert torch.autograd.gradcheck(selective_drive, tuple(inputs(shape=(1, 3), K=3)))


def test_under_autocast_the_outputs_are_fp32_and_the_gradients_bf16():
    z, p, nu, theta = (t.detach() for t in inputs(dtype=torch.float32))
    zb, pb = z.bfloat16().requires_grad_(), p.bfloat16().requires_grad_()
    log_lam, beta = selective_drive(zb, pb, nu, theta)
    assert log_lam.dtype == beta.dtype == torch.float32  # the scan runs in fp32
    (log_lam.sum() + beta.sum()).backward()
    assert zb.grad.dtype == pb.grad.dtype == torch.bfloat16


@pytest.fixture(scope="module")
def kernels():
    if not HAVE_TRITON:
        pytest.skip(NO_TRITON)
    return kernel_module("ten.selective_kernels")


# K not a power of two; rows not a multiple of a program's; tiny and large steps
@pytest.mark.parametrize("shape, K", [((1, 1), 4), ((3, 7), 6), ((2, 17), 32)])
@pytest.mark.parametrize("z_shift", [0.0, 8.0, -60.0])
def test_the_kernels_equal_the_operator(kernels, shape, K, z_shift):
    z, p, nu, theta = (t.detach().float() for t in inputs(shape, K, z_shift=z_shift))
    g = torch.Generator().manual_seed(2)
    d_ll, d_beta = (torch.randn(p.shape, generator=g).to(DEVICE) for _ in range(2))
    # the operator's torch implementation, on the CPU (on CUDA the operator is the kernel)
    ref = torch.ops.ten.selective_drive.default(*cpu(z, p, nu, theta))
    got = kernels.drive(z, p, nu, theta)
    for r, o in zip(ref, got, strict=True):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-5, atol=1e-6)
    ref_b = torch.ops.ten.selective_drive_backward.default(*cpu(d_ll, d_beta, z, p, nu, theta))
    got_b = kernels.drive_backward(d_ll, d_beta, z, p, nu, theta)
    for r, o in zip(ref_b, got_b, strict=True):
        torch.testing.assert_close(o.cpu(), r, rtol=1e-4, atol=1e-5)


def test_the_kernels_keep_bf16_inputs_bf16_gradients(kernels):
    z, p, nu, theta = (t.detach().float() for t in inputs((2, 3), 8))
    zb, pb = z.bfloat16(), p.bfloat16()
    log_lam, beta = kernels.drive(zb, pb, nu, theta)
    assert log_lam.dtype == beta.dtype == torch.float32
    ref = torch.ops.ten.selective_drive.default(*cpu(zb, pb, nu, theta))
    torch.testing.assert_close(beta.cpu(), ref[1], rtol=1e-5, atol=1e-6)
    dz, dp, _, _ = kernels.drive_backward(log_lam, beta, zb, pb, nu, theta)
    assert dz.dtype == dp.dtype == torch.bfloat16


def test_in_fp64_the_kernels_compute_in_fp64(kernels):
    """A float64 model and the gradient checks run the kernels in fp64 on a GPU: they
    must not round through fp32 (the first H200 run failed the checks above on that)."""
    z, p, nu, theta = (t.detach() for t in inputs((3, 7), 6))
    g = torch.Generator().manual_seed(2)
    d_ll, d_beta = (torch.randn(p.shape, generator=g, dtype=p.dtype).to(DEVICE)
                    for _ in range(2))
    ref = torch.ops.ten.selective_drive.default(*cpu(z, p, nu, theta))
    got = kernels.drive(z, p, nu, theta)
    ref_b = torch.ops.ten.selective_drive_backward.default(*cpu(d_ll, d_beta, z, p, nu, theta))
    got_b = kernels.drive_backward(d_ll, d_beta, z, p, nu, theta)
    for r, o in zip((*ref, *ref_b), (*got, *got_b), strict=True):
        assert o.dtype == torch.float64
        torch.testing.assert_close(o.cpu(), r, rtol=1e-12, atol=1e-12)
