"""The fused (Triton) scan must equal the reference loop, in values and gradients.

Where it runs: tests/support/triton_mode.py (compiled on CUDA, interpreted on CPU). Sizes
are tiny (B=2, K=6 lanes in blocks of 4 or 8, T <= 40): the interpreter runs every program
one after another in Python.
"""

from __future__ import annotations

import math

import pytest
import torch
from triton_mode import HAVE_TRITON, NO_TRITON, interpret_without_cuda, kernel_module

from ten.kernels.scan import scan, scan_ref

interpret_without_cuda()
pytestmark = [pytest.mark.cuda_kernels, pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)]

B, K = 2, 6
DEVICE = "cpu"  # set by the fixture: "cuda" when the kernels are compiled


@pytest.fixture(scope="module")
def fused():
    global DEVICE
    mod = kernel_module("ten.kernels.scan_fused")
    DEVICE = "cpu" if mod.INTERPRETED else "cuda"
    return mod


def _inputs(T, selective, dtype=torch.float64, strong=False):
    beta = torch.randn(B, T, 2 * K, dtype=dtype)
    shape = (B, T, K) if selective else (K,)
    rate = 3.0 if strong else 0.3
    log_mag = -torch.rand(shape, dtype=dtype) * rate
    angle = (torch.rand(shape, dtype=dtype) - 0.5) * 2 * math.pi
    log_lam = torch.cat([log_mag, angle], dim=-1)
    state = torch.randn(B, 2 * K, dtype=dtype)
    return [t.to(DEVICE).requires_grad_() for t in (beta, log_lam, state)]


def _grads(c, last, weight, inputs):
    return torch.autograd.grad((c * weight).sum() + last.pow(2).sum(), inputs)


# (T, launch plan): one tile; several tiles in one pass over two lane blocks (K=6, BK=4);
# three groups of two tiles with the last one partial; more groups (35) than the carry
# kernel scans at a time (32); T=1; scan()'s own default plan.
PLANS = [
    (5, dict(block_t=8, block_k=8, group_tiles=1)),
    (13, dict(block_t=4, block_k=4, group_tiles=4)),
    (40, dict(block_t=8, block_k=8, group_tiles=2)),
    pytest.param(69, dict(block_t=2, block_k=8, group_tiles=1),  # ~10 s each, interpreted
                 marks=pytest.mark.slow),
    (1, dict(block_t=4, block_k=8, group_tiles=1)),
    (37, None),
]


@pytest.mark.parametrize("selective", [False, True], ids=["fixed", "selective"])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero-state", "carried-state"])
@pytest.mark.parametrize(("T", "kw"), PLANS, ids=lambda v: v if isinstance(v, int) else (
    "default" if v is None else "BT{block_t}-BK{block_k}-G{group_tiles}".format(**v)))
def test_fused_matches_ref_outputs_and_gradients(fused, selective, with_state, T, kw):
    beta, log_lam, state = _inputs(T, selective)
    s = state if with_state else None
    c_ref, last_ref = scan(beta, log_lam, s, backend="ref")
    if kw is None:
        c_fus, last_fus = scan(beta, log_lam, s, backend="fused")
    else:
        c_fus, last_fus = fused.scan_fused(beta, log_lam, s, **kw)
    assert c_fus.dtype == torch.float64
    assert _error(c_ref, c_fus) < 1e-10
    assert _error(last_ref, last_fus) < 1e-10
    weight = torch.randn_like(c_ref)
    inputs = [beta, log_lam] + ([state] if with_state else [])
    for g_ref, g_fus in zip(_grads(c_ref, last_ref, weight, inputs),
                            _grads(c_fus, last_fus, weight, inputs), strict=True):
        assert g_ref.shape == g_fus.shape
        assert _error(g_ref, g_fus) < 1e-10


def _error(want, got):
    """Largest difference, relative to the largest value past 1: fixed λ's gradient sums
    every step of every row, and its float64 rounding grows with it (3e5 over 299 steps
    differed by 8e-10)."""
    return ((want - got).abs().max() / want.abs().max().clamp(min=1.0)).item()


def test_only_the_inputs_that_need_it_get_gradients(fused):
    beta, log_lam, state = _inputs(9, selective=True)
    c, _ = fused.scan_fused(beta, log_lam.detach(), state.detach(), block_t=4, block_k=4)
    (g,) = torch.autograd.grad(c.sum(), [beta])
    c_ref, _ = scan_ref(beta, log_lam.detach(), state.detach())
    (g_ref,) = torch.autograd.grad(c_ref.sum(), [beta])
    assert (g - g_ref).abs().max() < 1e-10


