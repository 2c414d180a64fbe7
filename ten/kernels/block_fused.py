"""The block's element-wise work as torch operators with fused CUDA kernels: a LayerNorm
that writes its output in the matmul's dtype, SwiGLU, and the mixer's short causal
convolution.

Why (benchmarks/bench_traffic.py, one flagship micro-batch): in torch ops a pre-LN block
writes the LayerNorm's output in fp32 and autocast casts it again for every linear that
reads it; SwiGLU is a chunk, a silu, a product and, in backward, two more products and a
``cat`` of the halves. Here each is one kernel forward and one backward:

    layer_norm    x (fp32) -> y (bf16 under autocast), the row's mean and 1/std kept
    add_layer_norm  x, r -> h = x + r and LN(h): a residual add and the norm after it in
                  one pass (on an H100 the fp32 adds and their backward took 6.4 ms of a
                  72 ms flagship micro-batch); backward adds the stream's own gradient.
                  With a gate g, h = x + σ(g)·r: the TEN mixer's output gate applied as the
                  norm reads r (it was a kernel of its own each way, writing σ(g)·r and its
                  gradient for this norm alone to read: 6.4 GB less a flagship micro-batch)
    swiglu        [a | b] -> silu(a)·b;  backward -> [d a | d b] in one write, and
                  silu(a)·b again over its gradient (swiglu_down: the down projection
                  reads it, and keeping it from forward cost (B, T, H) per block)
    causal_conv   a depthwise convolution over the last W tokens, on (B, T, d) as the
                  model holds it: torch's conv wants (B, d, T), and on an H200 its
                  depthwise kernels and the transposes around them took 12.5 ms of a
                  77 ms flagship micro-batch (benchmarks/gpu_suite.py's profile); the
                  W - 1 inputs before x (zeros at a sequence's start) are read where
                  they are, not copied in front of x (a (B, T, d) copy per layer);
                  causal_conv_and_linear: with the gate's linear map of the same x, whose
                  d x adds itself into the convolution's (no third pass to sum them)
    linears       several linear maps of one x (the matrix state's drive, values and
                  queries), their d x summed in the GEMMs' epilogues, not in passes of
                  their own
    float8_swiglu the SwiGLU block with its six GEMMs in float8 (ten.kernels.fp8): under
                  one scale a tensor the norm before it (add_layer_norm_with_scale) and
                  its SwiGLU forward take each operand's scale as they write it, and the
                  backward writes its three GEMMs' operands in float8 itself, the
                  gradient [d a | d b] with a scale bounded before it is computed

Each operator has a torch implementation (every device: torch's own kernels, the CPU's
numerics unchanged) and a Triton kernel registered for CUDA (``ten.kernels.ops.register_cuda``): the
device picks, as it does for every aten operator. The kernels (``ten.kernels.block_kernels``)
compute in fp32 whatever the storage dtype; under ``TRITON_INTERPRET=1`` they run on CPU
tensors there, and the tests hold them to the operators here.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ten.kernels.fp8 import (
    ALIGN,
    E4M3,
    E5M2,
    TINY,
    Float8Gemms,
    Float8Operand,
    amax_scale,
    check_widths,
    float8_copy,
    gemm_rows,
    linear_dtype,
)
from ten.kernels.ops import define, register_cuda

__all__ = ["LayerNorm", "add_layer_norm", "add_layer_norm_with_scale", "causal_conv",
           "causal_conv_and_linear", "float8_swiglu", "layer_norm", "linears",
           "swiglu_down"]

# --- the operators: torch reference -----------------------------------------------------------

def _acc(x: Tensor) -> torch.dtype:
    return torch.promote_types(x.dtype, torch.float32)  # fp32; a float64 model stays exact


def _layer_norm_impl(x: Tensor, weight: Tensor, bias: Tensor, eps: float,
                out_dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(y in out_dtype, mean (N,), rstd (N,)) of x (N, d); computed in fp32 (fp64 for a
    float64 model) whatever x's dtype, as the kernels do. Here torch's own kernel; on CUDA
    ten.kernels.block_kernels'."""
    y, mean, rstd = torch.native_layer_norm(x.to(_acc(x)), (x.shape[-1],), weight, bias, eps)
    return y.to(out_dtype), mean.view(-1), rstd.view(-1)


def _layer_norm_fake(x, weight, bias, eps, out_dtype):
    n = x.shape[0]
    return (x.new_empty(x.shape, dtype=out_dtype), x.new_empty(n, dtype=_acc(x)),
            x.new_empty(n, dtype=_acc(x)))


