"""Triton kernels for ``ten.kernels.fp8``'s scale and cast (``ten::fp8_scale``,
``ten::fp8_cast``, ``ten::fp8_cast_both``, registered there for CUDA): a 2-D tensor to
float8 with dynamic scales, laid out as the GEMM that reads it wants it (row-major,
transposed, or both from one read), with zero rows appended where the GEMM's summed width
must be a multiple of 16, in three launches:

    _amax_kernel    each program the largest magnitude of its stretch of rows (a scale a
                    tensor or a column) or of columns (a scale a row): partial maxima
    _scale_kernel   the partials' maximum per scale, and the scale: max(amax, TINY) / top
    _cast_kernel    t times 1 / scale, clamped to ±top, rounded, in the output's layout

A cast reads the tensor twice (once for its scale, once to cast it) and writes each
float8 layout once: 5 bytes an element from bf16, 6 for both layouts, where torch's eager
cast (float, abs, amax, div, clamp, to, and a contiguous copy for a transposed or padded
operand) moves ~40. Every step is the torch operator's to the bit: the maxima are exact,
the few divisions (a scale, its reciprocal) IEEE's (``div_rn``, not CUDA's approximate
``/``), an element is multiplied by its scale's reciprocal, and the rounding to float8
is done in fp32 (round to nearest even on the format's grid, the quantum a power of two,
then the sign of a zero put back), so the conversion after it is exact: the same bits
from the GPU's ``cvt`` and from the interpreter, whose own fp32 -> float8 conversion
misrounds where the mantissa carries into the exponent.

One program a BR x BC tile; the amax programs loop over STEPS tiles along the axis they
reduce. Offsets are int64 (a flagship operand is 131,072 x 8,192 elements)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["FORMATS", "fp8_cast", "fp8_cast_both", "fp8_scale", "max_nan", "quantize"]

BR, BC = 64, 64  # a tile: rows x columns
STEPS = 8  # tiles an amax program reduces over (one partial per 8 tiles)
SCALE_BP, SCALE_BS = 16, 128  # the scale kernel's block: partials x scales
NUM_WARPS = 4
_MAGIC = tl.constexpr(12582912.0)  # 1.5 * 2**23: x + it - it is x to an integer, RNE (|x| < 2**22)


@triton.jit
def max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)  # as torch's amax: NaN wins


@triton.jit
def _amax_kernel(t_ptr, part_ptr, R, C, PER_ROW: tl.constexpr, PER_COL: tl.constexpr,
                 BR: tl.constexpr, BC: tl.constexpr, STEPS: tl.constexpr):
    """part (P, S): per row (S = R), per column (S = C) or for the tensor (S = 1), the
    largest |t| of this program's STEPS tiles."""
    pr, pc = tl.program_id(0), tl.program_id(1)
    top = tl.zeros((BR, BC), dtype=tl.float32)
    for i in range(STEPS):
        if PER_ROW:  # along the row: its columns
            rows = pr * BR + tl.arange(0, BR)
            cols = (pc * STEPS + i) * BC + tl.arange(0, BC)
        else:  # down the columns: the rows
            rows = (pr * STEPS + i) * BR + tl.arange(0, BR)
            cols = pc * BC + tl.arange(0, BC)
        rows = rows.to(tl.int64)
        mask = (rows[:, None] < R) & (cols[None, :] < C)
        x = tl.load(t_ptr + rows[:, None] * C + cols[None, :], mask=mask, other=0.0)
        top = max_nan(top, tl.abs(x.to(tl.float32)))
    if PER_ROW:
        rows = (pr * BR + tl.arange(0, BR)).to(tl.int64)
        tl.store(part_ptr + pc * R + rows, tl.reduce(top, 1, max_nan), mask=rows < R)
    elif PER_COL:
        cols = pc * BC + tl.arange(0, BC)
        tl.store(part_ptr + pr * C + cols, tl.reduce(top, 0, max_nan), mask=cols < C)
    else:
        tl.store(part_ptr + pr * tl.num_programs(1) + pc,
                 tl.reduce(tl.reduce(top, 1, max_nan), 0, max_nan))


