"""The matrix-state scan's ``fused`` backend: Triton kernels for

    C_t = λ_t ⊙ C_{t-1} + k_t v_tᵀ,    y_t = Re(q_tᴴ C_t)

and its backward, with the signature, layouts and result of
:func:`ten.kernels.matrix_scan.matrix_scan_ref` (that module's docstring says what the
tensors are). Imported only when the fused backend is asked for; with ``TRITON_INTERPRET=1``
set before triton is first imported the kernels run on CPU tensors, which is how the tests
hold them to the reference without a GPU (``INTERPRETED`` says which mode this module's
kernels were built in).

The design. A program owns one batch row, one head and a block of BP value columns, and
walks the sequence in chunks of BT tokens carrying its block of the state, the head's N
eigenstates × BP columns (re and im), in registers. Per chunk it computes what the chunked
torch form does (``matrix_scan_chunked``), without writing any of it to memory:

    A_j = R_j + iφ_j            the cumulative log-eigenvalues from the chunk's start
    k̂ = k e^{-iφ}, q̂ = q e^{-iφ}  the rotation folded into keys and queries
    y_j = Σ_{s≤j} Σ_n e^{R_jn − R_sn} Re(conj(q̂_jn) k̂_sn) v_s + e^{R_j} Re(q̂_jᴴ S)
    S  <- e^{A_end} ⊙ S + e^{iφ_end} Σ_s e^{R_end − R_s} k̂_s v_sᵀ

The decays are formed from differences R_j − R_s ≤ 0 (a (BT, BT, BN) tile, never as
exp(R_j)·exp(−R_s), which overflows), the rest is five small matrix products. Everything
between chunks stays in the rotated-real form, so no angle grows past one chunk's sum.
The chunk's scores, score[j, s] (the first sum's Σ_n), do not depend on the value
columns: a kernel of their own forms them once a chunk (``_matrix_scores_kernel``, one
program per batch row, head and chunk, 1 KB a chunk) for every block of columns to read;
formed by each block, the decays were most of the forward's instructions, P / BP times
over (benchmarks/kernel_check.py, 32 columns: 2,675 instructions a pass and a warp, 1,493
with the scores read, BENCHMARKS.md).

Backward. With dS = dL/dS for the state leaving a chunk, rotated into the chunk's frame
as dŜ = e^{-iφ_end} dS, and M[j, s] = dy_j · v_s over every value column:

    dS_in = e^{R_end} dŜ + Σ_j e^{R_j} q̂_j dy_jᵀ                   the state entering
    dv_s = Σ_j score[j, s] dy_j + Σ_n e^{R_end − R_s} Re(conj(k̂_s) dŜ)
    dq̂_j = Σ_s e^{R_j − R_s} M[j, s] k̂_s + e^{R_j} S dy_j            dq = e^{iφ} dq̂
    dk̂_s = Σ_j e^{R_j − R_s} M[j, s] q̂_j + e^{R_end − R_s} dŜ v_s     dk = e^{iφ} dk̂

Only the first is a recurrence. So, as gated linear attention's kernels do, three passes:
the states entering the chunks recomputed (the forward kernel writing them instead of y),
dS leaving every chunk by the recurrence walked backwards (``_matrix_dstates_kernel``;
both per batch row, head and block of value columns, one layer at a time), then every
chunk at once (``_matrix_backward_kernel``, one program per batch row, head and chunk).
The two passes keep one state of each pair of chunks (2m, 2m + 1) in their scratch
buffers, B·H·T/32 states of 2N × P numbers each: S entering 2m and dS leaving 2m + 1;
the backward takes the pair's other state one step from it, as the pass did (an odd
chunk's S_in from its neighbour's keys and values, an even chunk's dS_out from its
neighbour's queries and dy). The states are most of the scan's bytes (at the flagship's
head a state is 64 KB, a chunk's keys, queries, log λ, v and dy ~26 KB): kept for every
chunk they cost twice the writes and reads, for two (16, 16) products a block of columns
and the neighbour's rows fewer (BENCHMARKS.md). In one pass over the value columns,
reading each column's v, dy, the neighbour's v or dy and the two kept states once, the
backward writes dv and sums M and the state terms, then forms dq and dk whole; dv's
scores are the forward's (kept
for the backward), and the (BT, BT, BN) decays are formed once a chunk after the pass,
for dq and dk, not once per block of columns. d log λ comes from
them, as in gated linear attention: the pair (j, s) depends on A_j − A_s, so for the step
u it is the pairs with s < u ≤ j, which is

    dR_u = Σ_{t≥u} Re(conj(q_t) dq_t) − Re(conj(k_t) dk_t)     (+ the last state's read)
    dφ_u = Σ_{t≥u} −Im(conj(q_t) dq_t) + Im(conj(k_t) dk_t)

the reverse cumulative sum within a chunk written by the kernel with the chunk's total,
the later chunks' totals added by torch in one pass, with, when the last state has a
gradient, the term of its read, Re / −Im of Σ_p conj(dC) C, at every u.

Arithmetic is in the keys' dtype (``matrix_scan`` passes float32, or float64), and so
are the states, the scratch buffers and log λ's gradient; the matrix products use IEEE
float32 (no TF32) so the kernel keeps the reference's precision. Values and queries are
read in their own dtype (bf16 under autocast: the projections wrote them so), and y and
the gradients of v and q written in it: the same numbers as casting them to float32
before and back after, without the casts' passes over memory (bench_traffic). The
scratch states stay float32: in bf16 (half their bytes, as some linear-attention kernels
keep them) d log λ's error grows with the length, a reverse sum of terms that cancel, to
2.1e-2 of its norm at T 4,096 (benchmarks/bench_matrix_scratch.py).
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from ten.kernels.ops import define
from ten.kernels.scan_fused import _sincos

__all__ = ["INTERPRETED", "matrix_scan_fused"]


# --- kernels -------------------------------------------------------------------------------

@triton.jit
def _chunk(k_ptr, q_ptr, ll_ptr, b, h, c, T, K, N, ll_sb, ll_st,
           BT: tl.constexpr, BN: tl.constexpr):
    """One chunk's keys and queries in its rotated frame and its decays: (R, k̂r, k̂i, q̂r,
    q̂i, each (BT, BN); R_end, cos φ_end, sin φ_end, each (BN,); cos φ, sin φ, each
    (BT, BN), to turn gradients back; t (BT,), valid (BT,)). Past T and past N:
    log λ = 0, k = q = 0 (steps that change nothing)."""
    t = c * BT + tl.arange(0, BT)
    n = tl.arange(0, BN)
    ok = t < T
    m = ok[:, None] & (n < N)[None, :]
    col = h * N + n
    ll = ll_ptr + b.to(tl.int64) * ll_sb + t.to(tl.int64)[:, None] * ll_st + col[None, :]
    lm = tl.load(ll, mask=m, other=0.0)
    la = tl.load(ll + K, mask=m, other=0.0)
    R = tl.cumsum(lm, axis=0)
    sin_p, cos_p = _sincos(tl.cumsum(la, axis=0))
    row = (b.to(tl.int64) * T + t)[:, None] * (2 * K) + col[None, :]
    kr = tl.load(k_ptr + row, mask=m, other=0.0)
    ki = tl.load(k_ptr + row + K, mask=m, other=0.0)
    qr = tl.load(q_ptr + row, mask=m, other=0.0).to(kr.dtype)  # bf16 queries read as such
    qi = tl.load(q_ptr + row + K, mask=m, other=0.0).to(kr.dtype)
    sin_e, cos_e = _sincos(tl.sum(la, axis=0))
    khr, khi = _unturn(kr, ki, cos_p, sin_p)
    qhr, qhi = _unturn(qr, qi, cos_p, sin_p)
    return (R, khr, khi, qhr, qhi, tl.sum(lm, axis=0), cos_e, sin_e, cos_p, sin_p, t, ok)


@triton.jit
def _turn(xr, xi, cos, sin):
    """x e^{iφ}, complex, from cos φ and sin φ."""
    return cos * xr - sin * xi, sin * xr + cos * xi


@triton.jit
def _unturn(xr, xi, cos, sin):
    """x e^{-iφ}, complex, from cos φ and sin φ."""
    return cos * xr + sin * xi, cos * xi - sin * xr


@triton.jit
def _decay(R, BT: tl.constexpr):
    """e^{R_j − R_s} for s ≤ j, else 0: (BT, BT, BN), [j, s, n]."""
    j = tl.arange(0, BT)
    causal = (j[:, None] >= j[None, :])[:, :, None]
    return tl.exp(tl.where(causal, R[:, None, :] - R[None, :, :], float("-inf")))


@triton.jit
def _scores(D, qhr, qhi, khr, khi):
    """score[j, s] = Σ_n e^{R_jn − R_sn} Re(conj(q̂_jn) k̂_sn): (BT, BT)."""
    return tl.sum(D * (qhr[:, None, :] * khr[None, :, :] + qhi[:, None, :] * khi[None, :, :]),
                  axis=2)


@triton.jit
def _state_offsets(b, h, H, N, P, p, BN: tl.constexpr):
    """Offsets of a (B, H, 2, N, P) state's [re] block (im: + N·P) and its mask."""
    n = tl.arange(0, BN)
    off = ((b.to(tl.int64) * H + h) * 2 * N + n[:, None]) * P + p[None, :]
    return off, (n < N)[:, None] & (p < P)[None, :]


