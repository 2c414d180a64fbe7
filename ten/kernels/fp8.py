"""A linear layer's three GEMMs in float8, with the scales computed from each tensor as it
comes (dynamic scaling): what the L40S's and the H100's FP8 tensor cores run at twice
their bf16 rate.

``fp8_linear(x, weight, bias, scaling)`` is ``F.linear`` with

* forward ``y = x wᵀ``: x and w cast to e4m3 (3 mantissa bits, max 448);
* backward ``dx = dy w`` and ``dw = dyᵀ x``: the output's gradient cast to e5m2 (2 mantissa
  bits, max 57344: gradients span more decades than they need digits), each times the
  e4m3 operand it meets; dw comes out in float32 (the master weights').

A tensor is scaled so its largest magnitude lands on its format's largest value, then
rounded: ``scaling="tensor"`` takes one scale per tensor (one amax reduction each,
cheap; an outlier token costs every token its digits), ``"row"`` one per row of each
GEMM's operands along the summed dimension (an outlier costs its own row only). x is
cast once in forward into both layouts its GEMMs read (y's, and dw's, which the layer
keeps for backward in x's place: half the bytes F.linear keeps), the output's gradient
once in backward, the weight for each GEMM from its own dtype (:class:`Float8Gemms`).
torch's ``_scaled_mm`` multiplies, accumulating in fp32, and applies the scales to the
result. Which wins on a card is measured (benchmarks/bench_fp8.py).

The casts are operators (``ten::fp8_scale``, ``ten::fp8_cast``, ``ten::fp8_cast_both``):
torch's kernels here, Triton's on CUDA (ten.kernels.fp8_kernels: the same bits, 5 bytes
an element from bf16 where eager torch moved ~40), each writing its operand in the layout
its GEMM reads, zero rows included, so no copy follows; in the SwiGLU block the kernels
that write its operands (the norm before it, the SwiGLU) take their scales as they write
them, and its backward writes the product and its own gradient in float8 itself, the
gradient with a scale bounded before it is computed (ten.kernels.block_fused.float8_swiglu).
The casts are what FP8 costs: on the flagship's micro-batch they move ~21 GB under one
scale a tensor, 6 ms at an H100's bandwidth against the 27 ms of GEMM time FP8 saves it,
24 ms on an L40S against 74 (benchmarks/bench_traffic.py's rooflines; BENCHMARKS.md,
"Float8 casts", "scales from the kernels that write them" and "the gradient's scale from
a bound").

``_scaled_mm`` on CUDA takes its first operand row-major and its second column-major,
inner and output widths that are multiples of 16, at least one e4m3 operand, and, with
row scales, a bf16 output; :func:`scaled_mm` holds every call to that on any device, so
the tests on a CPU keep the contract a GPU enforces. A layer whose widths are not multiples of 16
is not FP8's to run: :func:`fp8_eligible`.
"""

from __future__ import annotations

import functools
import importlib.util
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from ten.config import FP8_ALIGN, FP8_SCALINGS
from ten.kernels.ops import define, register_cuda

E4M3 = torch.float8_e4m3fn  # what is multiplied forward: inputs and weights
E5M2 = torch.float8_e5m2  # the gradients that flow back
SCALINGS = FP8_SCALINGS  # declared with the model's fields (ten.config)
Scaling = Literal["tensor", "row"]
MIN_CAPABILITY = (8, 9)  # FP8 tensor cores: Ada (L40S, sm_89) and Hopper (H100, sm_90)
ALIGN = FP8_ALIGN  # _scaled_mm's widths on CUDA (the model config checks them too)
TINY = 1e-12  # an all-zero tensor's amax: its scale stays finite (and its values zero)


class FP8Error(ValueError):
    """Float8 GEMMs asked of a device without FP8 tensor cores."""


