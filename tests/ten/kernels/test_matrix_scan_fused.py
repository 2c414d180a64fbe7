"""The matrix-state scan's fused (Triton) backend must equal the reference loop, in values
and in the gradients of every input (keys, values, queries, eigenvalues, the carried
state) and of the state it ends with.

Where it runs: tests/support/triton_mode.py (compiled on CUDA, interpreted on CPU). Sizes
are tiny: the interpreter runs every program one after another in Python.
"""

from __future__ import annotations

import math

import pytest
import torch
from matrix_grads import outputs_and_grads, relative_error
from triton_mode import HAVE_TRITON, NO_TRITON, interpret_without_cuda, kernel_module

from ten.kernels.matrix_scan import matrix_scan

interpret_without_cuda()
pytestmark = [pytest.mark.cuda_kernels, pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)]

SEED = 4321
DEVICE = "cpu"  # set by the fixture: "cuda" when the kernels are compiled


@pytest.fixture(scope="module")
def fused():
    global DEVICE
    mod = kernel_module("ten.kernels.matrix_scan_fused")
    DEVICE = "cpu" if mod.INTERPRETED else "cuda"
    return mod


def _inputs(B, T, H, N, P, *, selective, with_state, dtype=torch.float64, rate=0.5, seed=SEED):
    print(f"seed {seed}")
    g = torch.Generator().manual_seed(seed)
    K = H * N

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    shape = (B, T, K) if selective else (K,)
    log_mag = -torch.rand(shape, generator=g, dtype=dtype) * rate
    angle = (torch.rand(shape, generator=g, dtype=dtype) - 0.5) * 2 * math.pi
    tensors = [randn(B, T, 2 * K), randn(B, T, H * P), randn(B, T, 2 * K),
               torch.cat([log_mag, angle], dim=-1)]
    tensors = [t.to(DEVICE).requires_grad_() for t in tensors]
    state = None
    if with_state:
        state = torch.complex(randn(B, H, N, P), randn(B, H, N, P)).to(DEVICE).requires_grad_()
    return tensors, state


def _outputs_and_grads(tensors, state, heads, backend):
    return outputs_and_grads(tensors, state, heads, backend, SEED + 1)


# ((B, T, H, N, P), selective, carried state): one partial chunk; exactly one chunk;
# several chunks, the last partial; eigenstates padded to a block of 32 and values in
# several blocks (32 + 32 + 6 forward, 16s backward); T = 1. Each of the four modes twice.
CASES = [((2, 5, 3, 4, 5), False, False), ((2, 16, 2, 4, 5), True, True),
         ((2, 37, 3, 4, 5), False, True), ((2, 37, 3, 4, 5), True, False),
         ((1, 19, 2, 20, 70), True, True), ((1, 19, 2, 20, 70), False, False),
         ((2, 1, 1, 16, 16), True, False), ((2, 16, 2, 4, 5), False, True)]


@pytest.mark.parametrize(("shape", "selective", "with_state"), CASES, ids=[
    "B{}-T{}-H{}-N{}-P{}-".format(*shape) + ("selective" if sel else "fixed")
    + ("-carried" if carried else "-zero") for shape, sel, carried in CASES])
def test_fused_matches_ref_outputs_and_gradients(fused, shape, selective, with_state):
    B, T, H, N, P = shape
    tensors, state = _inputs(B, T, H, N, P, selective=selective, with_state=with_state)
    want = _outputs_and_grads(tensors, state, H, "ref")
    got = _outputs_and_grads(tensors, state, H, "fused")
    names = ["y", "last state", "dk", "dv", "dq", "d log λ", "d state"]
    for name, a, b in zip(names[:len(want)], want, got, strict=True):
        assert a.shape == b.shape and a.dtype == b.dtype, name
        assert relative_error(a, b) < 1e-10, name


def test_the_state_carries_across_calls(fused):
    """Two calls, the second from the first's last state, give the one call's outputs."""
    tensors, _ = _inputs(2, 30, 2, 4, 6, selective=True, with_state=False)
    k, v, q, ll = (t.detach() for t in tensors)
    whole, last = matrix_scan(k, v, q, ll, None, heads=2, backend="fused")
    first, s = matrix_scan(k[:, :11], v[:, :11], q[:, :11], ll[:, :11], None, heads=2,
                           backend="fused")
    second, last2 = matrix_scan(k[:, 11:], v[:, 11:], q[:, 11:], ll[:, 11:], s, heads=2,
                                backend="fused")
    assert torch.allclose(torch.cat([first, second], 1), whole, atol=1e-12)
    assert torch.allclose(last2, last, atol=1e-12)


def test_an_output_depends_on_no_later_token(fused):
    tensors, _ = _inputs(1, 40, 2, 4, 6, selective=True, with_state=False)
    k, v, q, ll = (t.detach() for t in tensors)
    y, _ = matrix_scan(k, v, q, ll, None, heads=2, backend="fused")
    later = [t.clone() for t in (k, v, q, ll)]
    for t in later:
        t[:, 23:] = torch.randn_like(t[:, 23:])
    y2, _ = matrix_scan(*later, None, heads=2, backend="fused")
    assert torch.equal(y[:, :23], y2[:, :23]) and not torch.allclose(y[:, 23:], y2[:, 23:])


def test_an_empty_sequence_returns_the_state(fused):
    tensors, state = _inputs(2, 0, 2, 4, 5, selective=True, with_state=True)
    y, last = matrix_scan(*tensors, state, heads=2, backend="fused")
    assert y.shape == (2, 0, 10) and torch.equal(last, state)


