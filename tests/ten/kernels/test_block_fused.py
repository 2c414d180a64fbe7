"""ten.kernels.block_fused: the LayerNorm (alone and of a residual sum), SwiGLU, sigmoid gate and
causal convolution operators equal torch's,
in values and gradients, and their Triton kernels (ten.kernels.block_kernels) equal the operators.

Where they run: tests/support/triton_mode.py (compiled on CUDA, interpreted on CPU).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from operator_layout import assert_fake_layout
from saved_tensors import saved_for_backward
from torch import nn
from triton_mode import DEVICE, HAVE_TRITON, NO_TRITON, cpu, interpret_without_cuda, kernel_module

from ten.kernels.block_fused import (
    LayerNorm,
    add_layer_norm,
    causal_conv,
    causal_conv_and_linear,
    layer_norm,
    linears,
    swiglu_down,
)
from ten.kernels.fp8 import E4M3, E5M2, TINY
from ten.model.mlp import MLP

interpret_without_cuda()
pytestmark = pytest.mark.cuda_kernels


def rand(*shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g, dtype=dtype).to(DEVICE)


# --- the operators against torch ---------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_layer_norm_equals_torchs_in_values_and_gradients(dtype):
    torch_ln = nn.LayerNorm(24, dtype=dtype, device=DEVICE)
    ours = LayerNorm(24, dtype=dtype, device=DEVICE)
    with torch.no_grad():
        torch_ln.weight.normal_(), torch_ln.bias.normal_()
    ours.load_state_dict(torch_ln.state_dict())  # the same parameters and keys
    x = rand(3, 5, 24, dtype=dtype).requires_grad_()
    dy = rand(3, 5, 24, dtype=dtype, seed=1)
    ref = torch.autograd.grad(torch_ln(x), (x, torch_ln.weight, torch_ln.bias), dy)
    got = torch.autograd.grad(ours(x), (x, ours.weight, ours.bias), dy)
    tol = 1e-12 if dtype == torch.float64 else 1e-5
    torch.testing.assert_close(ours(x), torch_ln(x), rtol=tol, atol=tol)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=tol, atol=tol)


def test_under_autocast_the_norm_is_already_in_the_matmul_dtype():
    ln = LayerNorm(16, device=DEVICE)
    x = rand(4, 16)
    with torch.autocast(DEVICE, dtype=torch.bfloat16):
        y = ln(x)
    assert y.dtype == torch.bfloat16  # a linear reading it casts nothing
    torch.testing.assert_close(y, F.layer_norm(x, (16,)).to(torch.bfloat16))


def test_a_bf16_stream_is_normed_in_fp32_and_its_gradient_rounded_once():
    """A bf16 stream (residual_dtype: bf16): the norm computes in fp32 from the stored
    bf16, as the kernels do; its input's gradient is the fp32 one rounded to bf16. On the
    CPU: torch's bf16 LayerNorm backward takes no fp32 weight, which the model has."""
    ln = LayerNorm(24).to("cpu")
    with torch.no_grad():
        ln.weight.normal_(), ln.bias.normal_()
    x = torch.randn(3, 5, 24).to(torch.bfloat16).requires_grad_()
    wide = x.detach().float().requires_grad_()
    dy = torch.randn(3, 5, 24)
    params = (ln.weight, ln.bias)
    want = F.layer_norm(wide, (24,), *params)
    got = layer_norm(x, *params, ln.eps, torch.float32)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
    want_g = torch.autograd.grad(want, (wide, *params), dy)
    got_g = torch.autograd.grad(got, (x, *params), dy)
    assert got_g[0].dtype == torch.bfloat16
    assert torch.equal(got_g[0], want_g[0].to(torch.bfloat16))
    for w, g in zip(want_g[1:], got_g[1:], strict=True):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    r = torch.randn(3, 5, 24).to(torch.bfloat16)  # and the sum with a bf16 sublayer output
    h, y = add_layer_norm(x, r, *params, ln.eps, torch.bfloat16)
    assert h.dtype == torch.bfloat16 and torch.equal(h, x + r)
    torch.testing.assert_close(y, F.layer_norm(h.float(), (24,), *params).to(torch.bfloat16))