def _layer_norm_backward_impl(dy: Tensor, x: Tensor, weight: Tensor, mean: Tensor,
                         rstd: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(dx in x's dtype, d weight, d bias), computed as the forward was."""
    n, acc = x.shape[0], _acc(x)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(
        dy.to(acc), x.to(acc), (x.shape[-1],), mean.view(n, 1).to(acc),
        rstd.view(n, 1).to(acc), weight, weight, (True, True, True))  # (bias: its shape)
    return dx.to(x.dtype), dw, db


def _layer_norm_backward_fake(dy, x, weight, mean, rstd):
    return torch.empty_like(x), torch.empty_like(weight), torch.empty_like(weight)


def _ln_setup(ctx, inputs, output) -> None:
    x, weight, _, _, _ = inputs
    _, mean, rstd = output
    ctx.save_for_backward(x, weight, mean, rstd)


def _ln_backward(ctx, dy, _dmean, _drstd):
    x, weight, mean, rstd = ctx.saved_tensors
    dx, dw, db = _layer_norm_backward(dy.contiguous(), x, weight, mean, rstd)
    return dx, dw, db, None, None


_layer_norm_backward = define(
    "layer_norm_backward(Tensor dy, Tensor x, Tensor weight, Tensor mean, Tensor rstd) "
    "-> (Tensor, Tensor, Tensor)", _layer_norm_backward_impl, _layer_norm_backward_fake)
_layer_norm = define(
    "layer_norm(Tensor x, Tensor weight, Tensor bias, float eps, ScalarType out_dtype) "
    "-> (Tensor, Tensor, Tensor)", _layer_norm_impl, _layer_norm_fake,
    backward=_ln_backward, setup_context=_ln_setup)


def _add_layer_norm_impl(x: Tensor, r: Tensor, weight: Tensor, bias: Tensor, eps: float,
                         out_dtype: torch.dtype, gate: Tensor | None = None
                         ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(h = x + r, LN(h) in out_dtype, mean, rstd): the residual stream after a sublayer
    and the next sublayer's input, in one pass over the row on CUDA. With a ``gate`` (r's
    shape and dtype) the sublayer's output is σ(gate)·r, rounded to r's dtype as
    autograd's ``torch.sigmoid(gate) * r`` would round it, then added: the mixer's output
    gate applied as the norm reads it, so σ(gate)·r is never written."""
    h = x + (r if gate is None else _sigmoid_gate_impl(gate, r))
    return (h, *_layer_norm_impl(h, weight, bias, eps, out_dtype))


def _add_layer_norm_fake(x, r, weight, bias, eps, out_dtype, gate=None):
    h = x.new_empty(x.shape, dtype=torch.promote_types(x.dtype, r.dtype))
    return (h, *_layer_norm_fake(h, weight, bias, eps, out_dtype))


def _add_layer_norm_backward_impl(dh: Tensor | None, dy: Tensor, h: Tensor, weight: Tensor,
                                  mean: Tensor, rstd: Tensor, r_dtype: torch.dtype,
                                  r: Tensor | None = None, gate: Tensor | None = None
                                  ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dx, dr, d weight, d bias, d gate): dx = dh + the norm's input gradient, in h's
    dtype, and dr the same in r's dtype; dr is empty when r's dtype is h's (dx serves
    both: an operator's outputs may not be one tensor). With the forward's ``gate`` (and
    its r), dr and d gate are σ(gate)·r's gradients for dx; else d gate is empty."""
    dx, dw, db = _layer_norm_backward_impl(dy, h, weight, mean, rstd)
    if dh is not None:
        dx = dh + dx  # as autograd sums the two paths into h
    if gate is not None:  # the gate's gradients of dx in σ(gate)·r's dtype, as autograd's
        dgate, dr = _sigmoid_gate_backward_impl(dx.to(r.dtype), gate, r)
        return dx, dr, dw, db, dgate
    return (dx, (h.new_empty(0) if r_dtype == h.dtype else dx.to(r_dtype)), dw, db,
            h.new_empty(0))


def _add_layer_norm_backward_fake(dh, dy, h, weight, mean, rstd, r_dtype, r=None, gate=None):
    if gate is not None:
        dr, dgate = torch.empty_like(r), torch.empty_like(gate)
    else:
        dr = h.new_empty(0) if r_dtype == h.dtype else torch.empty_like(h, dtype=r_dtype)
        dgate = h.new_empty(0)
    return torch.empty_like(h), dr, torch.empty_like(weight), torch.empty_like(weight), dgate


def _add_ln_setup(ctx, inputs, output) -> None:
    _, r, weight, _, _, _, gate = inputs
    h, _, mean, rstd = output
    # a gated sum's gradients read r and its gate
    ctx.save_for_backward(h, weight, mean, rstd, *(() if gate is None else (r, gate)))
    ctx.r_dtype = r.dtype
    ctx.set_materialize_grads(False)  # the last block's h feeds nothing but its norm


def _add_ln_backward(ctx, dh, dy, _dmean, _drstd):
    h, weight, mean, rstd, *gated = ctx.saved_tensors
    if dy is None:
        dy = torch.zeros_like(h)
    dx, dr, dw, db, dgate = _add_layer_norm_backward(
        None if dh is None else dh.contiguous(), dy.contiguous(), h, weight, mean, rstd,
        ctx.r_dtype, *gated)
    if not gated:
        return dx, (dx if ctx.r_dtype == h.dtype else dr), dw, db, None, None, None
    return dx, dr, dw, db, None, None, dgate


def _add_layer_norm_with_scale_impl(x: Tensor, r: Tensor, weight: Tensor, bias: Tensor,
                                    eps: float, out_dtype: torch.dtype, fp8: torch.dtype,
                                    gate: Tensor | None = None
                                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(:func:`_add_layer_norm_impl`'s four, and the norm's one float8 scale for ``fp8``,
    as ``ten::fp8_scale`` takes it): what the float8 SwiGLU block's x needs. Here a pass
    more of torch's; on CUDA the norm's kernel takes each row's maximum as it writes it."""
    h, y, mean, rstd = _add_layer_norm_impl(x, r, weight, bias, eps, out_dtype, gate)
    return h, y, mean, rstd, amax_scale(y, fp8)


def _add_layer_norm_with_scale_fake(x, r, weight, bias, eps, out_dtype, fp8, gate=None):
    return (*_add_layer_norm_fake(x, r, weight, bias, eps, out_dtype),
            x.new_empty((), dtype=torch.float32))


def _add_ln_with_scale_setup(ctx, inputs, output) -> None:
    _add_ln_setup(ctx, (*inputs[:6], inputs[7]), output[:4])


def _add_ln_with_scale_backward(ctx, dh, dy, dmean, drstd, _dscale):
    *grads, dgate = _add_ln_backward(ctx, dh, dy, dmean, drstd)
    return (*grads, None, dgate)  # fp8 (the seventh input) takes none


_add_layer_norm_backward = define(
    "add_layer_norm_backward(Tensor? dh, Tensor dy, Tensor h, Tensor weight, Tensor mean, "
    "Tensor rstd, ScalarType r_dtype, Tensor? r=None, Tensor? gate=None) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _add_layer_norm_backward_impl, _add_layer_norm_backward_fake)
_add_layer_norm = define(
    "add_layer_norm(Tensor x, Tensor r, Tensor weight, Tensor bias, float eps, "
    "ScalarType out_dtype, Tensor? gate=None) -> (Tensor, Tensor, Tensor, Tensor)",
    _add_layer_norm_impl, _add_layer_norm_fake, backward=_add_ln_backward,
    setup_context=_add_ln_setup)
_add_layer_norm_with_scale = define(
    "add_layer_norm_with_scale(Tensor x, Tensor r, Tensor weight, Tensor bias, float eps, "
    "ScalarType out_dtype, ScalarType fp8, Tensor? gate=None) "
    "-> (Tensor, Tensor, Tensor, Tensor, Tensor)",
    _add_layer_norm_with_scale_impl, _add_layer_norm_with_scale_fake,
    backward=_add_ln_with_scale_backward, setup_context=_add_ln_with_scale_setup)


def _swiglu_impl(ab: Tensor) -> Tensor:
    """silu(a)·b of ab = [a | b] (..., 2H) -> (..., H). Here torch's own kernels (in ab's
    dtype, fp32 arithmetic inside for bf16); on CUDA ten.kernels.block_kernels'. Its gradient is
    :class:`_SwiGLUDown`'s, with the down projection's."""
    a, b = ab.chunk(2, dim=-1)
    return F.silu(a) * b


def _swiglu_fake(ab):
    return ab.new_empty(*ab.shape[:-1], ab.shape[-1] // 2)


def _swiglu_grads(dy: Tensor, ab: Tensor) -> tuple[Tensor, Tensor]:
    """([d a | d b] for y = silu(a)·b, written into one (..., 2H) buffer (no cat), and y
    again, as forward computed it): d a = dy·b·silu'(a), d b = dy·silu(a)."""
    a, b = ab.chunk(2, dim=-1)
    dab = torch.empty_like(ab)
    da, db = dab.chunk(2, dim=-1)
    silu = F.silu(a)
    torch.mul(dy, silu, out=db)
    da.copy_(torch.ops.aten.silu_backward(dy * b, a))
    return dab, silu * b


def _swiglu_backward_impl(dy: Tensor, ab: Tensor) -> Tensor:
    """[d a | d b] (:func:`_swiglu_grads`), and y written over dy (the down projection's
    weight gradient reads y, which forward did not keep; in dy's place, backward holds no
    more than it did when y was kept)."""
    dab, y = _swiglu_grads(dy, ab)
    dy.copy_(y)
    return dab


def _swiglu_backward_fake(dy, ab):
    return torch.empty_like(ab)


def _swiglu_gain(ab: Tensor) -> Tensor:
    """The largest factor by which SwiGLU's backward multiplies an element of dy, over
    ab = [a | b]: max(|b·silu'(a)|, |silu(a)|) in fp32 (NaN wins, as in torch's amax),
    computed as the backward computes d a / dy and d b / dy."""
    a, b = (t.float() for t in ab.chunk(2, dim=-1))
    s = torch.sigmoid(a)
    return torch.maximum((b * s * (1.0 + a * (1.0 - s))).abs().amax(), (a * s).abs().amax())


def _swiglu_with_scale_impl(ab: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor, Tensor]:
    """(silu(a)·b, its one float8 scale for ``dtype``, as ``ten::fp8_scale`` takes it, and
    the gain (:func:`_swiglu_gain`), from which backward bounds its gradient's scale). Here
    passes more of torch's; on CUDA the SwiGLU kernel takes the maxima as it writes the
    product, and each is reduced from one float of theirs a program."""
    y = _swiglu_impl(ab)
    return y, amax_scale(y, dtype), _swiglu_gain(ab)


def _swiglu_with_scale_fake(ab, dtype):
    scalar = ab.new_empty((), dtype=torch.float32)
    return _swiglu_fake(ab), scalar, torch.empty_like(scalar)


def _swiglu_backward_float8_impl(dy: Tensor, ab: Tensor, y_scale: Tensor, grad_scale: Tensor,
                                 grad_dtype: torch.dtype, y_dtype: torch.dtype,
                                 rows_to: int) -> tuple[Tensor, Tensor, Tensor]:
    """The float8 SwiGLU block's backward pass over dy (M, H) and ab (M, 2H), neither
    written: [d a | d b] as ``ten::fp8_cast_both`` casts it with ``grad_scale`` (by its rows,
    (M', 2H), and transposed, (2H, M'): the up projection's dx and dw operands), and y as
    ``ten::fp8_cast`` casts it with forward's ``y_scale``, transposed (H, M'): the down
    projection's dw operand; M' is M rounded up to a multiple of ``rows_to``, the rows
    after M zeros. Here torch's ops; on CUDA one kernel writes the three in float8, where
    the plain backward writes [d a | d b] and y in bf16."""
    dab, y = _swiglu_grads(dy, ab)
    dab8 = float8_copy(dab, grad_scale, grad_dtype, False, rows_to)
    return dab8, dab8.t().contiguous(), float8_copy(y, y_scale, y_dtype, True, rows_to)


def _swiglu_backward_float8_fake(dy, ab, y_scale, grad_scale, grad_dtype, y_dtype, rows_to):
    M, h = dy.shape
    Mp = M + (-M % rows_to)
    return (ab.new_empty((Mp, 2 * h), dtype=grad_dtype),
            ab.new_empty((2 * h, Mp), dtype=grad_dtype),
            ab.new_empty((h, Mp), dtype=y_dtype))


_swiglu_backward = define("swiglu_backward(Tensor(a!) dy, Tensor ab) -> Tensor",
                          _swiglu_backward_impl, _swiglu_backward_fake)
_swiglu = define("swiglu(Tensor ab) -> Tensor", _swiglu_impl, _swiglu_fake)
_swiglu_with_scale = define(
    "swiglu_with_scale(Tensor ab, ScalarType dtype) -> (Tensor, Tensor, Tensor)",
    _swiglu_with_scale_impl, _swiglu_with_scale_fake)
_swiglu_backward_float8 = define(
    "swiglu_backward_float8(Tensor dy, Tensor ab, Tensor y_scale, Tensor grad_scale, "
    "ScalarType grad_dtype, ScalarType y_dtype, int rows_to) -> (Tensor, Tensor, Tensor)",
    _swiglu_backward_float8_impl, _swiglu_backward_float8_fake)


class _SwiGLUDown(torch.autograd.Function):
    """z = silu(a)·b @ wᵀ, keeping [a | b] and w for backward but not the (..., H) product
    y between them: backward gets y again from the SwiGLU backward's pass over a and b,
    which reads them anyway, written over y's gradient once read (one more write of y,
    where keeping it held (..., H) per block from forward to backward: 172 MiB of the
    flagship's 32K-token micro-batch, per block).
    Not an operator: its three kernels each way stay visible to the traffic and memory
    tracers (an operator's inside is not)."""

    @staticmethod
    def forward(ctx, ab: Tensor, w: Tensor) -> Tensor:
        with torch.autocast(ab.device.type, enabled=False):  # in the inputs' dtype
            ctx.save_for_backward(ab, w)
            return F.linear(_swiglu(ab), w)

    @staticmethod
    def backward(ctx, dz: Tensor) -> tuple[Tensor, Tensor]:
        ab, w = ctx.saved_tensors
        d, h = w.shape
        dz = dz.reshape(-1, d)
        dy_then_y = dz @ w
        dab = _swiglu_backward(dy_then_y.view(*ab.shape[:-1], h), ab)
        return dab, dz.t() @ dy_then_y


# How far above its bound [d a | d b]'s scale is set: a binade, for the float8 rounding of
# the down projection's weight (e4m3: up to 1/16 up) and the bf16 roundings of dy and the
# gradient, which the bound's arithmetic does not see. It costs no digits (below).
GRAD_BOUND_MARGIN = 2.0


def _bounded_grad_scale(dz_scale: Tensor, down: Tensor, gain: Tensor) -> Tensor:
    """[d a | d b]'s one float8 scale, known before the pass that computes it: from dy =
    dz·W (W = down, (d, H)), each |dy| ≤ max|dz|·‖W‖₁ (‖W‖₁ the largest column's sum of
    magnitudes), and the SwiGLU backward multiplies each dy by at most the forward's gain,
    so max|[d a | d b]| ≤ max|dz|·‖W‖₁·gain. dz's e5m2 scale is max|dz| / the format's
    largest value, so the bound's scale for e5m2 is dz_scale·‖W‖₁·gain (times the margin).

    A scale above the true largest value costs no digits while the values stay in the
    format's normal range: e5m2 keeps 2 mantissa bits over 30 binades, and the bound
    measured 12-33x above the true amax (5x with dy's own amax) on a trained model's
    blocks, where the rounding errors of [d a | d b], dx and dw were those of the exact
    scale to the third digit and no element more flushed to zero (BENCHMARKS.md, "Float8:
    the gradient's scale from a bound"). A NaN or an inf anywhere stays in the scale; a
    bound of 0 (a zero weight, or a zero input's gain) is floored as an amax of zeros is,
    or the cast's reciprocal would make the zeros NaN."""
    norm = torch.linalg.matrix_norm(down.detach().float(), ord=1)
    floor = TINY / torch.finfo(E5M2).max
    return (dz_scale * norm * gain * GRAD_BOUND_MARGIN).clamp_min(floor).reshape(())


class _Float8SwiGLU(torch.autograd.Function):
    """z = down(silu(a)·b) with [a | b] = up(x) (x (M, d) rows), both projections' GEMMs in
    float8 (``gemms``), the product not kept for backward (as :class:`_SwiGLUDown`). One
    function for the whole block so that a SwiGLU kernel's output reaches its GEMMs with
    its scale: under one scale a tensor, the SwiGLU passes take the maxima of what they
    write (forward the product's, backward [d a | d b]'s), and no pass over either
    computes its scale again (the product is (M, H), its gradient (M, 2H): of the
    flagship's micro-batch, 2.2 GB a block of the 2.8 GB its scales read). And backward,
    which gets the product back from [a | b] for the down projection's dw, writes it in
    float8 with forward's scale, transposed as that GEMM reads it (1 byte an element,
    where writing it in bf16 and casting it moved 5); and writes [d a | d b] in float8 in
    both layouts the up projection's GEMMs read, with a scale bounded before the pass
    (:func:`_bounded_grad_scale`: its largest value is not known until the pass is
    over), where writing it in bf16 and casting it moved 8 bytes an element more.

    Kept for backward: of x, dw's operand in float8 (:class:`Float8Gemms`: half x's
    bytes), [a | b] and the weights; [a | b] lives until this backward ends, where a node
    of the up projection's own would have let it go before its GEMMs ran (one (M, 2H)
    tensor, one block's backward at a time)."""

    @staticmethod
    def forward(ctx, x: Tensor, up: Tensor, down: Tensor, gemms: Float8Gemms,
                x_scale: Tensor | None) -> Tensor:
        ctx.gemms, ctx.x_dtype = gemms, x.dtype
        x8 = gemms.operand(x, E4M3, x_scale)  # both layouts: y's GEMM now, dw's kept
        ab = gemms.forward(x8, up, x.dtype)
        if gemms.per_tensor:
            y, y_scale, gain = _swiglu_with_scale(ab, E4M3)
        else:  # a scale a row: the GEMMs take each row's from the product
            y, y_scale, gain = _swiglu(ab), None, None
        z = gemms.forward(gemms.operand(y, E4M3, y_scale, cols=False), down, x.dtype)
        # backward recomputes y from ab: forward's scale serves it (within y's last bit,
        # which the cast's clamp to the format's range absorbs)
        ctx.save_for_backward(x8.cols_t, x8.cols_scale, up, down, ab, y_scale, gain)
        return z

    @staticmethod
    def backward(ctx, dz: Tensor) -> tuple[Tensor, Tensor, Tensor, None, None]:
        x_cols_t, x_cols_scale, up, down, ab, y_scale, gain = ctx.saved_tensors
        gemms = ctx.gemms
        g = gemms.operand(dz.contiguous(), E5M2)
        dy = gemms.grad_input(g, down, dz.dtype)
        if gemms.per_tensor:  # every operand in float8 from the pass that computes it
            s = _bounded_grad_scale(g.rows_scale, down, gain)
            dab8, dab8_t, y_t = _swiglu_backward_float8(dy, ab, y_scale, s, E5M2, E4M3, ALIGN)
            y8 = Float8Operand.by_columns(y_t, y_scale)
            g_up = Float8Operand(dab8[:ab.shape[0]], s, dab8_t, s)
            del y_t, dab8, dab8_t  # the operands hold them (until their GEMMs are done)
        else:  # the columns' scales need all of y and [d a | d b] first: bf16, then casts
            dab = _swiglu_backward(dy, ab)
            y8 = gemms.operand(dy, E4M3, rows=False)  # (dy holds y now)
        d_down = gemms.grad_weight(g, y8).to(down.dtype)
        del dy, g, y8
        if not gemms.per_tensor:
            g_up = gemms.operand(dab, E5M2)
            del dab
        d_up = gemms.grad_weight(g_up, Float8Operand.by_columns(x_cols_t, x_cols_scale))
        return gemms.grad_input(g_up, up, ctx.x_dtype), d_up.to(up.dtype), d_down, None, None


def _sigmoid_gate_impl(g: Tensor, o: Tensor) -> Tensor:
    """σ(g)·o: the mixer's output gate, in torch's kernels (a gated add_layer_norm's sum;
    on CUDA its kernel computes the same in one pass)."""
    return torch.sigmoid(g) * o


def _sigmoid_gate_backward_impl(dy: Tensor, g: Tensor, o: Tensor) -> tuple[Tensor, Tensor]:
    """(d g, d o) in g's and o's dtypes, by the formulas (and roundings) autograd of
    ``torch.sigmoid(g) * o`` uses."""
    s = torch.sigmoid(g)
    return (torch.ops.aten.sigmoid_backward((dy * o).to(g.dtype), s), (dy * s).to(o.dtype))


def _conv_weight(xp: Tensor, weight: Tensor) -> Tensor:
    """The (d, W) weight as torch's depthwise conv takes it: (d, 1, W) in xp's dtype."""
    return weight.unsqueeze(1).to(xp.dtype)


def _padded(x: Tensor, tail: Tensor | None, W: int) -> Tensor:
    """xp = [tail | x] along time: the W - 1 inputs before x (zeros without a tail)."""
    if tail is None:
        tail = x.new_zeros(x.shape[0], W - 1, x.shape[2])
    return torch.cat([tail, x], dim=1)


def _causal_conv_impl(x: Tensor, tail: Tensor | None, weight: Tensor, bias: Tensor) -> Tensor:
    """y (B, T, d), y[:, t] = bias + sum_j weight[:, j]·xp[:, t + j] for xp = [tail | x]
    along time: the previous W - 1 inputs (B, W-1, d; zeros for None, a sequence's start),
    then this chunk's x (B, T, d); weight (d, W). Here torch's conv on the concatenation
    (the CPU's numerics as nn.Conv1d's); on CUDA ten.kernels.block_kernels', which concatenates
    nothing."""
    xp = _padded(x, tail, weight.shape[1])
    y = F.conv1d(xp.transpose(1, 2), _conv_weight(xp, weight), bias.to(xp.dtype),
                 groups=xp.shape[-1])
    return y.transpose(1, 2).contiguous()


def _causal_conv_fake(x, tail, weight, bias):
    return torch.empty_like(x)


def _causal_conv_backward_impl(dy: Tensor, x: Tensor, tail: Tensor | None, weight: Tensor,
                               bias: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(d x, d tail, d weight, d bias): torch's conv backward, as autograd of nn.Conv1d
    runs it. Without a tail, d tail is empty (zeros have no gradient to take)."""
    W = weight.shape[1]
    xp = _padded(x, tail, W)
    dxp, dw, db = torch.ops.aten.convolution_backward(
        dy.to(xp.dtype).transpose(1, 2), xp.transpose(1, 2), _conv_weight(xp, weight),
        [xp.shape[-1]], [1], [0], [1], False, [0], xp.shape[-1], [True, True, True])
    dxp = dxp.transpose(1, 2)
    dtail = x.new_empty(0) if tail is None else dxp[:, :W - 1].contiguous()
    return (dxp[:, W - 1:].contiguous(), dtail, dw.squeeze(1).to(weight.dtype),
            db.to(bias.dtype))


def _causal_conv_backward_fake(dy, x, tail, weight, bias):
    return (torch.empty_like(x), x.new_empty(0) if tail is None else torch.empty_like(tail),
            torch.empty_like(weight), torch.empty_like(bias))


def _conv_setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(*inputs)


def _conv_grad(ctx, dy):
    x, tail, weight, bias = ctx.saved_tensors
    dx, dtail, dweight, dbias = _causal_conv_backward(dy.contiguous(), x, tail, weight, bias)
    return dx, None if tail is None else dtail, dweight, dbias


_causal_conv_backward = define(
    "causal_conv_backward(Tensor dy, Tensor x, Tensor? tail, Tensor weight, Tensor bias) "
    "-> (Tensor, Tensor, Tensor, Tensor)", _causal_conv_backward_impl,
    _causal_conv_backward_fake)
_causal_conv = define(
    "causal_conv(Tensor x, Tensor? tail, Tensor weight, Tensor bias) -> Tensor",
    _causal_conv_impl, _causal_conv_fake, backward=_conv_grad, setup_context=_conv_setup)


class _ConvAndLinear(torch.autograd.Function):
    """(causal_conv(x), x @ wᵀ + b): two readers of one x, whose gradients autograd would
    sum in a pass of its own over (..., d), reading both and writing the sum (the
    flagship's micro-batch of 4: 8 such adds, 6.4 GB). Here the linear's d x = dg @ w is
    one GEMM that adds itself into the convolution's d x (beta = 1: a read of it, 2.1 GB).
    Not an operator: its kernels stay visible to the traffic and memory tracers."""

    @staticmethod
    def forward(ctx, x: Tensor, tail: Tensor | None, conv_w: Tensor, conv_b: Tensor,
                w: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
        ctx.save_for_backward(x, tail, conv_w, conv_b, w)
        with torch.autocast(x.device.type, enabled=False):  # in the inputs' dtypes
            return _causal_conv(x, tail, conv_w, conv_b), F.linear(x, w, b)

    @staticmethod
    def backward(ctx, dy: Tensor, dg: Tensor) -> tuple[Tensor | None, ...]:
        x, tail, conv_w, conv_b, w = ctx.saved_tensors
        dx, dtail, dconv_w, dconv_b = _causal_conv_backward(dy.contiguous(), x, tail, conv_w,
                                                            conv_b)
        rows = dg.reshape(-1, w.shape[0])
        dx.view(-1, x.shape[-1]).addmm_(rows, w)
        return (dx, None if tail is None else dtail, dconv_w, dconv_b,
                rows.t() @ x.reshape(-1, x.shape[-1]), rows.sum(0))


class _Linears(torch.autograd.Function):
    """(x @ w₁ᵀ, x @ w₂ᵀ, ...): linear maps of one x (no bias), whose d x autograd would
    sum in passes of their own over (..., d), each reading two and writing one (the
    matrix state's drive, values and queries: of the flagship's micro-batch, 16 such
    passes, 12.9 GB). Here the GEMMs for d x add themselves into the first's (beta = 1,
    in their epilogues), as :class:`_ConvAndLinear`'s does. Each output its own
    tensor, as its reader takes it: one GEMM of the stacked weights would write them
    as column slices of one, which the scans copy out and autograd's split joins back
    in backward (two passes as large as the three outputs). Not an operator, for the
    tracers (as :class:`_ConvAndLinear`)."""

    @staticmethod
    def forward(ctx, x: Tensor, *weights: Tensor) -> tuple[Tensor, ...]:
        ctx.save_for_backward(x, *weights)
        ctx.set_materialize_grads(False)  # an unused output's gradient: None, not zeros
        with torch.autocast(x.device.type, enabled=False):  # in the inputs' dtypes
            return tuple(F.linear(x, w) for w in weights)

    @staticmethod
    def backward(ctx, *grads: Tensor | None) -> tuple[Tensor | None, ...]:
        x, *weights = ctx.saved_tensors
        rows = x.reshape(-1, x.shape[-1])
        dx, dws = None, []
        for g, w in zip(grads, weights, strict=True):
            if g is None:  # an output no loss reached
                dws.append(None)
                continue
            g = g.reshape(-1, w.shape[0])
            dx = g @ w if dx is None else dx.addmm_(g, w)
            dws.append(g.t() @ rows)
        dx = torch.zeros_like(rows) if dx is None else dx
        return (dx.view(x.shape), *dws)


def linears(x: Tensor, *weights: Tensor) -> tuple[Tensor, ...]:
    """``tuple(F.linear(x, w) for w in weights)`` with one d x (see :class:`_Linears`),
    in F.linear's dtype (``linear_dtype``: autocast's, the weights cast to it, or x's)."""
    dtype = linear_dtype(x)
    return _Linears.apply(x.to(dtype), *(w.to(dtype) for w in weights))


# --- the public functions ---------------------------------------------------------------------

def layer_norm(x: Tensor, weight: Tensor, bias: Tensor, eps: float,
               out_dtype: torch.dtype | None = None) -> Tensor:
    """LayerNorm over the last dimension, the output in ``out_dtype`` (x's when None)."""
    shape = x.shape
    y, _, _ = _layer_norm(x.reshape(-1, shape[-1]).contiguous(), weight, bias, eps,
                          out_dtype or x.dtype)
    return y.view(shape)


def add_layer_norm(x: Tensor, r: Tensor, weight: Tensor, bias: Tensor, eps: float,
                   out_dtype: torch.dtype | None = None, gate: Tensor | None = None
                   ) -> tuple[Tensor, Tensor]:
    """(h = x + r, LayerNorm(h) in ``out_dtype``, h's when None): a pre-LN block's
    residual add and the norm after it, one kernel each way on CUDA. With ``gate`` (r's
    shape and dtype), h = x + σ(gate)·r: the mixer's output gate (autograd's roundings of
    ``torch.sigmoid(gate) * r``) applied in the same pass, forward and backward."""
    shape = x.shape
    h, y, _, _ = _add_layer_norm(*_rows(x, r, gate), weight, bias, eps,
                                 out_dtype or torch.promote_types(x.dtype, r.dtype),
                                 _gate_rows(gate, r))
    return h.view(shape), y.view(shape)


def add_layer_norm_with_scale(x: Tensor, r: Tensor, weight: Tensor, bias: Tensor, eps: float,
                              fp8: torch.dtype, out_dtype: torch.dtype | None = None,
                              gate: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """:func:`add_layer_norm`'s (h, LayerNorm(h)), and the norm's one float8 scale for
    ``fp8`` (ten.kernels.fp8), taken by the pass that writes it: the float8 SwiGLU block's
    input scale (:func:`float8_swiglu`)."""
    shape = x.shape
    h, y, _, _, scale = _add_layer_norm_with_scale(
        *_rows(x, r, gate), weight, bias, eps,
        out_dtype or torch.promote_types(x.dtype, r.dtype), fp8, _gate_rows(gate, r))
    return h.view(shape), y.view(shape), scale


def _rows(x: Tensor, r: Tensor, gate: Tensor | None) -> tuple[Tensor, Tensor]:
    """x and r as contiguous (rows, d), r checked against its gate."""
    if gate is not None and (gate.shape != r.shape or gate.dtype != r.dtype):
        raise ValueError(f"a gated sum takes its gate in r's shape and dtype, got "
                         f"{tuple(gate.shape)} {gate.dtype} for {tuple(r.shape)} {r.dtype}")
    d = x.shape[-1]
    return x.reshape(-1, d).contiguous(), r.reshape(-1, d).contiguous()


def _gate_rows(gate: Tensor | None, r: Tensor) -> Tensor | None:
    return None if gate is None else gate.reshape(-1, r.shape[-1]).contiguous()


def swiglu_down(ab: Tensor, weight: Tensor) -> Tensor:
    """The SwiGLU feed-forward block's output: silu(a)·b of ab = [a | b] along the last
    dimension, projected by ``weight`` (d, H) (the down projection's, cast to ab's dtype:
    under autocast ab is the up projection's output). Differentiable in both; the product
    silu(a)·b is not kept for backward (see :class:`_SwiGLUDown`)."""
    return _SwiGLUDown.apply(ab.contiguous(), weight.to(ab.dtype))


def float8_swiglu(x: Tensor, up: Tensor, down: Tensor, gemms: Float8Gemms,
                  x_scale: Tensor | None = None) -> Tensor:
    """The SwiGLU feed-forward block, ``swiglu_down(x @ upᵀ, down)``, its six GEMMs in
    float8 (:class:`_Float8SwiGLU`), in the autocast dtype where autocast is on, else x's
    (as ``fp8_linear``). up (2H, d), down (d, H), in their own dtype (the GEMMs cast them);
    every width a multiple of 16. ``x_scale``: x's one e4m3 scale where the norm that
    wrote x took it (:func:`add_layer_norm_with_scale`; one scale a tensor only)."""
    check_widths("float8_swiglu", up, down)
    rows, out_dtype = gemm_rows(x)
    with torch.autocast(x.device.type, enabled=False):  # the casts are the GEMMs' own
        z = _Float8SwiGLU.apply(rows, up, down, gemms, x_scale)
    return z.view(*x.shape[:-1], down.shape[0])


def causal_conv_and_linear(x: Tensor, tail: Tensor | None, conv_weight: Tensor,
                           conv_bias: Tensor, linear: nn.Linear) -> tuple[Tensor, Tensor]:
    """(:func:`causal_conv` of x, ``linear(x)``) with x's gradient from both summed in
    place (see :class:`_ConvAndLinear`): the mixer's convolution and its gate, which
    read the same normed input. ``linear`` has a bias, as the gate has; its weight and
    bias are cast to x's dtype, as autocast casts them for x in its dtype."""
    tail = _checked_tail(x, tail, conv_weight.shape[-1])
    return _ConvAndLinear.apply(x.contiguous(), tail,
                                conv_weight.reshape(conv_weight.shape[0], -1), conv_bias,
                                linear.weight.to(x.dtype), linear.bias.to(x.dtype))


def causal_conv(x: Tensor, tail: Tensor | None, weight: Tensor, bias: Tensor) -> Tensor:
    """The depthwise causal convolution of x (B, T, d) continuing from ``tail`` (B, W-1, d),
    the W - 1 inputs before x (None: zeros, a sequence's start), with weight (d, W) (or
    nn.Conv1d's (d, 1, W)) and bias (d,): y (B, T, d) in x's dtype, y[:, t] = bias + Σ_j
    weight[:, j]·xp[:, t + j] for xp = [tail | x] along time, which is never built on CUDA
    (the kernels read x, and the tail, where they are)."""
    tail = _checked_tail(x, tail, weight.shape[-1])
    return _causal_conv(x.contiguous(), tail, weight.reshape(weight.shape[0], -1), bias)


def _checked_tail(x: Tensor, tail: Tensor | None, W: int) -> Tensor | None:
    """The tail a width-W convolution of x continues from, (B, W - 1, d) in x's dtype, or
    None; ValueError for another shape."""
    if tail is None:
        return None
    if tail.shape != (x.shape[0], W - 1, x.shape[2]):
        raise ValueError(f"causal_conv of width {W} continues from a tail of shape "
                         f"{(x.shape[0], W - 1, x.shape[2])}, got {tuple(tail.shape)}")
    return tail.to(x.dtype).contiguous()


class LayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` (same parameters and state_dict) whose output is already in the
    autocast dtype when autocast is on, so the linears that read it cast nothing. Only
    the element-wise affine form with a bias (what the models use). ``add`` norms a
    residual sum it also returns."""

    def forward(self, x: Tensor) -> Tensor:
        with self._own_precision(x) as out:
            return layer_norm(x, self.weight, self.bias, self.eps, out)

    def add(self, x: Tensor, r: Tensor | None, gate: Tensor | None = None
            ) -> tuple[Tensor, Tensor]:
        """(x + r, this norm of it); r None: (x, this norm of x). With ``gate``, r enters
        the sum as σ(gate)·r (:func:`add_layer_norm`)."""
        if r is None:
            return x, self(x)
        with self._own_precision(x) as out:
            return add_layer_norm(x, r, self.weight, self.bias, self.eps, out, gate)

    def add_with_scale(self, x: Tensor, r: Tensor, fp8: torch.dtype,
                       gate: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """(x + r, this norm of it, the norm's one float8 scale for ``fp8``); ``gate`` as
        in :meth:`add`."""
        with self._own_precision(x) as out:
            return add_layer_norm_with_scale(x, r, self.weight, self.bias, self.eps, fp8, out,
                                             gate)

    @contextlib.contextmanager
    def _own_precision(self, x: Tensor) -> Iterator[torch.dtype | None]:
        """Autocast off inside; yields the dtype the output takes (autocast's, or None)."""
        device = x.device.type
        out = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        with torch.autocast(device, enabled=False):
            yield out


# --- the CUDA kernels (ten.kernels.block_kernels), registered where CUDA is -----------------
# Only then: a CPU process never imports triton here (the tests choose when triton is first
# imported, and in which mode: TRITON_INTERPRET).

if torch.cuda.is_available() and importlib.util.find_spec("triton") is not None:
    from ten.kernels import block_kernels as _k

    register_cuda("layer_norm", _k.layer_norm)
    register_cuda("layer_norm_backward", _k.layer_norm_backward)
    register_cuda("add_layer_norm", _k.add_layer_norm)
    register_cuda("add_layer_norm_backward", _k.add_layer_norm_backward)
    register_cuda("add_layer_norm_with_scale",
                  functools.partial(_k.add_layer_norm_with_scale, tiny=TINY))
    register_cuda("swiglu", _k.swiglu)
    register_cuda("swiglu_backward", _k.swiglu_backward)
    register_cuda("swiglu_with_scale", functools.partial(_k.swiglu_with_scale, tiny=TINY))
    register_cuda("swiglu_backward_float8", _k.swiglu_backward_float8)
    register_cuda("causal_conv", _k.causal_conv)

    def _causal_conv_backward_cuda(dy: Tensor, x: Tensor, tail: Tensor | None, weight: Tensor,
                                   bias: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        if weight.shape[1] > _k.CONV_MAX_WIDTH:  # wider than the kernel's accumulators
            return _causal_conv_backward_impl(dy, x, tail, weight, bias)
        return _k.causal_conv_backward(dy, x, tail, weight, bias)

    register_cuda("causal_conv_backward", _causal_conv_backward_cuda)