def check_device(device: torch.device, setting: str = "TENConfig.fp8") -> None:
    """FP8Error, naming ``setting`` (the model config's field) and what to set it to,
    unless ``device`` is a GPU with FP8 tensor cores (a CPU runs _scaled_mm only as a
    slow emulation: for tests, not runs)."""
    if device.type == "cuda":
        cap = torch.cuda.get_device_capability(device)
        if cap >= MIN_CAPABILITY:
            return
        where = f"{torch.cuda.get_device_name(device)} (compute capability {cap[0]}.{cap[1]})"
    else:
        where = f"the {device.type}"
    raise FP8Error(f"{setting} runs float8 GEMMs on a GPU with FP8 tensor cores (compute "
                   f"capability 8.9+: L40S, H100); this run is on {where}: set {setting} "
                   "to off")


def fp8_eligible(in_features: int, out_features: int) -> bool:
    """Whether a linear layer of these widths can run its GEMMs in float8: both widths a
    multiple of 16 (each is the summed or the output width of one of its three GEMMs)."""
    return in_features % ALIGN == 0 and out_features % ALIGN == 0


def amax_scale(t: Tensor, dtype: torch.dtype, dim: int | None = None) -> Tensor:
    """The fp32 scale that puts t's largest magnitude (the tensor's, or each slice's along
    ``dim``, kept as a size-1 dimension) on ``dtype``'s largest value, in torch's ops: the
    torch version of ``ten::fp8_scale`` (on CUDA ten.kernels.fp8_kernels': one pass over
    t, and one over its partial maxima), and what another operator's torch version
    computes a scale with (an operator called inside one would show in a profile where
    the trace, which sees the outer one only, has nothing)."""
    t = t.float().abs()
    amax = t.amax() if dim is None else t.amax(dim=dim, keepdim=True)
    return amax.clamp_min(TINY) / torch.finfo(dtype).max


def _rounded(t: Tensor, scale: Tensor, dtype: torch.dtype) -> Tensor:
    """t / scale in ``dtype``, clamped to its range: times the scale's reciprocal, a
    product an element (division, IEEE's in the kernels too, is ~10 instructions)."""
    top = torch.finfo(dtype).max
    return (t.float() * scale.reciprocal()).clamp(-top, top).to(dtype)


def to_fp8(t: Tensor, dtype: torch.dtype, dim: int | None = None) -> tuple[Tensor, Tensor]:
    """(t in ``dtype``, the fp32 scale that takes it back: t ≈ t8 · scale). One scale for
    the tensor (``dim`` None), or one per slice along ``dim`` kept as a size-1 dimension
    (dim 1 of an (M, K) tensor: a scale per row, (M, 1))."""
    scale = amax_scale(t, dtype, dim)
    return _rounded(t, scale, dtype), scale


def _padded(t: Tensor, scale: Tensor, rows_to: int) -> Tensor:
    """t (R, C) with zero rows after it up to a multiple of ``rows_to``: zero rows add
    nothing to a GEMM that sums over them, nor to an amax; a scale a row has none for them."""
    extra = -t.shape[0] % rows_to
    if extra and scale.numel() > 1 and scale.shape[-1] == 1:
        raise ValueError("fp8 cast: zero rows are appended under one scale a tensor or a "
                         "column, not a row")
    return F.pad(t, (0, 0, 0, extra)) if extra else t


def float8_copy(t: Tensor, scale: Tensor, dtype: torch.dtype, transpose: bool,
                rows_to: int) -> Tensor:
    """t rounded as :func:`to_fp8` rounds it with ``scale``, padded (:func:`_padded`), and
    written transposed where ``transpose`` is set, in torch's ops: the torch version of
    ``ten::fp8_cast`` (on CUDA ten.kernels.fp8_kernels': one pass), and what another
    operator's torch version casts with (as :func:`amax_scale`)."""
    t8 = _rounded(_padded(t, scale, rows_to), scale, dtype)
    return t8.t().contiguous() if transpose else t8


def _cast_both_impl(t: Tensor, scale: Tensor, dtype: torch.dtype,
                    rows_to: int) -> tuple[Tensor, Tensor]:
    """:func:`float8_copy` of t in both layouts, from one read of t on CUDA."""
    t8 = _rounded(_padded(t, scale, rows_to), scale, dtype)
    return t8, t8.t().contiguous()


