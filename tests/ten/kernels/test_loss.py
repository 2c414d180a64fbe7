"""ten.kernels.loss: the chunked linear cross-entropy equals the plain B×T×V loss (values and
gradients, through real tiny models) and never holds the whole logits; backend choice."""

import json
import warnings

import pytest
import torch
import torch.nn.functional as F
from saved_tensors import SavedForBackward

from ten.kernels import loss as loss_mod
from ten.kernels.loss import (
    NextTokenLoss,
    chunked_linear_cross_entropy,
    linear_cross_entropy,
    reference_linear_cross_entropy,
    resolve_loss_backend,
)
from ten.model.ten import TENLM, TENConfig
from ten.model.transformer import TransformerConfig, TransformerLM

V = 97


def problem(n=37, d=16, v=V, dtype=torch.float32, ignore=0, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(n, d, generator=g, dtype=dtype).requires_grad_()
    w = (0.3 * torch.randn(v, d, generator=g, dtype=dtype)).requires_grad_()
    t = torch.randint(0, v, (n,), generator=g)
    t[:ignore] = -100
    return h, w, t


def loss_and_grads(fn, h, w, t, scale=1.0):
    loss = fn(h, w, t)
    gh, gw = torch.autograd.grad(loss * scale, (h, w))
    return loss.detach(), gh, gw


# chunk sizes that do not divide N = 37, one larger than N, one row, and the default
@pytest.mark.parametrize("rows", [1, 5, 16, 64, None])
@pytest.mark.parametrize("ignore", [0, 4])
def test_chunked_equals_the_plain_loss_and_gradients_in_fp32(rows, ignore):
    h, w, t = problem(ignore=ignore)
    ref = loss_and_grads(reference_linear_cross_entropy, h, w, t, scale=3.0)
    got = loss_and_grads(lambda *a: chunked_linear_cross_entropy(*a, chunk_rows=rows),
                         h, w, t, scale=3.0)
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g, r, rtol=1e-6, atol=1e-6)
    if ignore:  # ignored rows get no gradient and do not count in the mean
        assert torch.all(got[1][:ignore] == 0)


def test_chunked_gradients_pass_gradcheck_in_fp64():
    h, w, t = problem(n=11, d=4, v=13, dtype=torch.float64, ignore=2)
    assert torch.autograd.gradcheck(
        lambda a, b: chunked_linear_cross_entropy(a, b, t, chunk_rows=3), (h, w))


def test_without_grad_the_loss_is_the_same_and_nothing_is_kept():
    h, w, t = problem()
    with torch.no_grad():
        got = chunked_linear_cross_entropy(h, w, t, chunk_rows=6)
        ref = reference_linear_cross_entropy(h, w, t)
    assert got.grad_fn is None
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)


