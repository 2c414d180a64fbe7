"""ten.train.optimizer_state: a run's optimizer state saved under one of the job's two
optimizers loads into the other with its moments and step counts (on the CPU, where
bitsandbytes >= 0.50 runs its 8-bit optimizers too).

bitsandbytes imports triton: imported when a test runs, never at collection (see
tests/ten/train/test_adamw8bit.py)."""

from __future__ import annotations

import importlib

import pytest
import torch
from optimizers import SEED, decoded, make_groups, make_params, take_steps

from ten.train.optimizer_state import for_optimizer

STEPS = 3


def adamw8bit(groups, **kw):
    return importlib.import_module("ten.train.adamw8bit").AdamW8bit(groups, **kw)


def adamw(groups, **kw):
    return torch.optim.AdamW(groups, **kw)


def train(make, **kw):
    """STEPS steps of the optimizer ``make`` builds, on the same gradients each time."""
    ps = make_params()
    opt = make(make_groups(ps), lr=1e-2, betas=(0.9, 0.95), **kw)
    take_steps(opt, ps, STEPS)
    return ps, opt


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_8bit_moments_load_into_adamw_as_adamw_would_have_them():
    print(f"seed {SEED}")
    _, q8 = train(adamw8bit)
    ref_ps, ref = train(adamw)  # what torch's AdamW holds after the same steps
    ps = make_params()
    opt = adamw(make_groups(ps), lr=1e-2, betas=(0.9, 0.95), fused=True)
    opt.load_state_dict(for_optimizer(q8.state_dict(), opt))
    for p, r in zip(ps, ref_ps, strict=True):
        mine, theirs = opt.state[p], ref.state[r]
        assert mine["step"].item() == STEPS
        assert relative(mine["exp_avg"], theirs["exp_avg"]) < 0.03  # 8-bit rounding
        assert relative(mine["exp_avg_sq"], theirs["exp_avg_sq"]) < 0.03
    assert opt.param_groups[0]["fused"] is True  # this run's flags, not the saved ones
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.0]
    opt.step()  # it steps: the KeyError 'exp_avg' this replaced came here


def test_adamw_moments_load_into_8bit_as_bitsandbytes_encodes_them():
    print(f"seed {SEED}")
    ref_ps, ref = train(adamw)
    ps = make_params()
    opt = adamw8bit(make_groups(ps), lr=1e-2, betas=(0.9, 0.95))
    opt.load_state_dict(for_optimizer(ref.state_dict(), opt))
    big, small = ps
    assert opt.state[big]["state1"].dtype == torch.uint8  # the layout bitsandbytes chose
    assert opt.state[small]["state1"].dtype == torch.float32
    for p, r in zip(ps, ref_ps, strict=True):
        assert opt.state[p]["step"] == STEPS
        assert relative(decoded(opt, p, 1), ref.state[r]["exp_avg"]) < 0.02
        assert relative(decoded(opt, p, 2), ref.state[r]["exp_avg_sq"]) < 0.02
    assert torch.equal(opt.state[small]["state2"], ref.state[ref_ps[1]]["exp_avg_sq"])
    before = big.detach().clone()
    big.grad, small.grad = torch.randn_like(big), torch.randn_like(small)
    opt.step()  # the KeyError 'state1' this replaced came here
    assert not torch.equal(big, before)


@pytest.mark.parametrize("make", [adamw, adamw8bit])
def test_a_state_in_the_optimizers_own_form_is_loaded_as_saved(make):
    _, opt = train(make)
    saved = opt.state_dict()
    fresh = make(make_groups(make_params()), lr=1e-2)
    assert for_optimizer(saved, fresh) is saved  # loaded as saved: a bit-exact resume


def test_the_saved_learning_rates_are_kept():
    """The schedule's lr lives in the groups: a converted state must not reset it to the
    peak for the first step after the resume."""
    _, q8 = train(adamw8bit)
    saved = q8.state_dict()
    for g in saved["param_groups"]:
        g["lr"], g["initial_lr"] = 4e-3, 1e-2
    opt = adamw(make_groups(make_params()), lr=1e-2)
    opt.load_state_dict(for_optimizer(saved, opt))
    assert [(g["lr"], g["initial_lr"]) for g in opt.param_groups] == [(4e-3, 1e-2)] * 2


def test_another_grouping_of_the_parameters_is_refused():
    _, q8 = train(adamw8bit)
    with pytest.raises(ValueError, match="2 parameter groups, this run's 1"):
        for_optimizer(q8.state_dict(), adamw(make_params(), lr=1e-2))
