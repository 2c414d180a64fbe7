"""ten.kernels.fp8 on the CPU (torch's _scaled_mm runs there): each GEMM equals the exact
product of its float8-rounded operands times their scales, forward and backward, under
both scalings; the result stays within float8's rounding of the float64 linear; an
outlier row costs the other rows their digits under one scale a tensor, not under a scale
a row; and every call keeps the layout and widths CUDA's _scaled_mm demands."""

from collections import Counter

import pytest
import torch
from saved_tensors import saved_for_backward
from torch.utils._python_dispatch import TorchDispatchMode

from ten.kernels.block_fused import float8_swiglu
from ten.kernels.fp8 import (
    E4M3,
    E5M2,
    Float8Gemms,
    fp8_eligible,
    fp8_linear,
    reference_linear,
    scaled_mm,
    to_fp8,
)

SEED = 0


def inputs(M=48, K=64, N=32, dtype=torch.float32):
    g = torch.Generator().manual_seed(SEED)
    print(f"seed {SEED}")
    x = torch.randn(M, K, generator=g, dtype=dtype, requires_grad=True)
    w = (torch.randn(N, K, generator=g, dtype=dtype) / K ** 0.5).requires_grad_()
    dy = torch.randn(M, N, generator=g, dtype=dtype)
    return x, w, dy


def rounded(t, dtype, dim=None):
    """t as float8 rounds it, back in float64: what the GEMM multiplies."""
    t8, s = to_fp8(t.detach(), dtype, dim)
    return t8.double() * s.double()


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("rows", [48, 40])  # 40: padded to 48 with zeros for dw's sum
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_each_gemm_is_the_exact_product_of_its_rounded_operands(scaling, rows):
    x, w, dy = inputs(M=rows)
    y = fp8_linear(x, w, scaling=scaling)
    y.backward(dy)
    row = scaling == "row"
    # forward: x by rows, w by its rows (the output's columns); then the two of backward
    want_y = rounded(x, E4M3, 1 if row else None) @ rounded(w, E4M3, 1 if row else None).t()
    want_dx = rounded(dy, E5M2, 1 if row else None) @ rounded(w, E4M3, 0 if row else None)
    want_dw = rounded(dy.t(), E5M2, 1 if row else None) @ rounded(x, E4M3, 0 if row else None)
    tol = 1e-2 if row else 1e-5  # row scaling's output is bf16 (CUDA's rule), else fp32
    assert rel(y, want_y) < tol
    assert rel(x.grad, want_dx) < tol and rel(w.grad, want_dw) < tol
    assert x.grad.dtype == x.dtype and w.grad.dtype == w.dtype


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_the_result_is_within_float8s_rounding_of_the_float64_linear(scaling):
    """e4m3 keeps 3 mantissa bits (relative rounding up to 1/16), e5m2 2 (1/8): errors of
    random signs average out over the sum; bounds at about twice what is seen."""
    x, w, dy = inputs()
    b = torch.randn(w.shape[0], dtype=torch.float64)
    y = fp8_linear(x, w, b, scaling=scaling)
    y.backward(dy)
    xd, wd = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    ref = reference_linear(xd, wd, b)
    ref.backward(dy.double())
    assert rel(y, ref) < 0.06
    assert rel(x.grad, xd.grad) < 0.12 and rel(w.grad, wd.grad) < 0.12


def test_an_outlier_row_costs_the_others_their_digits_under_one_scale_only():
    """One token 100,000 times the others (as a massive activation is): with one scale for
    the tensor the rest fall to e4m3's subnormals (steps of 2^-9 of a range whose top is
    the outlier's); a scale per row keeps them."""
    x, w, _ = inputs()
    with torch.no_grad():
        x[0] *= 1e5
    ref = reference_linear(x.detach().double(), w.detach().double())
    errors = {s: rel(fp8_linear(x, w, scaling=s)[1:], ref[1:]) for s in ("tensor", "row")}
    print(errors)
    assert errors["row"] < 0.06 < 0.3 < errors["tensor"]