def _padded_shape(t: Tensor, rows_to: int) -> tuple[int, int]:
    rows, cols = t.shape
    return rows + (-rows % rows_to), cols


def _scale_fake(t, dtype, dim):
    rows, cols = t.shape
    return t.new_empty({None: (), 0: (1, cols), 1: (rows, 1)}[dim], dtype=torch.float32)


def _cast_fake(t, scale, dtype, transpose, rows_to):
    rows, cols = _padded_shape(t, rows_to)
    return t.new_empty((cols, rows) if transpose else (rows, cols), dtype=dtype)


def _cast_both_fake(t, scale, dtype, rows_to):
    rows, cols = _padded_shape(t, rows_to)
    return t.new_empty((rows, cols), dtype=dtype), t.new_empty((cols, rows), dtype=dtype)


_scale = define("fp8_scale(Tensor t, ScalarType dtype, int? dim) -> Tensor", amax_scale,
                _scale_fake)
_cast = define("fp8_cast(Tensor t, Tensor scale, ScalarType dtype, bool transpose, "
               "int rows_to) -> Tensor", float8_copy, _cast_fake)
_cast_both = define("fp8_cast_both(Tensor t, Tensor scale, ScalarType dtype, int rows_to) "
                    "-> (Tensor, Tensor)", _cast_both_impl, _cast_both_fake)


def scale_of(t: Tensor, dtype: torch.dtype, dim: int | None = None) -> Tensor:
    """t's (R, C) scale for ``dtype``: () for the tensor, (1, C) a column (``dim`` 0) or
    (R, 1) a row (``dim`` 1): what :func:`cast` takes and ``_scaled_mm`` multiplies back."""
    return _scale(t, dtype, dim)


def cast(t: Tensor, scale: Tensor, dtype: torch.dtype, *, transpose: bool = False,
         rows_to: int = 1) -> Tensor:
    """t (R, C) in float8 with ``scale`` (:func:`scale_of`), after zero rows appended up to
    a multiple of ``rows_to`` (dw's summed width, the tokens, must be a multiple of 16 on
    CUDA), laid out as the GEMM reads it: (R', C) row-major, or with ``transpose`` its
    transpose (C, R') row-major, so ``t8.t()`` is the column-major operand ``_scaled_mm``
    takes second. One operator, no copy after it."""
    return _cast(t, scale, dtype, transpose, rows_to)


def cast_both(t: Tensor, scale: Tensor, dtype: torch.dtype, *,
              rows_to: int = 1) -> tuple[Tensor, Tensor]:
    """:func:`cast` of t in both layouts (row-major, transposed) from one read of it."""
    return _cast_both(t, scale, dtype, rows_to)


def scaled_mm(a: Tensor, b: Tensor, scale_a: Tensor, scale_b: Tensor,
        out_dtype: torch.dtype) -> Tensor:
    """a (M, K) @ b (K, N) in float8, scaled back, in ``out_dtype``; refuses (ValueError)
    what CUDA's ``_scaled_mm`` would."""
    (M, K), (K2, N) = a.shape, b.shape
    problems = []
    if K != K2:
        problems.append(f"inner widths {K} and {K2}")
    if K % ALIGN or N % ALIGN:
        problems.append(f"widths K={K}, N={N} not multiples of {ALIGN}")
    if not a.is_contiguous() or not b.t().is_contiguous():
        problems.append("the first operand must be row-major, the second column-major")
    if a.dtype == E5M2 and b.dtype == E5M2:
        problems.append("two e5m2 operands")
    if scale_a.numel() > 1 and out_dtype != torch.bfloat16:
        problems.append("row scales give a bf16 output only")
    if problems:
        raise ValueError(f"fp8 matmul of {(M, K)} by {(K2, N)}: " + "; ".join(problems))
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype)


