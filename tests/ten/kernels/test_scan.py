"""The chunked scan must equal the reference loop, in values and gradients."""

import dataclasses
import math
import sys
from types import SimpleNamespace

import pytest
import torch

from ten.kernels.scan import ScanBackendError, resolve_backend, resolve_scan, scan

B, K = 2, 6


def _inputs(T, selective, dtype=torch.float64, strong=False):
    beta = torch.randn(B, T, 2 * K, dtype=dtype)
    shape = (B, T, K) if selective else (K,)
    rate = 3.0 if strong else 0.3  # strong: |λ| down to e^-3 per step
    log_mag = -torch.rand(shape, dtype=dtype) * rate
    angle = (torch.rand(shape, dtype=dtype) - 0.5) * 2 * math.pi
    log_lam = torch.cat([log_mag, angle], dim=-1)
    state = torch.randn(B, 2 * K, dtype=dtype)
    return [t.requires_grad_() for t in (beta, log_lam, state)]


@pytest.mark.parametrize("selective", [False, True], ids=["fixed", "selective"])
@pytest.mark.parametrize("T", [1, 5, 16, 48, 53])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("Q", [4, 16], ids=["Q4-three-levels", "Q16"])
def test_chunked_matches_ref_outputs_and_gradients(selective, T, with_state, Q):
    beta, log_lam, state = _inputs(T, selective)
    s = state if with_state else None
    c_ref, last_ref = scan(beta, log_lam, s, backend="ref")
    c_chk, last_chk = scan(beta, log_lam, s, backend="chunked", chunk_size=Q)
    assert (c_ref - c_chk).abs().max() < 1e-10
    assert (last_ref - last_chk).abs().max() < 1e-10
    weight = torch.randn_like(c_ref)
    inputs = [beta, log_lam] + ([state] if with_state else [])

    def grads(c, last):
        return torch.autograd.grad((c * weight).sum() + last.pow(2).sum(), inputs)

    for g_ref, g_chk in zip(grads(c_ref, last_ref), grads(c_chk, last_chk), strict=True):
        assert (g_ref - g_chk).abs().max() < 1e-10


def test_ref_is_the_recurrence():
    """The oracle itself, against complex arithmetic written out by hand."""
    beta, log_lam, state = _inputs(7, selective=False)
    c, _ = scan(beta, log_lam, state, backend="ref")
    lam = torch.exp(torch.complex(log_lam[:K], log_lam[K:])).detach()
    b = torch.complex(beta[..., :K], beta[..., K:]).detach()
    h = torch.complex(state[:, :K], state[:, K:]).detach()
    for t in range(7):
        h = lam * h + b[:, t]
        assert torch.allclose(c[:, t, :K].detach(), h.real) and torch.allclose(c[:, t, K:], h.imag)


def test_strong_decay_long_chunk_stays_finite():
    """exp(A_j - A_s) from differences: no overflow for Q=256 and |λ| ~ e^-3."""
    beta, log_lam, _ = _inputs(512, selective=True, dtype=torch.float32, strong=True)
    c, last = scan(beta, log_lam, backend="chunked", chunk_size=256)
    ref, _ = scan(beta.double(), log_lam.double(), backend="ref")
    assert torch.isfinite(c).all() and torch.isfinite(last).all()
    assert (c.double() - ref).abs().max() < 1e-4


def test_causal():
    beta, log_lam, _ = _inputs(40, selective=True)
    c1, _ = scan(beta, log_lam, backend="chunked", chunk_size=8)
    beta2, log_lam2 = beta.detach().clone(), log_lam.detach().clone()
    beta2[:, 21] += 1.0
    log_lam2[:, 21] -= 0.5
    c2, _ = scan(beta2, log_lam2, backend="chunked", chunk_size=8)
    assert torch.equal(c1[:, :21], c2[:, :21])
    assert not torch.allclose(c1[:, 21:], c2[:, 21:])


@pytest.mark.parametrize("selective", [False, True], ids=["fixed", "selective"])
def test_state_carry(selective):
    beta, log_lam, _ = _inputs(50, selective)
    whole, last = scan(beta, log_lam, backend="chunked", chunk_size=16)
    ll1, ll2 = (log_lam[:, :23], log_lam[:, 23:]) if selective else (log_lam, log_lam)
    first, s = scan(beta[:, :23], ll1, backend="chunked", chunk_size=16)
    second, last2 = scan(beta[:, 23:], ll2, s, backend="chunked", chunk_size=16)
    assert torch.allclose(torch.cat([first, second], 1), whole, atol=1e-12)
    assert torch.allclose(last2, last, atol=1e-12)