def test_float32_with_strong_decays_over_many_chunks_stays_close_to_ref(fused):
    """|λ| down to e^-3 a step over 150 steps (10 chunks): the decays come from differences
    of cumulative logs, so nothing overflows; float32 values and gradients stay within
    1e-5 of the largest float64 ones."""
    tensors, state = _inputs(1, 150, 2, 8, 16, selective=True, with_state=True,
                             dtype=torch.float32, rate=3.0)
    ref_in = [t.detach().double().requires_grad_() for t in tensors]
    ref_state = state.detach().to(torch.complex128).requires_grad_()
    want = _outputs_and_grads(ref_in, ref_state, 2, "ref")
    got = _outputs_and_grads(tensors, state, 2, "fused")
    for a, b in zip(want, got, strict=True):
        assert b.dtype in (torch.float32, torch.complex64) and torch.isfinite(b).all()
        assert (a - b.to(a.dtype)).abs().max() / a.abs().max() < 1e-5


BF16_ULP = 2.0 ** -7  # bf16 keeps 8 significant bits: one unit in the last, relative


@pytest.mark.parametrize("backend", ["fused", "chunked"])
def test_bf16_values_and_queries_give_float32s_numbers_in_bf16(fused, backend):
    """Under autocast the values and queries arrive in bf16: the scan reads them so, computes
    in float32 and gives y (and their gradients) in bf16, the float32 path's numbers
    rounded once (within one bf16 unit: the interpreter truncates where a GPU rounds to
    nearest). The keys' and log λ's gradients and the last state are float32's exactly."""
    tensors, state = _inputs(2, 37, 2, 4, 6, selective=True, with_state=True,
                             dtype=torch.float32)
    k, v, q, ll = (t.detach() for t in tensors)
    v, q = v.bfloat16(), q.bfloat16()  # as a bf16 projection writes them
    state = state.detach()
    g = torch.Generator().manual_seed(SEED + 2)
    w = torch.randn(v.shape, generator=g).bfloat16().float().to(DEVICE)  # dy exact in bf16
    w_last = torch.randn(state.shape, generator=g, dtype=torch.complex64).to(DEVICE)

    def run(v, q):
        inputs = [x.clone().requires_grad_() for x in (k, v, q, ll)]
        y, last = matrix_scan(*inputs, state, heads=2, backend=backend, chunk_size=8)
        loss = (y.float() * w).sum() + (last.conj() * w_last).real.sum()
        return [y, last, *torch.autograd.grad(loss, inputs)]

    y, last, dk, dv, dq, dll = run(v, q)
    y32, last32, dk32, dv32, dq32, dll32 = run(v.float(), q.float())
    assert (y.dtype, dv.dtype, dq.dtype) == (torch.bfloat16,) * 3
    assert (dk.dtype, dll.dtype, last.dtype) == (torch.float32, torch.float32, torch.complex64)
    for name, a, b in (("y", y, y32), ("dv", dv, dv32), ("dq", dq, dq32)):
        assert ((a.float() - b).abs() <= b.abs() * BF16_ULP).all(), name
    for name, a, b in (("last state", last, last32), ("dk", dk, dk32), ("d log λ", dll, dll32)):
        assert torch.equal(a, b), name


def test_model_with_a_fused_matrix_state_matches_chunked(fused):
    """Through the TEN layer (selective, with its convolution): logits and every
    parameter's gradient agree in float64."""
    from ten.model.presets import build_model, model_config

    kw = dict(vocab_size=50, d_model=16, n_layers=2, seq_len=32, n_eigenstates=8, n_heads=2,
              chunk_size=4, state="matrix")
    torch.manual_seed(0)
    models = {b: build_model(model_config("ten", "tiny", scan_backend=b, **kw)).double()
              for b in ("chunked", "fused")}
    for p in models["chunked"].parameters():  # the selective projection starts at zero
        p.data.add_(0.05 * torch.randn_like(p))
    models["fused"].load_state_dict(models["chunked"].state_dict())
    ids = torch.randint(0, 50, (2, 21))
    out = {}
    for b, m in models.items():
        m = m.to(DEVICE)
        logits, _ = m(ids.to(DEVICE))
        logits.pow(2).mean().backward()
        out[b] = logits, {n: p.grad for n, p in m.named_parameters()}
    assert (out["fused"][0] - out["chunked"][0]).abs().max() < 1e-10
    for n, g in out["chunked"][1].items():
        assert (out["fused"][1][n] - g).abs().max() < 1e-10, n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_fused_compiled_on_cuda_float32_at_size(fused):
    """Compiled kernels, float32, a flagship head's width (N 32, P 256: eight value
    blocks forward, sixteen backward) over 1,000 steps, against ref in float64 on the CPU."""
    if fused.INTERPRETED:
        pytest.skip("TRITON_INTERPRET=1 is set: the kernels are not compiled")
    tensors, state = _inputs(2, 1000, 2, 32, 256, selective=True, with_state=True,
                             dtype=torch.float32, rate=0.3)
    ref_in = [t.detach().cpu().double().requires_grad_() for t in tensors]
    ref_state = state.detach().cpu().to(torch.complex128).requires_grad_()
    want = _outputs_and_grads(ref_in, ref_state, 2, "chunked")
    got = _outputs_and_grads(tensors, state, 2, "fused")
    for a, b in zip(want, got, strict=True):
        assert (a - b.cpu().to(a.dtype)).abs().max() / a.abs().max() < 1e-4