@triton.jit
def _scale_kernel(part_ptr, scale_ptr, P, S, TOP: tl.constexpr, TINY: tl.constexpr,
                  BP: tl.constexpr, BS: tl.constexpr):
    """scale[s] = max over p of part[p, s], at least TINY, over TOP (the format's largest)."""
    s = tl.program_id(0) * BS + tl.arange(0, BS)
    top = tl.zeros((BP, BS), dtype=tl.float32)
    p0 = 0
    while p0 < P:
        p = p0 + tl.arange(0, BP)
        mask = (p[:, None] < P) & (s[None, :] < S)
        top = max_nan(top, tl.load(part_ptr + p[:, None] * S + s[None, :], mask=mask,
                                    other=0.0))
        p0 += BP
    amax = max_nan(tl.reduce(top, 0, max_nan), TINY)
    tl.store(scale_ptr + s, tl.math.div_rn(amax, tl.full((BS,), TOP, tl.float32)),
             mask=s < S)


@triton.jit
def _to_grid(q, MANT: tl.constexpr, EMIN: tl.constexpr):
    """q (fp32, |q| <= the format's largest) rounded to nearest even on the grid of a float8
    with MANT mantissa bits and smallest normal exponent EMIN: the quantum at q's binade is
    2^(e - MANT), and 2^(EMIN - MANT) below the normals (the subnormals' spacing)."""
    bits = q.to(tl.int32, bitcast=True)
    e = tl.maximum((bits >> 23) & 0xFF, 127 + EMIN) - MANT  # the quantum's biased exponent
    quantum = (e << 23).to(tl.float32, bitcast=True)
    inverse = ((254 - e) << 23).to(tl.float32, bitcast=True)  # exact: both powers of two
    r = ((q * inverse + _MAGIC) - _MAGIC) * quantum  # |q * inverse| < 2^(MANT + 1)
    return (r.to(tl.int32, bitcast=True) | (bits & -2147483648)).to(tl.float32, bitcast=True)


@triton.jit
def quantize(x, inverse, TOP: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr):
    """x (fp32) times its scale's reciprocal, clamped to ±TOP (NaN kept), on the float8
    grid (:func:`_to_grid`): what the conversion to the format then writes exactly."""
    q = x * inverse
    q = tl.minimum(tl.maximum(q, -TOP, propagate_nan=tl.PropagateNan.ALL), TOP,
                   propagate_nan=tl.PropagateNan.ALL)
    return _to_grid(q, MANT, EMIN)