def test_autocast_bf16_accumulates_in_fp32():
    beta, log_lam, _ = _inputs(300, selective=False, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c, _ = scan(beta.bfloat16(), log_lam, backend="chunked", chunk_size=64)
    assert c.dtype == torch.float32
    ref, _ = scan(beta.bfloat16().double(), log_lam.double(), backend="ref")
    assert (c.double() - ref).abs().max() < 1e-4


def test_unknown_backend_raises_with_the_choices():
    beta, log_lam, _ = _inputs(4, selective=False)
    with pytest.raises(ScanBackendError, match="unknown scan backend 'cuda'.*auto, chunked, "
                       "fused, ref"):
        resolve_backend("cuda", "cpu")
    with pytest.raises(ScanBackendError, match="backends ref, chunked, fused, got 'cuda'"):
        scan(beta, log_lam, backend="cuda")


def test_fused_without_triton_raises_with_the_fix(monkeypatch):
    """Simulated: triton does not import. One line naming the field, never a fallback."""
    monkeypatch.delitem(sys.modules, "ten.kernels.scan_fused", raising=False)
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    beta, log_lam, _ = _inputs(4, selective=False)
    with pytest.raises(ScanBackendError,
                       match="needs triton.*TENConfig.scan_backend to chunked") as e:
        scan(beta, log_lam, backend="fused")
    assert "\n" not in str(e.value)
    assert resolve_backend("auto", "cuda") == "chunked"
    assert resolve_scan("auto", "cuda") == ("chunked",
                                          "scan backend: auto -> chunked (triton not installed)")


def test_fused_on_cpu_without_the_interpreter_raises_with_the_fix(monkeypatch):
    """Triton installed but the kernels compiled for a GPU, and the tensors on CPU."""
    monkeypatch.setitem(sys.modules, "ten.kernels.scan_fused", SimpleNamespace(INTERPRETED=False))
    beta, log_lam, _ = _inputs(4, selective=False)
    with pytest.raises(ScanBackendError,
                       match="CUDA device.*on cpu: set TENConfig.scan_backend to "
                       "auto or chunked"):
        scan(beta, log_lam, backend="fused")
    assert resolve_backend("fused", "cuda") == "fused"
    assert resolve_backend("auto", "cuda") == "fused"
    assert resolve_scan("auto", "cuda") == ("fused",
                                          "scan backend: auto -> fused (CUDA and triton)")


def test_a_model_lets_the_device_pick_its_scan_by_default():
    from ten.model.ten import TENConfig

    assert TENConfig().scan_backend == "auto"  # fused on a GPU without a job saying so


def test_auto_picks_chunked_off_cuda_and_says_so():
    assert resolve_backend("auto", torch.device("cpu")) == "chunked"
    assert resolve_scan("auto", "cpu") == ("chunked", "scan backend: auto -> chunked (no CUDA)")
    assert resolve_scan("chunked", "cpu") == ("chunked", "scan backend: chunked")
    with pytest.raises(ScanBackendError, match="unknown scan backend 'fast'"):
        resolve_scan("fast", "cpu")


def test_scan_runs_a_decided_backend_and_refuses_auto():
    # auto is decided once where the model is built for its device, not again per call
    beta, log_lam, state = _inputs(9, selective=True)
    with pytest.raises(ScanBackendError, match="decide 'auto' once"):
        scan(beta, log_lam, state, backend="auto", chunk_size=4)


def test_build_model_decides_auto_for_its_device():
    from ten.model.presets import build_model, model_config

    auto = model_config("ten", "tiny", vocab_size=64, d_model=16, n_layers=1)
    assert auto.scan_backend == "auto"
    model = build_model(auto, "cpu")
    assert model.config.scan_backend == "chunked"
    assert {block.mixer.cfg.scan_backend for block in model.blocks} == {"chunked"}
    explicit = build_model(dataclasses.replace(auto, scan_backend="ref"), "cpu")
    assert explicit.config.scan_backend == "ref"


def test_shape_errors_are_clear():
    beta, log_lam, _ = _inputs(4, selective=False)
    with pytest.raises(ValueError, match="log_lam must be"):
        scan(beta, log_lam[:3])
    with pytest.raises(ValueError, match="state must be"):
        scan(beta, log_lam, torch.zeros(3, 2 * K, dtype=torch.float64))
