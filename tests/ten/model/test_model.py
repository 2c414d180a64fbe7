"""Model-level behaviour users rely on, for both architectures."""

from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from ten.config import FieldError, UnknownFieldError
from ten.kernels.selective import STEP_UNIT
from ten.model.config import TENConfig, TransformerConfig
from ten.model.lm import recomputed_blocks
from ten.model.presets import build_model, model_config, ten_config
from ten.model.ten import TENLM, EigenstateMixer

V = 97


def tiny(arch, **kw):
    overrides = dict(vocab_size=V, d_model=32, n_layers=2, seq_len=32)
    if arch == "ten":
        # the fixed mode unless asked (the presets are selective with a convolution)
        overrides.update(n_eigenstates=8, n_heads=2, chunk_size=8, selective=False,
                         conv_width=0)
    overrides.update(kw)
    return build_model(model_config(arch, "tiny", **overrides)).double()


ARCHS = [
    pytest.param("ten", {}, id="ten"),
    pytest.param("ten", {"selective": True}, id="ten-selective"),
    pytest.param("ten", {"conv_width": 3}, id="ten-conv"),
    pytest.param("ten", {"selective": True, "conv_width": 4}, id="ten-selective-conv"),
    pytest.param("ten", {"state": "matrix"}, id="ten-matrix"),
    pytest.param("ten", {"state": "matrix", "selective": True, "conv_width": 4,
                         "value_dim": 6}, id="ten-matrix-selective-conv"),
    pytest.param("transformer", {}, id="transformer-rope"),
    pytest.param("transformer", {"pos": "learned"}, id="transformer-learned"),
]


@pytest.mark.parametrize("arch,kw", ARCHS)
def test_causal(arch, kw):
    model = tiny(arch, **kw)
    ids = torch.randint(0, V, (2, 30))
    ref, _ = model(ids)
    ids2 = ids.clone()
    ids2[:, 17] = (ids2[:, 17] + 1) % V
    out, _ = model(ids2)
    assert torch.equal(out[:, :17], ref[:, :17])
    assert not torch.allclose(out[:, 17:], ref[:, 17:])


@pytest.mark.parametrize("arch,kw", ARCHS)
def test_state_carry(arch, kw):
    model = tiny(arch, **kw)
    ids = torch.randint(0, V, (2, 29))
    whole, _ = model(ids)
    first, state = model(ids[:, :13])
    second, _ = model(ids[:, 13:], state)
    assert (torch.cat([first, second], 1) - whole).abs().max() < 1e-10


@pytest.mark.parametrize("arch,kw", ARCHS)
def test_token_by_token_logits_match_full_forward(arch, kw):
    model = tiny(arch, **kw)
    ids = torch.randint(0, V, (2, 20))
    full, _ = model(ids)
    state, steps = None, []
    for t in range(ids.shape[1]):
        logits, state = model(ids[:, t : t + 1], state)
        steps.append(logits)
    assert (torch.cat(steps, 1) - full).abs().max() < 1e-10


@pytest.mark.parametrize("arch,kw", ARCHS)
def test_generate_greedy_agrees_with_full_forward(arch, kw):
    model = tiny(arch, **kw)
    prompt = torch.randint(0, V, (2, 5))
    out = model.generate(prompt, max_new_tokens=12, temperature=0)
    assert out.shape == (2, 17) and torch.equal(out[:, :5], prompt)
    logits, _ = model(out)
    assert torch.equal(logits[:, 4:-1].argmax(-1), out[:, 5:])


def test_generate_sampling_respects_top_k_and_seed():
    model = tiny("ten")
    prompt = torch.randint(0, V, (1, 4))
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    a = model.generate(prompt, 16, temperature=1.0, top_k=1, generator=g1)
    assert torch.equal(a, model.generate(prompt, 16, temperature=0))  # top_k=1 is greedy
    b = model.generate(prompt, 16, temperature=1.5, top_k=20, generator=g2)
    c = model.generate(prompt, 16, temperature=1.5, top_k=20,
                       generator=torch.Generator().manual_seed(7))
    assert torch.equal(b, c)