def test_under_bf16_autocast_the_output_is_bf16_and_the_grads_the_params_dtypes():
    x, w, dy = inputs(M=40)  # rows need not be a multiple of 16
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = fp8_linear(x.view(4, 10, 64), w)
    assert y.dtype == torch.bfloat16 and y.shape == (4, 10, 32)
    gemms = y.grad_fn.next_functions[0][0]  # under the view: the float8 GEMMs' node
    x_cols_t, _, kept_w = gemms.saved_tensors  # of x, dw's operand: (K, M padded to 16)
    assert x_cols_t.dtype == E4M3 and x_cols_t.shape == (64, 48) and kept_w is w
    y.backward(dy.view(4, 10, 32).bfloat16())
    assert x.grad.dtype == torch.float32 and w.grad.dtype == torch.float32
    assert torch.isfinite(w.grad).all()


def test_zeros_stay_zeros():
    x = torch.zeros(16, 32, requires_grad=True)
    w = torch.zeros(16, 32, requires_grad=True)
    y = fp8_linear(x, w)
    y.sum().backward()
    assert not y.any() and torch.isfinite(x.grad).all() and not w.grad.any()


def test_widths_that_are_not_multiples_of_16_are_refused_not_run():
    assert fp8_eligible(64, 32) and not fp8_eligible(64, 40) and not fp8_eligible(24, 32)
    x, w, _ = inputs(N=40)
    with pytest.raises(ValueError, match=r"multiples of 16, got a \(40, 64\) weight"):
        fp8_linear(x, w)
    with pytest.raises(ValueError, match="scaling must be one of"):
        fp8_linear(*inputs()[:2], scaling="block")


def test_every_call_keeps_cudas_layout_and_format_rules():
    a8, sa = to_fp8(torch.randn(16, 32), E4M3)
    b8, sb = to_fp8(torch.randn(48, 32), E4M3)
    assert scaled_mm(a8, b8.t(), sa, sb, torch.float32).shape == (16, 48)  # row- by column-major
    with pytest.raises(ValueError, match="row-major, the second column-major"):
        scaled_mm(a8, b8.t().contiguous(), sa, sb, torch.float32)
    g8, sg = to_fp8(torch.randn(16, 32), E5M2)
    with pytest.raises(ValueError, match="two e5m2"):
        scaled_mm(g8, to_fp8(torch.randn(48, 32), E5M2)[0].t(), sg, sg, torch.float32)
    with pytest.raises(ValueError, match="row scales give a bf16 output only"):
        scaled_mm(a8, b8.t(), torch.ones(16, 1), torch.ones(1, 48), torch.float32)
    with pytest.raises(ValueError, match="not multiples of 16"):
        scaled_mm(a8[:, :24], b8[:, :24].t(), sa, sb, torch.float32)


def swiglu_block_inputs():
    g = torch.Generator().manual_seed(SEED)
    print(f"seed {SEED}")
    x = torch.randn(2, 20, 64, generator=g, requires_grad=True)
    up = (torch.randn(2 * 48, 64, generator=g) / 64 ** 0.5).requires_grad_()
    down = (torch.randn(32, 48, generator=g) / 48 ** 0.5).requires_grad_()
    return x, up, down, torch.randn(2, 20, 32, generator=g)


def two_projections(x, up, down, dz, scaling):
    """The SwiGLU block from fp8_linear, silu(a)·b kept, and fp8_linear: (z, the grads)."""
    x, up, down = (t.detach().clone().requires_grad_() for t in (x, up, down))
    a, b = fp8_linear(x, up, scaling=scaling).chunk(2, dim=-1)
    z = fp8_linear(torch.nn.functional.silu(a) * b, down, scaling=scaling)
    z.backward(dz)
    return z, (x.grad, up.grad, down.grad)


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_the_swiglu_block_in_float8_equals_its_two_projections_with_the_product_kept(scaling):
    """float8_swiglu takes the product's scale from the SwiGLU pass and gets the product
    back in backward instead of keeping it: the same GEMMs on the same operands as
    fp8_linear, silu(a)·b kept, and fp8_linear again; under one scale a tensor all but the
    up projection's, whose operand [d a | d b] has a bounded scale (the next test)."""
    x, up, down, dz = swiglu_block_inputs()
    z = float8_swiglu(x, up, down, Float8Gemms(scaling))
    z.backward(dz)
    z2, (dx2, dup2, ddown2) = two_projections(x, up, down, dz, scaling)
    assert z.shape == (2, 20, 32)
    assert torch.allclose(z, z2, rtol=1e-6, atol=1e-6)
    assert torch.allclose(down.grad, ddown2, rtol=1e-5, atol=1e-6)
    if scaling == "row":
        for got, want in ((x.grad, dx2), (up.grad, dup2)):
            assert torch.allclose(got, want, rtol=1e-5, atol=1e-6)


