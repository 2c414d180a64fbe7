"""ten.model.statehealth: the figures say what they name (a state with no imaginary part
reports a share of 0, rotation brings it back; a fixed decay reads as itself)."""

import math

import torch

from ten.model.presets import build_model, model_config
from ten.model.statehealth import state_health

SEED = 7


def tiny(**kw):
    torch.manual_seed(SEED)
    return build_model(model_config("ten", "tiny", vocab_size=100, d_model=32, n_layers=1,
                                    n_eigenstates=8, n_heads=2, seq_len=64, **kw))


def test_the_imaginary_share_is_zero_without_imaginary_drive_or_rotation():
    model = tiny(selective=False, conv_width=0)
    mixer = model.blocks[0].mixer
    with torch.no_grad():
        mixer.in_proj.weight[8:].zero_()  # β's imaginary half
        mixer.theta.zero_()  # no rotation to carry the real part into it
    ids = torch.randint(0, 100, (2, 64))
    assert state_health(model, ids)["L0/imag_share"] == 0.0
    with torch.no_grad():
        mixer.theta.fill_(0.5)
    assert state_health(model, ids)["L0/imag_share"] > 0.1


def test_a_matrix_states_imaginary_share_is_zero_without_imaginary_keys_or_rotation():
    """The value vectors are real: a key with no imaginary half and no rotation write
    none; rotation turns the rows written into the imaginary part."""
    model = tiny(selective=False, conv_width=0, state="matrix")
    mixer = model.blocks[0].mixer
    with torch.no_grad():
        mixer.in_proj.weight[8:].zero_()
        mixer.theta.zero_()
    ids = torch.randint(0, 100, (2, 64))
    assert state_health(model, ids)["L0/imag_share"] == 0.0
    with torch.no_grad():
        mixer.theta.fill_(0.5)
    assert state_health(model, ids)["L0/imag_share"] > 0.1


def test_a_fixed_decay_is_reported_as_its_eigenvalues_moduli():
    model = tiny(selective=False, conv_width=0)
    with torch.no_grad():
        model.blocks[0].mixer.nu.copy_(torch.log(-torch.log(torch.linspace(0.5, 0.99, 8))))
    health = state_health(model, torch.randint(0, 100, (1, 16)))
    moduli = torch.linspace(0.5, 0.99, 8)
    for q in (10, 50, 90):
        assert math.isclose(health[f"L0/decay_p{q}"], float(torch.quantile(moduli, q / 100)),
                            rel_tol=1e-5)
    assert "L0/step_p50" not in health  # no step in the fixed mode


def test_the_selective_step_is_reported_as_the_steps_the_layer_took():
    """With the step's weights at 0, Δ_k = softplus(b_k) / STEP_UNIT whatever the tokens:
    the quantiles over the lanes, whichever way the layer computes its steps."""
    from ten.kernels.selective import STEP_UNIT

    model = tiny(selective=True, conv_width=4)
    delta = model.blocks[0].mixer.delta
    with torch.no_grad():
        delta.weight.zero_()
        delta.bias.copy_(torch.linspace(-6.0, 2.0, 8))
    health = state_health(model, torch.randint(0, 100, (2, 16)))
    lanes = torch.nn.functional.softplus(torch.linspace(-6.0, 2.0, 8)) / STEP_UNIT
    steps = lanes.repeat(2 * 16)  # every token of the batch takes them
    for q in (10, 50, 90):
        assert math.isclose(health[f"L0/step_p{q}"], float(torch.quantile(steps, q / 100)),
                            rel_tol=1e-5)


def test_compiled_blocks_report_the_eager_figures_and_compile_nothing_new():
    """Under train.compile the figures are the eager model's: the compiled blocks had run
    without the hooks that read a selective model's steps (its step figures missing, its
    decay read at a step of 1), and no graph is compiled for the figures."""
    model = tiny(selective=True)
    ids = torch.randint(0, 100, (2, 64))
    eager = state_health(model, ids)
    for block in model.blocks:
        block.compile(backend="eager")  # dynamo traces and guards; no inductor
    torch._dynamo.reset()
    counters = torch._dynamo.utils.counters
    with torch.no_grad():
        model.hidden_states(ids)
    compiled = counters["stats"]["unique_graphs"]
    assert state_health(model, ids) == eager
    assert counters["stats"]["unique_graphs"] == compiled
