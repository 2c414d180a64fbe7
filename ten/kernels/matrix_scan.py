"""The matrix-state recurrence: eigenstates that hold value vectors (docs/model.md,
"Eigenstates that hold values").

Per head, N = K/H eigenstates, each a row of P complex numbers, C_t (N × P):

    C_t = λ_t ⊙ C_{t-1} + k_t v_tᵀ        k_t ∈ ℂ^N the drive (the key), v_t ∈ ℝ^P the value
    y_t = Re(q_tᴴ C_t) ∈ ℝ^P               q_t ∈ ℂ^N the query

λ_t broadcast along a row: eigenstate n decays and turns its whole row by λ_t[n]. It is
the vector scan's recurrence with a value vector where a number was, read by a query
instead of a fixed projection: linear attention whose decay is TEN's eigenvalues.

Layouts (complex numbers as ``[re | im]`` halves of the last dimension, as
:mod:`ten.kernels.scan` keeps them; heads contiguous inside each half):

    k, q     (B, T, 2K)       keys (already scaled by γ) and queries
    v        (B, T, H·P)      values
    log_lam  (2K,)            fixed eigenvalues, [log|λ| | arg λ]
             (B, T, 2K)       selective eigenvalues, same layout
    state    (B, H, N, P)     complex C_{-1}, or None for zeros
    returns  y (B, T, H·P) and C_{T-1} (B, H, N, P) complex, to carry on

Backends:
    ``ref``      a plain loop over time: the oracle.
    ``chunked``  exact for any chunk of Q tokens: inside a chunk every output is a
                 causal (Q × Q) mix of the chunk's values plus the query's read of the
                 state entering it, every chunk at once; then the states between chunks
                 (a loop over T/Q of one multiply-add). Decays are formed from
                 differences of cumulative log-eigenvalues, never as exp(A_j)·exp(-A_s),
                 which overflows. O(B·H·T·(Q·(N + P) + N·P)) work and a (Q × Q × N)
                 decay tensor per head and chunk.
    ``fused``    the same chunked computation in Triton kernels with their own backward
                 (``ten.kernels.matrix_scan_fused``): the state stays in registers, only
                 the inputs are read and y written. Needs triton and a CUDA tensor (or,
                 for tests, CPU tensors with TRITON_INTERPRET=1 set before triton is
                 first imported); its chunk is its own (16 tokens), not ``chunk_size``.

Like the vector scan it computes in float32 (float64 for float64 keys) with autocast
off, and runs the backend it is given. y comes back in the values' dtype where that is
narrower (bf16 under autocast, what the output projection reads), else in the arithmetic's;
the fused backend reads bf16 values and queries and writes y in bf16 itself.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

BACKENDS = ("ref", "chunked", "fused")
# Values and queries in these dtypes stay so (the arithmetic is float32's all the same).
NARROW = (torch.bfloat16, torch.float16)

__all__ = ["BACKENDS", "matrix_scan", "matrix_scan_chunked", "matrix_scan_ref"]


def _complex_heads(x: Tensor, heads: int) -> Tensor:
    """(B, T, 2K) [re | im] -> (B, H, T, N) complex."""
    B, T, K2 = x.shape
    K = K2 // 2
    c = torch.complex(x[..., :K], x[..., K:])
    return c.view(B, T, heads, K // heads).transpose(1, 2)


def _complex_eigenvalues(log_lam: Tensor, heads: int) -> Tensor:
    """log λ as complex, (H, 1, N) fixed (broadcast over batch and time) or (B, H, T, N)."""
    if log_lam.dim() == 1:
        K = log_lam.shape[0] // 2
        a = torch.complex(log_lam[:K], log_lam[K:])
        return a.view(heads, 1, K // heads)
    return _complex_heads(log_lam, heads)


def _as_inputs(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, heads: int):
    B, T, _ = k.shape
    return (_complex_heads(k, heads), v.view(B, T, heads, -1).transpose(1, 2),
            _complex_heads(q, heads), _complex_eigenvalues(log_lam, heads))


def _heads_out(y: Tensor) -> Tensor:
    """(B, H, T, P) -> (B, T, H·P)."""
    B, H, T, P = y.shape
    return y.transpose(1, 2).reshape(B, T, H * P)


def matrix_scan_ref(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, state: Tensor | None,
                    heads: int) -> tuple[Tensor, Tensor]:
    """One step per token. Slow, obviously correct."""
    kc, vh, qc, a = _as_inputs(k, v, q, log_lam, heads)
    B, H, T, N = kc.shape
    P = vh.shape[-1]
    C = kc.new_zeros(B, H, N, P) if state is None else state
    lam = torch.exp(a)
    outs = []
    for t in range(T):
        lam_t = lam[..., 0, :] if lam.shape[-2] == 1 else lam[:, :, t]  # (·, H, N)
        C = lam_t[..., None] * C + kc[:, :, t, :, None] * vh[:, :, t, None, :]
        outs.append((qc[:, :, t, :, None].conj() * C).sum(-2).real)
    y = torch.stack(outs, dim=2) if T else vh.new_zeros(B, H, 0, P)
    return _heads_out(y), C


def matrix_scan_chunked(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor,
                        state: Tensor | None, heads: int,
                        chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """Every chunk at once, then the states between them. For a chunk's positions j and
    s ≤ j, with A_j = R_j + iφ_j the cumulative sum of log λ from the chunk's start,

        y_j   = Σ_s Re(Σ_n conj(q_jn) exp(A_jn − A_sn) k_sn) v_s     the chunk's own tokens
              + Re Σ_n conj(q_jn) exp(A_jn) S[n]                  the state S entering it
        U     = Σ_s exp(A_{Q-1} − A_s) k_s v_sᵀ                   what the chunk writes
        S'    = exp(A_{Q-1}) ⊙ S + U                              the state leaving it

    The rotation is folded into the keys and queries, k̂_s = k_s e^{-iφ_s} and
    q̂_j = q_j e^{-iφ_j} (phases from the chunk's start, so they stay small), leaving a
    real decay between them: conj(q_j) exp(A_j − A_s) k_s = exp(R_j − R_s) conj(q̂_j) k̂_s.
    That decay is formed per eigenstate from the difference R_j − R_s ≤ 0 (|λ| < 1),
    never as exp(R_j)·exp(-R_s), which overflows; the rest is real matrix products. The
    sequence is padded to whole chunks with steps that change nothing (λ = 1, k = 0)."""
    B, T, K2 = k.shape
    K = K2 // 2
    N = K // heads
    P = v.shape[-1] // heads
    Q = max(1, min(chunk_size, T))
    n = -(-T // Q)
    pad = n * Q - T

    def chunks(x: Tensor) -> Tensor:  # (B, T, H·w) -> (B, H, n, Q, w), zeros after T
        x = torch.nn.functional.pad(x, (0, 0, 0, pad))
        return x.view(B, n, Q, heads, -1).permute(0, 3, 1, 2, 4)

    if log_lam.dim() == 1:
        log_lam = log_lam.expand(B, T, K2)
    R, phi = chunks(log_lam[..., :K]).cumsum(3), chunks(log_lam[..., K:]).cumsum(3)
    cos, sin = torch.cos(phi), torch.sin(phi)
    kr, ki, qr, qi = chunks(k[..., :K]), chunks(k[..., K:]), chunks(q[..., :K]), chunks(q[..., K:])
    vc = chunks(v)  # (B, H, n, Q, P)
    khr, khi = kr * cos + ki * sin, ki * cos - kr * sin  # k̂ = k e^{-iφ}
    qhr, qhi = qr * cos + qi * sin, qi * cos - qr * sin  # q̂ = q e^{-iφ}

    causal = torch.ones(Q, Q, dtype=torch.bool, device=k.device).tril()[..., None]
    decay = torch.exp((R[..., :, None, :] - R[..., None, :, :]).masked_fill(~causal, -math.inf))
    pairs = (qhr[..., :, None, :] * khr[..., None, :, :]  # Re(conj(q̂_j) k̂_s) per eigenstate
             + qhi[..., :, None, :] * khi[..., None, :, :])
    y = (decay * pairs).sum(-1) @ vc  # (B, H, n, Q, P)

    to_end = torch.exp(R[..., -1:, :] - R)  # (B, H, n, Q, N)
    write_r = (to_end * khr).transpose(-1, -2) @ vc  # Û = Σ_s e^{R_end - R_s} k̂_s v_sᵀ
    write_i = (to_end * khi).transpose(-1, -2) @ vc
    end_cos, end_sin = cos[..., -1, :, None], sin[..., -1, :, None]  # U = e^{iφ_end} Û
    written_r = end_cos * write_r - end_sin * write_i
    written_i = end_sin * write_r + end_cos * write_i
    across = torch.exp(R[..., -1, :, None])  # (B, H, n, N, 1): a whole chunk's |decay|
    if state is None:
        Sr = Si = k.new_zeros(B, heads, N, P)
    else:
        Sr, Si = state.real, state.imag
    entering = []
    for c in range(n):
        entering.append(torch.cat([Sr, Si], dim=-2))  # (B, H, 2N, P)
        ar, ai = across[:, :, c] * end_cos[:, :, c], across[:, :, c] * end_sin[:, :, c]
        Sr, Si = (ar * Sr - ai * Si + written_r[:, :, c],
                  ai * Sr + ar * Si + written_i[:, :, c])
    reads = torch.exp(R)  # Re(conj(q_j) e^{A_j} S) = Re(conj(q̂_j) e^{R_j} S)
    y = y + torch.cat([qhr * reads, qhi * reads], dim=-1) @ torch.stack(entering, dim=2)
    y = y.reshape(B, heads, n * Q, P)[:, :, :T]
    return _heads_out(y), torch.complex(Sr, Si)


def matrix_scan(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, state: Tensor | None, *,
                heads: int, backend: str = "chunked",
                chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """Run the matrix-state recurrence with the named backend (the module docstring):
    returns (y (B, T, H·P), the last state (B, H, N, P) complex), computed in float32
    (float64 for float64 keys) whatever the autocast; y in the values' dtype where it
    is narrower."""
    if backend not in BACKENDS:
        raise ValueError(f"the matrix-state scan runs one of the backends "
                         f"{', '.join(BACKENDS)}, got {backend!r}")
    dtype = torch.float64 if k.dtype == torch.float64 else torch.float32
    cdtype = torch.complex128 if dtype == torch.float64 else torch.complex64
    with torch.autocast(k.device.type, enabled=False):
        k, log_lam = k.to(dtype), log_lam.to(dtype)
        v, q = (x if x.dtype in NARROW else x.to(dtype) for x in (v, q))
        state = None if state is None else state.to(cdtype)
        if backend == "fused":  # reads v and q as they are, writes y in v's dtype
            from ten.kernels.matrix_scan_fused import matrix_scan_fused

            return matrix_scan_fused(k, v, q, log_lam, state, heads)
        out = v.dtype
        v, q = v.to(dtype), q.to(dtype)
        if backend == "ref":
            y, last = matrix_scan_ref(k, v, q, log_lam, state, heads)
        else:
            y, last = matrix_scan_chunked(k, v, q, log_lam, state, heads, chunk_size)
        return y.to(out), last