def test_the_gradients_bounded_scale_bounds_it_where_the_bound_is_tight():
    """The bound max|dz|·‖W‖₁·gain is attained when a row of dz has the signs of the
    column of W with the largest sum of magnitudes, at the element of the largest gain:
    [d a | d b] there reaches the bound (so a bound taken over rows of W, or without the
    gain, would fail here), and the scale (with its margin) still covers it."""
    from ten.kernels.block_fused import GRAD_BOUND_MARGIN, _bounded_grad_scale, _swiglu_gain

    g = torch.Generator().manual_seed(SEED)
    print(f"seed {SEED}")
    M, d, h = 8, 32, 48
    down = torch.randn(d, h, generator=g) / h ** 0.5
    ab = torch.randn(M, 2 * h, generator=g)
    j = int(down.abs().sum(0).argmax())
    ab[3, j], ab[3, h + j] = 1.5, 6.0  # the largest gain, |b·silu'(a)|, in W's column j
    dz = torch.randn(M, d, generator=g) * 0.1
    dz[3] = torch.sign(down[:, j])  # dy[3, j] = ‖W‖₁, the most any dy can be
    dy = dz @ down
    a, b = ab.double().chunk(2, dim=-1)
    s = torch.sigmoid(a)
    dab = torch.cat([dy.double() * b * s * (1 + a * (1 - s)), dy.double() * a * s], 1)
    dz_scale = dz.abs().amax() / torch.finfo(E5M2).max
    bound = _bounded_grad_scale(dz_scale, down, _swiglu_gain(ab)) * torch.finfo(E5M2).max
    assert dab.abs().max() <= bound
    assert dab.abs().max() > 0.99 * bound / GRAD_BOUND_MARGIN


def test_the_bounded_scale_of_the_blocks_gradient_costs_it_no_digits():
    """Under one scale a tensor [d a | d b] is cast with a scale bounded before it is
    computed (several times its own amax's): its errors against the float64 block stay
    those of the two projections', which scale it by its own amax."""
    x, up, down, dz = swiglu_block_inputs()
    float8_swiglu(x, up, down, Float8Gemms("tensor")).backward(dz)
    _, (dx2, dup2, _) = two_projections(x, up, down, dz, "tensor")
    xd, upd, downd = (t.detach().double().requires_grad_() for t in (x, up, down))
    a, b = torch.nn.functional.linear(xd, upd).chunk(2, dim=-1)
    torch.nn.functional.linear(torch.nn.functional.silu(a) * b, downd).backward(dz.double())
    for bounded, own, exact in ((x.grad, dx2, xd.grad), (up.grad, dup2, upd.grad)):
        assert rel(bounded, exact) < 1.2 * rel(own, exact) + 0.005


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_the_float8_swiglu_block_keeps_of_x_only_what_dw_reads_in_float8(scaling):
    """x (40 rows of 64) is cast in forward for dw too: backward keeps that (64, 48) float8
    operand (the rows padded to 16), one byte an element, and no copy of x itself."""
    x, up, down, _ = swiglu_block_inputs()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        saved = saved_for_backward(float8_swiglu, x, up, down, Float8Gemms(scaling))
    assert 40 * 64 not in saved.sizes and 64 * 48 in saved.sizes


def test_the_float8_swiglu_block_refuses_widths_cuda_cannot_multiply():
    x, up, down, _ = swiglu_block_inputs()
    with pytest.raises(ValueError, match=r"float8_swiglu needs widths that are multiples of "
                                         r"16, got a \(32, 40\) weight"):
        float8_swiglu(x, up[:80], down[:, :40], Float8Gemms())


def test_a_scale_a_row_takes_no_scale_from_the_kernel_that_wrote_its_operand():
    x, _, dy = inputs()
    for t, dtype in ((x, E4M3), (dy, E5M2)):
        with pytest.raises(ValueError, match="one scale was passed to GEMMs that scale each "
                                             "row"):
            Float8Gemms("row").operand(t.detach(), dtype, torch.ones(()))


class TenOps(TorchDispatchMode):
    """Counts the ``ten::`` operators dispatched inside it, by name."""

    def __init__(self):
        super().__init__()
        self.counts = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "ten":
            self.counts[func.__name__.split(".")[0]] += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("scaling, scales, casts, both", [("tensor", 4, 2, 2),
                                                          ("row", 6, 6, 0)])  # passes