@dataclass(frozen=True)
class Float8Operand:
    """A GEMM operand t (M, K) cast once for the GEMMs of a layer that read it, each in the
    layout its GEMM takes: by its rows, row-major (x in y = x wᵀ, dy in dx = dy w), and by
    its columns, transposed, with zero rows up to a multiple of 16 (x and dy in dw = dyᵀ x,
    which sums over the rows). A layout no GEMM asks for is None."""

    rows: Tensor | None  # (M, K)
    rows_scale: Tensor | None  # () or (M, 1)
    cols_t: Tensor | None  # (K, M')
    cols_scale: Tensor | None  # () or (1, K)

    @classmethod
    def by_columns(cls, cols_t: Tensor, cols_scale: Tensor) -> Float8Operand:
        """The columns' layout alone (what a layer keeps of x for dw)."""
        return cls(None, None, cols_t, cols_scale)


def _as_rows_scale(scale: Tensor) -> Tensor:
    """A (1, K) scale of t's columns as the (K, 1) scale of tᵀ's rows (one a tensor as it is)."""
    return scale.view(-1, 1) if scale.dim() else scale


class Float8Gemms:
    """The three GEMMs of y = x wᵀ (x (M, K), w (N, K)) in float8, with scales of
    ``scaling``, for a layer that casts its operands with :meth:`operand`: x once in forward
    into both layouts (y's, and dw's, which the layer keeps for backward in x's place: half
    its bytes, and no pass over x in backward), the output's gradient once in backward
    for dx and dw. Under one scale a tensor both layouts share one scale and come from one
    pass (:func:`cast_both`); the weight is cast in each GEMM from its own dtype."""

    def __init__(self, scaling: Scaling = "tensor"):
        if scaling not in SCALINGS:
            raise ValueError(f"scaling must be one of {SCALINGS}, got {scaling!r}")
        self.scaling = scaling
        self._row = scaling == "row"
        self.per_tensor = not self._row  # one scale a tensor: a kernel writing one can take it

    def operand(self, t: Tensor, dtype: torch.dtype, scale: Tensor | None = None, *,
                rows: bool = True, cols: bool = True) -> Float8Operand:
        """t (M, K) in ``dtype`` by its rows and by its columns (:class:`Float8Operand`;
        ``rows`` or ``cols`` False leaves that layout out). ``scale``: t's one scale where
        the kernel that wrote t took it (ten.kernels.block_fused's SwiGLU), so no pass over
        t computes it again; a scale a row refuses one (ValueError)."""
        if self._row:
            if scale is not None:
                raise ValueError("Float8Gemms: a tensor's one scale was passed to GEMMs "
                                 "that scale each row")
            by_row = scale_of(t, dtype, 1) if rows else None  # (M, 1)
            by_col = scale_of(t, dtype, 0) if cols else None  # (1, K)
            return Float8Operand(
                cast(t, by_row, dtype) if rows else None, by_row,
                cast(t, by_col, dtype, transpose=True, rows_to=ALIGN) if cols else None, by_col)
        s = scale_of(t, dtype) if scale is None else scale
        if rows and cols:
            t8, t8_t = cast_both(t, s, dtype, rows_to=ALIGN)
            return Float8Operand(t8[:t.shape[0]], s, t8_t, s)
        return Float8Operand(cast(t, s, dtype) if rows else None, s if rows else None,
                             cast(t, s, dtype, transpose=True, rows_to=ALIGN) if cols else None,
                             s if cols else None)

    def forward(self, x: Float8Operand, w: Tensor, out_dtype: torch.dtype) -> Tensor:
        """y = x wᵀ (M, N) in ``out_dtype``: x by its rows, w by its rows (y's columns)."""
        sw = scale_of(w, E4M3, 1 if self._row else None)  # (N, 1) or ()
        return scaled_mm(x.rows, cast(w, sw, E4M3).t(), x.rows_scale, sw.t() if self._row else sw,
                   torch.bfloat16 if self._row else out_dtype).to(out_dtype)

    def grad_input(self, g: Float8Operand, w: Tensor, out_dtype: torch.dtype) -> Tensor:
        """dx = dy w (M, K) in ``out_dtype``: dy by its rows, w by its columns."""
        sw = scale_of(w, E4M3, 0 if self._row else None)  # (1, K) or ()
        return scaled_mm(g.rows, cast(w, sw, E4M3, transpose=True).t(), g.rows_scale, sw,
                   torch.bfloat16 if self._row else out_dtype).to(out_dtype)

    def grad_weight(self, g: Float8Operand, x: Float8Operand) -> Tensor:
        """dw = dyᵀ x (N, K) in float32: dy by its columns, x by its columns, both with
        zero rows up to a multiple of 16 (the sum runs over them)."""
        return scaled_mm(g.cols_t, x.cols_t.t(), _as_rows_scale(g.cols_scale), x.cols_scale,
                   torch.bfloat16 if self._row else torch.float32).float()