def test_ten_state_is_constant_size_during_generation():
    """O(1) memory per token: the carried state never grows with the sequence."""
    model = tiny("ten", conv_width=4)

    def shapes(state):  # per layer: the eigenstates and the convolution's last inputs
        return [(tuple(eig.shape), tuple(tail.shape)) for eig, tail in state]

    _, state = model(torch.randint(0, V, (1, 3)))
    sizes = shapes(state)
    for _ in range(50):
        _, state = model(torch.randint(0, V, (1, 1)), state)
    assert shapes(state) == sizes == [((1, 16), (1, 3, 32))] * 2


def test_a_matrix_state_is_constant_size_during_generation():
    """A matrix state is K/H × P complex numbers a head whatever the length read."""
    model = tiny("ten", state="matrix", conv_width=4)
    _, state = model(torch.randint(0, V, (1, 3)))
    for _ in range(20):
        _, state = model(torch.randint(0, V, (1, 1)), state)
    assert [(tuple(eig.shape), eig.dtype) for eig, _ in state] == [
        ((1, 2, 4, 16), torch.complex128)] * 2  # H 2, K/H 4, P = d_model / H


@pytest.mark.parametrize("arch", ["ten", "transformer"])
def test_runs_at_four_times_training_length(arch):
    model = tiny(arch).float()
    ids = torch.randint(0, V, (1, 4 * model.config.seq_len))
    logits, _ = model(ids)
    logits.float().logsumexp(-1).sum().backward()
    assert torch.isfinite(logits).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_learned_positions_refuse_longer_inputs_clearly():
    model = tiny("transformer", pos="learned")
    with pytest.raises(ValueError, match="learned positions cover 32 tokens.*rope"):
        model(torch.randint(0, V, (1, 33)))


@pytest.mark.parametrize("arch", ["ten", "transformer"])
def test_bf16_autocast_close_to_fp32(arch):
    model = tiny(arch).float()
    ids = torch.randint(0, V, (2, 64))
    ref, _ = model(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = model(ids)
    assert torch.isfinite(out).all()
    p_ref, p_out = ref.softmax(-1), out.float().softmax(-1)
    assert (p_ref - p_out).abs().max() < 0.02
    assert (ref.argmax(-1) == out.float().argmax(-1)).float().mean() > 0.95


def blocks_stream_and_gradients(model, ids, amp):
    """(the dtype of the stream block 1 takes, logits, every parameter's gradient) of one
    forward and backward under autocast to ``amp`` (None: no autocast)."""
    seen = []
    hook = model.blocks[1].register_forward_pre_hook(lambda _, a: seen.append(a[0].dtype))
    with torch.autocast("cpu", dtype=amp or torch.bfloat16, enabled=amp is not None):
        logits, _ = model(ids)
    hook.remove()
    loss = logits.float().logsumexp(-1).mean()
    return seen[0], logits.float(), torch.autograd.grad(loss, list(model.parameters()))


@pytest.mark.parametrize("arch", ["ten", "transformer"])
def test_a_bf16_residual_stream_runs_under_bf16_autocast_within_its_rounding(arch):
    """residual_dtype: bf16 carries the stream between the blocks in bf16 under bf16
    autocast, with the logits and gradients of the fp32 stream within bf16's rounding;
    without bf16 autocast (fp32, fp16) the stream is what it was."""
    torch.manual_seed(0)
    wide = tiny(arch, selective=True, conv_width=4) if arch == "ten" else tiny(arch)
    narrow = tiny(arch, residual_dtype="bf16", **({"selective": True, "conv_width": 4}
                                                  if arch == "ten" else {}))
    wide, narrow = wide.float(), narrow.float()
    narrow.load_state_dict(wide.state_dict())
    ids = torch.randint(0, V, (2, 32))
    s_wide, l_wide, g_wide = blocks_stream_and_gradients(wide, ids, torch.bfloat16)
    s_narrow, l_narrow, g_narrow = blocks_stream_and_gradients(narrow, ids, torch.bfloat16)
    assert (s_wide, s_narrow) == (torch.float32, torch.bfloat16)
    assert (l_narrow - l_wide).abs().max() < 0.02 * l_wide.abs().max()
    flat = [torch.cat([g.flatten() for g in gs]) for gs in (g_wide, g_narrow)]
    assert (flat[1] - flat[0]).norm() < 0.02 * flat[0].norm()
    for amp in (None, torch.float16):
        assert blocks_stream_and_gradients(narrow, ids, amp)[0] == torch.float32


def test_eigenvalue_magnitudes_at_init_lie_in_range():
    cfg = TENConfig(vocab_size=V, d_model=32, n_layers=3, n_eigenstates=64, n_heads=4)
    model = TENLM(cfg)
    for block in model.blocks:
        mag = torch.exp(-torch.exp(block.mixer.nu.detach()))
        assert mag.min() >= cfg.lambda_min - 1e-6 and mag.max() <= cfg.lambda_max + 1e-6
        # memory well beyond 6 tokens: the slowest modes keep 1e-3 after 100 steps
        assert mag.max() ** 100 > 1e-3
        assert mag.min() > 0.48
        theta = block.mixer.theta.detach()
        assert theta.min() >= 0 and theta.max() <= cfg.theta_max


def test_gradient_checkpointing_gives_same_gradients():
    torch.manual_seed(1)
    a = tiny("ten")
    b = tiny("ten", grad_checkpointing=True)
    b.load_state_dict(a.state_dict())
    ids = torch.randint(0, V, (2, 20))
    for m in (a, b):
        m.train()
        m(ids)[0].logsumexp(-1).sum().backward()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-12), name