def test_state_carry(fused):
    beta, log_lam, _ = _inputs(30, selective=True)
    kw = dict(block_t=4, block_k=4, group_tiles=2)
    whole, last = fused.scan_fused(beta, log_lam, **kw)
    first, s = fused.scan_fused(beta[:, :11], log_lam[:, :11], **kw)
    second, last2 = fused.scan_fused(beta[:, 11:], log_lam[:, 11:], s, **kw)
    assert torch.allclose(torch.cat([first, second], 1), whole, atol=1e-12)
    assert torch.allclose(last2, last, atol=1e-12)


def test_empty_sequence_returns_the_state(fused):
    beta, log_lam, state = _inputs(0, selective=False)
    c, last = fused.scan_fused(beta, log_lam, state)
    assert c.shape == (B, 0, 2 * K) and torch.equal(last, state)


def test_strong_decay_float32_stays_finite_and_close(fused):
    beta, log_lam, _ = _inputs(40, selective=True, dtype=torch.float32, strong=True)
    c, last = scan(beta, log_lam, backend="fused")
    ref, _ = scan(beta.double(), log_lam.double(), backend="ref")
    assert c.dtype == torch.float32 and torch.isfinite(c).all() and torch.isfinite(last).all()
    assert (c.double() - ref).abs().max() < 1e-5


@pytest.mark.parametrize("selective", [False, True], ids=["fixed", "selective"])
def test_float32_rotation_is_accurate_far_from_zero(fused, selective):
    """λ's rotation comes from the kernels' own sin/cos (one argument reduction for both,
    no libdevice slow path): to ~1 ulp for angles up to 8e3 rad and on the quadrant
    boundaries. One step from the state 1 with no drive gives c = λ exactly."""
    torch.manual_seed(0)
    n = 512
    angle = (torch.rand(n, dtype=torch.float64) * 2 - 1) * 8e3
    angle[:64] = torch.arange(-32, 32, dtype=torch.float64) * math.pi / 4
    angle = angle.float()
    log_lam = torch.cat([torch.zeros(n), angle])
    if selective:
        log_lam = log_lam.view(1, 1, 2 * n)
    state = torch.cat([torch.ones(n), torch.zeros(n)]).view(1, 2 * n)
    c, _ = fused.scan_fused(*(t.to(DEVICE) for t in (torch.zeros(1, 1, 2 * n), log_lam, state)))
    c = c.double().cpu()[0, 0]
    exact = angle.double()
    assert (c[:n] - torch.cos(exact)).abs().max() < 2e-7
    assert (c[n:] - torch.sin(exact)).abs().max() < 2e-7


@pytest.mark.slow  # 256 steps interpreted: ~6 s each
@pytest.mark.parametrize("selective", [False, True], ids=["fixed", "selective"])
def test_float32_scan_in_many_groups_stays_close_to_ref(fused, selective):
    """The summary pass composes each tile in log space; over 256 slowly decaying steps
    with one-signed angles (as θ·Δ turns), float32 values and gradients stay within 1e-5
    of the largest (measured: 2.4e-6 at most; the chunked backend's own log space 1.2e-6;
    the GPU tests allow 1e-4)."""
    torch.manual_seed(1)
    b, T, k = 2, 256, 8
    shape = (b, T, k) if selective else (k,)
    log_lam = torch.cat([-torch.rand(shape) * 0.05, torch.rand(shape) * math.pi], -1)
    x = [torch.randn(b, T, 2 * k), log_lam, torch.randn(b, 2 * k)]
    ref_in = [t.double().requires_grad_() for t in x]
    fused_in = [t.to(DEVICE).requires_grad_() for t in x]
    c0, last0 = scan_ref(*ref_in)
    c1, last1 = fused.scan_fused(*fused_in, block_t=32, block_k=8, group_tiles=1)  # 8 groups
    w = torch.randn_like(c0)
    g0 = torch.autograd.grad((c0 * w).sum() + last0.sum(), ref_in)
    g1 = torch.autograd.grad((c1 * w.float().to(DEVICE)).sum() + last1.sum(), fused_in)
    for want, got in zip((c0, *g0), (c1, *g1), strict=True):
        assert (want - got.double().cpu()).abs().max() / want.abs().max() < 1e-5