class _FP8Linear(torch.autograd.Function):
    """y = x wᵀ with float8 GEMMs each way (:class:`Float8Gemms`), keeping w and, of x,
    what dw reads: x by its columns in float8 (half the bytes F.linear keeps)."""

    @staticmethod
    def forward(ctx, x: Tensor, w: Tensor, out_dtype: torch.dtype,
                gemms: Float8Gemms) -> Tensor:
        ctx.gemms, ctx.x_dtype = gemms, x.dtype
        x8 = gemms.operand(x, E4M3)
        ctx.save_for_backward(x8.cols_t, x8.cols_scale, w)
        return gemms.forward(x8, w, out_dtype)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, None, None]:
        x_cols_t, x_cols_scale, w = ctx.saved_tensors
        g = ctx.gemms.operand(dy.contiguous(), E5M2)
        dw = ctx.gemms.grad_weight(g, Float8Operand.by_columns(x_cols_t, x_cols_scale))
        return ctx.gemms.grad_input(g, w, ctx.x_dtype), dw.to(w.dtype), None, None


def fp8_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
               scaling: Scaling = "tensor") -> Tensor:
    """``F.linear(x, weight, bias)`` with its GEMMs in float8 (forward and backward), in
    the autocast dtype where autocast is on (as F.linear would be), else x's; of x,
    backward keeps what dw reads, in float8. weight (N, K) with N and K multiples of 16
    (:func:`fp8_eligible`); x (..., K), any number of rows."""
    gemms = Float8Gemms(scaling)
    check_widths("fp8_linear", weight)
    rows, out_dtype = gemm_rows(x)
    with torch.autocast(x.device.type, enabled=False):  # the casts are this function's own
        y = _FP8Linear.apply(rows, weight, out_dtype, gemms)
        y = y.view(*x.shape[:-1], weight.shape[0])
        return y if bias is None else y + bias.to(out_dtype)


def check_widths(caller: str, *weights: Tensor) -> None:
    """ValueError naming ``caller`` unless each (N, K) weight is :func:`fp8_eligible`."""
    for weight in weights:
        N, K = weight.shape
        if not fp8_eligible(K, N):
            raise ValueError(f"{caller} needs widths that are multiples of {ALIGN}, "
                             f"got a ({N}, {K}) weight")


def linear_dtype(x: Tensor) -> torch.dtype:
    """The dtype F.linear's output takes for x: autocast's where autocast is on, else x's."""
    dev = x.device.type
    return torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else x.dtype


def gemm_rows(x: Tensor) -> tuple[Tensor, torch.dtype]:
    """(x (..., K) as the (M, K) rows a float8 layer multiplies, the dtype of its output,
    :func:`linear_dtype`'s)."""
    out_dtype = linear_dtype(x)
    return x.reshape(-1, x.shape[-1]).to(out_dtype).contiguous(), out_dtype


def reference_linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """What fp8_linear approximates: F.linear in x's dtype (float64 in the tests)."""
    return F.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))


# --- the CUDA kernels (ten.kernels.fp8_kernels), registered where CUDA is ------------------

if torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    from ten.kernels import fp8_kernels as _k

    register_cuda("fp8_scale", functools.partial(_k.fp8_scale, tiny=TINY))
    register_cuda("fp8_cast", _k.fp8_cast)
    register_cuda("fp8_cast_both", _k.fp8_cast_both)