@pytest.mark.parametrize("arch", ["ten", "transformer"])
def test_checkpoint_blocks_recomputes_only_the_first_n_with_the_same_gradients(arch):
    """checkpoint_blocks: 1 of 2: block 0 runs its forward again in backward, block 1
    does not, and the gradients are those of the plain model."""
    torch.manual_seed(1)
    a = tiny(arch)
    b = tiny(arch, grad_checkpointing=True, checkpoint_blocks=1)
    b.load_state_dict(a.state_dict())
    calls = {i: 0 for i in range(len(b.blocks))}
    for i, block in enumerate(b.blocks):
        block.register_forward_pre_hook(lambda *_, i=i: calls.__setitem__(i, calls[i] + 1))
    ids = torch.randint(0, V, (2, 20))
    for m in (a, b):
        m.train()
        m(ids)[0].logsumexp(-1).sum().backward()
    assert calls == {0: 2, 1: 1}
    for (name, pa), pb in zip(a.named_parameters(), b.parameters(), strict=True):
        assert torch.allclose(pa.grad, pb.grad, atol=1e-12), name


@pytest.mark.parametrize("arch", ["ten", "transformer"])
def test_compiled_blocks_share_one_graph_for_training_and_one_for_evaluation(arch):
    """compile_blocks (train.compile): every block, the first included, calls its
    compiled forward with the same kinds of arguments, so three blocks compile one graph
    for a training step and one more for evaluation (no grad). The first block had its
    own pair: on a GPU, each graph is a compile of its own, minutes of a run's start."""
    torch.manual_seed(1)
    model = tiny(arch, n_layers=3).float()
    model.compile_blocks(backend="eager")  # dynamo traces and guards; no inductor
    torch._dynamo.reset()
    stats = torch._dynamo.utils.counters["stats"]
    before = stats["unique_graphs"]  # the process's earlier tests' (reset keeps counters)
    ids = torch.randint(0, V, (2, 16))
    model.train()
    model(ids)[0].logsumexp(-1).sum().backward()
    assert stats["unique_graphs"] - before == 1
    model.eval()
    with torch.no_grad():
        model(ids)
    assert stats["unique_graphs"] - before == 2


