"""Selective mode's eigenvalues and drive as one torch operator (a Triton kernel on CUDA).

Per token and eigenstate (``ten.model.ten``'s docstring has the model):

    [p | z - b_Δ] = [W_in; W_Δ]·u        one matmul for both of u's projections
    Δ = softplus(z) / STEP_UNIT          z = W_Δ·u + b_Δ, the step's pre-activation
    a = exp(ν) · Δ                       -log|λ| over this step
    log λ = [-a | θ·Δ]                   what the scan reads, [re | im]
    γ = sqrt(max(1 - exp(-2a), MIN_WRITE))
    β = p ⊙ [γ | γ]                      p = W_in·u, the drive before its scale

In torch ops that is a dozen element-wise passes over (B, T, K) and (B, T, 2K) tensors in
fp32 each way, 19 GB of the flagship's micro-batch (benchmarks/bench_traffic.py); as one
operator it reads the projection pz = [p | z - b_Δ] once and writes log λ and β once (the
backward reads them and the two incoming gradients and writes d pz, and b_Δ's, ν's and
θ's gradients summed per program). One projection for p and z, not two linears reading
u, leaves autograd one gradient for u, not two to add (a (B, T, d) sum per layer).

The operator's torch implementation (every device) is the plain formula above, with its
backward written out and checked against autograd in float64; CUDA runs
``ten.kernels.selective_kernels``.
"""

from __future__ import annotations

import importlib.util

import torch
import torch.nn.functional as F
from torch import Tensor

from ten.kernels.ops import define, register_cuda
from ten.kernels.selective_constants import DELTA_BIAS, MIN_WRITE, STEP_UNIT

__all__ = ["DELTA_BIAS", "MIN_WRITE", "STEP_UNIT", "selective_drive", "step_of"]

def step_of(z: Tensor) -> Tensor:
    """Δ from its pre-activation: at least fp32 (bf16 under autocast), float64 stays."""
    return F.softplus(z.float() if z.element_size() < 4 else z) / STEP_UNIT


def _forward_parts(z: Tensor, p: Tensor, nu: Tensor, theta: Tensor):
    step = step_of(z)  # (B, T, K)
    rate = torch.exp(nu)  # -log|λ| per unit step
    write = (-torch.expm1(-2.0 * rate * step)).clamp_min(MIN_WRITE)
    gamma = torch.sqrt(write)
    return step, rate, write, gamma


