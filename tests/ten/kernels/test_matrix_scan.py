"""The matrix-state scan (eigenstates holding value vectors): the chunked form equals the
reference loop in values and gradients for any chunk, is causal, carries its state, and
stays finite where decays are strong and sequences long."""

import math

import pytest
import torch

from ten.kernels.matrix_scan import matrix_scan

B, H, N, P = 2, 3, 4, 5
K = H * N
SEED = 1234


def _inputs(T, selective, dtype=torch.float64, rate=0.5, with_state=False):
    print(f"seed {SEED}")
    g = torch.Generator().manual_seed(SEED)

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=dtype)

    shape = (B, T, K) if selective else (K,)
    log_mag = -torch.rand(shape, generator=g, dtype=dtype) * rate
    angle = (torch.rand(shape, generator=g, dtype=dtype) - 0.5) * 2 * math.pi
    tensors = [randn(B, T, 2 * K), randn(B, T, H * P), randn(B, T, 2 * K),
               torch.cat([log_mag, angle], dim=-1)]
    state = torch.complex(randn(B, H, N, P), randn(B, H, N, P)) if with_state else None
    return [t.requires_grad_() for t in tensors], state


def test_one_eigenstate_with_a_real_eigenvalue_sums_the_values_it_decayed():
    """N = P = 1, λ = 1/2, k = q = 1: y_t = Σ_{s≤t} 2^{s-t} v_s."""
    T = 6
    v = torch.arange(1.0, T + 1, dtype=torch.float64).view(1, T, 1)
    ones = torch.ones(1, T, 2, dtype=torch.float64) * torch.tensor([1.0, 0.0],
                                                                   dtype=torch.float64)
    log_lam = torch.tensor([math.log(0.5), 0.0], dtype=torch.float64)
    want = torch.tensor([sum(v[0, s, 0].item() * 0.5 ** (t - s) for s in range(t + 1))
                         for t in range(T)], dtype=torch.float64)
    for backend in ("ref", "chunked"):
        y, C = matrix_scan(ones, v, ones, log_lam, None, heads=1, backend=backend,
                           chunk_size=4)
        assert torch.allclose(y.view(T), want), backend
        assert torch.allclose(C.view(()).real, want[-1]) and C.imag.abs().max() == 0


def test_a_query_reads_the_rotated_state_by_its_phase():
    """A key written at s and read at t through a rotating eigenstate (|λ| = 1 - ε, angle
    θ): the read is Re(conj(q) e^{iθ(t-s)} k) v, here cos(θ(t-s)) for q = k = 1."""
    T, theta = 5, 0.7
    k = torch.zeros(1, T, 2, dtype=torch.float64)
    k[0, 0, 0] = 1.0  # written once, at s = 0
    q = torch.zeros(1, T, 2, dtype=torch.float64)
    q[..., 0] = 1.0
    v = torch.ones(1, T, 1, dtype=torch.float64)
    log_lam = torch.tensor([0.0, theta], dtype=torch.float64)
    y, _ = matrix_scan(k, v, q, log_lam, None, heads=1, backend="chunked", chunk_size=2)
    want = torch.cos(theta * torch.arange(T, dtype=torch.float64))
    assert torch.allclose(y.view(T), want)


@pytest.mark.parametrize("selective", [False, True], ids=["fixed", "selective"])
@pytest.mark.parametrize("T", [1, 7, 16, 23])
@pytest.mark.parametrize("Q", [1, 4, 16, 64])
@pytest.mark.parametrize("with_state", [False, True], ids=["zero", "carried"])
def test_chunked_matches_ref_outputs_and_gradients(selective, T, Q, with_state):
    tensors, state = _inputs(T, selective, with_state=with_state)
    if state is not None:
        state.requires_grad_()
    y_ref, c_ref = matrix_scan(*tensors, state, heads=H, backend="ref")
    y_chk, c_chk = matrix_scan(*tensors, state, heads=H, backend="chunked", chunk_size=Q)
    assert (y_ref - y_chk).abs().max() < 1e-10
    assert (c_ref - c_chk).abs().max() < 1e-10
    g = torch.Generator().manual_seed(SEED + 1)
    w = torch.randn(y_ref.shape, generator=g, dtype=torch.float64)
    wc = torch.randn(c_ref.shape, generator=g, dtype=torch.complex128)
    inputs = tensors + ([state] if state is not None else [])

    def grads(y, c):
        loss = (w * y).sum() + (wc.conj() * c).real.sum()
        return torch.autograd.grad(loss, inputs)

    for a, b in zip(grads(y_ref, c_ref), grads(y_chk, c_chk), strict=True):
        assert (a - b).abs().max() < 1e-9


@pytest.mark.slow  # float64 finite differences: ~5 s
def test_chunked_gradients_match_finite_differences():
    tensors, _ = _inputs(6, selective=True)
    assert torch.autograd.gradcheck(
        lambda k, v, q, a: matrix_scan(k, v, q, a, None, heads=H, chunk_size=4)[0],
        tensors)


def test_outputs_do_not_depend_on_later_tokens():
    T, cut = 20, 9
    tensors, _ = _inputs(T, selective=True)
    y, _ = matrix_scan(*tensors, None, heads=H, chunk_size=8)
    changed = [t.detach().clone() for t in tensors]
    for t in changed:
        t[:, cut:] += 1.0
    y2, _ = matrix_scan(*changed, None, heads=H, chunk_size=8)
    assert torch.equal(y[:, :cut], y2[:, :cut])
    assert not torch.allclose(y[:, cut:], y2[:, cut:])


@pytest.mark.parametrize("selective", [False, True], ids=["fixed", "selective"])
def test_two_pieces_with_the_carried_state_equal_one_scan(selective):
    """Generation and a resumed stream read a sequence in pieces: the state carried
    from the first must make the second's outputs those of one scan."""
    T, cut = 30, 11
    tensors, _ = _inputs(T, selective)
    y, C = matrix_scan(*tensors, None, heads=H, chunk_size=8)

    def part(sl):
        return [t if t.dim() == 1 else t[:, sl] for t in tensors]

    y1, C1 = matrix_scan(*part(slice(0, cut)), None, heads=H, chunk_size=8)
    y2, C2 = matrix_scan(*part(slice(cut, T)), C1, heads=H, chunk_size=8)
    assert torch.allclose(torch.cat([y1, y2], dim=1), y, atol=1e-12)
    assert torch.allclose(C2, C, atol=1e-12)


def test_float32_long_sequences_with_strong_decay_stay_finite_and_close():
    """Strong decays (|λ| down to e^-8 a step) over 512 tokens: formed from differences,
    no decay overflows, and float32 stays close to float64."""
    tensors, _ = _inputs(512, selective=True, rate=8.0)
    y64, _ = matrix_scan(*tensors, None, heads=H, chunk_size=64)
    y32, C32 = matrix_scan(*(t.detach().float() for t in tensors), None, heads=H,
                           chunk_size=64)
    assert y32.dtype == torch.float32 and C32.dtype == torch.complex64
    assert torch.isfinite(y32).all()
    assert (y32.double() - y64).abs().max() < 1e-3 * y64.abs().max()


def test_an_unknown_backend_is_refused_by_name():
    tensors, _ = _inputs(3, selective=False)
    with pytest.raises(ValueError, match="one of the backends ref, chunked, fused, got 'auto'"):
        matrix_scan(*tensors, None, heads=H, backend="auto")