@pytest.mark.parametrize("arch", ["ten", "transformer"])
@pytest.mark.parametrize("residual", ["fp32", "bf16"])
def test_an_eager_first_block_adds_no_zeros_and_computes_what_it_did(arch, residual):
    """Eager blocks: the first block's norm reads the stream alone (the zeros compiled
    blocks need, x * 0, cost a pass forward and two back). Its loss and every gradient
    equal the zeros' bit for bit, under bf16 autocast, on a bf16 stream too."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Products(TorchDispatchMode):  # the element-wise products forward and backward
        def __init__(self):
            super().__init__()
            self.shapes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] == "mul":
                self.shapes.append(tuple(args[0].shape))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(2)
    model = tiny(arch, selective=True, conv_width=4, residual_dtype=residual) if arch == "ten" \
        else tiny(arch, residual_dtype=residual)
    model = model.float()
    ids = torch.randint(0, V, (2, 16))

    def step(zeros):
        model.blocks_compiled = zeros  # the zeros without compiling: what changes is them
        model.zero_grad()
        with Products() as seen, torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(ids)[0].float().logsumexp(-1).sum()
            loss.backward()
        return loss.detach(), [p.grad.clone() for p in model.parameters()], seen.shapes

    loss, grads, products = step(False)
    want, want_grads, zero_products = step(True)
    stream = (2, 16, model.config.d_model)
    assert stream not in products and stream in zero_products
    assert torch.equal(loss, want)
    for (name, _), g, w in zip(model.named_parameters(), grads, want_grads, strict=True):
        assert torch.equal(g, w), name


@pytest.mark.parametrize("value", [-1, True, 1.5])
def test_checkpoint_blocks_that_is_not_a_count_is_refused_by_name(value):
    with pytest.raises(ValueError, match=r"^checkpoint_blocks: must be (an integer|>= 0)"):
        tiny("ten", grad_checkpointing=True, checkpoint_blocks=value)


def test_checkpoint_blocks_above_n_layers_checkpoints_every_block():
    assert recomputed_blocks(tiny("ten", grad_checkpointing=True, checkpoint_blocks=3)
                             .config) == 2


def test_no_weight_decay_group():
    model = tiny("ten", selective=True)
    names = model.no_weight_decay()
    for i in range(2):
        assert {f"blocks.{i}.mixer.nu", f"blocks.{i}.mixer.theta",
                f"blocks.{i}.mixer.gate.bias", f"blocks.{i}.norm1.weight",
                f"blocks.{i}.mixer.delta.bias"} <= names
        assert f"blocks.{i}.mixer.in_proj.weight" not in names
        assert f"blocks.{i}.mixer.coupling" not in names
    assert "embed.weight" in names
    decay, no_decay = model.optimizer_groups(0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    n_total = sum(p.numel() for p in model.parameters())
    assert sum(p.numel() for g in (decay, no_decay) for p in g["params"]) == n_total
    # an AdamW step with weight decay leaves ν untouched when its gradient is zero
    opt = torch.optim.AdamW(model.optimizer_groups(0.5), lr=0.1)
    nu = model.blocks[0].mixer.nu.detach().clone()
    model.blocks[0].mixer.in_proj.weight.sum().backward()
    opt.step()
    assert torch.equal(model.blocks[0].mixer.nu.detach(), nu)


def test_config_errors_name_the_field():
    """Structured: the job layer points at model.<field> from the error's attributes."""
    with pytest.raises(FieldError, match="n_heads: must divide n_eigenstates=10") as e:
        TENConfig(n_eigenstates=10, n_heads=4)
    assert (e.value.field, e.value.value) == ("n_heads", 4)
    with pytest.raises(FieldError, match="lambda_min"):
        TENConfig(lambda_min=0.999, lambda_max=0.99)
    # a laptop validating a GPU job accepts the name; whether it can run is said later
    assert TENConfig(scan_backend="fused").scan_backend == "fused"
    with pytest.raises(FieldError, match="must be one of auto, chunked, fused, ref") as e:
        TENConfig(scan_backend="fussed")
    assert (e.value.field, e.value.value) == ("scan_backend", "fussed")
    with pytest.raises(UnknownFieldError) as e:
        ten_config("tiny", d_modle=64)
    assert e.value.field == "d_modle" and "did you mean 'd_model'?" in str(e.value)


