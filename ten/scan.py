"""The eigenstate recurrence ``c_t = λ_t · c_{t-1} + β_t`` and its backends.

Every backend has the same signature and the same layout convention: a complex
tensor is stored as real numbers with its real parts in the first half of the last
dimension and its imaginary parts in the second half (``[re | im]``). That is exactly
how the layer produces the drive (``W_in ∈ R^{2K×d}``) and consumes the states
(``W_out ∈ R^{d×2K}``), so no reshuffling happens around the scan.

    beta     (B, T, 2K)   drive, already scaled by γ
    log_lam  (2K,)        fixed eigenvalues: [log|λ| | arg λ]
             (B, T, 2K)   selective (input-dependent) eigenvalues, same layout
    state    (B, 2K)      carried state c_{-1}, or None for zeros
    returns  c (B, T, 2K) every state, and c_{T-1} (B, 2K) to carry on

Backends:
    ``ref``      a plain loop over time: the test oracle, never the fast path.
    ``chunked``  the chunked matmul form (see ``_scan_chunked``): O(B·T·Q·K) work in
                 batched GEMMs plus a loop of T/Q steps over chunk states.

Whatever the autocast dtype, the scan runs with autocast off in float32 (float64
when its inputs are float64): decays raised to powers of hundreds lose everything in
bf16. Asking for a backend that does not exist raises; nothing falls back silently.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["BACKENDS", "ScanBackendError", "scan", "scan_ref", "scan_chunked"]


class ScanBackendError(ValueError):
    """The configured scan backend does not exist or cannot run here."""


# --- complex helpers on the [re | im] layout -------------------------------------------

def _split(x: Tensor) -> tuple[Tensor, Tensor]:
    half = x.shape[-1] // 2
    return x[..., :half], x[..., half:]


def _cmul(x: Tensor, y: Tensor) -> Tensor:
    """Complex product of two [re | im] tensors (broadcasting)."""
    xr, xi = _split(x)
    yr, yi = _split(y)
    return torch.cat([xr * yr - xi * yi, xr * yi + xi * yr], dim=-1)


def _cexp(a: Tensor) -> Tensor:
    """exp of a complex [re | im] tensor: exp(ar) · (cos ai + i sin ai)."""
    ar, ai = _split(a)
    mag = torch.exp(ar)
    return torch.cat([mag * torch.cos(ai), mag * torch.sin(ai)], dim=-1)


# --- backends ----------------------------------------------------------------------------

def scan_ref(beta: Tensor, log_lam: Tensor, state: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Reference backend: one step per token. Slow, obviously correct."""
    B, T, K2 = beta.shape
    lam = _cexp(log_lam)  # (2K,) or (B, T, 2K)
    c = beta.new_zeros(B, K2) if state is None else state
    outs = []
    for t in range(T):
        lam_t = lam if lam.dim() == 1 else lam[:, t]
        c = _cmul(lam_t, c) + beta[:, t]
        outs.append(c)
    if T == 0:
        return beta, c
    return torch.stack(outs, dim=1), c