def test_x_and_the_gradient_are_each_scaled_once_and_cast_once_for_both_their_gemms(
        scaling, scales, casts, both):
    """Each amax and each cast is a pass over its tensor. Under one scale a tensor, x is
    scaled once and cast into both layouts in one pass in forward (y's, and dw's, kept
    for backward), and so is the gradient in backward (dx's and dw's); the weight is
    scaled and cast for each GEMM (forward by rows, backward transposed): 4 scales, 2
    casts, 2 of both layouts. A scale a row needs x's and the gradient's rows and columns
    apart (6 scales), each layout cast alone (6)."""
    x, w, dy = inputs()
    with TenOps() as ops:
        fp8_linear(x, w, scaling=scaling).backward(dy)
    assert ops.counts["fp8_scale"] == scales
    assert ops.counts["fp8_cast"] == casts
    assert ops.counts["fp8_cast_both"] == both


@pytest.mark.parametrize("scaling, scales, casts, fused", [("tensor", 6, 5, 1),
                                                           ("row", 12, 12, 0)])
def test_the_swiglu_blocks_product_and_its_gradient_are_scaled_by_the_passes_writing_them(
        scaling, scales, casts, fused):
    """Under one scale a tensor, the float8 SwiGLU block's largest operands, the product
    (M, H) and [d a | d b] (M, 2H), get their scales from the SwiGLU forward (the
    product's amax, and the gain that bounds the gradient): the scale passes left are x's
    and the output gradient's, and the weights' (each twice: forward, then backward's
    dx), 6 where two fp8_linear layers take 8; and the backward writes the product and
    [d a | d b] in float8 for their GEMMs itself, so the casts left are x, the output
    gradient, the weights, and the product by rows forward (5, and 2 of both layouts).
    A scale a row takes each operand's own scales and casts (12 and 12)."""
    x, up, down, dz = swiglu_block_inputs()
    with TenOps() as ops:
        float8_swiglu(x, up, down, Float8Gemms(scaling)).backward(dz)
    assert ops.counts["fp8_scale"] == scales and ops.counts["fp8_cast"] == casts
    assert ops.counts["fp8_cast_both"] == 2 * fused
    assert ops.counts["swiglu_with_scale"] == ops.counts["swiglu_backward_float8"] == fused
    assert ops.counts["swiglu"] == ops.counts["swiglu_backward"] == 1 - fused