@pytest.mark.parametrize("config,field,value", [
    (lambda: TENConfig(d_model=128.0), "d_model", 128.0),
    (lambda: TENConfig(selective="yes"), "selective", "yes"),
    (lambda: TENConfig(n_layers=True), "n_layers", True),
    (lambda: TransformerConfig(pos="alibi"), "pos", "alibi"),
    (lambda: TransformerConfig(rope_base="1e4"), "rope_base", "1e4"),
])
def test_a_config_field_of_the_wrong_type_is_refused_by_name(config, field, value):
    """The library checks its declared types, not only the job schema: a Python user who
    passes 128.0 for a width is told which field, before a module is built."""
    with pytest.raises(FieldError) as e:
        config()
    assert (e.value.field, e.value.value) == (field, value)


def test_numpy_numbers_are_numbers_to_a_config():
    """A sweep that draws sizes with numpy is not refused for the integer's type."""
    import numpy as np

    cfg = TENConfig(d_model=np.int64(64), n_eigenstates=np.int32(32), mlp_ratio=np.float32(2))
    assert (cfg.d_model, cfg.n_eigenstates, cfg.mlp_ratio) == (64, 32, 2.0)


def test_gate_bias_and_selective_init():
    """The step starts around the fixed model's (Δ = 1) but already depends on the token,
    in softplus's exponential part: a unit of pre-activation scales it by ~e."""
    model = tiny("ten", selective=True, gate_bias=-2.0)
    mixer = model.blocks[0].mixer
    assert torch.all(mixer.gate.bias == -2.0)
    assert torch.allclose(F.softplus(mixer.delta.bias) / STEP_UNIT,
                          torch.ones_like(mixer.delta.bias))
    xn = F.layer_norm(torch.randn(4, 64, 32, dtype=torch.float64), (32,))
    step = F.softplus(mixer.delta(xn)) / STEP_UNIT
    assert 0.5 < step.log().mean().exp() < 2.0  # around 1 ...
    assert 0.5 < step.log().std() < 2.0  # ... and varying with the token, from the start
    fixed = tiny("ten")
    missing, unexpected = fixed.load_state_dict(model.state_dict(), strict=False)
    assert not missing and all(".delta." in k for k in unexpected)
    with torch.no_grad():  # the same model as the fixed one when the step is held at 1
        mixer_steps = [b.mixer.delta for b in model.blocks]
        for lin in mixer_steps:
            lin.weight.zero_()
    ids = torch.randint(0, V, (1, 10))
    assert torch.allclose(fixed(ids)[0], model(ids)[0], atol=1e-12)


def test_short_conv_sees_the_last_few_tokens_and_zeros_before_the_start():
    """With conv_width W, the drive at t is a function of tokens t-W+1..t: the start of a
    sequence (zero padding) is visible to the layer, and token t-W does not matter."""
    model = tiny("ten", conv_width=3, n_layers=1)
    conv = model.blocks[0].mixer.conv
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    u, tail = conv(x, None)
    assert torch.equal(tail, x[:, -2:])
    x2 = x.clone()
    x2[:, 5] += 1.0
    changed = (conv(x2, None)[0] - u).abs().amax(dim=(0, 2)) > 0
    assert changed.nonzero().flatten().tolist() == [5, 6, 7]
    padded = conv(torch.cat([torch.zeros(2, 2, 32, dtype=torch.float64), x], 1), None)[0]
    assert torch.allclose(padded[:, 2:], u)
    with pytest.raises(FieldError, match="conv_width"):
        TENConfig(conv_width=-1)


@pytest.mark.parametrize("T", [3, 40], ids=["on-the-states", "folded"])
def test_the_coupling_is_coupling_the_states_then_projecting_them(T):
    """y = W_out [(I + M_h) c per head, re and im alike], as the model's math reads, with
    the same output and gradients for W_out and M whichever way the mixer computes it:
    on the states for fewer tokens than d (generation), folded into one weight for more
    (a coupling far from 0, so a wrong fold cannot pass)."""
    mixer = tiny("ten", n_eigenstates=8, n_heads=2).blocks[0].mixer  # d = 32
    with torch.no_grad():
        mixer.coupling.normal_(0.0, 0.5)
    c = torch.randn(1, T, 16, dtype=torch.float64)  # (B, T, 2K): re then im, 2 heads of 4
    cv = c.view(1, T, 2, 2, 4)  # re/im, head, state
    coupled = torch.einsum("hrs,btzhs->btzhr", torch.eye(4) + mixer.coupling, cv)
    want = F.linear(coupled.reshape(1, T, 16), mixer.out_proj.weight)
    got = mixer.project(c)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    params = (mixer.out_proj.weight, mixer.coupling)
    dy = torch.randn_like(want)
    for w, g in zip(torch.autograd.grad(want, params, dy), torch.autograd.grad(got, params, dy),
                    strict=True):
        torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-12)