def scan_chunked(
    beta: Tensor, log_lam: Tensor, state: Tensor | None = None, chunk_size: int = 64
) -> tuple[Tensor, Tensor]:
    """Chunked backend: intra-chunk decay matrices as GEMMs, a short loop between chunks.

    Split T into n chunks of Q. Inside a chunk, with a_t = log λ_t and the segment sums
    D[j, s] = a_{s+1} + … + a_j (s ≤ j), every state is

        c[j] = Σ_{s≤j} exp(D[j, s]) · β[s]  +  exp(A_j) · S_prev,      A_j = a_0 + … + a_j

    The first term is U = L·β with the lower-triangular (causal) matrix L = exp(D);
    for fixed λ, L is the Toeplitz matrix λ^{j-s}, shared by every chunk and batch row,
    so U is one batched GEMM over the K eigenstates. The second term needs the state
    S_prev at the end of the previous chunk, which follows its own short recurrence
    S_c = exp(A_{Q-1}) · S_{c-1} + U_c[Q-1]: the same scan, T/Q steps long.

    L is formed from the difference of decays (a segment sum), never as
    exp(A_j)·exp(-A_s), which overflows for long chunks and strong decay.
    """
    B, T, K2 = beta.shape
    K = K2 // 2
    if T == 0:
        return beta, beta.new_zeros(B, K2) if state is None else state
    Q = min(chunk_size, T)
    n = math.ceil(T / Q)
    pad = n * Q - T
    selective = log_lam.dim() == 3
    if pad:
        # Padded steps sit after every real one, so they change no real output. The
        # final state is read at T-1, before them.
        beta = torch.nn.functional.pad(beta, (0, 0, 0, pad))
        if selective:
            log_lam = torch.nn.functional.pad(log_lam, (0, 0, 0, pad))

    br, bi = _split(beta.view(B, n, Q, K2))  # (B, n, Q, K) each
    pos = torch.arange(Q, device=beta.device)
    causal = pos[:, None] >= pos[None, :]  # (Q, Q): j >= s

    if selective:
        a = log_lam.view(B, n, Q, K2)
        A = torch.cumsum(a, dim=2)  # (B, n, Q, 2K) decay from chunk start to j, inclusive
        Ar, Ai = (x.transpose(2, 3) for x in _split(A))  # (B, n, K, Q) each
        Dr = Ar[..., :, None] - Ar[..., None, :]  # (B, n, K, Q, Q)
        Di = Ai[..., :, None] - Ai[..., None, :]
        A_end = A[:, :, -1]  # (B, n, 2K)
    else:
        ar, ai = _split(log_lam)  # (K,)
        lag = (pos[:, None] - pos[None, :]).to(beta.dtype)  # (Q, Q): j - s
        Dr = ar[:, None, None] * lag  # (K, Q, Q)
        Di = ai[:, None, None] * lag
        A = (pos + 1).to(beta.dtype)[:, None] * log_lam  # (Q, 2K)
        A_end = A[-1]  # (2K,)

    # Mask before exp: above the diagonal D > 0 and exp would overflow.
    E = torch.exp(torch.where(causal, Dr, torch.full_like(Dr, -math.inf)))
    L = torch.cat([E * torch.cos(Di), E * torch.sin(Di)], dim=-2)  # (..., K, 2Q, Q): [Lr; Li]

    # Arrange β as (..., K, Q, N) so one matmul serves both cases: for fixed λ the batch
    # and chunk dims go into N (a real GEMM); for selective λ they lead (batched matvec).
    if selective:
        rhs = torch.stack([br, bi], dim=-1).transpose(2, 3)  # (B, n, K, Q, 2)
        P = torch.matmul(L, rhs)  # (B, n, K, 2Q, 2)
        Ur = P[..., :Q, 0] - P[..., Q:, 1]  # Lr·br - Li·bi   (B, n, K, Q)
        Ui = P[..., :Q, 1] + P[..., Q:, 0]  # Lr·bi + Li·br
        U = torch.cat([Ur, Ui], dim=2).transpose(2, 3)  # (B, n, Q, 2K)
    else:
        N = B * n
        rhs = torch.cat([br, bi], dim=0)  # (2B, n, Q, K)
        rhs = rhs.permute(3, 2, 0, 1).reshape(K, Q, 2 * N)  # (K, Q, [br | bi])
        P = torch.matmul(L, rhs)  # (K, 2Q, 2N)
        Ur = P[:, :Q, :N] - P[:, Q:, N:]
        Ui = P[:, :Q, N:] + P[:, Q:, :N]
        U = torch.cat([Ur, Ui], dim=0).view(K2, Q, B, n).permute(2, 3, 1, 0)  # (B, n, Q, 2K)

    # Inter-chunk: the state entering every chunk, by the same recurrence over chunks.
    S, _ = scan_ref(U[:, :, -1], A_end, state)  # (B, n, 2K): state at each chunk's end
    s0 = beta.new_zeros(B, 1, K2) if state is None else state[:, None]
    S_prev = torch.cat([s0, S[:, :-1]], dim=1)  # (B, n, 2K)
    c = U + _cmul(_cexp(A), S_prev[:, :, None, :])  # (B, n, Q, 2K)
    c = c.reshape(B, n * Q, K2)[:, :T]
    return c, c[:, -1]


BACKENDS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "ref": scan_ref,
    "chunked": scan_chunked,
}

_PLANNED = {
    "fused": "a fused Triton/CUDA kernel with its own backward is not built yet",
}


def check_backend(name: str) -> None:
    """Raise ScanBackendError with the fix when ``name`` cannot be used."""
    if name in BACKENDS:
        return
    known = ", ".join(sorted(BACKENDS))
    if name in _PLANNED:
        raise ScanBackendError(
            f"scan backend {name!r} is not available: {_PLANNED[name]}; "
            f"set model.scan_backend to one of: {known}"
        )
    raise ScanBackendError(f"unknown scan backend {name!r}; choose one of: {known}")


def scan(
    beta: Tensor,
    log_lam: Tensor,
    state: Tensor | None = None,
    *,
    backend: str = "chunked",
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Run ``c_t = λ_t c_{t-1} + β_t`` with the named backend (see the module docstring).

    Computes in float32 (float64 for float64 inputs) with autocast disabled; the
    outputs come back in that dtype.
    """
    check_backend(backend)
    if beta.dim() != 3 or beta.shape[-1] % 2:
        raise ValueError(f"beta must be (B, T, 2K), got {tuple(beta.shape)}")
    B, T, K2 = beta.shape
    if log_lam.shape not in ((K2,), (B, T, K2)):
        raise ValueError(
            f"log_lam must be ({K2},) or {(B, T, K2)} to match beta, got {tuple(log_lam.shape)}"
        )
    if state is not None and state.shape != (B, K2):
        raise ValueError(f"state must be {(B, K2)}, got {tuple(state.shape)}")
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    dtype = torch.float64 if beta.dtype == torch.float64 else torch.float32
    with torch.autocast(device_type=beta.device.type, enabled=False):
        beta = beta.to(dtype)
        log_lam = log_lam.to(dtype)
        state = None if state is None else state.to(dtype)
        if backend == "chunked":
            return scan_chunked(beta, log_lam, state, chunk_size)
        return BACKENDS[backend](beta, log_lam, state)