def test_autocast_bf16_accumulates_in_fp32_like_chunked(fused):
    """bf16 drive in, float32 out (as ``chunked``); gradients as chunked's, per dtype."""
    beta32, log_lam, state = (t.detach() for t in _inputs(40, False, dtype=torch.float32))
    results = {}
    for backend in ("chunked", "fused"):
        beta = beta32.bfloat16().requires_grad_()
        ll = log_lam.clone().requires_grad_()
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            c, last = scan(beta, ll, state.bfloat16(), backend=backend, chunk_size=16)
        assert c.dtype == last.dtype == torch.float32
        weight = torch.linspace(-1, 1, c.numel(), device=DEVICE).view_as(c)
        gb, gl = torch.autograd.grad((c * weight).sum() + last.sum(), [beta, ll])
        assert gb.dtype == torch.bfloat16 and gl.dtype == torch.float32
        results[backend] = c, gb, gl
    (c_c, gb_c, gl_c), (c_f, gb_f, gl_f) = results["chunked"], results["fused"]
    ref, _ = scan(beta32.bfloat16().double(), log_lam.double(), state.bfloat16().double(),
                  backend="ref")
    assert (c_f.double() - ref).abs().max() < 1e-4
    assert (c_f - c_c).abs().max() < 1e-4
    assert torch.allclose(gb_f.float(), gb_c.float(), rtol=1e-2, atol=1e-2)
    assert torch.allclose(gl_f, gl_c, rtol=1e-4, atol=1e-3)


def test_model_with_fused_matches_chunked(fused):
    """Through the TEN layer (selective): logits and every gradient agree in float64."""
    from ten.model.presets import build_model, model_config

    kw = dict(vocab_size=50, d_model=16, n_layers=1, seq_len=16, n_eigenstates=6, n_heads=2,
              chunk_size=4, selective=True)
    torch.manual_seed(0)
    models = {b: build_model(model_config("ten", "tiny", scan_backend=b, **kw)).double()
              for b in ("chunked", "fused")}
    models = {b: m.to(DEVICE) for b, m in models.items()}
    for p in models["chunked"].parameters():  # the selective projection starts at zero
        p.data.add_(0.05 * torch.randn_like(p))
    models["fused"].load_state_dict(models["chunked"].state_dict())
    ids = torch.randint(0, 50, (B, 11), device=DEVICE)
    out = {}
    for b, m in models.items():
        logits, _ = m(ids)
        logits.pow(2).mean().backward()
        out[b] = logits, {n: p.grad for n, p in m.named_parameters()}
    assert (out["fused"][0] - out["chunked"][0]).abs().max() < 1e-10
    for n, g in out["chunked"][1].items():
        assert (out["fused"][1][n] - g).abs().max() < 1e-10, n


def test_plan_rejects_blocks_that_are_not_powers_of_two(fused):
    with pytest.raises(ValueError, match="block_t must be a power of two, got 6"):
        fused.plan(B, 10, K, torch.device(DEVICE), block_t=6)


def test_the_plan_keeps_every_program_in_one_wave(fused):
    """K = 128 in blocks of 32 lanes, batch 1 to 8, on the L40S (142 SMs) and the H100
    (132): never a program past one wave, and at least half a wave where T allows."""
    for sms in (142, 132):
        slots = fused.PROGRAMS_PER_SM * sms
        for batch in range(1, 9):
            for T in (2048, 8192, 32768):
                n_tiles, lanes = T // 32, batch * 4
                per_group = fused.tiles_per_group(n_tiles, lanes, slots)
                programs = lanes * math.ceil(n_tiles / per_group)
                assert programs <= slots, (sms, batch, T)
                assert programs > slots / 2 or n_tiles * lanes <= slots, (sms, batch, T)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("selective", [False, True], ids=["fixed", "selective"])
def test_fused_compiled_on_cuda_float32_at_size(fused, selective):
    """Compiled kernels, float32, the default plan (groups sized to the SM count) and a
    hand-cut one, against ref in float64 on the CPU."""
    if fused.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 is set: the kernels are not compiled")
    torch.manual_seed(0)
    b, k = 3, 80
    for T, kw in ((1000, {}), (333, dict(block_t=16, block_k=32, group_tiles=3))):
        shape = (b, T, k) if selective else (k,)
        ll = torch.cat([-torch.rand(shape) * 0.3, (torch.rand(shape) - 0.5) * 2 * math.pi], -1)
        x = [torch.randn(b, T, 2 * k), ll, torch.randn(b, 2 * k)]
        ref_in = [t.double().requires_grad_() for t in x]
        gpu_in = [t.cuda().requires_grad_() for t in x]
        c0, l0 = scan_ref(*ref_in)
        c1, l1 = fused.scan_fused(*gpu_in, **kw)
        w = torch.randn_like(c0)
        g0 = torch.autograd.grad((c0 * w).sum() + l0.sum(), ref_in)
        g1 = torch.autograd.grad((c1 * w.float().cuda()).sum() + l1.sum(), gpu_in)
        # relative to the largest value, as the gradients: fp32 over T steps (the first
        # H200 run measured 2e-4 absolute on values up to 9.4)
        assert (c0 - c1.double().cpu()).abs().max() / c0.abs().max() < 1e-4
        for a, g in zip(g0, g1, strict=True):
            assert (a - g.double().cpu()).abs().max() / a.abs().max() < 1e-4