def test_short_conv_in_pieces_equals_it_whole():
    """Generation feeds a few tokens at a time: each piece continues from the tail the
    last one left (its last W - 1 inputs), pieces shorter than the tail included."""
    conv = tiny("ten", conv_width=4, n_layers=1).blocks[0].mixer.conv
    x = torch.randn(2, 20, 32, dtype=torch.float64)
    whole, last = conv(x, None)
    pieces, tail = [], None
    for a, b in [(0, 1), (1, 2), (2, 7), (7, 9), (9, 20)]:
        y, tail = conv(x[:, a:b], tail)
        pieces.append(y)
    torch.testing.assert_close(torch.cat(pieces, 1), whole, rtol=1e-12, atol=1e-12)
    assert torch.equal(tail, last) and torch.equal(last, x[:, -3:])


def test_selective_step_holds_a_token_for_thousands_of_steps_and_overwrites_on_demand():
    """What the selective step is for: a token whose step is large is written (γ -> 1,
    λ -> 0: the old contents go); tokens whose step is tiny are ignored (γ -> 0) and the
    state holds what it has (λ -> 1). The fixed model forgets it within ~1000 steps."""
    torch.manual_seed(0)
    cfg = TENConfig(vocab_size=V, d_model=8, n_layers=1, n_eigenstates=4, n_heads=1,
                    selective=True, conv_width=0, lambda_min=0.9, lambda_max=0.99)
    mixer = EigenstateMixer(cfg).double()
    marker, noise = torch.zeros(8, dtype=torch.float64), torch.randn(4095, 8).double()
    marker[0], noise[:, 0] = 10.0, 0.0  # feature 0: "write this token"
    with torch.no_grad():
        mixer.delta.weight.zero_()
        mixer.delta.weight[:, 0] = 40.0  # pre-activation 400 - 25 on the marker,
        mixer.delta.bias.fill_(-25.0)  # -25 (Δ ~ 1e-11) on every other token
    xn = torch.cat([marker[None], noise])[None]  # (1, 4096, 8)
    log_lam, gamma = mixer.eigenvalues(xn)
    assert torch.all(gamma[0, 0] > 0.99) and torch.all(log_lam[0, 0, :4] < -2.0)  # write
    assert torch.all(gamma[0, 1:] <= 1e-3) and log_lam[0, 1:, :4].min() > -1e-9  # hold
    _, _, state = mixer(xn, None)
    written = mixer.in_proj(marker) * gamma[0, 0]  # c_0: the marker's own write
    held = state[0] - written
    assert held.abs().max() < 1e-2 * written.abs().max()
    fixed = EigenstateMixer(replace(cfg, selective=False)).double()
    fixed.load_state_dict(mixer.state_dict(), strict=False)
    without_marker = torch.cat([torch.zeros(1, 8, dtype=torch.float64), noise])[None]
    forgot = fixed(xn, None)[2] - fixed(without_marker, None)[2]  # |λ|^4095 <= 0.99^4095
    assert forgot.abs().max() < 1e-12 * written.abs().max()


def test_a_matrix_states_flops_count_its_values():
    """MFU counts the work done: wider value vectors, more work a token."""
    narrow = TENLM(ten_config("tiny", state="matrix", value_dim=8))
    wide = TENLM(ten_config("tiny", state="matrix", value_dim=64))
    cfg = wide.config
    weights = 2 * cfg.n_layers * cfg.d_model * cfg.n_heads * (64 - 8)  # value and out_proj
    assert wide.flops_per_token(256) - narrow.flops_per_token(256) > 6 * weights
