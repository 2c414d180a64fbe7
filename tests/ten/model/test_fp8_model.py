"""A model with ``fp8`` set (TENConfig / TransformerConfig.fp8): its feed-forward blocks run
float8 GEMMs (on the CPU by torch's emulation), it learns as the same model without them
does, and its weights are the same tensors under the same names (a checkpoint moves
between the two: the field is execution-only)."""

import dataclasses

import pytest
import torch

from ten.config import FieldError
from ten.kernels.loss import NextTokenLoss
from ten.model.config import TENConfig, TransformerConfig
from ten.model.presets import EXECUTION_FIELDS, build_model

SEED = 0
SMALL = dict(vocab_size=256, d_model=64, n_layers=2, seq_len=32)


def configs():
    return [TENConfig(**SMALL, n_eigenstates=16, n_heads=2),
            TransformerConfig(**SMALL, n_heads=2, mlp_hidden=128)]


def train(config, steps=40):
    """Losses of ``steps`` AdamW steps on one sequence of a repeating pattern (one row:
    more rows of the same sequence give the same gradient, and the CPU's float8 GEMMs
    cost ~25 ms per million multiply-adds)."""
    torch.manual_seed(SEED)
    print(f"seed {SEED}")
    model = build_model(config, "cpu")
    objective = NextTokenLoss(model, "chunked")  # the head in float8 where fp8_head is set
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(SEED)
    pattern = torch.randint(0, config.vocab_size, (8,), generator=g)
    x = pattern.repeat(1, 5)[:, :33]
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = objective(x[:, :-1], x[:, 1:])
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("config", configs(), ids=lambda c: type(c).__name__)
def test_a_float8_model_learns_as_the_same_model_without_float8(config):
    off = train(config)
    on = train(dataclasses.replace(config, fp8="tensor"))
    assert on[0] == pytest.approx(off[0], rel=0.01)  # the same start, rounded differently
    assert on[-1] < 0.5 * on[0]  # it learns the pattern
    assert on[-1] == pytest.approx(off[-1], rel=0.05)  # seen: 0.7% (TEN), 0.1%


@pytest.mark.parametrize("config", configs(), ids=lambda c: type(c).__name__)
def test_a_model_with_its_head_in_float8_learns_as_without(config):
    body = train(dataclasses.replace(config, fp8="tensor"))
    head = train(dataclasses.replace(config, fp8="tensor", fp8_head=True))
    assert head[0] == pytest.approx(body[0], rel=0.01)
    assert head[-1] < 0.5 * head[0]
    assert head[-1] == pytest.approx(body[-1], rel=0.05)  # seen: +2.5% (TEN), +0.2%


@pytest.mark.parametrize("config", configs(), ids=lambda c: type(c).__name__)
def test_float8_changes_no_weight_and_is_execution_only(config):
    torch.manual_seed(SEED)
    plain = build_model(config, "cpu")
    torch.manual_seed(SEED)
    fp8 = build_model(dataclasses.replace(config, fp8="row"), "cpu")
    a, b = plain.state_dict(), fp8.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert {blk.mlp.gemms.scaling for blk in fp8.blocks} == {"row"}
    assert "fp8" in EXECUTION_FIELDS


def test_widths_float8_cannot_multiply_are_refused_naming_the_field():
    with pytest.raises(FieldError, match="fp8: needs d_model and the feed-forward width "
                                         r"to be multiples of 16 \(they are 40 and 128\)"):
        TransformerConfig(d_model=40, n_heads=2, mlp_hidden=128, fp8="tensor")
    with pytest.raises(FieldError, match="fp8: must be one of off, tensor, row"):
        TENConfig(fp8="block")
    with pytest.raises(FieldError, match="fp8_head: needs fp8 set to tensor or row"):
        TENConfig(fp8_head=True)
    with pytest.raises(FieldError, match="fp8_head: needs vocab_size to be a multiple of 16 "
                                         r"\(it is 1000\)"):
        TENConfig(vocab_size=1000, fp8="tensor", fp8_head=True)


def test_a_model_trained_with_float8_loads_without_it():
    """Evaluation, sampling and export load the checkpoint on any device (a CPU, a GPU
    without FP8 tensor cores): at the weights' precision."""
    from ten.model.presets import config_of

    config = dataclasses.replace(configs()[0], fp8="tensor", fp8_head=True)
    loaded = config_of("TENLM", dataclasses.asdict(config))
    assert loaded == dataclasses.replace(config, fp8="off", fp8_head=False)
    assert {"fp8", "fp8_head"} <= EXECUTION_FIELDS  # a resume may turn either on or off
