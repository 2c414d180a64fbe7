"""The eigenstate recurrence ``c_t = λ_t · c_{t-1} + β_t`` and its backends (docs/model.md,
"Computing the recurrence" and "Gradients of the scan").

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
    ``chunked``  fixed λ: the chunked matmul form (see ``scan_chunked``), O(B·T·Q·K)
                 work in batched GEMMs; the T/Q chunk states come from the same
                 algorithm one level up, so no Python loop runs over time or chunks.
                 Selective λ: parallel prefix scans inside chunks and the same one
                 level up (``scan_prefix``), O(B·T·K·log Q) elementwise work.
    ``fused``    Triton kernels with their own backward (``ten.kernels.scan_fused``): O(B·T·K),
                 c written once. Needs triton and a CUDA tensor (or, for tests, CPU
                 tensors with TRITON_INTERPRET=1 set before triton is first imported).
    ``auto``     not a backend but a choice: ``fused`` on CUDA when triton imports,
                 ``chunked`` otherwise; ``resolve_backend``/``resolve_scan`` say which.
                 Decided once, where the model is built for its device (the trainer
                 builds it with ``ten.train.execution``'s choice; ``build_model(config,
                 device)`` decides for other callers): :func:`scan` runs a backend and
                 refuses ``auto``.

Whatever the autocast dtype, the scan runs with autocast off in float32 (float64
when its inputs are float64): decays raised to powers of hundreds lose everything in
bf16. Asking for a backend that does not exist, or cannot run here, raises with the fix;
nothing falls back silently (``auto`` is the explicit way to let the device decide).
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import Tensor
from torch._subclasses.fake_tensor import is_fake  # (torch imports it anyway)

from ten.config import SCAN_BACKENDS

__all__ = ["BACKENDS", "ScanBackendError", "check_backend", "resolve_backend",
           "resolve_scan", "scan", "scan_chunked", "scan_prefix", "scan_ref"]


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
    """Chunked backend: intra-chunk decay matrices as GEMMs, the same scan between chunks.
    Selective (input-dependent) λ goes to :func:`scan_prefix` instead: its decay
    matrices differ per row, chunk and eigenstate, so they are no GEMM.

    Split T into n chunks of Q. Inside a chunk, with a_t = log λ_t and the segment sums
    D[j, s] = a_{s+1} + … + a_j (s ≤ j), every state is

        c[j] = Σ_{s≤j} exp(D[j, s]) · β[s]  +  exp(A_j) · S_prev,      A_j = a_0 + … + a_j

    The first term is U = L·β with the lower-triangular (causal) matrix L = exp(D);
    for fixed λ, L is the Toeplitz matrix λ^{j-s}, shared by every chunk and batch row,
    so U is one batched GEMM over the K eigenstates. The second term needs the state
    S_prev at the end of the previous chunk, which follows its own short recurrence
    S_c = exp(A_{Q-1}) · S_{c-1} + U_c[Q-1]: the same scan, T/Q steps long, solved by
    calling this function on it (log_Q T levels).

    L is formed from the difference of decays (a segment sum), never as
    exp(A_j)·exp(-A_s), which overflows for long chunks and strong decay.
    """
    B, T, K2 = beta.shape
    if T == 0:
        return beta, beta.new_zeros(B, K2) if state is None else state
    if log_lam.dim() == 3:
        return scan_prefix(beta, log_lam, state, chunk_size)
    Q = min(chunk_size, T)
    n = math.ceil(T / Q)
    if n * Q > T:
        # Padded steps sit after every real one, so they change no real output. The
        # final state is read at T-1, before them.
        beta = F.pad(beta, (0, 0, 0, n * Q - T))
    c = _chunked_fixed(beta, log_lam, state, Q)[:, :T]
    return c, c[:, -1]


def _chunked_fixed(beta: Tensor, log_lam: Tensor, state: Tensor | None, Q: int) -> Tensor:
    """Fixed λ: L is one Toeplitz matrix per eigenstate, so every chunk of every batch
    row is a column of one GEMM per eigenstate. Complex products are written as real
    2×2 blocks, [[re, -im], [im, re]], so the GEMMs are real and need no slicing."""
    B, TQ, K2 = beta.shape
    K, n = K2 // 2, TQ // Q
    ar, ai = (v[:, None, None] for v in _split(log_lam))  # (K, 1, 1)
    pos = torch.arange(Q, device=beta.device)
    lag = (pos[:, None] - pos[None, :]).to(beta.dtype)  # (Q, Q): j - s
    # λ^{j-s} for s <= j, else 0. Masked before exp: positive lags would overflow.
    E = torch.exp(torch.where(lag >= 0, ar * lag, torch.tensor(-math.inf, dtype=beta.dtype)))
    Lr, Li = E * torch.cos(ai * lag), E * torch.sin(ai * lag)  # (K, Q, Q)
    L = torch.cat([torch.cat([Lr, -Li], 2), torch.cat([Li, Lr], 2)], 1)  # (K, 2Q, 2Q)

    # (K, [Q re rows; Q im rows], B·n): batch rows and chunks become GEMM columns.
    x = beta.view(B, n, Q, 2, K).permute(4, 3, 2, 0, 1).reshape(K, 2 * Q, B * n)
    u = L[:, [Q - 1, 2 * Q - 1]] @ x  # (K, 2, B·n): each chunk's own end state
    u = u.view(K, 2, B, n).permute(2, 3, 1, 0).reshape(B, n, K2)  # (B, n, 2K)
    s_prev = _states_entering_chunks(u, Q * log_lam, state, Q)  # (B, n, 2K)
    s_prev = s_prev.view(B, n, 2, K).permute(3, 2, 0, 1).reshape(K, 2, B * n)

    # The carried state enters row j as λ^{j+1} · S_prev.
    steps = (pos + 1).to(beta.dtype)  # (Q,)
    E1 = torch.exp(ar[:, :, 0] * steps)  # (K, Q)
    Pr, Pi = E1 * torch.cos(ai[:, :, 0] * steps), E1 * torch.sin(ai[:, :, 0] * steps)
    P = torch.stack([torch.cat([Pr, Pi], 1), torch.cat([-Pi, Pr], 1)], dim=2)  # (K, 2Q, 2)
    out = torch.baddbmm(P @ s_prev, L, x)  # (K, 2Q, B·n)
    return out.view(K, 2, Q, B, n).permute(3, 4, 2, 1, 0).reshape(B, TQ, K2)


def _states_entering_chunks(
    u: Tensor, log_lam_chunk: Tensor, state: Tensor | None, Q: int
) -> Tensor:
    """The state entering each chunk, S_{c-1}, from S_c = Λ_c · S_{c-1} + u_c.

    u: (B, n, 2K) each chunk's end state from its own inputs; log_lam_chunk: the decay
    across a whole chunk, (2K,). This is the same recurrence, n = T/Q
    steps long, so it is solved by the same chunked scan: log_Q(T) levels in all, and
    never a Python loop over chunks.
    """
    B, n, K2 = u.shape
    s0 = u.new_zeros(B, 1, K2) if state is None else state[:, None]
    if n == 1:
        return s0
    ends, _ = scan_chunked(u, log_lam_chunk, state, Q)  # (B, n, 2K): state after chunk c
    return torch.cat([s0, ends[:, :-1]], dim=1)


def scan_prefix(beta: Tensor, log_lam: Tensor, state: Tensor | None = None,
                chunk_size: int = 64) -> tuple[Tensor, Tensor]:
    """Selective λ (B, T, 2K): the recurrence as parallel prefix scans (Hillis-Steele).

    One step is the affine map c -> λ_t·c + β_t; two compose as (λ1, β1) then (λ2, β2)
    = (λ2·λ1, λ2·β1 + β2). Inside each chunk of Q steps, after the level with stride d,
    row j holds the composition of steps j-2d+1..j (from the chunk's start at most):
    log2(Q) levels give every state from the chunk's own inputs, U[j], and the product
    Λ[j] of λ from the chunk's start to j. The states entering the chunks follow the
    same recurrence T/Q steps long (S_c = Λ_c[Q-1]·S_{c-1} + U_c[Q-1]), solved by
    calling this function on it; then c[j] = U[j] + Λ[j]·S_prev. Work O(B·T·K·log Q),
    no Q×Q matrix, no Python loop over time. Only products of |λ| ≤ 1 are formed (never
    a division by a decay), so nothing overflows however strong the decay. Real and
    imaginary parts are kept apart so each level is a few elementwise products.
    """
    B, T, K2 = beta.shape
    if T == 0:
        return beta, beta.new_zeros(B, K2) if state is None else state
    Q = max(1, min(chunk_size, T))
    n = math.ceil(T / Q)
    if n * Q > T:  # padded steps (λ = 1, β = 0) come after every real one
        beta = F.pad(beta, (0, 0, 0, n * Q - T))
        log_lam = F.pad(log_lam, (0, 0, 0, n * Q - T))
    ar, ai = (x.reshape(B, n, Q, K2 // 2) for x in _split(_cexp(log_lam)))  # λ_t
    br, bi = (x.reshape(B, n, Q, K2 // 2) for x in _split(beta))
    d = 1
    while d < Q:
        # U[j] += Λ[j]·U[j-d] and Λ[j] *= Λ[j-d] for j >= d inside each chunk
        pr, pi, qr, qi = br[:, :, :-d], bi[:, :, :-d], ar[:, :, d:], ai[:, :, d:]
        br = torch.cat([br[:, :, :d], br[:, :, d:] + qr * pr - qi * pi], dim=2)
        bi = torch.cat([bi[:, :, :d], bi[:, :, d:] + qr * pi + qi * pr], dim=2)
        pr, pi = ar[:, :, :-d], ai[:, :, :-d]
        ar, ai = (torch.cat([ar[:, :, :d], qr * pr - qi * pi], dim=2),
                  torch.cat([ai[:, :, :d], qr * pi + qi * pr], dim=2))
        d *= 2
    # The state entering each chunk (the carried one, or zeros, for the first: λ stays in
    # the graph as in the recurrence, so its gradient is a zero tensor, never missing).
    s0 = beta.new_zeros(B, 1, K2) if state is None else state[:, None]
    if n > 1:
        ends = torch.cat([br[:, :, -1], bi[:, :, -1]], dim=-1)  # (B, n, 2K)
        across = log_lam.view(B, n, Q, K2).sum(dim=2)  # log of each chunk's whole decay
        entering, _ = scan_prefix(ends[:, :-1], across[:, :-1], state, chunk_size)
        s0 = torch.cat([s0, entering], dim=1)
    sr, si = (x[:, :, None] for x in _split(s0))  # (B, n, 1, K)
    cr, ci = br + ar * sr - ai * si, bi + ar * si + ai * sr
    c = torch.cat([cr, ci], dim=-1).reshape(B, n * Q, K2)[:, :T]
    return c, c[:, -1]


def _fused_module() -> ModuleType:
    """ten.kernels.scan_fused, imported on first use so that ``import ten.kernels.scan``
    needs no triton."""
    try:
        return importlib.import_module("ten.kernels.scan_fused")
    except ImportError as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ScanBackendError(
            f"scan backend 'fused' needs triton, which does not import here ({why}): "
            "pip install the triton your torch pins (the CUDA torch wheel brings it), "
            "or set TENConfig.scan_backend to chunked (or auto)"
        ) from None


def _fused_entry(beta: Tensor, log_lam: Tensor, state: Tensor | None = None):
    return _fused_module().scan_fused(beta, log_lam, state)


BACKENDS: dict[str, Callable[..., tuple[Tensor, Tensor]]] = {
    "ref": scan_ref,
    "chunked": scan_chunked,
    "fused": _fused_entry,
}


def check_backend(name: str) -> None:
    """Raise ScanBackendError when ``name`` is not a backend (or ``auto``).

    Only the name: a laptop validating a job meant for a GPU must accept ``fused``.
    Whether it can run is decided where the tensors are, by ``resolve_backend``.
    """
    if name not in SCAN_BACKENDS:
        raise ScanBackendError(
            f"unknown scan backend {name!r}; choose one of: {', '.join(SCAN_BACKENDS)}"
        )


def _device_type(device: torch.device | str) -> str:
    return torch.device(device).type


def _auto_choice(device: torch.device | str) -> tuple[str, str]:
    """(backend, why) for ``auto`` on this device."""
    if _device_type(device) != "cuda":
        return "chunked", "no CUDA"
    try:
        mod = _fused_module()
    except ScanBackendError:
        return "chunked", "triton not installed"
    if mod.INTERPRETED:
        return "chunked", "TRITON_INTERPRET=1 is set"
    return "fused", "CUDA and triton"


def resolve_backend(name: str, device: torch.device | str) -> str:
    """The backend that runs for ``name`` on ``device``: ``auto`` picks, others must run.

    Raises ScanBackendError, naming TENConfig.scan_backend, for an unknown name or for
    ``fused`` where it cannot run (no triton; a CPU tensor without the interpreter).
    """
    check_backend(name)
    if name == "auto":
        return _auto_choice(device)[0]
    if name == "fused":
        mod = _fused_module()
        kind = _device_type(device)
        if kind != "cuda" and not mod.INTERPRETED:
            raise ScanBackendError(
                f"scan backend 'fused' runs Triton kernels on a CUDA device and this run is "
                f"on {kind}: set TENConfig.scan_backend to auto or chunked (tests run it on CPU "
                "with TRITON_INTERPRET=1)"
            )
    return name


def resolve_scan(name: str, device: torch.device | str) -> tuple[str, str]:
    """(the backend that runs for ``name`` on ``device``, one log line saying which), e.g.
    'scan backend: auto -> chunked (no CUDA)'. Raises like ``resolve_backend``."""
    if name == "auto":
        backend, why = _auto_choice(device)
        return backend, f"scan backend: auto -> {backend} ({why})"
    return resolve_backend(name, device), f"scan backend: {name}"


def scan(
    beta: Tensor,
    log_lam: Tensor,
    state: Tensor | None = None,
    *,
    backend: str = "chunked",
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor]:
    """Run ``c_t = λ_t c_{t-1} + β_t`` with the named backend (see the module docstring):
    one of :data:`BACKENDS`, decided before (``auto`` is refused, not decided per call).

    Computes in float32 (float64 for float64 inputs) with autocast disabled; the
    outputs come back in that dtype.
    """
    if backend not in BACKENDS:
        raise ScanBackendError(
            f"scan() runs one of the backends {', '.join(BACKENDS)}, got {backend!r}: decide "
            "'auto' once for the device first (resolve_backend, or build_model(config, device))")
    if not (backend == "fused" and is_fake(beta)):  # a fake runs nothing: fused traces
        resolve_backend(backend, beta.device)  # anywhere (ten.train.memory, on a CPU)
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