@pytest.mark.parametrize("r_dtype", [torch.float64, torch.float32])
def test_the_norm_of_a_residual_sum_is_the_sum_then_torchs_norm_with_gradients(r_dtype):
    """h, LN(h) = ln.add(x, r) against x + r and nn.LayerNorm: both outputs and every
    gradient, with gradients arriving on both (h feeds the next sum too); r narrower
    than x (a bf16 sublayer output on an fp32 stream) gets its gradient in its dtype."""
    torch_ln = nn.LayerNorm(24, dtype=torch.float64, device=DEVICE)
    with torch.no_grad():
        torch_ln.weight.normal_(), torch_ln.bias.normal_()
    ours = LayerNorm(24, dtype=torch.float64, device=DEVICE)
    ours.load_state_dict(torch_ln.state_dict())
    x = rand(3, 5, 24, dtype=torch.float64).requires_grad_()
    r = rand(3, 5, 24, seed=1).to(r_dtype).requires_grad_()
    dh, dy = rand(3, 5, 24, dtype=torch.float64, seed=2), rand(3, 5, 24, dtype=torch.float64,
                                                               seed=3)
    want_h = x + r
    want = (want_h, torch_ln(want_h))
    got = ours.add(x, r)
    for w, g in zip(want, got, strict=True):
        assert g.dtype == torch.float64
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    inputs = (x, r, ours.weight, ours.bias)
    ref = torch.autograd.grad(want, (x, r, torch_ln.weight, torch_ln.bias), (dh, dy))
    for w, g in zip(ref, torch.autograd.grad(got, inputs, (dh, dy)), strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    # the model's last sum feeds only the final norm: no gradient arrives on h
    ref = torch.autograd.grad(torch_ln(x + r), (x, r), dy)
    for w, g in zip(ref, torch.autograd.grad(ours.add(x, r)[1], (x, r), dy), strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    assert ours.add(x, None)[0] is x  # nothing to add: the first block's norm


def test_add_layer_norm_gradients_pass_gradcheck_in_fp64():
    x, r = (rand(4, 6, dtype=torch.float64, seed=i).requires_grad_() for i in (0, 1))
    w = rand(6, dtype=torch.float64, seed=2).requires_grad_()
    b = rand(6, dtype=torch.float64, seed=3).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: add_layer_norm(*a, 1e-5), (x, r, w, b))


def test_swiglu_down_is_the_projection_of_silu_times_the_gate_with_gradients():
    ab = rand(2, 3, 2 * 7, dtype=torch.float64).requires_grad_()
    w = rand(5, 7, dtype=torch.float64, seed=1).requires_grad_()
    a, b = ab.chunk(2, dim=-1)
    torch.testing.assert_close(swiglu_down(ab, w), F.linear(F.silu(a) * b, w))
    assert torch.autograd.gradcheck(swiglu_down, (ab, w))


@pytest.mark.parametrize("amp", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_swiglu_block_equals_autograds_and_keeps_no_product_for_backward(amp):
    """The feed-forward block against down(silu(a)·b) in torch ops (what it was): the same
    output and gradients, in fp32 and under bf16 autocast; and what it keeps for backward
    holds no (B, T, H) product silu(a)·b, which torch's linear keeps (172 MiB a block at
    the flagship's 32K tokens)."""
    torch.manual_seed(0)
    mlp = MLP(16, 24).to("cpu")
    x = torch.randn(2, 5, 16, requires_grad=True)
    dz = torch.randn(2, 5, 16)
    product = 2 * 5 * 24  # no input, output or weight has as many elements

    def reference(x):
        a, b = mlp.up(x).chunk(2, dim=-1)
        return mlp.down(F.silu(a) * b)

    params = (x, mlp.up.weight, mlp.down.weight)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        want, got = reference(x), mlp(x)
        assert product in saved_for_backward(reference, x).sizes  # the control finds it
        assert product not in saved_for_backward(mlp, x).sizes
    assert got.dtype == want.dtype
    assert torch.equal(got, want)
    tol = {"rtol": 2e-2, "atol": 2e-2} if amp else {"rtol": 1e-5, "atol": 1e-6}
    for g, r in zip(torch.autograd.grad(got, params, dz), torch.autograd.grad(want, params, dz),
                    strict=True):
        assert g.dtype == r.dtype
        torch.testing.assert_close(g, r, **tol)


@pytest.mark.parametrize("stream, act", [(torch.float32, torch.float32),
                                         (torch.float32, torch.bfloat16),
                                         (torch.bfloat16, torch.bfloat16)])
def test_a_gated_sum_is_autograds_gate_then_the_sum_bit_for_bit(stream, act):
    """The mixer's gate applied by the norm after it (h = x + σ(g)·o and LN(h), one
    operator) computes what the graph before did, autograd's ``torch.sigmoid(g) * o``
    added by add_layer_norm: both outputs and every gradient, bit for bit, on the CPU (on
    CUDA the kernels run: held to the operator below)."""
    x, dh = rand(3, 5, 16).to("cpu", stream), rand(3, 5, 16, seed=1).to("cpu", stream)
    o, g, dy = (rand(3, 5, 16, seed=i).to("cpu", act) for i in (2, 3, 4))
    w, b = rand(16, seed=5).cpu(), rand(16, seed=6).cpu()
    inputs = [t.requires_grad_() for t in (x, o, g, w, b)]
    want = add_layer_norm(x, torch.sigmoid(g) * o, w, b, 1e-5, act)
    got = add_layer_norm(x, o, w, b, 1e-5, act, gate=g)
    for have, wanted in zip(got, want, strict=True):
        assert have.dtype == wanted.dtype and torch.equal(have, wanted)
    for have, wanted in zip(torch.autograd.grad(got, inputs, (dh, dy)),
                            torch.autograd.grad(want, inputs, (dh, dy)), strict=True):
        assert have.dtype == wanted.dtype and torch.equal(have, wanted)


def test_a_gated_sum_passes_gradcheck_in_fp64_and_refuses_a_gate_unlike_its_input():
    x, o, g = (rand(4, 6, dtype=torch.float64, seed=i).requires_grad_() for i in (0, 1, 2))
    w = rand(6, dtype=torch.float64, seed=3).requires_grad_()
    b = rand(6, dtype=torch.float64, seed=4).requires_grad_()
    assert torch.autograd.gradcheck(
        lambda x, o, g, w, b: add_layer_norm(x, o, w, b, 1e-5, gate=g), (x, o, g, w, b))
    with pytest.raises(ValueError, match="in r's shape and dtype"):
        add_layer_norm(x, o, w, b, 1e-5, gate=g[..., :1])
    with pytest.raises(ValueError, match="in r's shape and dtype"):
        add_layer_norm(x, o, w, b, 1e-5, gate=g.float())


def test_layer_norm_gradients_pass_gradcheck_in_fp64():
    x = rand(4, 6, dtype=torch.float64).requires_grad_()
    w = rand(6, dtype=torch.float64, seed=1).requires_grad_()
    b = rand(6, dtype=torch.float64, seed=2).requires_grad_()
    assert torch.autograd.gradcheck(lambda *a: layer_norm(*a, 1e-5), (x, w, b))


@pytest.mark.parametrize("W", [2, 4])
def test_causal_conv_is_nn_conv1ds_depthwise_convolution_with_gradients(W):
    """On x after the tail of inputs before it, as nn.Conv1d on the two concatenated:
    values and the gradients of x, the tail, the weight and the bias."""
    conv = nn.Conv1d(6, 6, W, groups=6, dtype=torch.float64, device=DEVICE)
    x = rand(2, 9, 6, dtype=torch.float64).requires_grad_()
    tail = rand(2, W - 1, 6, dtype=torch.float64, seed=2).requires_grad_()
    want = conv(torch.cat([tail, x], 1).transpose(1, 2)).transpose(1, 2)
    got = causal_conv(x, tail, conv.weight, conv.bias)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    dy = rand(*want.shape, dtype=torch.float64, seed=1)
    params = (x, tail, conv.weight, conv.bias)
    for w, g in zip(torch.autograd.grad(want, params, dy), torch.autograd.grad(got, params, dy),
                    strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)
    weight, bias = (t.detach().clone().requires_grad_() for t in (conv.weight, conv.bias))
    assert torch.autograd.gradcheck(causal_conv, (x, tail, weight.view(6, W), bias))
    # no tail: a sequence's start, the zeros nn.Conv1d's left padding gives
    start = F.conv1d(x.transpose(1, 2), conv.weight, conv.bias, padding=W - 1, groups=6)
    torch.testing.assert_close(causal_conv(x, None, conv.weight, conv.bias),
                               start[..., :9].transpose(1, 2), rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(causal_conv, (x, None, weight.view(6, W), bias))


def test_causal_conv_names_the_tail_it_needs():
    x, w, b = rand(2, 9, 6), rand(6, 4), rand(6)
    with pytest.raises(ValueError, match=r"width 4 continues from a tail of shape \(2, 3, 6\), "
                                         r"got \(2, 4, 6\)"):
        causal_conv(x, rand(2, 4, 6), w, b)


@pytest.mark.parametrize("amp", [False, True], ids=["fp64", "bf16-autocast"])
@pytest.mark.parametrize("with_tail", [False, True], ids=["start", "tail"])
def test_the_convolution_and_the_gate_of_one_input_equal_the_two_apart(amp, with_tail):
    """causal_conv_and_linear (the mixer's convolution and gate of its normed input) against
    causal_conv and the linear called apart, autograd summing x's two gradients: the same
    outputs, and the gradients of x, the tail, both weights and both biases."""
    dtype = torch.float32 if amp else torch.float64
    conv = nn.Conv1d(6, 6, 4, groups=6, dtype=dtype, device=DEVICE)
    gate = nn.Linear(6, 5, dtype=dtype, device=DEVICE)
    x = rand(2, 9, 6, dtype=torch.bfloat16 if amp else dtype).requires_grad_()
    tail = rand(2, 3, 6, dtype=x.dtype, seed=2).requires_grad_() if with_tail else None
    params = (x, *([tail] if with_tail else []), conv.weight, conv.bias, gate.weight,
              gate.bias)
    device = torch.device(DEVICE).type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        want = causal_conv(x, tail, conv.weight, conv.bias), gate(x)
        got = causal_conv_and_linear(x, tail, conv.weight, conv.bias, gate)
    dy, dg = rand(2, 9, 6, seed=3).to(want[0].dtype), rand(2, 9, 5, seed=4).to(want[1].dtype)
    tol = {"rtol": 2e-2, "atol": 2e-2} if amp else {"rtol": 1e-12, "atol": 1e-12}
    for w, g in zip((*want, *torch.autograd.grad(want, params, (dy, dg))),
                    (*got, *torch.autograd.grad(got, params, (dy, dg))), strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, **tol)


def adds_over(x: torch.Tensor, loss: torch.Tensor) -> int:
    """How many passes backward of ``loss`` takes only to add gradients as large as x's
    (``add``/``add_`` of x's number of elements, in any shape; a GEMM's ``addmm_``, which
    adds in its epilogue, is not one)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Adds(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.full = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func.__name__.split(".")[0] in ("add", "add_") and out.numel() == x.numel():
                self.full += 1
            return out

    counted = Adds()
    with counted:
        torch.autograd.grad(loss, [x])
    return counted.full


def test_the_convolution_and_the_gate_sum_their_input_gradient_without_a_pass_of_its_own():
    """Apart, autograd adds x's two gradients in an add of their own (a read of both and a
    write, 6.4 GB in the flagship's micro-batch of 4); together the gate's d x GEMM adds
    itself into the convolution's."""
    conv = nn.Conv1d(6, 6, 4, groups=6, device=DEVICE)
    gate = nn.Linear(6, 6, device=DEVICE)
    x = rand(2, 9, 6).requires_grad_()
    for together, adds in ((False, 1), (True, 0)):
        if together:
            u, g = causal_conv_and_linear(x, None, conv.weight, conv.bias, gate)
        else:
            u, g = causal_conv(x, None, conv.weight, conv.bias), gate(x)
        assert adds_over(x, (u * g).sum()) == adds, together


@pytest.mark.parametrize("amp", [False, True], ids=["fp64", "bf16-autocast"])
def test_linears_of_one_input_equal_the_linears_apart(amp):
    """linears (the matrix state's drive, values and queries of one input) against the
    three F.linear calls, autograd summing x's gradients: the same outputs in the same
    dtypes, and the gradients of x and of each weight; an output no loss reaches gets its
    weight no gradient, as apart."""
    dtype = torch.float32 if amp else torch.float64
    weights = [rand(n, 6, dtype=dtype, seed=n).requires_grad_() for n in (9, 4, 6)]
    x = rand(2, 5, 6, dtype=torch.bfloat16 if amp else dtype).requires_grad_()
    device = torch.device(DEVICE).type
    with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
        want = tuple(F.linear(x, w) for w in weights)
        got = linears(x, *weights)
    tol = {"rtol": 2e-2, "atol": 2e-2} if amp else {"rtol": 1e-12, "atol": 1e-12}
    for reached in ((0, 1, 2), (0, 2)):  # the second: the middle output unused
        grads = [rand(*want[i].shape, seed=10 + i).to(want[i].dtype) for i in reached]

        def gradients(outs, reached=reached, grads=grads):
            return torch.autograd.grad([outs[i] for i in reached], [x, *weights], grads,
                                       retain_graph=True, allow_unused=True)

        for w, g in zip((*want, *gradients(want)), (*got, *gradients(got)), strict=True):
            assert (g is None) == (w is None)
            if w is not None:
                assert g.dtype == w.dtype
                torch.testing.assert_close(g, w, **tol)


def test_linears_of_one_input_sum_its_gradient_without_a_pass_of_their_own():
    """Apart, autograd adds x's three gradients in two adds of their own (each a read of
    two and a write: 12.9 GB in the flagship's micro-batch under the matrix state);
    together each GEMM after the first adds itself into the first's d x."""
    weights = [rand(n, 6, seed=n) for n in (9, 4, 6)]
    x = rand(2, 5, 6).requires_grad_()
    for together, adds in ((False, 2), (True, 0)):
        outs = linears(x, *weights) if together else tuple(F.linear(x, w) for w in weights)
        assert adds_over(x, sum(o.sum() for o in outs)) == adds, together


# --- the kernels against the operators ---------------------------------------------------------

@pytest.fixture(scope="module")
def kernels():
    if not HAVE_TRITON:
        pytest.skip(NO_TRITON)
    return kernel_module("ten.kernels.block_kernels")


# d not a power of two; rows not a multiple of the backward's rows per program
@pytest.mark.parametrize("n, d", [(1, 8), (37, 24), (16, 100)])
@pytest.mark.parametrize("out, stream", [(torch.float32, torch.float32),
                                         (torch.bfloat16, torch.float32),
                                         (torch.bfloat16, torch.bfloat16)])
def test_layer_norm_kernels_equal_the_operator(kernels, n, d, out, stream):
    x, w, b, dy = rand(n, d).to(stream), rand(d, seed=1), rand(d, seed=2), \
        rand(n, d, seed=3).to(out)
    # the operator's torch implementation, on the CPU (on CUDA the operator is the kernel)
    ref = torch.ops.ten.layer_norm.default(*cpu(x, w, b), 1e-5, out)
    got = kernels.layer_norm(x, w, b, 1e-5, out)
    for r, g in zip(ref, got, strict=True):
        assert g.dtype == r.dtype  # bf16: within one rounding (the interpreter truncates)
        tol = {} if g.dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
        torch.testing.assert_close(g.cpu(), r, **tol)
    ref_b = torch.ops.ten.layer_norm_backward.default(*cpu(dy, x, w), ref[1], ref[2])
    got_b = kernels.layer_norm_backward(dy, x, w, *(t.to(DEVICE) for t in ref[1:]))
    for r, g in zip(ref_b, got_b, strict=True):
        assert g.dtype == r.dtype  # a bf16 stream's gradient is bf16
        tol = {} if g.dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
        torch.testing.assert_close(g.cpu(), r, **tol)
    assert_fake_layout("layer_norm", (x, w, b, 1e-5, out), got)
    assert_fake_layout("layer_norm_backward", (dy, x, w, *got[1:]), got_b)


@pytest.mark.parametrize("n, d", [(1, 8), (37, 24)])
@pytest.mark.parametrize("act, stream", [(torch.float32, torch.float32),
                                         (torch.bfloat16, torch.float32),
                                         (torch.bfloat16, torch.bfloat16)])
@pytest.mark.parametrize("with_dh", [True, False])
def test_add_layer_norm_kernels_equal_the_operator(kernels, n, d, act, stream, with_dh):
    """A stream x (fp32, or bf16 with residual_dtype: bf16) and a sublayer output r in
    ``act`` (bf16 under autocast): the sum, its norm in ``act``, and backward with and
    without the stream's own gradient; r's gradient in its dtype (bf16), or none written
    when it is the stream's."""
    x, r = rand(n, d).to(stream), rand(n, d, seed=1).to(act)
    w, b = rand(d, seed=2), rand(d, seed=3)
    dh = rand(n, d, seed=4).to(stream) if with_dh else None
    dy = rand(n, d, seed=5).to(act)
    ref = torch.ops.ten.add_layer_norm.default(*cpu(x, r, w, b), 1e-5, act)
    got = kernels.add_layer_norm(x, r, w, b, 1e-5, act)
    # the norm of the sum the kernel stored: a bf16 sum may differ from torch's by one
    # rounding (the interpreter truncates), which moves the row's statistics
    ref = (ref[0], *torch.ops.ten.layer_norm.default(*cpu(got[0], w, b), 1e-5, act))
    for want, have in zip(ref, got, strict=True):
        assert have.dtype == want.dtype
        tol = {} if have.dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
        torch.testing.assert_close(have.cpu(), want, **tol)
    ref_b = torch.ops.ten.add_layer_norm_backward.default(
        None if dh is None else dh.cpu(), *cpu(dy, ref[0].to(DEVICE), w), ref[2], ref[3], act)
    got_b = kernels.add_layer_norm_backward(dh, dy, ref[0].to(DEVICE), w,
                                            *(t.to(DEVICE) for t in ref[2:]), act)
    assert got_b[1].shape == ((0,) if act == stream else (n, d))
    assert_fake_layout("add_layer_norm", (x, r, w, b, 1e-5, act), got)
    assert_fake_layout("add_layer_norm_backward", (dh, dy, got[0], w, *got[2:], act), got_b)
    for want, have in zip(ref_b, got_b, strict=True):
        assert have.dtype == want.dtype
        tol = {} if have.dtype == torch.bfloat16 else {"rtol": 1e-4, "atol": 1e-4}
        if stream == torch.bfloat16 and with_dh and have is got_b[0]:
            # dx = the norm's gradient rounded to bf16, + dh: the interpreter truncates
            # where torch rounds, and a sum that cancels keeps that one step of its terms
            tol = {"rtol": 0.016, "atol": 2**-7 * float(want.abs().max())}
        torch.testing.assert_close(have.cpu(), want, **tol)


@pytest.mark.parametrize("n, d", [(1, 8), (37, 24)])
@pytest.mark.parametrize("act, stream", [(torch.float32, torch.float32),
                                         (torch.bfloat16, torch.float32),
                                         (torch.bfloat16, torch.bfloat16)])
def test_the_gated_add_layer_norm_kernels_equal_the_operator(kernels, n, d, act, stream):
    """h = x + σ(g)·r, the mixer's gate applied by the norm after it: σ(g)·r in fp32 from
    the stored inputs, rounded once to r's dtype (torch's bf16 kernels round σ(g) on the
    way: the reference widens), then the sum, and its norm as the plain kernel writes it;
    backward, dx as without a gate and the gate's gradients of it."""
    x, r, g = rand(n, d).to(stream), rand(n, d, seed=1).to(act), rand(n, d, seed=6).to(act)
    w, b = rand(d, seed=2), rand(d, seed=3)
    dh, dy = rand(n, d, seed=4).to(stream), rand(n, d, seed=5).to(act)
    got = kernels.add_layer_norm(x, r, w, b, 1e-5, act, g)
    product = (torch.sigmoid(g.float()) * r.float()).to(act)  # one rounding, as the kernel
    want = (x + product).to(stream)
    if act == torch.bfloat16:  # a rounding of the product and one of h apart at most (the
        # interpreter truncates where torch rounds): a bf16 step of each, 2^-7 relative
        gap = (got[0].float() - want.float()).abs()
        assert torch.all(gap <= 2**-7 * (product.float().abs() + want.float().abs()))
    else:  # the interpreter's sigmoid is not torch's to the last bit
        torch.testing.assert_close(got[0], want, rtol=1e-6, atol=1e-6)
    for want, have in zip(kernels.layer_norm(got[0], w, b, 1e-5, act), got[1:], strict=True):
        assert torch.equal(have, want)  # the norm of h as stored
    got_b = kernels.add_layer_norm_backward(dh, dy, got[0], w, got[2], got[3], act, r, g)
    plain_b = kernels.add_layer_norm_backward(dh, dy, got[0], w, got[2], got[3], act)
    for i in (0, 2, 3):  # dx, d weight, d bias: the gate changes none of them
        assert torch.equal(got_b[i], plain_b[i])
    # dr, dg: σ(g)·r's gradients of dx as the kernel stored it, rounded to r's dtype, in
    # fp32 (the CPU operator's are autograd's: held to it bit for bit above), rounded once
    dx, s = got_b[0].to(act).float(), torch.sigmoid(g.float())
    tol = {} if act == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-6}
    for want, have in (((dx * s).to(act), got_b[1]),
                       ((dx * r.float() * (1 - s) * s).to(act), got_b[4])):
        assert have.dtype == act
        torch.testing.assert_close(have, want, **tol)
    assert_fake_layout("add_layer_norm", (x, r, w, b, 1e-5, act, g), got)
    assert_fake_layout("add_layer_norm_backward", (dh, dy, got[0], w, *got[2:], act, r, g),
                       got_b)


# T and d not multiples of a program's tile (32 tokens, 128 channels); one sequence or two;
# T shorter than the tail
@pytest.mark.parametrize("B, T, d, W", [(1, 5, 8, 4), (2, 70, 130, 4), (2, 33, 16, 2),
                                        (1, 9, 8, 1), (1, 12, 8, 3), (2, 2, 8, 4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("start", [False, True], ids=["tail", "start"])
def test_causal_conv_kernels_equal_the_operator(kernels, B, T, d, W, dtype, start):
    """In fp32 from the stored inputs, one rounding at the end: against the operator on
    the inputs widened to fp32 (torch's bf16 conv rounds the weights and its sums to bf16
    on the way, which the kernel does not). After a tail, and at a sequence's start."""
    x, dy = rand(B, T, d).to(dtype), rand(B, T, d, seed=3).to(dtype)
    tail = None if start else rand(B, W - 1, d, seed=4).to(dtype)
    w, b = rand(d, W, seed=1), rand(d, seed=2)  # fp32 parameters, as under autocast
    wide = cpu(x.float(), None if start else tail.float(), w, b)
    ref = torch.ops.ten.causal_conv.default(*wide).to(dtype)
    got = kernels.causal_conv(x, tail, w, b)
    assert got.dtype == dtype
    assert_fake_layout("causal_conv", (x, tail, w, b), got)
    tol = {} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
    torch.testing.assert_close(got.cpu(), ref, **tol)
    dx, dtail, dw, db = torch.ops.ten.causal_conv_backward.default(dy.cpu().float(), *wide)
    got_b = kernels.causal_conv_backward(dy, x, tail, w, b)
    assert [t.dtype for t in got_b] == [dtype, dtype, w.dtype, b.dtype]
    # the strides the operator's fake promises: torch.compile asserts them (the H100 run
    # of train.compile stopped on a transposed d weight)
    assert_fake_layout("causal_conv_backward", (dy, x, tail, w, b), got_b)
    for r, g in ((dx, got_b[0]), (dtail, got_b[1])):
        torch.testing.assert_close(g.cpu(), r.to(dtype), **tol)
    for r, g in ((dw, got_b[2]), (db, got_b[3])):
        torch.testing.assert_close(g.cpu(), r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_conv_backward_tile_the_gpu_suite_times_computes_the_shipped_ones_gradients(
        kernels, dtype):
    """The GPU suite's `conv` section times these against the shipped tile, which one to
    ship is its answer: each must give d x bit for bit (each element's sum over the taps
    in one order) and d w, d bias as the operator's, on a T and d no tile divides."""
    B, T, d, W = 2, 70, 130, 4
    x, dy = rand(B, T, d).to(dtype), rand(B, T, d, seed=3).to(dtype)
    w, b = rand(d, W, seed=1), rand(d, seed=2)
    shipped = kernels.causal_conv_backward(dy, x, None, w, b)
    _, _, dw, db = torch.ops.ten.causal_conv_backward.default(
        dy.cpu().float(), *cpu(x.float(), None, w, b))
    assert kernels.CONV_BACKWARD_CANDIDATES[0] == kernels.CONV_BACKWARD
    for tiles in kernels.CONV_BACKWARD_CANDIDATES[1:]:
        got = kernels.causal_conv_backward(dy, x, None, w, b, tiles=tiles)
        assert torch.equal(got[0], shipped[0]), tiles
        for r, g in ((dw, got[2]), (db, got[3])):
            torch.testing.assert_close(g.cpu(), r, rtol=1e-4, atol=1e-4)


def test_the_conv_backward_kernel_refuses_widths_beyond_its_accumulators(kernels):
    """Wider convolutions run torch's backward on CUDA (ten.kernels.block_fused's dispatch)."""
    W = kernels.CONV_MAX_WIDTH + 1
    x, tail, w, b = rand(1, 8, 4), rand(1, W - 1, 4, seed=3), rand(4, W, seed=1), rand(4, seed=2)
    with pytest.raises(ValueError, match=f"widths up to {W - 1}, got {W}"):
        kernels.causal_conv_backward(rand(1, 8, 4, seed=3), x, tail, w, b)


@pytest.mark.parametrize("h", [5, 1100])  # below one block; a block and a ragged one
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_swiglu_kernels_equal_the_operator(kernels, h, dtype):
    """And the backward writes the forward's silu(a)·b over dy, bit for bit: the down
    projection's weight gradient reads it in place of the one forward did not keep."""
    ab, dy = rand(2, 3, 2 * h).to(dtype), rand(2, 3, h, seed=1).to(dtype)
    y = kernels.swiglu(ab)
    torch.testing.assert_close(y.cpu(), torch.ops.ten.swiglu.default(ab.cpu()))
    dy_then_y, want_y = dy.clone(), dy.cpu().clone()
    dab = kernels.swiglu_backward(dy_then_y, ab)
    torch.testing.assert_close(dab.cpu(), torch.ops.ten.swiglu_backward.default(want_y, ab.cpu()))
    torch.testing.assert_close(dy_then_y.cpu(), want_y)  # the operator's y, over its dy
    assert torch.equal(dy_then_y, y)
    assert_fake_layout("swiglu", (ab,), y)
    assert_fake_layout("swiglu_backward", (dy, ab), dab)


@pytest.mark.parametrize("stream", [torch.float32, torch.bfloat16])
def test_the_norm_before_the_float8_block_scales_what_it_writes(kernels, stream):
    """add_layer_norm_with_scale: the residual sum and its norm (bf16, as under autocast)
    as add_layer_norm's kernel writes them, bit for bit, and the norm's e4m3 scale as
    ten::fp8_scale takes it of that norm afterwards; the largest row planted last."""
    x, r = rand(37, 24).to(stream), rand(37, 24, seed=1).to(stream)
    w, b = rand(24, seed=2), rand(24, seed=3)
    x[36, 5] = 30.0
    got = kernels.add_layer_norm_with_scale(x, r, w, b, 1e-5, torch.bfloat16, E4M3, tiny=TINY)
    for want, have in zip(kernels.add_layer_norm(x, r, w, b, 1e-5, torch.bfloat16), got[:4],
                          strict=True):
        assert torch.equal(have, want)
    assert torch.equal(got[4].cpu(), torch.ops.ten.fp8_scale.default(got[1].cpu(), E4M3, None))
    assert_fake_layout("add_layer_norm_with_scale", (x, r, w, b, 1e-5, torch.bfloat16, E4M3),
                       got)
    g = rand(37, 24, seed=4).to(stream)  # a TEN block's: the mixer's gate applied too
    gated = kernels.add_layer_norm_with_scale(x, r, w, b, 1e-5, torch.bfloat16, E4M3, g,
                                              tiny=TINY)
    for want, have in zip(kernels.add_layer_norm(x, r, w, b, 1e-5, torch.bfloat16, g),
                          gated[:4], strict=True):
        assert torch.equal(have, want)
    assert torch.equal(gated[4].cpu(),
                       torch.ops.ten.fp8_scale.default(gated[1].cpu(), E4M3, None))


@pytest.mark.parametrize("h", [5, 1100])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_swiglu_forward_scales_what_it_writes_as_a_pass_over_it_would(kernels, h, dtype):
    """With the maxima taken as the product is written (the float8 block's SwiGLU), the
    product is the plain kernel's bit for bit, and its scale the one ten::fp8_scale takes
    of it afterwards. The largest magnitude is planted in the ragged last block of a row."""
    ab = rand(2, 3, 2 * h).to(dtype)
    ab[1, 2, h - 1] = ab[1, 2, 2 * h - 1] = 40.0  # silu(40)·40: the product's largest
    ab[0, 1, h - 2] = 1.0  # b·silu'(a) = -100·silu'(1): the largest gain, not the product's
    ab[0, 1, 2 * h - 2] = -100.0
    y, y_scale, gain = kernels.swiglu_with_scale(ab, E4M3, tiny=TINY)
    assert torch.equal(y, kernels.swiglu(ab))
    assert torch.equal(y_scale.cpu(), torch.ops.ten.fp8_scale.default(y.cpu().view(-1, h),
                                                                       E4M3, None))
    want = torch.ops.ten.swiglu_with_scale.default(ab.cpu(), E4M3)[2]
    assert want.item() == pytest.approx(100 * 0.9277, rel=1e-3)  # silu'(1) = 0.9277
    torch.testing.assert_close(gain.cpu(), want, rtol=1e-6, atol=0)
    assert_fake_layout("swiglu_with_scale", (ab, E4M3), (y, y_scale, gain))


@pytest.mark.parametrize("rows, h", [(6, 5), (70, 100)])  # one tile; tiles and ragged ones
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_float8_swiglu_backward_writes_the_plain_gradient_and_y_in_float8(kernels, rows,
                                                                             h, dtype):
    """The float8 block's backward pass writes its GEMMs' operands in float8: [d a | d b]
    as the plain kernel writes it, cast with the given scale by its rows and transposed,
    the bytes ten::fp8_cast_both writes of it, and y (which the plain kernel writes over
    dy in bf16) with forward's scale, transposed, the bytes ten::fp8_cast writes of the
    plain kernels' y; each with zero rows to 16; dy is left as it was. Large gradients
    are planted in the last, ragged tile, and the scale leaves one of them saturated."""
    ab, dy = rand(rows, 2 * h).to(dtype), rand(rows, h, seed=1).to(dtype)
    ab[rows - 1, 2 * h - 1], dy[rows - 1, h - 1] = 3.0, 50.0
    y, y_scale, _ = kernels.swiglu_with_scale(ab, E4M3, tiny=TINY)
    dab = kernels.swiglu_backward(dy.clone(), ab)
    grad_scale = (dab.float().abs().amax() / 2 / torch.finfo(E5M2).max).reshape(())
    before = dy.clone()
    dab8, dab8_t, y8_t = kernels.swiglu_backward_float8(dy, ab, y_scale, grad_scale, E5M2,
                                                        E4M3, 16)
    assert torch.equal(dy, before)
    want8, want8_t = torch.ops.ten.fp8_cast_both.default(dab.cpu(), grad_scale.cpu(), E5M2, 16)
    Mp = rows + (-rows % 16)
    assert dab8.shape == want8.shape == (Mp, 2 * h) and dab8_t.shape == (2 * h, Mp)
    assert torch.equal(dab8.cpu().view(torch.uint8), want8.view(torch.uint8))
    assert torch.equal(dab8_t.cpu().view(torch.uint8), want8_t.view(torch.uint8))
    want = torch.ops.ten.fp8_cast.default(y.cpu(), y_scale.cpu(), E4M3, True, 16)
    assert y8_t.shape == want.shape == (h, Mp)
    assert torch.equal(y8_t.cpu().view(torch.uint8), want.view(torch.uint8))
    assert_fake_layout("swiglu_backward_float8", (dy, ab, y_scale, grad_scale, E5M2, E4M3, 16),
                       (dab8, dab8_t, y8_t))


def test_a_nan_in_the_swiglu_output_makes_its_scale_nan_as_torchs_amax_does(kernels):
    """A non-finite step must show in the float8 scale and the gain (the trainer's
    non-finite check then skips the step), not be dropped by a max that ignores NaN."""
    ab = rand(4, 2 * 64)
    ab[2, 3] = float("nan")
    _, scale, gain = kernels.swiglu_with_scale(ab, E4M3, tiny=TINY)
    assert torch.isnan(scale).item() and torch.isnan(gain).item()
    _, scale, gain = torch.ops.ten.swiglu_with_scale.default(ab.cpu(), E4M3)
    assert torch.isnan(scale).item() and torch.isnan(gain).item()


def test_in_fp64_the_kernels_compute_in_fp64(kernels):
    """A float64 model and the gradient checks run the kernels in fp64 on a GPU: they
    must not round through fp32 (the first H200 run failed gradcheck on that, and the
    LayerNorm backward did not compile)."""
    x, w, b = (rand(*s, dtype=torch.float64, seed=i) for i, s in enumerate([(37, 24), (24,),
                                                                           (24,)]))
    dy = rand(37, 24, dtype=torch.float64, seed=3)
    ref = torch.ops.ten.layer_norm.default(*cpu(x, w, b), 1e-5, torch.float64)
    got = kernels.layer_norm(x, w, b, 1e-5, torch.float64)
    ref_b = torch.ops.ten.layer_norm_backward.default(*cpu(dy, x, w), ref[1], ref[2])
    got_b = kernels.layer_norm_backward(dy, x, w, *(t.to(DEVICE) for t in ref[1:]))
    ab, g = rand(2, 3, 14, dtype=torch.float64), rand(2, 3, 7, dtype=torch.float64, seed=1)
    cx, ct, cw, cb = (rand(*s, dtype=torch.float64, seed=i)
                      for i, s in enumerate([(2, 37, 9), (2, 3, 9), (9, 4), (9,)]))
    cdy = rand(2, 37, 9, dtype=torch.float64, seed=5)
    r, dh = rand(37, 24, dtype=torch.float64, seed=6), rand(37, 24, dtype=torch.float64, seed=7)
    add = torch.ops.ten.add_layer_norm.default(*cpu(x, r, w, b), 1e-5, torch.float64)
    add_b = torch.ops.ten.add_layer_norm_backward.default(*cpu(dh, dy, add[0], w), add[2],
                                                          add[3], torch.float64)
    got_add = kernels.add_layer_norm(x, r, w, b, 1e-5, torch.float64)
    got_add_b = kernels.add_layer_norm_backward(dh, dy, add[0].to(DEVICE), w,
                                                *(t.to(DEVICE) for t in add[2:]), torch.float64)
    gated = torch.ops.ten.add_layer_norm.default(*cpu(x, r, w, b), 1e-5, torch.float64,
                                                 dh.cpu())  # dh serves as the gate
    gated_b = torch.ops.ten.add_layer_norm_backward.default(
        *cpu(dh, dy, gated[0], w), gated[2], gated[3], torch.float64, *cpu(r, dh))
    got_gated = kernels.add_layer_norm(x, r, w, b, 1e-5, torch.float64, dh)
    got_gated_b = kernels.add_layer_norm_backward(dh, dy, gated[0].to(DEVICE), w,
                                                  *(t.to(DEVICE) for t in gated[2:]),
                                                  torch.float64, r, dh)
    want = (*ref, *ref_b, *add, *add_b, *gated, *gated_b,
            torch.ops.ten.swiglu.default(ab.cpu()),
            torch.ops.ten.swiglu_backward.default(g.cpu().clone(), ab.cpu()),
            torch.ops.ten.causal_conv.default(*cpu(cx, ct, cw, cb)),
            *torch.ops.ten.causal_conv_backward.default(*cpu(cdy, cx, ct, cw, cb)))
    have = (*got, *got_b, *got_add, *got_add_b, *got_gated, *got_gated_b, kernels.swiglu(ab),
            kernels.swiglu_backward(g.clone(), ab),
            kernels.causal_conv(cx, ct, cw, cb),
            *kernels.causal_conv_backward(cdy, cx, ct, cw, cb))
    for r, o in zip(want, have, strict=True):
        assert o.dtype == torch.float64
        torch.testing.assert_close(o.cpu(), r, rtol=1e-12, atol=1e-12)