@triton.jit
def _cast_kernel(t_ptr, scale_ptr, out_ptr, out_t_ptr, R, Rp, C, OUT: tl.constexpr,
                 TOP: tl.constexpr, MANT: tl.constexpr, EMIN: tl.constexpr,
                 PER_ROW: tl.constexpr, PER_COL: tl.constexpr, ROWS: tl.constexpr,
                 TRANSPOSED: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    """round(clamp(t · (1 / scale), ±TOP)) in OUT, rows from R to Rp zero: into out (Rp, C)
    with ROWS, into out_t (C, Rp) with TRANSPOSED (both: one read for two layouts)."""
    rows = (tl.program_id(0) * BR + tl.arange(0, BR)).to(tl.int64)
    cols = (tl.program_id(1) * BC + tl.arange(0, BC)).to(tl.int64)  # cols * Rp: past 2^31
    x = tl.load(t_ptr + rows[:, None] * C + cols[None, :],
                mask=(rows[:, None] < R) & (cols[None, :] < C), other=0.0).to(tl.float32)
    if PER_ROW:
        scale = tl.load(scale_ptr + rows, mask=rows < R, other=1.0)
        inverse = tl.math.div_rn(tl.full((BR,), 1.0, tl.float32), scale)[:, None]
    elif PER_COL:
        scale = tl.load(scale_ptr + cols, mask=cols < C, other=1.0)
        inverse = tl.math.div_rn(tl.full((BC,), 1.0, tl.float32), scale)[None, :]
    else:
        inverse = tl.math.div_rn(tl.full((1, 1), 1.0, tl.float32),
                                 tl.load(scale_ptr + tl.zeros((1, 1), tl.int32)))
    y = quantize(x, inverse, TOP, MANT, EMIN).to(OUT)
    keep = (rows[:, None] < Rp) & (cols[None, :] < C)
    if ROWS:
        tl.store(out_ptr + rows[:, None] * C + cols[None, :], y, mask=keep)
    if TRANSPOSED:
        tl.store(out_t_ptr + cols[None, :] * Rp + rows[:, None], y, mask=keep)


# torch's float8 dtype -> (Triton's, its largest value, mantissa bits, smallest normal exponent)
FORMATS = {torch.float8_e4m3fn: (tl.float8e4nv, 448.0, 3, -6),
           torch.float8_e5m2: (tl.float8e5, 57344.0, 2, -14)}


def fp8_scale(t: Tensor, dtype: torch.dtype, dim: int | None, *, tiny: float) -> Tensor:
    """The launcher of ``ten::fp8_scale`` (ten.kernels.fp8: its contract, its torch version,
    and ``tiny``, the floor of an amax, bound where it registers this)."""
    t = t.contiguous()
    R, C = t.shape
    top = FORMATS[dtype][1]
    per_row, per_col = dim == 1, dim == 0
    if per_row:
        grid = (triton.cdiv(R, BR), triton.cdiv(C, BC * STEPS))
        partials, scales, scale = grid[1], R, t.new_empty((R, 1), dtype=torch.float32)
    else:
        grid = (triton.cdiv(R, BR * STEPS), triton.cdiv(C, BC))
        partials = grid[0] if per_col else grid[0] * grid[1]
        scales = C if per_col else 1
        scale = t.new_empty((1, C) if per_col else (), dtype=torch.float32)
    part = t.new_empty((partials, scales), dtype=torch.float32)
    _amax_kernel[grid](t, part, R, C, PER_ROW=per_row, PER_COL=per_col, BR=BR, BC=BC,
                       STEPS=STEPS, num_warps=NUM_WARPS)
    wide = scales > 1
    _scale_kernel[(triton.cdiv(scales, SCALE_BS if wide else 1),)](
        part, scale, partials, scales, TOP=top, TINY=tiny, BP=SCALE_BP if wide else 1024,
        BS=SCALE_BS if wide else 1, num_warps=NUM_WARPS)
    return scale


def _cast(t: Tensor, scale: Tensor, dtype: torch.dtype, rows_to: int, rows: bool,
          transposed: bool) -> tuple[Tensor | None, Tensor | None]:
    t = t.contiguous()
    R, C = t.shape
    Rp = R + (-R % rows_to)
    fmt, top, mant, emin = FORMATS[dtype]
    per_row = scale.numel() > 1 and scale.shape[-1] == 1  # else one a tensor, or a column
    if per_row and Rp != R:
        raise ValueError("fp8 cast: zero rows are appended under one scale a tensor or a "
                         "column, not a row")
    out = t.new_empty((Rp, C), dtype=dtype) if rows else None
    out_t = t.new_empty((C, Rp), dtype=dtype) if transposed else None
    _cast_kernel[(triton.cdiv(Rp, BR), triton.cdiv(C, BC))](  # (a layout not written gets
        t, scale, out if rows else out_t, out_t if transposed else out, R, Rp, C,  # the other)
        OUT=fmt,
        TOP=top, MANT=mant, EMIN=emin, PER_ROW=per_row,
        PER_COL=scale.numel() > 1 and not per_row, ROWS=rows, TRANSPOSED=transposed, BR=BR,
        BC=BC, num_warps=NUM_WARPS)
    return out, out_t


def fp8_cast(t: Tensor, scale: Tensor, dtype: torch.dtype, transpose: bool,
             rows_to: int) -> Tensor:
    """The launcher of ``ten::fp8_cast``."""
    out, out_t = _cast(t, scale, dtype, rows_to, rows=not transpose, transposed=transpose)
    return out_t if transpose else out


def fp8_cast_both(t: Tensor, scale: Tensor, dtype: torch.dtype,
                  rows_to: int) -> tuple[Tensor, Tensor]:
    """The launcher of ``ten::fp8_cast_both``."""
    return _cast(t, scale, dtype, rows_to, rows=True, transposed=True)
