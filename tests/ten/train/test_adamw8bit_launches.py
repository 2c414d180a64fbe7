"""ten.train.adamw8bit stepped in one launch per group and state kind (its CUDA path; here
under Triton's interpreter, ``multi_tensor=True``): bitsandbytes' updates to its 8-bit
rounding, bitsandbytes' states and checkpoints, a resume bit-exact, a non-finite step
skipped on the device.

bitsandbytes rounds a moment to a code by its own search (on the CPU, not always the
nearest value: 3% of the mean squares one to seven codes off after a step, measured);
the launches take the nearest, so the two agree to 8-bit rounding, not bit for bit.
Where it runs: tests/support/triton_mode.py."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from optimizers import SEED, decoded, make_groups, make_params, take_steps
from triton_mode import DEVICE, HAVE_TRITON, NO_TRITON, interpret_without_cuda

interpret_without_cuda()
pytestmark = [pytest.mark.cuda_kernels, pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)]

HYPER = {"lr": 1e-2, "betas": (0.9, 0.95)}


def bitsandbytes_own(groups):
    return importlib.import_module("bitsandbytes").optim.AdamW8bit(groups, **HYPER)


def launched(groups, multi_tensor=True):
    return importlib.import_module("ten.train.adamw8bit").AdamW8bit(
        groups, multi_tensor=multi_tensor, **HYPER)


def test_the_launches_step_as_bitsandbytes_to_its_8bit_rounding():
    print(f"seed {SEED}")
    start = make_params(DEVICE)
    mine, theirs = make_params(DEVICE), make_params(DEVICE)
    opt_mine, opt_theirs = launched(make_groups(mine)), bitsandbytes_own(make_groups(theirs))
    assert opt_mine.skips_on_device
    take_steps(opt_mine, mine, 5)
    take_steps(opt_theirs, theirs, 5)
    for p0, a, b in zip(start, mine, theirs, strict=True):
        moved = (b - p0).norm()
        assert (a - b).norm() < 0.02 * moved  # the 8-bit rounding's share of the steps
        for k in (1, 2):
            want = decoded(opt_theirs, b, k)
            assert (decoded(opt_mine, a, k) - want).norm() < 0.02 * want.norm()
    # bitsandbytes' layout: the same keys, dtypes and shapes, the step counts its ints
    sa, sb = opt_mine.state_dict()["state"], opt_theirs.state_dict()["state"]
    assert sa.keys() == sb.keys()
    for i in sb:
        assert sa[i]["step"] == sb[i]["step"] == 5
        for key, want in sb[i].items():
            if isinstance(want, dict):
                got = sa[i][key]
                assert {k: (v.dtype, v.shape) for k, v in got.items()} == \
                    {k: (v.dtype, v.shape) for k, v in want.items()}


def test_a_resume_steps_bit_for_bit_as_the_run_never_stopped():
    print(f"seed {SEED}")
    straight = make_params(DEVICE)
    take_steps(launched(make_groups(straight)), straight, 5)

    params = make_params(DEVICE)
    before = launched(make_groups(params))
    take_steps(before, params, 3)
    saved = copy.deepcopy({"params": [p.detach() for p in params], "opt": before.state_dict()})
    resumed = [torch.nn.Parameter(p.clone()) for p in saved["params"]]
    after = launched(make_groups(resumed))
    after.load_state_dict(saved["opt"])
    take_steps(after, resumed, 2, first=3)
    for a, b in zip(straight, resumed, strict=True):
        assert torch.equal(a, b)
    assert all(s["step"] == 5 for s in after.state_dict()["state"].values())

    # an optimizer that has stepped on loads the checkpoint too (its launches are remade)
    take_steps(before, params, 2, first=3)
    with torch.no_grad():
        for p, w in zip(params, saved["params"], strict=True):
            p.copy_(w)
    before.load_state_dict(saved["opt"])
    take_steps(before, params, 2, first=3)
    for a, b in zip(straight, params, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("into", ["bitsandbytes", "launched"])
def test_a_checkpoint_moves_between_bitsandbytes_and_the_launches(into):
    """Saved by one, resumed by the other: the run goes on with the saved moments and step
    counts (the bias corrections of step 4 and 5, not of 1 and 2)."""
    print(f"seed {SEED}")
    reference = make_params(DEVICE)
    opt_ref = bitsandbytes_own(make_groups(reference))
    take_steps(opt_ref, reference, 5)

    params = make_params(DEVICE)
    first = launched(make_groups(params)) if into == "bitsandbytes" \
        else bitsandbytes_own(make_groups(params))
    take_steps(first, params, 3)
    second = bitsandbytes_own(make_groups(params)) if into == "bitsandbytes" \
        else launched(make_groups(params))
    second.load_state_dict(first.state_dict())
    take_steps(second, params, 2, first=3)
    assert all(s["step"] == 5 for s in second.state_dict()["state"].values())
    start = make_params(DEVICE)
    for p0, a, b in zip(start, params, reference, strict=True):
        assert (a - b).norm() < 0.02 * (b - p0).norm()


def test_a_non_finite_step_is_skipped_on_the_device():
    """As torch's fused AdamW: step_unless hands the flag over as ``found_inf``; the
    weights, moments and step counts stay as they were."""
    from ten.train.nonfinite import step_unless

    params = make_params(DEVICE)
    opt = launched(make_groups(params))
    take_steps(opt, params, 2)
    before = copy.deepcopy(opt.state_dict())
    weights = [p.detach().clone() for p in params]
    for p in params:
        p.grad = torch.full_like(p, float("nan"))
    step_unless(opt, torch.tensor(True, device=DEVICE))
    assert not hasattr(opt, "found_inf")
    after = opt.state_dict()
    for w, p in zip(weights, params, strict=True):
        assert torch.equal(w, p)
    for i, s in before["state"].items():
        assert after["state"][i]["step"] == s["step"] == 2
        for key, want in s.items():
            if isinstance(want, dict):
                assert all(torch.equal(after["state"][i][key][k], v) for k, v in want.items())


def test_without_cuda_or_when_asked_the_step_is_bitsandbytes_own():
    params = make_params("cpu")
    assert not launched(make_groups(params), multi_tensor=None).skips_on_device
    assert not launched(make_groups(params), multi_tensor=False).skips_on_device
