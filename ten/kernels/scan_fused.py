"""The ``fused`` scan backend: Triton kernels for ``c_t = λ_t · c_{t-1} + β_t`` and its
backward, with the signature and the [re | im] layout of ``ten.kernels.scan.scan_ref``.

Imported only when the ``fused`` backend is asked for (``ten.kernels.scan`` works without
triton). Triton picks compiled-for-the-GPU or interpreted once per process: with
``TRITON_INTERPRET=1`` in the environment before triton is first imported (and still
there at the first launch), the kernels run on CPU tensors (numpy underneath, float64
included), which is how the tests check them against ``ref`` without a GPU.
``INTERPRETED`` says which mode this module's kernels were built in.

Why not a library kernel (flash-linear-attention's element-wise recurrences): those take a
real decay, so the rotation would move onto inputs and outputs as e^{∓iΘ_t} with the
running phase Θ_t = θ_0 + … + θ_t, which reaches thousands of radians at T = 32K, where one
float32 ulp is already ~2e-4 rad before T additions' rounding adds up (and selective θ_t
needs its own cumulative sum). A complex recurrence needs no such trick. Which is faster
is for a GPU run of benchmarks/bench_scan.py to say.

The design. The recurrence is diagonal: every eigenstate lane k is independent, so a
program owns one batch row and a block of BK lanes, and walks time in tiles of BT rows.
Inside a tile the steps are combined by ``tl.associative_scan`` on pairs (a, b) meaning
"x -> a·x + b" (complex): (a1, b1) then (a2, b2) is (a2·a1, a2·b1 + b2). That gives for
every row the decay from the tile's start, A_t, and the state from a zero start, U_t, so
c_t = U_t + A_t · c_in. Rows past T are the identity step (a = 1, b = 0), so a tile's
last row always holds its summary.

Parallelism over time, when B·K alone would leave the GPU idle: T is cut into G groups
of whole tiles. (1) ``_scan_summary_kernel`` gives each group's end state from zero and its
total decay; (2) ``_scan_carry_kernel`` scans the short G-step recurrence over groups to get
the state entering each; (3) ``_scan_forward_kernel`` runs each group again from that state
and writes c. With G = 1 only (3) runs: β and λ read once, c written once.

Backward is the same recurrence run backwards in time (``REVERSE``):
    g_t = dL/dc_t + conj(λ_{t+1}) · g_{t+1}     (g_{T-1} = dL/dc_{T-1})
    dL/dβ_t = g_t
    dL/d log λ_t = conj(λ_t) · g_t · conj(c_{t-1})      (c_{-1}: the carried state)
    dL/d state = conj(λ_0) · g_0
"d/d log λ" is [d/d log|λ| | d/d arg λ]: λ = exp(log λ) is holomorphic, so the real-pair
gradient is conj(λ') · dL/dλ with λ' = λ, and dL/dλ_t = g_t · conj(c_{t-1}). Fixed
eigenvalues (2K,) sum this over every batch row and step: each program sums its own rows
and torch adds the (B, G, 2K) partial sums.

All arithmetic is in the dtype it is given (``scan()`` passes float32, or float64).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from ten.kernels.ops import define

__all__ = ["INTERPRETED", "Plan", "plan", "scan_fused", "tiles_per_group"]


# --- kernels -------------------------------------------------------------------------------

@triton.jit
def _combine(ar1, ai1, br1, bi1, ar2, ai2, br2, bi2):
    """(a1, b1) then (a2, b2): x -> a2·(a1·x + b1) + b2, complex."""
    return (ar2 * ar1 - ai2 * ai1,
            ar2 * ai1 + ai2 * ar1,
            ar2 * br1 - ai2 * bi1 + br2,
            ar2 * bi1 + ai2 * br1 + bi2)


@triton.jit
def _sincos(x):
    """(sin x, cos x), sharing one argument reduction. libdevice's sinf and cosf reduce
    each on its own and keep a slow path for |x| past ~1e5 (a loop, a stack frame); the
    scans evaluate λ's rotation per element in every pass, and with this pair their loops
    issue 13-21% fewer instructions (benchmarks/kernel_check.py).

    float32: x = q·π/2 + r, with π/2 split in three parts whose products with q are exact
    without a fused multiply-add (Cody and Waite's reduction; the interpreter's arithmetic
    agrees; exact to |x| ~ 8e3, far past a step's angle), then sin and cos of r in
    [-π/4, π/4] by minimax polynomials (Cephes' sinf/cosf coefficients, ~1 ulp), and the
    quadrant q mod 4 picking and signing them. float64 keeps libdevice's.
    """
    if x.dtype == tl.float64:
        return tl.sin(x), tl.cos(x)
    q = tl.floor(x * 0.6366197466850281 + 0.5)  # nearest multiple of π/2
    r = x - q * 1.5703125  # 8 significant bits: q·1.5703125 is exact for |q| < 2^16
    r = r - q * 4.837512969970703125e-4
    r = r - q * 7.54978995489188216e-8
    r2 = r * r
    s = r + r * r2 * (-1.6666654611e-1 + r2 * (8.3321608736e-3 + r2 * -1.9515295891e-4))
    c = 1.0 - 0.5 * r2 + r2 * r2 * (4.166664568298827e-2 + r2 * (
        -1.388731625493765e-3 + r2 * 2.443315711809948e-5))
    n = q.to(tl.int32)
    odd = (n & 1) != 0
    sin_x = tl.where(odd, c, s)
    cos_x = tl.where(odd, s, c)
    sin_x = tl.where((n & 2) != 0, -sin_x, sin_x)
    cos_x = tl.where(((n + 1) & 2) != 0, -cos_x, cos_x)
    return sin_x, cos_x


@triton.jit
def _last_row(x, rows, BT: tl.constexpr):
    """Row BT-1 of a (BT, BK) tile, as (BK,)."""
    return tl.sum(tl.where(rows[:, None] == BT - 1, x, 0.0), axis=0)


@triton.jit
def _rows(b, r0, T, BT: tl.constexpr, REVERSE: tl.constexpr):
    """Scan rows r0 .. r0+BT-1 of batch row b: (row offset in (B·T), time t, valid)."""
    i = tl.arange(0, BT)
    r = r0 + i
    ok = r < T
    if REVERSE:
        t = T - 1 - r
    else:
        t = r
    return b.to(tl.int64) * T + t, t, ok, i


@triton.jit
def _load_lambda(ll_ptr, row, k, m2, K, BT: tl.constexpr, BK: tl.constexpr,
                 SELECTIVE: tl.constexpr):
    """λ = exp(log|λ|)·e^{i arg λ} at the given rows (selective) or per lane (fixed)."""
    if SELECTIVE:
        off = row[:, None] * (2 * K) + k[None, :]
        lm = tl.load(ll_ptr + off, mask=m2, other=0.0)
        la = tl.load(ll_ptr + off + K, mask=m2, other=0.0)
        mag = tl.exp(lm)
        sin_a, cos_a = _sincos(la)
        lr = mag * cos_a
        li = mag * sin_a
    else:
        kmask = k < K
        lm = tl.load(ll_ptr + k, mask=kmask, other=0.0)
        la = tl.load(ll_ptr + K + k, mask=kmask, other=0.0)
        mag = tl.exp(lm)  # once per lane, then the same for every row
        sin_a, cos_a = _sincos(la)
        lr = tl.broadcast_to((mag * cos_a)[None, :], (BT, BK))
        li = tl.broadcast_to((mag * sin_a)[None, :], (BT, BK))
    return lr, li


@triton.jit
def _tile_inputs(x_ptr, b, r0, k, T, K, BT: tl.constexpr, REVERSE: tl.constexpr):
    """A tile's x rows (re, im), and which row's λ steps each one: forward λ_t (valid rows),
    REVERSE λ_{t+1} (none past the last step). Returns (xr, xi, row, t, ok, i, m2, off,
    lam_row, lam_ok)."""
    row, t, ok, i = _rows(b, r0, T, BT, REVERSE)
    kmask = k < K
    m2 = ok[:, None] & kmask[None, :]
    off = row[:, None] * (2 * K) + k[None, :]
    xr = tl.load(x_ptr + off, mask=m2, other=0.0)
    xi = tl.load(x_ptr + off + K, mask=m2, other=0.0)
    if REVERSE:
        lam_row, lam_ok = row + 1, ok & (t + 1 < T)
    else:
        lam_row, lam_ok = row, ok
    return xr, xi, row, t, ok, i, m2, off, lam_row, lam_ok


@triton.jit
def _tile(x_ptr, ll_ptr, b, r0, k, T, K, BT: tl.constexpr, BK: tl.constexpr,
          SELECTIVE: tl.constexpr, REVERSE: tl.constexpr):
    """One tile scanned: (A, U) as (Ar, Ai, Ur, Ui), each (BT, BK), plus the rows.

    Forward the step at t is (λ_t, β_t); REVERSE reads rows backwards in time and the
    step is (conj(λ_{t+1}), x_t) with x = dL/dc. Invalid rows are (1, 0).
    """
    xr, xi, row, t, ok, i, m2, off, lam_row, lam_ok = _tile_inputs(x_ptr, b, r0, k, T, K, BT,
                                                                   REVERSE)
    lam_m2 = lam_ok[:, None] & (k < K)[None, :]
    ar, ai = _load_lambda(ll_ptr, lam_row, k, lam_m2, K, BT, BK, SELECTIVE)
    if REVERSE:
        ai = -ai
    ar = tl.where(lam_ok[:, None], ar, 1.0)
    ai = tl.where(lam_ok[:, None], ai, 0.0)
    Ar, Ai, Ur, Ui = tl.associative_scan((ar, ai, xr, xi), 0, _combine)
    return Ar, Ai, Ur, Ui, row, t, ok, i, m2, off


@triton.jit
def _tile_total(x_ptr, ll_ptr, b, r0, k, T, K, BT: tl.constexpr, SELECTIVE: tl.constexpr,
                REVERSE: tl.constexpr):
    """One tile's steps composed into one, (A, U): A = λ_1···λ_n, U = Σ_i (Π_{j>i} λ_j) x_i.

    In log space, where composing is adding: A = exp(Σ_j log λ_j), and x_i's weight is
    exp of the suffix sum Σ_{j>i} log λ_j (selective: a running sum over the rows; fixed:
    the count of later rows times the lane's log λ). Scanning the steps as complex pairs
    (``_tile``) and picking out the last row cost the summary pass 15% more instructions
    (selective) or twice as many (fixed); see benchmarks/kernel_check.py. The sums span
    one tile, so the angles stay small: float32 keeps ~2e-6 of the largest value over 256
    steps (tests/ten/kernels/test_scan_fused.py). Steps as in ``_tile``; invalid rows: log λ = 0.
    """
    xr, xi, row, t, ok, i, m2, off, lam_row, lam_ok = _tile_inputs(x_ptr, b, r0, k, T, K, BT,
                                                                   REVERSE)
    kmask = k < K
    if SELECTIVE:
        lam_m2 = lam_ok[:, None] & kmask[None, :]
        lam_off = lam_row[:, None] * (2 * K) + k[None, :]
        lm = tl.load(ll_ptr + lam_off, mask=lam_m2, other=0.0)
        la = tl.load(ll_ptr + lam_off + K, mask=lam_m2, other=0.0)
        wm = tl.cumsum(lm, axis=0, reverse=True) - lm  # Σ_{j>i}
        wa = tl.cumsum(la, axis=0, reverse=True) - la
        total_m, total_a = tl.sum(lm, axis=0), tl.sum(la, axis=0)
    else:  # one λ per lane: the sums are counts of the rows that step
        lm = tl.load(ll_ptr + k, mask=kmask, other=0.0)
        la = tl.load(ll_ptr + K + k, mask=kmask, other=0.0)
        steps = lam_ok.to(lm.dtype)
        after = tl.cumsum(steps, axis=0, reverse=True) - steps
        wm, wa = after[:, None] * lm[None, :], after[:, None] * la[None, :]
        n = tl.sum(steps, axis=0)
        total_m, total_a = n * lm, n * la
    mag = tl.exp(wm)
    sin_w, cos_w = _sincos(wa)
    sin_a, cos_a = _sincos(total_a)
    if REVERSE:  # conj(λ): the angles' signs flipped
        sin_w = -sin_w
        sin_a = -sin_a
    wr = mag * cos_w
    wi = mag * sin_w
    ur = tl.sum(wr * xr - wi * xi, axis=0)
    ui = tl.sum(wr * xi + wi * xr, axis=0)
    am = tl.exp(total_m)
    return am * cos_a, am * sin_a, ur, ui


@triton.jit
def _scan_summary_kernel(x_ptr, ll_ptr, end_ptr, dec_ptr, T, K, G, tiles,
                    BT: tl.constexpr, BK: tl.constexpr,
                    SELECTIVE: tl.constexpr, REVERSE: tl.constexpr):
    """Per (b, lane block, group): the group's end state from zero, and its decay."""
    b, kb, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k = kb * BK + tl.arange(0, BK)
    kmask = k < K
    sr = tl.zeros((BK,), x_ptr.dtype.element_ty)
    si = tl.zeros((BK,), x_ptr.dtype.element_ty)
    dr = sr + 1.0
    di = tl.zeros((BK,), x_ptr.dtype.element_ty)
    j = 0
    while j < tiles:  # a while, not range(tiles): see _scan_forward_kernel
        ar, ai, ur, ui = _tile_total(x_ptr, ll_ptr, b, (g * tiles + j) * BT, k, T, K, BT,
                                     SELECTIVE, REVERSE)
        sr, si = ar * sr - ai * si + ur, ar * si + ai * sr + ui
        dr, di = ar * dr - ai * di, ar * di + ai * dr
        j += 1
    out = (b.to(tl.int64) * G + g) * (2 * K) + k
    tl.store(end_ptr + out, sr, mask=kmask)
    tl.store(end_ptr + out + K, si, mask=kmask)
    tl.store(dec_ptr + out, dr, mask=kmask)
    tl.store(dec_ptr + out + K, di, mask=kmask)


@triton.jit
def _scan_carry_kernel(end_ptr, dec_ptr, h0_ptr, sin_ptr, K, G, BG: tl.constexpr,
                       BK: tl.constexpr, HAS_H0: tl.constexpr):
    """The state entering each group: S_g = dec_{g-1}·S_{g-1} + end_{g-1}, S_0 = h0.

    The groups' steps (dec_g, end_g) are themselves a recurrence, scanned like a tile's
    rows: BG groups at a time, so the G steps take G/BG dependent passes, not G (walked
    one group after another it took ~28 µs a call on an H100 at G = 132, by the profile).
    """
    b, kb = tl.program_id(0), tl.program_id(1)
    k = kb * BK + tl.arange(0, BK)
    kmask = k < K
    if HAS_H0:
        sr = tl.load(h0_ptr + b.to(tl.int64) * (2 * K) + k, mask=kmask, other=0.0)
        si = tl.load(h0_ptr + b.to(tl.int64) * (2 * K) + K + k, mask=kmask, other=0.0)
    else:
        sr = tl.zeros((BK,), end_ptr.dtype.element_ty)
        si = tl.zeros((BK,), end_ptr.dtype.element_ty)
    first = b.to(tl.int64) * G * (2 * K) + k
    tl.store(sin_ptr + first, sr, mask=kmask)  # S_0
    tl.store(sin_ptr + first + K, si, mask=kmask)
    i = tl.arange(0, BG)
    g0 = 0
    while g0 < G:
        g = g0 + i
        m2 = (g < G)[:, None] & kmask[None, :]
        off = (b.to(tl.int64) * G + g)[:, None] * (2 * K) + k[None, :]
        ar = tl.load(dec_ptr + off, mask=m2, other=1.0)  # past G: the identity step
        ai = tl.load(dec_ptr + off + K, mask=m2, other=0.0)
        ur = tl.load(end_ptr + off, mask=m2, other=0.0)
        ui = tl.load(end_ptr + off + K, mask=m2, other=0.0)
        Ar, Ai, Ur, Ui = tl.associative_scan((ar, ai, ur, ui), 0, _combine)
        # the state leaving group g is the one entering g + 1: stored one group on
        leaving = (g + 1 < G)[:, None] & kmask[None, :]
        _, _, sr, si = _from_state(Ar, Ai, Ur, Ui, sr, si, sin_ptr + 2 * K, off, leaving, i,
                                   K, BG)
        g0 += BG


@triton.jit
def _entering_state(sin_ptr, b, g, G, K, k, kmask):
    """The state entering group ``g`` of batch row ``b`` (re, im), and its offset."""
    s_off = (b.to(tl.int64) * G + g) * (2 * K) + k
    sr = tl.load(sin_ptr + s_off, mask=kmask, other=0.0)
    si = tl.load(sin_ptr + s_off + K, mask=kmask, other=0.0)
    return sr, si, s_off


@triton.jit
def _from_state(Ar, Ai, Ur, Ui, sr, si, out_ptr, off, m2, i, K, BT: tl.constexpr):
    """A tile's values from the state entering it, x = U + A·s (complex), stored at
    ``out_ptr``; returns them and the tile's last row, the state leaving it."""
    xr = Ur + Ar * sr[None, :] - Ai * si[None, :]
    xi = Ui + Ar * si[None, :] + Ai * sr[None, :]
    tl.store(out_ptr + off, xr, mask=m2)
    tl.store(out_ptr + off + K, xi, mask=m2)
    return xr, xi, _last_row(xr, i, BT), _last_row(xi, i, BT)


@triton.jit
def _scan_forward_kernel(x_ptr, ll_ptr, sin_ptr, c_ptr, T, K, G, tiles,
                    BT: tl.constexpr, BK: tl.constexpr, SELECTIVE: tl.constexpr):
    """c for one group of tiles, from the state entering the group."""
    b, kb, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k = kb * BK + tl.arange(0, BK)
    kmask = k < K
    sr, si, s_off = _entering_state(sin_ptr, b, g, G, K, k, kmask)
    # Loops over a runtime count are while loops: Triton 3.6's interpreter cannot take a
    # runtime int as range()'s bound under NumPy >= 2.4 (3.7 can); compiled, both are loops.
    j = 0
    while j < tiles:
        Ar, Ai, Ur, Ui, row, t, ok, i, m2, off = _tile(
            x_ptr, ll_ptr, b, (g * tiles + j) * BT, k, T, K, BT, BK, SELECTIVE, False)
        _, _, sr, si = _from_state(Ar, Ai, Ur, Ui, sr, si, c_ptr, off, m2, i, K, BT)
        j += 1


@triton.jit
def _scan_backward_kernel(dc_ptr, ll_ptr, c_ptr, h0_ptr, sin_ptr, dx_ptr, dll_ptr, T, K, G, tiles,
                     BT: tl.constexpr, BK: tl.constexpr, SELECTIVE: tl.constexpr,
                     HAS_H0: tl.constexpr):
    """g = dL/dβ for one group (backwards in time) and dL/d log λ from it."""
    b, kb, g = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    k = kb * BK + tl.arange(0, BK)
    kmask = k < K
    sr, si, s_off = _entering_state(sin_ptr, b, g, G, K, k, kmask)
    acc_r = tl.zeros((BK,), dc_ptr.dtype.element_ty)  # fixed λ: this program's sum
    acc_i = tl.zeros((BK,), dc_ptr.dtype.element_ty)
    j = 0
    while j < tiles:
        Ar, Ai, Ur, Ui, row, t, ok, i, m2, off = _tile(
            dc_ptr, ll_ptr, b, (g * tiles + j) * BT, k, T, K, BT, BK, SELECTIVE, True)
        gr, gi, sr, si = _from_state(Ar, Ai, Ur, Ui, sr, si, dx_ptr, off, m2, i, K, BT)

        # c_{t-1}: the previous row of c, or the carried state at t = 0.
        has_prev = m2 & (t > 0)[:, None]
        pr = tl.load(c_ptr + off - 2 * K, mask=has_prev, other=0.0)
        pi = tl.load(c_ptr + off - K, mask=has_prev, other=0.0)
        if HAS_H0:
            first = m2 & (t == 0)[:, None]
            h_off = b.to(tl.int64) * (2 * K) + k
            hr = tl.load(h0_ptr + h_off, mask=kmask, other=0.0)
            hi = tl.load(h0_ptr + h_off + K, mask=kmask, other=0.0)
            pr = tl.where(first, hr[None, :], pr)
            pi = tl.where(first, hi[None, :], pi)
        lr, li = _load_lambda(ll_ptr, row, k, m2, K, BT, BK, SELECTIVE)
        qr = gr * pr + gi * pi  # q = g · conj(c_{t-1}) = dL/dλ_t
        qi = gi * pr - gr * pi
        dr = tl.where(m2, lr * qr + li * qi, 0.0)  # conj(λ_t) · q
        di = tl.where(m2, lr * qi - li * qr, 0.0)
        if SELECTIVE:
            tl.store(dll_ptr + off, dr, mask=m2)
            tl.store(dll_ptr + off + K, di, mask=m2)
        else:
            acc_r += tl.sum(dr, axis=0)
            acc_i += tl.sum(di, axis=0)
        j += 1
    if not SELECTIVE:
        tl.store(dll_ptr + s_off, acc_r, mask=kmask)
        tl.store(dll_ptr + s_off + K, acc_i, mask=kmask)


# --- launch plan and the autograd function --------------------------------------------------

# Groups the carry kernel scans at a time (a power of two).
CARRY_GROUPS = 32

# Programs every scan kernel fits on an SM at the least (benchmarks/kernel_check.py holds
# them to it for the L40S and the H100): a wave of the plan's programs.
PROGRAMS_PER_SM = 4

# True when triton built the kernels for its interpreter (TRITON_INTERPRET=1 at import).
INTERPRETED = type(_scan_forward_kernel).__name__ == "InterpretedFunction"


@dataclass(frozen=True)
class Plan:
    """How one scan is cut: BT rows per tile, BK lanes per program, groups of tiles."""

    block_t: int
    block_k: int
    group_tiles: int  # tiles per group; the number of groups is ceil(tiles / group_tiles)
    num_warps: int = 4


def plan(B: int, T: int, K: int, device: torch.device, *, block_t: int | None = None,
         block_k: int | None = None, group_tiles: int | None = None) -> Plan:
    """The default cut, or the one asked for (tests and benchmarks pass their own).

    Groups exist only to give the GPU enough programs: with B·K/BK programs already
    filling 4 per SM the scan runs in one pass (G = 1); otherwise as many groups as keep
    the programs within one wave (``tiles_per_group``).
    """
    bt = block_t or min(32, max(16, triton.next_power_of_2(T)))  # 16 or 32: two variants
    bk = block_k or min(32, triton.next_power_of_2(K))
    for name, v in (("block_t", bt), ("block_k", bk)):
        if v < 1 or v & (v - 1):
            raise ValueError(f"{name} must be a power of two, got {v}")
    n_tiles = max(1, math.ceil(T / bt))
    if group_tiles is None:
        slots = 1  # the interpreter runs programs one after another
        if device.type == "cuda" and not INTERPRETED:
            slots = PROGRAMS_PER_SM * torch.cuda.get_device_properties(device).multi_processor_count
        group_tiles = tiles_per_group(n_tiles, B * math.ceil(K / bk), slots)
    if group_tiles < 1:
        raise ValueError(f"group_tiles must be >= 1, got {group_tiles}")
    return Plan(bt, bk, group_tiles)


def tiles_per_group(n_tiles: int, lanes: int, slots: int) -> int:
    """Tiles per group so that ``lanes`` programs per group fill at most ``slots`` places
    on the GPU. The groups round down: a program past a full wave would run in a second
    wave of its own and take as long as the first (at B = 4 the L40S's 142 SMs x 4
    places were given 576 programs)."""
    groups = max(1, min(n_tiles, slots // lanes))
    return math.ceil(n_tiles / groups)


def _run(x: Tensor, log_lam: Tensor, h0: Tensor | None, p: Plan, *, reverse: bool,
         c: Tensor | None = None) -> tuple[Tensor, Tensor | None]:
    """Forward (reverse=False): c. Backward (reverse=True, x = dL/dc, c given): (g, dlog_lam
    raw: (B, T, 2K) selective, (B, G, 2K) partial sums fixed)."""
    B, T, K2 = x.shape
    K = K2 // 2
    selective = log_lam.dim() == 3
    n_tiles = math.ceil(T / p.block_t)
    G = math.ceil(n_tiles / p.group_tiles)
    kb = math.ceil(K / p.block_k)
    consts = dict(BT=p.block_t, BK=p.block_k, SELECTIVE=selective)
    h0_in = h0 if h0 is not None else x  # a pointer the kernels never read without HAS_H0

    if G > 1:
        end, dec = x.new_empty(B, G, K2), x.new_empty(B, G, K2)
        _scan_summary_kernel[(B, kb, G)](x, log_lam, end, dec, T, K, G, p.group_tiles,
                                    REVERSE=reverse, num_warps=p.num_warps, **consts)
        s_in = x.new_empty(B, G, K2)
        # Backwards in time nothing enters the last step: the carry starts from zero.
        has_h0 = h0 is not None and not reverse
        _scan_carry_kernel[(B, kb)](end, dec, h0_in, s_in, K, G, BG=CARRY_GROUPS,
                                    BK=p.block_k, HAS_H0=has_h0, num_warps=p.num_warps)
    elif h0 is not None and not reverse:
        s_in = h0.reshape(B, 1, K2)
    else:
        s_in = x.new_zeros(B, 1, K2)

    out = torch.empty_like(x)
    if not reverse:
        _scan_forward_kernel[(B, kb, G)](x, log_lam, s_in, out, T, K, G, p.group_tiles,
                                    num_warps=p.num_warps, **consts)
        return out, None
    assert c is not None
    dll = torch.empty_like(x) if selective else x.new_empty(B, G, K2)
    _scan_backward_kernel[(B, kb, G)](x, log_lam, c, h0_in, s_in, out, dll, T, K, G, p.group_tiles,
                                 HAS_H0=h0 is not None, num_warps=p.num_warps, **consts)
    return out, dll


# The kernels as torch operators (ten.kernels.ops): opaque to torch.compile (no graph break), and
# traceable under FakeTensorMode by their fakes, which give each output's shape (ten.train.memory
# and benchmarks/bench_traffic.py trace through them).

def _forward_impl(beta: Tensor, log_lam: Tensor, state: Tensor | None, block_t: int,
                  block_k: int, group_tiles: int) -> Tensor:
    """c (B, T, 2K) from contiguous float32/64 inputs, cut as the plan says."""
    return _run(beta, log_lam, state, Plan(block_t, block_k, group_tiles), reverse=False)[0]


def _forward_fake(beta, log_lam, state, block_t, block_k, group_tiles):
    return torch.empty_like(beta)


def _backward_impl(dc: Tensor, log_lam: Tensor, state: Tensor | None, c: Tensor,
                   block_t: int, block_k: int, group_tiles: int) -> tuple[Tensor, Tensor]:
    """(dL/dβ, dL/d log λ raw: (B, T, 2K) selective, (B, G, 2K) partial sums fixed)."""
    return _run(dc, log_lam, state, Plan(block_t, block_k, group_tiles), reverse=True, c=c)


def _backward_fake(dc, log_lam, state, c, block_t, block_k, group_tiles):
    B, T, K2 = dc.shape
    groups = math.ceil(math.ceil(T / block_t) / group_tiles)
    return torch.empty_like(dc), (torch.empty_like(dc) if log_lam.dim() == 3
                                  else dc.new_empty(B, groups, K2))


def _setup_context(ctx, inputs, output) -> None:
    beta, log_lam, state, *cut = inputs
    ctx.save_for_backward(log_lam, state, output)
    ctx.cut = cut


def _backward(ctx, dc: Tensor):
    log_lam, state, c = ctx.saved_tensors
    g, dll = _backward_op(dc.contiguous(), log_lam, state, c, *ctx.cut)
    d_log_lam = None
    if ctx.needs_input_grad[1]:
        d_log_lam = dll if log_lam.dim() == 3 else dll.sum(dim=(0, 1))
    d_state = None
    if state is not None and ctx.needs_input_grad[2]:
        half = state.shape[-1] // 2
        ll0 = log_lam[:, 0] if log_lam.dim() == 3 else log_lam  # λ_0
        mag = torch.exp(ll0[..., :half])
        lr, li = mag * torch.cos(ll0[..., half:]), mag * torch.sin(ll0[..., half:])
        gr, gi = g[:, 0, :half], g[:, 0, half:]
        d_state = torch.cat([lr * gr + li * gi, lr * gi - li * gr], dim=-1)  # conj(λ_0)·g_0
    return g, d_log_lam, d_state, None, None, None


_backward_op = define(
    "scan_fused_backward(Tensor dc, Tensor log_lam, Tensor? state, Tensor c, int block_t, "
    "int block_k, int group_tiles) -> (Tensor, Tensor)", _backward_impl, _backward_fake)
_forward_op = define(
    "scan_fused_forward(Tensor beta, Tensor log_lam, Tensor? state, int block_t, "
    "int block_k, int group_tiles) -> Tensor", _forward_impl, _forward_fake,
    backward=_backward, setup_context=_setup_context)


def scan_fused(beta: Tensor, log_lam: Tensor, state: Tensor | None = None, *,
               block_t: int | None = None, block_k: int | None = None,
               group_tiles: int | None = None) -> tuple[Tensor, Tensor]:
    """Fused backend: same signature and result as ``scan_ref`` (see the module doc).

    Expects float32 or float64 inputs on one device (``ten.kernels.scan.scan`` casts them);
    block_t / block_k / group_tiles override the launch plan (tests, benchmarks).
    """
    B, T, K2 = beta.shape
    if T == 0:
        return beta, beta.new_zeros(B, K2) if state is None else state
    p = plan(B, T, K2 // 2, beta.device, block_t=block_t, block_k=block_k,
             group_tiles=group_tiles)
    c = _forward_op(beta.contiguous(), log_lam.contiguous(),
                    None if state is None else state.contiguous(), p.block_t, p.block_k,
                    p.group_tiles)
    return c, c[:, -1]