@triton.jit
def _block_or_zeros(ptr, off, mask, im, like_ptr, BN: tl.constexpr, BP: tl.constexpr,
                    GIVEN: tl.constexpr):
    """A (BN, BP) block of a complex state (re at ``off``, im ``im`` further), or zeros in
    ``like_ptr``'s dtype when none was given."""
    if GIVEN:
        return tl.load(ptr + off, mask=mask, other=0.0), tl.load(ptr + off + im, mask=mask,
                                                                  other=0.0)
    zeros = tl.zeros((BN, BP), like_ptr.dtype.element_ty)
    return zeros, zeros


@triton.jit
def _pair_state_offset(b, h, c, H, N, P, n_chunks):
    """Where the state kept for chunk ``c``'s pair (chunks 2m and 2m + 1, m = c // 2)
    starts in a (B, H, ceil(n_chunks / 2), 2, N, P) buffer."""
    return ((b.to(tl.int64) * H + h) * ((n_chunks + 1) // 2) + c // 2) * 2 * N * P


@triton.jit
def _chunk_scores_offsets(b, h, c, H, n_chunks, BT: tl.constexpr):
    """Offsets of chunk ``c``'s (BT, BT) scores in a (B, H, n_chunks, BT, BT) buffer."""
    j = tl.arange(0, BT)
    start = ((b.to(tl.int64) * H + h) * n_chunks + c) * BT * BT
    return start + j[:, None] * BT + j[None, :]


@triton.jit
def _matrix_scores_kernel(k_ptr, q_ptr, ll_ptr, sc_ptr, T, K, H, N, ll_sb, ll_st, n_chunks,
                          BT: tl.constexpr, BN: tl.constexpr):
    """One (batch row, head, chunk)'s scores, score[j, s] = Σ_n e^{R_jn − R_sn}
    Re(conj(q̂_jn) k̂_sn) (zero for s > j): the chunk's (BT, BT, BN) decays formed once,
    for every block of value columns the forward then reads them in."""
    b, h, c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    R, khr, khi, qhr, qhi, _, _, _, _, _, _, _ = _chunk(
        k_ptr, q_ptr, ll_ptr, b, h, c, T, K, N, ll_sb, ll_st, BT, BN)
    tl.store(sc_ptr + _chunk_scores_offsets(b, h, c, H, n_chunks, BT),
             _scores(_decay(R, BT), qhr, qhi, khr, khi))


@triton.jit
def _matrix_forward_kernel(k_ptr, v_ptr, q_ptr, ll_ptr, s0_ptr, sc_ptr, y_ptr, send_ptr,
                           st_ptr, T, K, H, N, P, ll_sb, ll_st, n_chunks,
                           BT: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr,
                           HAS_S0: tl.constexpr, WRITE_Y: tl.constexpr,
                           WRITE_STATES: tl.constexpr):
    """y for one (batch row, head, value block), from the chunks' scores
    (``_matrix_scores_kernel``'s), and the state it ends with; with WRITE_STATES (and no
    scores read) the state entering every even chunk too, S_in(2m) at m
    ((B, H, ceil(n_chunks / 2), 2, N, P))."""
    b, h, pb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    p = pb * BP + tl.arange(0, BP)
    pmask = p < P
    s_off, s_mask = _state_offsets(b, h, H, N, P, p, BN)
    inner = s_off - (b.to(tl.int64) * H + h) * 2 * N * P  # n·P + p
    Sr, Si = _block_or_zeros(s0_ptr, s_off, s_mask, N * P, k_ptr, BN, BP, HAS_S0)
    c = 0
    while c < n_chunks:  # a while: the interpreter's range() takes no runtime bound (scan_fused)
        R, khr, khi, qhr, qhi, R_end, cos_e, sin_e, _, _, t, ok = _chunk(
            k_ptr, q_ptr, ll_ptr, b, h, c, T, K, N, ll_sb, ll_st, BT, BN)
        v_off = (b.to(tl.int64) * T + t)[:, None] * (H * P) + h * P + p[None, :]
        vm = ok[:, None] & pmask[None, :]
        v = tl.load(v_ptr + v_off, mask=vm, other=0.0).to(khr.dtype)
        if WRITE_STATES:
            if c % 2 == 0:
                c_off = _pair_state_offset(b, h, c, H, N, P, n_chunks) + inner
                tl.store(st_ptr + c_off, Sr, mask=s_mask)
                tl.store(st_ptr + c_off + N * P, Si, mask=s_mask)
        if WRITE_Y:
            scores = tl.load(sc_ptr + _chunk_scores_offsets(b, h, c, H, n_chunks, BT))
            eR = tl.exp(R)
            y = tl.dot(scores, v, input_precision="ieee")
            y += tl.dot(qhr * eR, Sr, input_precision="ieee")
            y += tl.dot(qhi * eR, Si, input_precision="ieee")
            tl.store(y_ptr + v_off, y.to(y_ptr.dtype.element_ty), mask=vm)
        to_end = tl.exp(R_end[None, :] - R)
        wr = tl.dot(tl.trans(to_end * khr), v, input_precision="ieee")
        wi = tl.dot(tl.trans(to_end * khi), v, input_precision="ieee")
        a = tl.exp(R_end)
        ar, ai = (a * cos_e)[:, None], (a * sin_e)[:, None]
        cr, ci = cos_e[:, None], sin_e[:, None]
        # e^{A_end} S + e^{iφ_end} Û written out (not as two _turn sums): one FMA chain,
        # 16 fewer instructions a pass (kernel_check)
        Sr, Si = (ar * Sr - ai * Si + cr * wr - ci * wi,
                  ai * Sr + ar * Si + ci * wr + cr * wi)
        c += 1
    tl.store(send_ptr + s_off, Sr, mask=s_mask)
    tl.store(send_ptr + s_off + N * P, Si, mask=s_mask)


@triton.jit
def _matrix_dstates_kernel(k_ptr, q_ptr, ll_ptr, dy_ptr, dsend_ptr, dst_ptr, ds0_ptr,
                           T, K, H, N, P, ll_sb, ll_st, n_chunks,
                           BT: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr,
                           HAS_DSEND: tl.constexpr):
    """dL/dS for the state leaving every chunk of one (batch row, head, value block),
    walking the chunks backwards: dS <- e^{R_end} dŜ + Σ_j e^{R_j} q̂_j dy_jᵀ (module doc),
    stored for every odd chunk, dS_out(2m + 1) at m ((B, H, ceil(n_chunks / 2), 2, N, P),
    in the absolute frame), and the last one as the gradient of the state the scan
    started from. With an odd number of chunks the walk starts at chunk n_chunks, past T,
    whose step changes nothing (exactly: its decay is 1, its queries 0), so that the last
    pair's entry is dS_end."""
    b, h, pb = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    p = pb * BP + tl.arange(0, BP)
    s_off, s_mask = _state_offsets(b, h, H, N, P, p, BN)
    dSr, dSi = _block_or_zeros(dsend_ptr, s_off, s_mask, N * P, k_ptr, BN, BP, HAS_DSEND)
    inner = s_off - (b.to(tl.int64) * H + h) * 2 * N * P  # n·P + p
    c = (n_chunks + 1) // 2 * 2 - 1
    while c >= 0:
        R, _, _, qhr, qhi, R_end, cos_e, sin_e, _, _, t, ok = _chunk(
            k_ptr, q_ptr, ll_ptr, b, h, c, T, K, N, ll_sb, ll_st, BT, BN)
        if c % 2 == 1:
            c_off = _pair_state_offset(b, h, c, H, N, P, n_chunks) + inner
            tl.store(dst_ptr + c_off, dSr, mask=s_mask)
            tl.store(dst_ptr + c_off + N * P, dSi, mask=s_mask)
        dy_off = (b.to(tl.int64) * T + t)[:, None] * (H * P) + h * P + p[None, :]
        dy = tl.load(dy_ptr + dy_off, mask=ok[:, None] & (p < P)[None, :],
                     other=0.0).to(qhr.dtype)
        cr, ci = cos_e[:, None], sin_e[:, None]
        a = tl.exp(R_end)[:, None]
        eR = tl.exp(R)
        dShr, dShi = _unturn(dSr, dSi, cr, ci)  # e^{-iφ_end} dS
        dSr = a * dShr + tl.dot(tl.trans(qhr * eR), dy, input_precision="ieee")
        dSi = a * dShi + tl.dot(tl.trans(qhi * eR), dy, input_precision="ieee")
        c -= 1
    tl.store(ds0_ptr + s_off, dSr, mask=s_mask)
    tl.store(ds0_ptr + s_off + N * P, dSi, mask=s_mask)


@triton.jit
def _neighbour(k_ptr, q_ptr, ll_ptr, b, h, c, odd, T, K, H, N, P, ll_sb, ll_st,
               BT: tl.constexpr, BN: tl.constexpr):
    """Chunk ``c``'s pair neighbour's step, for ``_matrix_backward_kernel``: X (BT, BN),
    re and im, the coefficients its step multiplies its v or dy rows by (odd c: the
    neighbour's keys to its end, e^{R_end − R_s} k̂_s; even c: its queries, e^{R_j} q̂_j),
    e^{R_end}, cos φ_end and sin φ_end (BN,), its rows of v or dy and which are in T."""
    nb = c + 1 - 2 * (c % 2)
    R, khr, khi, qhr, qhi, R_end, cos_e, sin_e, _, _, t, ok = _chunk(
        k_ptr, q_ptr, ll_ptr, b, h, nb, T, K, N, ll_sb, ll_st, BT, BN)
    to_end = tl.exp(R_end[None, :] - R)
    eR = tl.exp(R)
    xr = tl.where(odd, to_end * khr, qhr * eR)
    xi = tl.where(odd, to_end * khi, qhi * eR)
    rows = (b.to(tl.int64) * T + t)[:, None] * (H * P) + h * P
    return xr, xi, tl.exp(R_end), cos_e, sin_e, rows, ok


@triton.jit
def _matrix_backward_kernel(k_ptr, v_ptr, q_ptr, ll_ptr, sc_ptr, st_ptr, dst_ptr, dy_ptr,
                            dk_ptr, dv_ptr, dq_ptr, within_ptr, total_ptr,
                            T, K, H, N, P, ll_sb, ll_st, n_chunks,
                            BT: tl.constexpr, BN: tl.constexpr, BP: tl.constexpr):
    """One (batch row, head, chunk), every value column: dk, dq and dv from the state
    entering and the gradient leaving the chunk (the module doc's formulas), and each
    step's share of d log λ, [Re | -Im](conj(q) dq) - [Re | -Im](conj(k) dk), summed
    back over the chunk's later steps (``within``, (B, chunks·BT, 2K): zeros past T)
    with the chunk's total apart (``total``, (B, chunks, 2K)), from which torch adds the later
    chunks' (:func:`_log_lam_grad`). The (BT, BT, BN) decays are formed once, for all
    columns.

    The scratch keeps one state of each pair of chunks (2m, 2m + 1), S_in(2m) and
    dS_out(2m + 1); the chunk's other one is a step of its neighbour (n) from the kept one:

        odd c:  S_in = e^{A_end,n} S + e^{iφ_end,n} W,   W = Xᵀ v_n   (the states pass's)
        even c: dS_out = e^{R_end,n} e^{-iφ_end,n} dS + U,   U = Xᵀ dy_n   (dstates')

    (X: ``_neighbour``'s; past T the neighbour's step changes nothing). The chunk reads
    its states only through products linear in them, so the step is taken on those
    rather than on the (N, P) states, whose layout would change twice a block of columns
    (benchmarks/kernel_check.py): with M_n = dy v_nᵀ (odd) or v dy_nᵀ (even), summed over
    the columns as M is, S dy_jᵀ (``read``) becomes e^{iφ_end,n} (e^{R_end,n} read +
    M_n X) and dŜ v_sᵀ (``write``) gains e^{-iφ_end} M_n X; dv's state term gains Z dy_n,
    Z = Re(w e^{iφ_end} Xᴴ), w the chunk's keys to its end, and takes the kept dS turned
    by the even chunk's factor."""
    b, h, c = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    odd, even = c % 2 == 1, c % 2 == 0
    R, khr, khi, qhr, qhi, R_end, cos_e, sin_e, cos_p, sin_p, t, ok = _chunk(
        k_ptr, q_ptr, ll_ptr, b, h, c, T, K, N, ll_sb, ll_st, BT, BN)
    n = tl.arange(0, BN)
    pair = _pair_state_offset(b, h, c, H, N, P, n_chunks)
    rows = (b.to(tl.int64) * T + t)[:, None] * (H * P) + h * P
    f32 = k_ptr.dtype.element_ty  # the arithmetic's (float32, or float64)
    M = tl.zeros((BT, BT), f32)  # dy_j · v_s over every column
    M_n = tl.zeros((BT, BT), f32)  # the neighbour's: dy_j · v_n,s (odd) or v_s · dy_n,j
    read_r = tl.zeros((BT, BN), f32)  # S dy_j, per eigenstate, of the kept state
    read_i = tl.zeros((BT, BN), f32)
    write_r = tl.zeros((BT, BN), f32)  # dŜ v_s
    write_i = tl.zeros((BT, BN), f32)
    # dv's chunk terms, so that dv is written in the same pass over the columns that sums
    # M and the state terms (its dy and dŜ read once): the forward's scores, and the decays
    # formed below, once
    scores_t = tl.trans(tl.load(sc_ptr + _chunk_scores_offsets(b, h, c, H, n_chunks, BT)))
    to_end = tl.exp(R_end[None, :] - R)
    wr, wi = khr * to_end, khi * to_end
    xr, xi, a_n, cos_n, sin_n, rows_n, ok_n = _neighbour(
        k_ptr, q_ptr, ll_ptr, b, h, c, odd, T, K, H, N, P, ll_sb, ll_st, BT, BN)
    # dŜ = g dS of the kept dS: g = e^{-iφ_end}, times e^{R_end,n} e^{-iφ_end,n} (even)
    gr, gi = _unturn(tl.where(odd, 1.0, a_n * cos_n), tl.where(odd, 0.0, -a_n * sin_n),
                     cos_e, sin_e)
    gr, gi = gr[:, None], gi[:, None]
    w_tr, w_ti = _turn(wr, wi, cos_e[None, :], sin_e[None, :])  # w e^{iφ_end}
    Z = tl.dot(w_tr, tl.trans(xr), input_precision="ieee")
    Z += tl.dot(w_ti, tl.trans(xi), input_precision="ieee")
    Z = tl.where(odd, 0.0, Z)  # (BT, BT): U's share of dv
    p0 = 0
    while p0 < P:
        p = p0 + tl.arange(0, BP)
        vm = ok[:, None] & (p < P)[None, :]
        v = tl.load(v_ptr + rows + p[None, :], mask=vm, other=0.0).to(f32)
        dy = tl.load(dy_ptr + rows + p[None, :], mask=vm, other=0.0).to(f32)
        # the neighbour's v (odd) or dy (even) rows of these columns: one of the two reads
        vm_n = ok_n[:, None] & (p < P)[None, :]
        y_n = tl.load(v_ptr + rows_n + p[None, :], mask=vm_n & odd, other=0.0).to(f32) \
            + tl.load(dy_ptr + rows_n + p[None, :], mask=vm_n & even,
                      other=0.0).to(f32)
        s_off = pair + n[:, None] * P + p[None, :]
        s_mask = (n < N)[:, None] & (p < P)[None, :]
        Sr = tl.load(st_ptr + s_off, mask=s_mask, other=0.0)
        Si = tl.load(st_ptr + s_off + N * P, mask=s_mask, other=0.0)
        dSr = tl.load(dst_ptr + s_off, mask=s_mask, other=0.0)
        dSi = tl.load(dst_ptr + s_off + N * P, mask=s_mask, other=0.0)
        dShr, dShi = gr * dSr - gi * dSi, gi * dSr + gr * dSi
        M += tl.dot(dy, tl.trans(v), input_precision="ieee")
        M_n += tl.dot(tl.where(odd, dy, v), tl.trans(y_n), input_precision="ieee")
        read_r += tl.dot(dy, tl.trans(Sr), input_precision="ieee")
        read_i += tl.dot(dy, tl.trans(Si), input_precision="ieee")
        write_r += tl.dot(v, tl.trans(dShr), input_precision="ieee")
        write_i += tl.dot(v, tl.trans(dShi), input_precision="ieee")
        dv = tl.dot(scores_t, dy, input_precision="ieee")
        dv += tl.dot(wr, dShr, input_precision="ieee")
        dv += tl.dot(wi, dShi, input_precision="ieee")
        dv += tl.dot(Z, y_n, input_precision="ieee")
        tl.store(dv_ptr + rows + p[None, :], dv.to(dv_ptr.dtype.element_ty), mask=vm)
        p0 += BP
    mxr = tl.dot(M_n, xr, input_precision="ieee")
    mxi = tl.dot(M_n, xi, input_precision="ieee")
    # odd: the read of S_in = e^{iφ_end,n} (e^{R_end,n} read + M_n X); even: the write of
    # U's share, e^{-iφ_end} M_n X
    in_r, in_i = _turn(a_n[None, :] * read_r + mxr, a_n[None, :] * read_i + mxi,
                       cos_n[None, :], sin_n[None, :])
    read_r, read_i = tl.where(odd, in_r, read_r), tl.where(odd, in_i, read_i)
    u_r, u_i = _unturn(mxr, mxi, cos_e[None, :], sin_e[None, :])
    write_r, write_i = tl.where(odd, write_r, write_r + u_r), tl.where(odd, write_i,
                                                                        write_i + u_i)
    # the chunk read again rather than held through the loop: held, it spilled
    # (kernel_check; the neighbour's X, held, did not)
    R, khr, khi, qhr, qhi, R_end, cos_e, sin_e, cos_p, sin_p, t, ok = _chunk(
        k_ptr, q_ptr, ll_ptr, b, h, c, T, K, N, ll_sb, ll_st, BT, BN)
    D = _decay(R, BT)
    eR = tl.exp(R)
    to_end = tl.exp(R_end[None, :] - R)
    DM = D * M[:, :, None]  # [j, s, n]
    dqhr = tl.sum(DM * khr[None, :, :], axis=1) + eR * read_r
    dqhi = tl.sum(DM * khi[None, :, :], axis=1) + eR * read_i
    dkhr = tl.sum(DM * qhr[:, None, :], axis=0) + to_end * write_r
    dkhi = tl.sum(DM * qhi[:, None, :], axis=0) + to_end * write_i
    row = (b.to(tl.int64) * T + t)[:, None] * (2 * K) + (h * N + n)[None, :]
    m = ok[:, None] & (n < N)[None, :]
    dqr, dqi = _turn(dqhr, dqhi, cos_p, sin_p)  # e^{iφ} dq̂
    dkr, dki = _turn(dkhr, dkhi, cos_p, sin_p)
    tl.store(dq_ptr + row, dqr.to(dq_ptr.dtype.element_ty), mask=m)
    tl.store(dq_ptr + row + K, dqi.to(dq_ptr.dtype.element_ty), mask=m)
    tl.store(dk_ptr + row, dkr, mask=m)
    tl.store(dk_ptr + row + K, dki, mask=m)
    # conj(q) dq and conj(k) dk do not change when both turn by e^{-iφ}: the rotated ones
    # (0 past T, where q and k are)
    share_r = qhr * dqhr + qhi * dqhi - khr * dkhr - khi * dkhi
    share_i = qhi * dqhr - qhr * dqhi - khr * dkhi + khi * dkhr
    col = h * N + n
    padded = (b.to(tl.int64) * n_chunks * BT + t)[:, None] * (2 * K) + col[None, :]
    nm = (n < N)[None, :]  # every step of the chunk, past T too
    tl.store(within_ptr + padded, tl.cumsum(share_r, axis=0, reverse=True), mask=nm)
    tl.store(within_ptr + padded + K, tl.cumsum(share_i, axis=0, reverse=True), mask=nm)
    chunk = (b.to(tl.int64) * n_chunks + c) * (2 * K) + col
    tl.store(total_ptr + chunk, tl.sum(share_r, axis=0), mask=n < N)
    tl.store(total_ptr + chunk + K, tl.sum(share_i, axis=0), mask=n < N)


# True when triton built the kernels for its interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED = type(_matrix_forward_kernel).__name__ == "InterpretedFunction"

# The chunk: tl.dot takes no dimension under 16, and the (BT, BT, BN) decay tile grows
# with its square.
BLOCK_T = 16
# (value columns a program takes at a time, warps) per kernel, from benchmarks/
# kernel_check.py at the flagship's head (N 32, P 256): no spills, and as many programs
# an SM as the registers allow. The forward, states and dstates passes walk the chunks in
# order, B·H·P/BP programs: at the job's micro-batch (4 x 32,768, 4 heads) 128 at 32
# columns, one an SM, so a pass's instructions a warp set their time; 64 columns issue
# fewer in all but more a pass, on half the SMs (BENCHMARKS.md).
SCORES_WARPS = 4  # the chunks' scores: one program a chunk, its (16, 16, N) decays
FORWARD_BLOCK = (32, 4)  # the forward and the states pass: a block of the state held
DSTATES_BLOCK = (32, 4)  # dS held the same way
BACKWARD_BLOCK = (16, 8)  # one chunk, every column in one pass: at 32 columns it spilled


def _block_n(N: int) -> int:
    """BN: the head's eigenstates in one block (at least 16, as tl.dot takes)."""
    return max(16, triton.next_power_of_2(N))


def _block_p(P: int, most: int) -> int:
    """BP: a program's value columns, at least 16 and at most ``most``."""
    return max(16, min(most, triton.next_power_of_2(P)))


def _launch_shape(k: Tensor, v: Tensor, heads: int) -> tuple[int, int, int, int, int, int]:
    B, T, K2 = k.shape
    K = K2 // 2
    return B, T, K, K // heads, v.shape[-1] // heads, math.ceil(T / BLOCK_T)


def _pairs(n_chunks: int) -> int:
    """The scratch buffers' states: one for each pair of chunks (the backward kernel's doc)."""
    return (n_chunks + 1) // 2


def _ll_strides(log_lam: Tensor) -> tuple[int, int]:
    """(batch, time) strides of log λ: 0 for a fixed one (2K,), read the same everywhere."""
    if log_lam.dim() == 1:
        return 0, 0
    return log_lam.stride(0), log_lam.stride(1)


def _forward(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, s0: Tensor | None, heads: int,
             scores: Tensor | None) -> tuple[Tensor, Tensor, Tensor | None]:
    """(y, the last state (B, H, 2, N, P), None) from the chunks' scores; without them
    (the backward's states pass) (an empty y, the last state, the states entering the
    chunks)."""
    B, T, K, N, P, n_chunks = _launch_shape(k, v, heads)
    BP, warps = _block_p(P, FORWARD_BLOCK[0]), FORWARD_BLOCK[1]
    write_y = scores is not None
    y = torch.empty_like(v) if write_y else v.new_empty(0)
    s_end = k.new_empty(B, heads, 2, N, P)
    states = None if write_y else k.new_empty(B, heads, _pairs(n_chunks), 2, N, P)
    grid = (B, heads, math.ceil(P / BP))
    _matrix_forward_kernel[grid](
        k, v, q, log_lam, s0 if s0 is not None else v, scores if write_y else v, y, s_end,
        states if states is not None else v, T, K, heads, N, P, *_ll_strides(log_lam),
        n_chunks, BT=BLOCK_T, BN=_block_n(N), BP=BP, HAS_S0=s0 is not None, WRITE_Y=write_y,
        WRITE_STATES=not write_y, num_warps=warps)
    return y, s_end, states


# The kernels as torch operators (ten.kernels.ops), as the vector scan's: opaque to
# torch.compile, traceable under FakeTensorMode by their fakes. The backward is three, so
# that a trace (ten.train.memory, bench_traffic) sees its two buffers of chunk states.

def _scores_impl(k: Tensor, q: Tensor, log_lam: Tensor, heads: int) -> Tensor:
    """Every chunk's (16, 16) scores, (B, H, T/16, 16, 16), for the forward to read."""
    B, T, K, N, _, n_chunks = _launch_shape(k, q, heads)
    scores = _scores_fake(k, q, log_lam, heads)
    _matrix_scores_kernel[(B, heads, n_chunks)](
        k, q, log_lam, scores, T, K, heads, N, *_ll_strides(log_lam), n_chunks,
        BT=BLOCK_T, BN=_block_n(N), num_warps=SCORES_WARPS)
    return scores


def _scores_fake(k, q, log_lam, heads):
    B, T, _, _, _, n_chunks = _launch_shape(k, q, heads)
    return k.new_empty(B, heads, n_chunks, BLOCK_T, BLOCK_T)


def _forward_impl(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, s0: Tensor | None,
                  scores: Tensor, heads: int) -> tuple[Tensor, Tensor]:
    y, s_end, _ = _forward(k, v, q, log_lam, s0, heads, scores)
    return y, s_end


def _forward_fake(k, v, q, log_lam, s0, scores, heads):
    B, T, K, N, P, n_chunks = _launch_shape(k, v, heads)
    return torch.empty_like(v), k.new_empty(B, heads, 2, N, P)


def _states_impl(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, s0: Tensor | None,
                 heads: int) -> Tensor:
    """The states entering the even chunks, (B, H, T/32, 2, N, P), recomputed for the
    backward."""
    return _forward(k, v, q, log_lam, s0, heads, None)[2]


def _states_fake(k, v, q, log_lam, s0, heads):
    B, T, K, N, P, n_chunks = _launch_shape(k, v, heads)
    return k.new_empty(B, heads, _pairs(n_chunks), 2, N, P)


def _dstates_impl(k: Tensor, q: Tensor, log_lam: Tensor, dy: Tensor, ds_end: Tensor | None,
                  heads: int) -> tuple[Tensor, Tensor]:
    """(dL/dS leaving the odd chunks (B, H, T/32, 2, N, P), d s0 (B, H, 2, N, P))."""
    B, T, K, N, P, n_chunks = _launch_shape(k, dy, heads)
    BP, warps = _block_p(P, DSTATES_BLOCK[0]), DSTATES_BLOCK[1]
    dstates, ds0 = _dstates_fake(k, q, log_lam, dy, ds_end, heads)
    _matrix_dstates_kernel[(B, heads, math.ceil(P / BP))](
        k, q, log_lam, dy, ds_end if ds_end is not None else dy, dstates, ds0,
        T, K, heads, N, P, *_ll_strides(log_lam), n_chunks,
        BT=BLOCK_T, BN=_block_n(N), BP=BP, HAS_DSEND=ds_end is not None, num_warps=warps)
    return dstates, ds0


def _dstates_fake(k, q, log_lam, dy, ds_end, heads):
    B, T, K, N, P, n_chunks = _launch_shape(k, dy, heads)
    return k.new_empty(B, heads, _pairs(n_chunks), 2, N, P), k.new_empty(B, heads, 2, N, P)


def _backward_impl(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, scores: Tensor,
                   states: Tensor, dstates: Tensor, dy: Tensor, heads: int
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dk, dq, dv, the steps' shares of d log λ summed within their chunk
    (B, chunks·BT, 2K), each chunk's total (B, chunks, 2K))."""
    B, T, K, N, P, n_chunks = _launch_shape(k, v, heads)
    dk, dq, dv, within, total = _backward_fake(k, v, q, log_lam, scores, states, dstates,
                                               dy, heads)
    _matrix_backward_kernel[(B, heads, n_chunks)](
        k, v, q, log_lam, scores, states, dstates, dy, dk, dv, dq, within, total,
        T, K, heads, N, P, *_ll_strides(log_lam), n_chunks,
        BT=BLOCK_T, BN=_block_n(N), BP=_block_p(P, BACKWARD_BLOCK[0]),
        num_warps=BACKWARD_BLOCK[1])
    return dk, dq, dv, within, total


def _backward_fake(k, v, q, log_lam, scores, states, dstates, dy, heads):
    B, T, K, N, P, n_chunks = _launch_shape(k, v, heads)
    return (torch.empty_like(k), torch.empty_like(q), torch.empty_like(v),
            k.new_empty(B, n_chunks * BLOCK_T, 2 * K), k.new_empty(B, n_chunks, 2 * K))


def _setup_context(ctx, inputs, output) -> None:
    k, v, q, log_lam, s0, scores, heads = inputs
    ctx.save_for_backward(k, v, q, log_lam, s0, scores, output[1])
    ctx.heads = heads


def _backward(ctx, dy: Tensor | None, ds_end: Tensor | None):
    k, v, q, log_lam, s0, scores, s_end = ctx.saved_tensors
    dy = torch.zeros_like(v) if dy is None else dy.contiguous()
    ds_end = None if ds_end is None else ds_end.contiguous()
    states = _states_op(k, v, q, log_lam, s0, ctx.heads)
    dstates, ds0 = _dstates_op(k, q, log_lam, dy, ds_end, ctx.heads)
    dk, dq, dv, within, totals = _backward_op(k, v, q, log_lam, scores, states, dstates, dy,
                                              ctx.heads)
    return (dk, dv, dq, _log_lam_grad(within, totals, log_lam, k.shape[1], s_end, ds_end),
            ds0 if s0 is not None else None, None, None)


def _log_lam_grad(within: Tensor, totals: Tensor, log_lam: Tensor, T: int, s_end: Tensor,
                  ds_end: Tensor | None) -> Tensor:
    """d log λ (the module docstring): each step's reads minus its writes, summed over
    that step and every later one, plus the last state's read when it has a gradient.
    The backward kernel gave the sums within each chunk (``within``, (B, chunks·BT, 2K))
    and each chunk's total (B, chunks, 2K); here the later chunks' totals, and the read,
    are added to a chunk's steps in one pass (a flip, a cumsum and a flip over
    (B, T, 2K), then an add, had taken four: of the flagship's micro-batch, 8.6 GB)."""
    later = totals.flip(1).cumsum(1).flip(1) - totals  # small: a float a chunk
    if ds_end is not None:  # Re / -Im of Σ_p conj(dC) C per eigenstate, at every step
        Cr, Ci, dCr, dCi = s_end[:, :, 0], s_end[:, :, 1], ds_end[:, :, 0], ds_end[:, :, 1]
        read = torch.cat([(dCr * Cr + dCi * Ci).sum(-1).flatten(1),
                          (dCi * Cr - dCr * Ci).sum(-1).flatten(1)], dim=-1)  # (B, 2K)
        later = later + read[:, None, :]
    B, chunks, K2 = totals.shape
    d = (within.view(B, chunks, BLOCK_T, K2) + later[:, :, None, :]).view(B, -1, K2)[:, :T]
    # (a copy only where T is not a multiple of the chunk)
    return d.contiguous() if log_lam.dim() == 3 else d.sum(dim=(0, 1))


_states_op = define(
    "matrix_scan_fused_states(Tensor k, Tensor v, Tensor q, Tensor log_lam, Tensor? s0, "
    "int heads) -> Tensor", _states_impl, _states_fake)
_dstates_op = define(
    "matrix_scan_fused_dstates(Tensor k, Tensor q, Tensor log_lam, Tensor dy, Tensor? ds_end, "
    "int heads) -> (Tensor, Tensor)", _dstates_impl, _dstates_fake)
_backward_op = define(
    "matrix_scan_fused_backward(Tensor k, Tensor v, Tensor q, Tensor log_lam, Tensor scores, "
    "Tensor states, Tensor dstates, Tensor dy, int heads) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)", _backward_impl, _backward_fake)
_scores_op = define(
    "matrix_scan_fused_scores(Tensor k, Tensor q, Tensor log_lam, int heads) -> Tensor",
    _scores_impl, _scores_fake)
_forward_op = define(
    "matrix_scan_fused_forward(Tensor k, Tensor v, Tensor q, Tensor log_lam, Tensor? s0, "
    "Tensor scores, int heads) -> (Tensor, Tensor)", _forward_impl, _forward_fake,
    backward=_backward, setup_context=_setup_context)


def matrix_scan_fused(k: Tensor, v: Tensor, q: Tensor, log_lam: Tensor, state: Tensor | None,
                      heads: int) -> tuple[Tensor, Tensor]:
    """Fused backend: the result of ``matrix_scan_ref`` (y (B, T, H·P), the last state
    (B, H, N, P) complex) from keys and log λ in float32 or float64 and values and
    queries in that dtype or a narrower one (bf16, fp16) on one device; y in the values'
    dtype."""
    s0 = None if state is None else torch.stack([state.real, state.imag], dim=2).contiguous()
    k, v, q, log_lam = k.contiguous(), v.contiguous(), q.contiguous(), log_lam.contiguous()
    # the scores are a function of k, q and log λ whose gradient the forward's backward
    # gives whole (through them): they enter it as a constant, kept for the backward's dv
    scores = _scores_op(k.detach(), q.detach(), log_lam.detach(), heads)
    y, s_end = _forward_op(k, v, q, log_lam, s0, scores, heads)
    return y, torch.complex(s_end[:, :, 0], s_end[:, :, 1])
