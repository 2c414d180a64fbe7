"""ten.train.adamw8bit's per-parameter path (where its launches do not apply): bitsandbytes'
8-bit AdamW without a host sync per parameter, the same updates and state as
bitsandbytes' own (run on the CPU, where bitsandbytes >= 0.50 has its 8-bit optimizers
too).

bitsandbytes imports triton, so it is imported when a test runs, never at collection:
there it would fix triton's mode before the kernel test modules turn its interpreter on
(tests/support/triton_mode.py)."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch
from optimizers import SEED, make_groups, make_params, take_steps


def bitsandbytes_own(groups, **kw):
    return importlib.import_module("bitsandbytes").optim.AdamW8bit(groups, **kw)


def ours(groups, **kw):
    """The per-parameter path (the launches: test_adamw8bit_launches.py)."""
    return importlib.import_module("ten.train.adamw8bit").AdamW8bit(groups, multi_tensor=False,
                                                                   **kw)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_updates_and_state_equal_bitsandbytes_own_bit_for_bit(device):
    print(f"seed {SEED}")
    mine, theirs = make_params(device), make_params(device)
    opt_mine = ours(make_groups(mine), lr=1e-2, betas=(0.9, 0.95))
    opt_theirs = bitsandbytes_own(make_groups(theirs), lr=1e-2, betas=(0.9, 0.95))
    take_steps(opt_mine, mine, 5)
    take_steps(opt_theirs, theirs, 5)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(mine, theirs, strict=True):
        state_a, state_b = opt_mine.state[a], opt_theirs.state[b]
        assert state_a.keys() == state_b.keys() and state_a["step"] == state_b["step"] == 5
        for k, v in state_a.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(state_b[k])), k


def test_a_checkpoint_of_bitsandbytes_own_optimizer_resumes_the_same():
    """Runs checkpointed with bitsandbytes' AdamW8bit, before this class, resume here."""
    params = make_params()
    before = bitsandbytes_own(make_groups(params), lr=1e-2)
    take_steps(before, params, 3)
    saved = copy.deepcopy({"params": [p.detach() for p in params], "opt": before.state_dict()})
    take_steps(before, params, 2, first=3)

    resumed = [torch.nn.Parameter(p.clone()) for p in saved["params"]]
    after = ours(make_groups(resumed), lr=1e-2)
    after.load_state_dict(saved["opt"])
    take_steps(after, resumed, 2, first=3)
    for a, b in zip(params, resumed, strict=True):
        assert torch.equal(a, b)


@pytest.fixture
def syncs(monkeypatch):
    """The per-parameter syncs bitsandbytes' step makes, counted."""
    calls = []
    monkeypatch.setattr(importlib.import_module("bitsandbytes.optim.optimizer"), "sync_gpu",
                        lambda t: calls.append(t))
    return calls


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_no_host_sync_per_parameter(syncs, device):
    params = make_params(device)
    take_steps(bitsandbytes_own(make_groups(params), lr=1e-2), params, 2)
    assert len(syncs) == 2 * len(params)  # what bitsandbytes' own step does
    syncs.clear()
    take_steps(ours(make_groups(params), lr=1e-2), params, 2)
    assert syncs == []


def test_paged_states_keep_bitsandbytes_step_and_its_syncs(syncs):
    params = make_params()
    with pytest.warns(UserWarning):  # on a CPU paged states fall back to plain ones
        opt = ours(make_groups(params), lr=1e-2, is_paged=True)
        take_steps(opt, params, 1)
    assert len(syncs) >= len(params)


@pytest.mark.gpu
def test_on_another_stream_bitsandbytes_step_keeps_its_syncs(syncs):
    """bitsandbytes launches on stream 0: from another stream only its syncs order the
    updates after the gradients, so its own step runs."""
    params = make_params("cuda")
    with torch.cuda.stream(torch.cuda.Stream()):
        take_steps(ours(make_groups(params), lr=1e-2), params, 1)
    assert len(syncs) == len(params)