def block_peak_bytes(scaling: str) -> int:
    """The most a float8 SwiGLU block of 4,096 tokens holds at once, forward and backward
    under bf16 autocast, on fake tensors (ten.train.memory's tracker)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from ten.model.mlp import MLP

    with FakeTensorMode():
        mlp = MLP(256, 704, fp8=scaling)
        x = torch.empty(4096, 256, requires_grad=True)
        tracker = MemTracker()
        tracker.track_external(mlp)
        with tracker:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                z = mlp(x)
            z.backward(torch.empty_like(z))
        return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"]


def test_one_scale_a_tensor_holds_no_more_at_its_peak_than_a_scale_a_row():
    """Its backward writes the product in float8 for dw from the SwiGLU pass (a scale a
    row casts it after), and must let that go with dw's GEMM: a reference kept past it
    held (M, H) bytes more through the up projection's backward (0.34 GiB a flagship
    block)."""
    assert block_peak_bytes("tensor") <= block_peak_bytes("row")


FP8_CARD = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (8, 9)


@pytest.mark.gpu
@pytest.mark.skipif(not FP8_CARD, reason="needs a GPU with FP8 tensor cores")
@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_on_an_fp8_card_the_swiglu_block_agrees_with_its_two_projections(scaling):
    """On CUDA the block runs the SwiGLU kernels that take the scales and write the float8
    product, the cast kernels and _scaled_mm: within float8's rounding of the same block
    from fp8_linear, silu(a)·b kept, and fp8_linear (torch's bf16 silu rounds where the
    kernel does not, so a product may land in the next float8 step: not bit for bit)."""
    x, up, down, dz = (t.detach().cuda() for t in swiglu_block_inputs())
    x, up, down = (t.requires_grad_() for t in (x, up, down))
    x2, up2, down2 = (t.detach().clone().requires_grad_() for t in (x, up, down))
    with torch.autocast("cuda", dtype=torch.bfloat16):
        z = float8_swiglu(x, up, down, Float8Gemms(scaling))
        a, b = fp8_linear(x2, up2, scaling=scaling).chunk(2, dim=-1)
        z2 = fp8_linear(torch.nn.functional.silu(a) * b, down2, scaling=scaling)
    z.backward(dz)
    z2.backward(dz)
    assert rel(z, z2) < 0.02
    for got, want in ((x.grad, x2.grad), (up.grad, up2.grad), (down.grad, down2.grad)):
        assert rel(got, want) < 0.05


@pytest.mark.parametrize("scaling, scales, normed", [("tensor", 5, 1), ("row", 12, 0)])
def test_in_a_model_the_norm_before_the_float8_block_takes_its_input_scale(scaling, scales,
                                                                          normed):
    """A TEN block with fp8: under one scale a tensor, the norm that writes the feed-forward
    block's input takes its scale (add_layer_norm_with_scale), so the block's own scale
    passes are the output gradient's and the weights' (5 a layer); a scale a row takes
    each operand's own. The loss and gradients equal those of the block scaling x itself."""
    from ten.model.config import TENConfig
    from ten.model.presets import build_model

    torch.manual_seed(SEED)
    print(f"seed {SEED}")
    config = TENConfig(vocab_size=64, d_model=32, n_layers=2, seq_len=32, n_eigenstates=8,
                       n_heads=2, fp8=scaling)  # a feed-forward width of 128
    model = build_model(config, "cpu")
    ids = torch.randint(0, 64, (2, 20))
    with TenOps() as ops:
        loss = torch.nn.functional.cross_entropy(model(ids)[0].flatten(0, 1), ids.flatten())
        loss.backward()
    assert ops.counts["fp8_scale"] == scales * config.n_layers
    assert ops.counts["add_layer_norm_with_scale"] == normed * config.n_layers
    grads = [p.grad.clone() for p in model.parameters()]
    for block in model.blocks:  # the block scaling x itself: the same numbers
        block.mlp.input_scale_for = None
    model.zero_grad()
    again = torch.nn.functional.cross_entropy(model(ids)[0].flatten(0, 1), ids.flatten())
    again.backward()
    assert torch.equal(again, loss)
    assert all(torch.equal(p.grad, g) for p, g in zip(model.parameters(), grads, strict=True))


@pytest.mark.parametrize("scaling", ["tensor", "row"])
def test_a_float8_model_recomputing_its_blocks_gets_the_same_gradients(scaling):
    """grad_checkpointing: each block's forward runs again in backward (autograd's saved
    tensors hooks), the float8 block's operands and scales with it: the same loss and
    gradients, to the bit, as the model keeping them."""
    from ten.model.config import TENConfig
    from ten.model.presets import build_model

    print(f"seed {SEED}")
    ids = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(SEED))
    results = []
    for recompute in (False, True):
        torch.manual_seed(SEED)
        model = build_model(TENConfig(vocab_size=64, d_model=32, n_layers=2, seq_len=32,
                                      n_eigenstates=8, n_heads=2, fp8=scaling,
                                      grad_checkpointing=recompute), "cpu")
        model.train()
        with TenOps() as ops:
            loss = torch.nn.functional.cross_entropy(model(ids)[0].flatten(0, 1),
                                                     ids.flatten())
            loss.backward()
        results.append((loss.detach(), [p.grad for p in model.parameters()],
                        ops.counts["swiglu_with_scale"] + ops.counts["swiglu"]))
    (loss, grads, forwards), (loss_again, grads_again, forwards_again) = results
    assert (forwards, forwards_again) == (2, 4)  # each block's SwiGLU ran again
    assert torch.equal(loss_again, loss)
    assert all(torch.equal(a, b) for a, b in zip(grads_again, grads, strict=True))


@pytest.mark.parametrize("zero", ["down", "x"])
def test_a_block_whose_gradient_bound_is_zero_gets_zero_gradients_not_nans(zero):
    """A zero down projection (‖W‖₁ = 0) or a zero input (the gain 0) bounds [d a | d b]
    by 0: its scale is floored as an amax of zeros is, so the gradients stay finite."""
    x, up, down, dz = swiglu_block_inputs()
    with torch.no_grad():
        {"down": down, "x": x}[zero].zero_()
    float8_swiglu(x, up, down, Float8Gemms("tensor")).backward(dz)
    for grad in (x.grad, up.grad, down.grad):
        assert torch.isfinite(grad).all()
    assert not up.grad.any()