def _split(pz: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """(z, p) from the projection pz = [p | z - b_Δ] (B, T, 3K) and b_Δ (K,): the step's
    pre-activation (at least fp32 once the bias is added) and the drive before its scale."""
    K = bias.shape[0]
    z = pz[..., 2 * K:] + bias
    return z if z.element_size() >= 4 else z.float(), pz[..., :2 * K]


def _drive_impl(pz: Tensor, bias: Tensor, nu: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
    """(log λ (B, T, 2K), β (B, T, 2K)) from pz = [p | z - b_Δ] (B, T, 3K) and b_Δ."""
    z, p = _split(pz, bias)
    step, rate, _, gamma = _forward_parts(z, p, nu, theta)
    log_lam = torch.cat([-rate * step, theta * step], dim=-1)
    return log_lam, p * torch.cat([gamma, gamma], dim=-1)


def _out_dtype(pz: Tensor, nu: Tensor) -> torch.dtype:
    return torch.promote_types(torch.promote_types(pz.dtype, torch.float32), nu.dtype)


def _drive_fake(pz, bias, nu, theta):
    shape = (*pz.shape[:-1], 2 * bias.shape[0])
    return (pz.new_empty(shape, dtype=_out_dtype(pz, nu)),
            pz.new_empty(shape, dtype=_out_dtype(pz, nu)))


def _drive_backward_impl(d_log_lam: Tensor, d_beta: Tensor, pz: Tensor, bias: Tensor,
                         nu: Tensor, theta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(d pz, d b_Δ, dν, dθ): the chain rule of the formula above, written out."""
    z, p = _split(pz, bias)
    step, rate, write, gamma = _forward_parts(z, p, nu, theta)
    K = bias.shape[0]
    d_re, d_im = d_log_lam[..., :K], d_log_lam[..., K:]
    p_re, p_im = p[..., :K].to(gamma.dtype), p[..., K:].to(gamma.dtype)
    d_gamma = d_beta[..., :K] * p_re + d_beta[..., K:] * p_im
    # γ = sqrt(1 - exp(-2a)): dγ/da = exp(-2a)/γ, zero where the floor holds
    dg_da = torch.where(write > MIN_WRITE, (1.0 - write) / gamma, torch.zeros_like(gamma))
    d_a = -d_re + d_gamma * dg_da  # a = rate · Δ
    d_step = rate * d_a + theta * d_im
    dz = d_step * torch.sigmoid(z) / STEP_UNIT  # softplus' = sigmoid
    dp = d_beta * torch.cat([gamma, gamma], dim=-1)
    reduce = tuple(range(pz.dim() - 1))
    d_nu = (d_a * step).sum(reduce) * rate  # d/d ν = rate · d/d rate
    d_theta = (d_im * step).sum(reduce)
    return (torch.cat([dp, dz], dim=-1).to(pz.dtype), dz.sum(reduce).to(bias.dtype),
            d_nu.to(nu.dtype), d_theta.to(theta.dtype))


def _drive_backward_fake(d_log_lam, d_beta, pz, bias, nu, theta):
    return (torch.empty_like(pz), torch.empty_like(bias), torch.empty_like(nu),
            torch.empty_like(theta))


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _backward(ctx, d_log_lam, d_beta):
    pz, bias, nu, theta = ctx.saved_tensors
    if d_log_lam is None:
        d_log_lam = torch.zeros_like(d_beta)
    if d_beta is None:
        d_beta = torch.zeros_like(d_log_lam)
    return _drive_backward(d_log_lam.contiguous(), d_beta.contiguous(), pz, bias, nu, theta)


_drive_backward = define(
    "selective_drive_backward(Tensor d_log_lam, Tensor d_beta, Tensor pz, Tensor bias, "
    "Tensor nu, Tensor theta) -> (Tensor, Tensor, Tensor, Tensor)", _drive_backward_impl,
    _drive_backward_fake)
_drive = define("selective_drive(Tensor pz, Tensor bias, Tensor nu, Tensor theta) "
                "-> (Tensor, Tensor)", _drive_impl, _drive_fake, backward=_backward,
                setup_context=_setup)


def selective_drive(pz: Tensor, bias: Tensor, nu: Tensor,
                    theta: Tensor) -> tuple[Tensor, Tensor]:
    """(log λ, β) of selective mode, both (B, T, 2K), from the projection pz = [p | z - b_Δ]
    (B, T, 3K) of the unscaled drive p and the step's pre-activation z less its bias, the
    bias b_Δ and the eigenvalue parameters ν, θ (K,)."""
    K = bias.shape[0]
    if pz.shape[-1] != 3 * K or nu.shape != (K,) or theta.shape != (K,):
        raise ValueError(f"selective_drive takes pz (..., 3K) and b_Δ, ν, θ (K,): got pz "
                         f"{tuple(pz.shape)}, b_Δ {tuple(bias.shape)}, ν {tuple(nu.shape)}, "
                         f"θ {tuple(theta.shape)}")
    return _drive(pz.contiguous(), bias, nu, theta)


# CUDA runs the Triton kernels (ten.kernels.selective_kernels). Registered only where CUDA is: a
# CPU process never imports triton here (the tests choose when, and in which mode).
if torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    from ten.kernels import selective_kernels as _k

    register_cuda("selective_drive", _k.drive)
    register_cuda("selective_drive_backward", _k.drive_backward)
