"""Triton kernels for ``ten.kernels.selective``'s operator (registered there for CUDA): selective
mode's eigenvalues and drive, forward and backward, with the operator's signatures.

A program owns BR rows (tokens) and every eigenstate lane (BK ≥ K), so b_Δ, ν and θ are
read once per program and the backward's b_Δ, ν and θ gradients are summed in registers
over its rows, written per program, and summed by torch. A row of the projection pz is
[p_re | p_im | z - b_Δ] (3K); of log λ, β and their gradients [re | im] (2K).

Arithmetic in ``ACC`` (fp32; fp64 for fp64 tensors, so a float64 model and the gradient
checks stay exact); 1 - exp(-x) and log(1 + y) are computed in forms that do not cancel
(the step starts at 1 and |λ| near 0.999, where 2a ~ 0.002).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ten.kernels.block_kernels import acc, compute_dtype
from ten.kernels.selective_constants import MIN_WRITE, STEP_UNIT

__all__ = ["drive", "drive_backward"]

ROWS = 4  # rows per program: 4 x 128 lanes on 4 warps, 4 elements a thread
BR = tl.constexpr(ROWS)


@triton.jit
def _softplus(x):
    """log(1 + e^x) as torch computes it (x above 20: x), with log1p(y) as
    log(u)·y/(u - 1), u = 1 + y: exact to rounding where log(1 + y) would lose y's digits
    (the step starts at softplus(z) = 0.01)."""
    y = tl.exp(-tl.abs(x))
    u = 1.0 + y
    exact = u == 1.0  # y below half an ulp of 1: log1p(y) = y
    log1p = tl.where(exact, y, tl.log(u) * (y / tl.where(exact, 1.0, u - 1.0)))
    return tl.where(x > 20.0, x, tl.maximum(x, 0.0) + log1p)


@triton.jit
def _one_minus_exp_neg(x):
    """1 - e^{-x} for x >= 0 as -expm1(-x): (1 - u)·x/(-log u), u = e^{-x} (Kahan's),
    exact to rounding as x -> 0 (2a ~ 0.002 at the start)."""
    u = tl.exp(-x)
    exact = u == 1.0  # x below half an ulp: 1 - e^{-x} = x
    safe = tl.where(exact | (u == 0.0), 0.5, u)  # no log(0) or 0/0 in the unused branch
    small = tl.where(exact, x, (1.0 - u) * (x / -tl.log(safe)))
    return tl.where(x > 30.0, 1.0, small)


@triton.jit
def _parts(pz_ptr, bias_ptr, nu_ptr, rows, k, n, K, STEP: tl.constexpr, FLOOR: tl.constexpr,
           ACC: tl.constexpr):
    """z (the step's pre-activation, bias added), Δ, rate, 1 - |λ|² (floored), γ and the
    mask of a (BR, BK) tile."""
    mask = (rows[:, None] < n) & (k[None, :] < K)
    z = tl.load(pz_ptr + rows[:, None] * (3 * K) + 2 * K + k[None, :], mask=mask,
                other=0.0).to(ACC)
    z += tl.load(bias_ptr + k, mask=k < K, other=0.0).to(ACC)[None, :]
    rate = tl.exp(tl.load(nu_ptr + k, mask=k < K, other=0.0).to(ACC))[None, :]
    step = _softplus(z) / STEP
    write = tl.maximum(_one_minus_exp_neg(2.0 * rate * step), FLOOR)
    return z, step, rate, write, tl.sqrt(write), mask


@triton.jit
def _drive_kernel(pz_ptr, bias_ptr, nu_ptr, theta_ptr, ll_ptr, beta_ptr, n, K,
                  BK: tl.constexpr, STEP: tl.constexpr, FLOOR: tl.constexpr,
                  ACC: tl.constexpr):
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    k = tl.arange(0, BK)
    _, step, rate, _, gamma, mask = _parts(pz_ptr, bias_ptr, nu_ptr, rows, k, n, K, STEP, FLOOR,
                                           ACC)
    theta = tl.load(theta_ptr + k, mask=k < K, other=0.0).to(ACC)[None, :]
    re = rows[:, None] * (2 * K) + k[None, :]  # [re | im] offsets in a (.., 2K) row
    p_re_ptr = pz_ptr + rows[:, None] * (3 * K) + k[None, :]
    p_re = tl.load(p_re_ptr, mask=mask, other=0.0).to(ACC)
    p_im = tl.load(p_re_ptr + K, mask=mask, other=0.0).to(ACC)
    tl.store(ll_ptr + re, -rate * step, mask=mask)
    tl.store(ll_ptr + re + K, theta * step, mask=mask)
    tl.store(beta_ptr + re, p_re * gamma, mask=mask)
    tl.store(beta_ptr + re + K, p_im * gamma, mask=mask)


@triton.jit
def _drive_backward_kernel(dll_ptr, dbeta_ptr, pz_ptr, bias_ptr, nu_ptr, theta_ptr, dpz_ptr,
                           dbias_ptr, dnu_ptr, dtheta_ptr, n, K, BK: tl.constexpr,
                           STEP: tl.constexpr, FLOOR: tl.constexpr, ACC: tl.constexpr):
    pid = tl.program_id(0)
    rows = (pid * BR + tl.arange(0, BR)).to(tl.int64)
    k = tl.arange(0, BK)
    z, step, rate, write, gamma, mask = _parts(pz_ptr, bias_ptr, nu_ptr, rows, k, n, K, STEP,
                                               FLOOR, ACC)
    theta = tl.load(theta_ptr + k, mask=k < K, other=0.0).to(ACC)[None, :]
    re = rows[:, None] * (2 * K) + k[None, :]
    pz_row = rows[:, None] * (3 * K) + k[None, :]  # p_re's offsets; p_im +K, z +2K
    d_re = tl.load(dll_ptr + re, mask=mask, other=0.0).to(ACC)
    d_im = tl.load(dll_ptr + re + K, mask=mask, other=0.0).to(ACC)
    db_re = tl.load(dbeta_ptr + re, mask=mask, other=0.0).to(ACC)
    db_im = tl.load(dbeta_ptr + re + K, mask=mask, other=0.0).to(ACC)
    p_re = tl.load(pz_ptr + pz_row, mask=mask, other=0.0).to(ACC)
    p_im = tl.load(pz_ptr + pz_row + K, mask=mask, other=0.0).to(ACC)
    d_gamma = db_re * p_re + db_im * p_im
    dg_da = tl.where(write > FLOOR, (1.0 - write) / gamma, 0.0)
    d_a = tl.where(mask, -d_re + d_gamma * dg_da, 0.0)
    d_step = rate * d_a + theta * d_im
    dz = d_step * tl.sigmoid(z) / STEP
    out_ty = dpz_ptr.dtype.element_ty
    tl.store(dpz_ptr + pz_row, (db_re * gamma).to(out_ty), mask=mask)
    tl.store(dpz_ptr + pz_row + K, (db_im * gamma).to(out_ty), mask=mask)
    tl.store(dpz_ptr + pz_row + 2 * K, dz.to(out_ty), mask=mask)
    out = pid.to(tl.int64) * K + k
    rate_k = tl.exp(tl.load(nu_ptr + k, mask=k < K, other=0.0).to(ACC))
    tl.store(dbias_ptr + out, tl.sum(tl.where(mask, dz, 0.0), axis=0), mask=k < K)
    tl.store(dnu_ptr + out, tl.sum(d_a * step, axis=0) * rate_k, mask=k < K)  # ν = log rate
    tl.store(dtheta_ptr + out, tl.sum(tl.where(mask, d_im * step, 0.0), axis=0), mask=k < K)


def _cut(bias: Tensor, pz: Tensor) -> tuple[int, int, int, int]:
    K = bias.shape[0]
    n = pz.numel() // (3 * K) if K else 0
    return n, K, triton.cdiv(n, ROWS), triton.next_power_of_2(max(K, 1))


def drive(pz: Tensor, bias: Tensor, nu: Tensor, theta: Tensor) -> tuple[Tensor, Tensor]:
    n, K, programs, bk = _cut(bias, pz)
    dtype = torch.promote_types(torch.promote_types(pz.dtype, torch.float32), nu.dtype)
    shape = (*pz.shape[:-1], 2 * K)
    log_lam = pz.new_empty(shape, dtype=dtype)
    beta = pz.new_empty(shape, dtype=dtype)
    if n:
        _drive_kernel[(programs,)](pz, bias, nu, theta, log_lam, beta, n, K, BK=bk,
                                   STEP=STEP_UNIT, FLOOR=MIN_WRITE,
                                   ACC=acc(pz, bias, nu, theta), num_warps=4)
    return log_lam, beta


def drive_backward(d_log_lam: Tensor, d_beta: Tensor, pz: Tensor, bias: Tensor, nu: Tensor,
                   theta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    n, K, programs, bk = _cut(bias, pz)
    d_pz = torch.empty_like(pz)
    tensors = (d_log_lam, d_beta, pz, bias, nu, theta)
    d_bias = pz.new_zeros((max(programs, 1), K), dtype=compute_dtype(*tensors))
    d_nu, d_theta = torch.zeros_like(d_bias), torch.zeros_like(d_bias)
    if n:
        _drive_backward_kernel[(programs,)](*tensors, d_pz, d_bias, d_nu, d_theta, n, K,
                                            BK=bk, STEP=STEP_UNIT, FLOOR=MIN_WRITE,
                                            ACC=acc(*tensors), num_warps=4)
    return (d_pz, d_bias.sum(0).to(bias.dtype), d_nu.sum(0).to(nu.dtype),
            d_theta.sum(0).to(theta.dtype))