def test_bf16_autocast_matches_the_plain_loss_under_autocast():
    h, w, t = problem(n=64, d=32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = loss_and_grads(reference_linear_cross_entropy, h, w, t)
        got = loss_and_grads(lambda *a: chunked_linear_cross_entropy(*a, chunk_rows=10),
                             h, w, t)
    assert got[0].dtype == torch.float32 and got[1].dtype == h.dtype == got[2].dtype
    torch.testing.assert_close(got[0], ref[0], rtol=1e-3, atol=1e-3)
    for r, g in zip(ref[1:], got[1:], strict=True):
        torch.testing.assert_close(g, r, rtol=2e-2, atol=2e-4)


def test_flattens_batch_and_time():
    h, w, t = problem(n=24)
    a = linear_cross_entropy(h.view(4, 6, -1), w, t.view(4, 6), chunk_rows=5)
    torch.testing.assert_close(a, reference_linear_cross_entropy(h, w, t))


# --- through real tiny models ---------------------------------------------------------

MODELS = {
    "ten": lambda: TENLM(TENConfig(vocab_size=V, d_model=32, n_layers=2, n_eigenstates=8,
                                   n_heads=2, seq_len=16, chunk_size=8)),
    "ten-ckpt": lambda: TENLM(TENConfig(vocab_size=V, d_model=32, n_layers=2,
                                        n_eigenstates=8, n_heads=2, seq_len=16, chunk_size=8,
                                        grad_checkpointing=True)),
    "transformer-rope": lambda: TransformerLM(TransformerConfig(
        vocab_size=V, d_model=32, n_layers=2, n_heads=2, seq_len=16, mlp_hidden=64)),
    "transformer-learned": lambda: TransformerLM(TransformerConfig(
        vocab_size=V, d_model=32, n_layers=2, n_heads=2, seq_len=16, mlp_hidden=64,
        pos="learned")),
}


@pytest.mark.parametrize("arch", list(MODELS))
def test_every_parameter_gradient_equals_the_plain_loss_through_the_model(arch):
    torch.manual_seed(0)
    model = MODELS[arch]().train()
    batch = torch.randint(0, V, (3, 17))
    inputs, targets = batch[:, :-1], batch[:, 1:]
    grads = {}
    for backend in ("reference", "chunked"):
        model.zero_grad(set_to_none=True)
        loss = NextTokenLoss(model, backend, chunk_rows=7)(inputs, targets)  # 48 rows
        loss.backward()
        grads[backend] = (loss.detach(), {n: p.grad.clone() for n, p in
                                          model.named_parameters()})
    (l_ref, g_ref), (l_got, g_got) = grads["reference"], grads["chunked"]
    torch.testing.assert_close(l_got, l_ref, rtol=1e-6, atol=1e-6)
    assert g_ref.keys() == g_got.keys() and "embed.weight" in g_got  # the tied head
    for name in g_ref:
        torch.testing.assert_close(g_got[name], g_ref[name], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("arch", ["ten", "transformer-learned"])
def test_logits_are_the_hidden_states_through_the_head(arch):
    model = MODELS[arch]().eval()
    ids = torch.randint(0, V, (2, 9))
    with torch.no_grad():
        logits, state = model(ids)
        hidden, state2 = model.hidden_states(ids)
        assert torch.equal(logits, F.linear(hidden, model.output_weight))
        # and with a carried state (positions / eigenstates continue)
        more = torch.randint(0, V, (2, 3))
        logits2, _ = model(more, state)
        hidden2, _ = model.hidden_states(more, state2)
        assert torch.equal(logits2, F.linear(hidden2, model.output_weight))
    assert model.output_weight is model.embed.weight


def test_a_model_without_hidden_states_needs_the_reference_backend():
    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.out = torch.nn.Embedding(V, V)

        def forward(self, x):
            return self.out(x), None

    with pytest.raises(ValueError, match="hidden_states.*'reference'"):
        NextTokenLoss(Tiny(), "chunked")
    batch = torch.randint(0, V, (2, 5))
    assert NextTokenLoss(Tiny(), "reference")(batch[:, :-1], batch[:, 1:]).dim() == 0


# --- memory -------------------------------------------------------------------------------

def peak_cpu_bytes(fn, tmp_path, name):
    """Peak CPU bytes allocated while ``fn`` runs, from torch's memory profiler timeline;
    None where this torch no longer has it."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        fn()
    if not hasattr(prof, "export_memory_timeline"):
        return None
    path = tmp_path / f"{name}.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # deprecated for CUDA snapshots
        prof.export_memory_timeline(str(path), device="cpu")
    _, sizes = json.loads(path.read_text())
    return max((sum(s) for s in sizes), default=0)


def test_memory_stays_far_below_the_full_logits(tmp_path):
    n, d, v, rows = 1024, 64, 8192, 128  # full fp32 logits: 32 MiB; a chunk's: 4 MiB
    h, w, t = problem(n=n, d=d, v=v)
    logits_bytes = n * v * 4

    def run(fn):
        saved = SavedForBackward()
        with saved:
            loss = fn(h, w, t)
        loss.backward()
        return saved.total_bytes

    chunked = lambda *a: chunked_linear_cross_entropy(*a, chunk_rows=rows)  # noqa: E731
    saved_ref = run(reference_linear_cross_entropy)
    saved_chunked = run(chunked)
    peak_ref = peak_cpu_bytes(lambda: run(reference_linear_cross_entropy), tmp_path, "ref")
    peak_chunked = peak_cpu_bytes(lambda: run(chunked), tmp_path, "chunked")
    mib = lambda b: "-" if b is None else f"{b / 2**20:.1f} MiB"  # noqa: E731
    print(f"logits {mib(logits_bytes)}; peak allocated: plain {mib(peak_ref)}, chunked "
          f"{mib(peak_chunked)}; saved for backward: plain {mib(saved_ref)}, chunked "
          f"{mib(saved_chunked)}")
    assert saved_ref >= logits_bytes  # the plain loss keeps B×T×V fp32 for backward
    assert saved_chunked <= (n * d + v * d) * 4 + 4096  # grad_h and grad_W only
    if peak_ref is not None:
        assert peak_ref >= 2 * logits_bytes
        assert peak_chunked < logits_bytes / 2 and peak_chunked * 5 < peak_ref


# --- choosing a backend ---------------------------------------------------------------

def _triton(monkeypatch, state):
    """ten.kernels.loss_fused as this machine would have it: "compiled", "interpreted" or None."""
    from types import SimpleNamespace

    def module():
        if state is None:
            raise ValueError("loss backend 'fused' needs triton, which does not import here")
        return SimpleNamespace(INTERPRETED=state == "interpreted")

    monkeypatch.setattr(loss_mod, "_fused_module", module)


@pytest.mark.parametrize("name,device,triton,backend,says", [
    ("auto", "cpu", "compiled", "chunked", "auto: cpu"),
    ("auto", "cuda", "compiled", "fused", "auto: CUDA and triton"),  # no host sync, no liger
    ("auto", "cuda", None, "chunked", "triton not installed"),
    ("auto", "cuda", "interpreted", "chunked", "TRITON_INTERPRET=1"),
    ("chunked", "cuda", "compiled", "chunked", "asked for"),
    ("fused", "cuda", "compiled", "fused", "asked for"),
    ("fused", "cpu", "interpreted", "fused", "asked for"),  # how the tests run it
    ("reference", "cpu", None, "reference", "asked for"),
])
def test_backend_choice_is_explicit_and_said(monkeypatch, name, device, triton, backend, says):
    _triton(monkeypatch, triton)
    got, note = resolve_loss_backend(name, device)
    assert got == backend and says in note and note.startswith("loss: ")


def test_liger_is_chosen_only_when_asked_for(monkeypatch):
    monkeypatch.setattr(loss_mod, "liger_available", lambda: True)
    _triton(monkeypatch, "compiled")
    assert resolve_loss_backend("liger", "cuda")[0] == "liger"
    assert resolve_loss_backend("auto", "cuda")[0] == "fused"


@pytest.mark.parametrize("name,device,liger,triton,error", [
    ("liger", "cpu", True, "compiled", "needs a CUDA device"),
    ("liger", "cuda", False, "compiled", "pip install 'ten-runner[gpu]'"),
    ("fused", "cpu", True, "compiled", "runs a Triton kernel on a CUDA device"),
    ("fused", "cuda", True, None, "needs triton"),
    ("fuse", "cpu", True, "compiled", "must be one of"),
])
def test_a_backend_that_cannot_run_raises_with_the_fix(monkeypatch, name, device, liger,
                                                       triton, error):
    monkeypatch.setattr(loss_mod, "liger_available", lambda: liger)
    _triton(monkeypatch, triton)
    with pytest.raises(ValueError, match=error.replace("[", r"\[").replace("]", r"\]")):
        resolve_loss_backend(name, device)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("backend", ["chunked", "fused", "liger"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_backends_match_the_plain_loss(backend, dtype):
    if backend == "liger" and not loss_mod.liger_available():
        pytest.skip("liger-kernel not installed")
    h, w, t = (x.cuda() for x in problem(n=300, d=64, v=1000, ignore=3))
    h, w = h.detach().requires_grad_(), w.detach().requires_grad_()
    with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
        ref = loss_and_grads(reference_linear_cross_entropy, h, w, t)
        got = loss_and_grads(lambda *a: linear_cross_entropy(*a, backend=backend), h, w, t)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for r, g in zip(ref, got, strict=True):
        torch.testing.assert_close(g.float(), r.float(), rtol=tol, atol=tol)


def test_a_cpu_torch_has_no_kernel_to_add_a_bf16_product_into_fp32():
    """The loss asks torch for its bf16 chunks' weight gradient added into the fp32 sum in
    the GEMM only on CUDA: torch has no CPU kernel for it. If a torch gains one, this fails
    and ``widening_addmm`` can ask the CPU too."""
    a = torch.ones(2, 2, dtype=torch.bfloat16)
    total = torch.zeros(2, 2)
    with pytest.raises(NotImplementedError, match="addmm.dtype_out"):
        torch.addmm(total, a, a, torch.float32, out=total)
    assert not loss_mod.widening_addmm("cpu", torch.bfloat16, torch.float32)
    assert loss_mod.weight_grad_path("cpu", torch.bfloat16, torch.float32) == (
        "product rounded, then an fp32 add")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_weight_gradient_is_added_in_place_and_in_the_gemm_where_torch_offers_it():
    """A bf16 chunk into the fp32 sum, in place. Where torch adds it in the GEMM's epilogue
    the sum is the float64 one to fp32 rounding, closer than the rounded product's."""
    seed = 0
    g = torch.Generator().manual_seed(seed)
    dlogits = (torch.randn(300, 1000, generator=g) / 300).cuda().to(torch.bfloat16)
    h = torch.randn(300, 64, generator=g).cuda().to(torch.bfloat16)
    start = torch.randn(1000, 64, generator=g).cuda() / 300
    want = start.double() + dlogits.double().t() @ h.double()
    total = start.clone()
    where = total.data_ptr()
    loss_mod.add_weight_grad(total, dlogits, h)
    assert total.data_ptr() == where and total.dtype == torch.float32
    error = float((total.double() - want).abs().max() / want.abs().max())
    rounded = float(((start + dlogits.t() @ h).double() - want).abs().max()
                    / want.abs().max())
    path = loss_mod.weight_grad_path("cuda", torch.bfloat16, torch.float32)
    print(f"seed {seed}; {path}: rel. error {error:.1e}, the rounded product's {rounded:.1e}")
    if loss_mod.widening_addmm("cuda", torch.bfloat16, torch.float32):
        assert error < 1e-5 and error < rounded
    else:
        assert error == rounded
