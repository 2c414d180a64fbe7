"""ten.train.adamw8bit: bitsandbytes' 8-bit AdamW without a host sync per parameter, the same
updates and state as bitsandbytes' own (run on the CPU, where bitsandbytes >= 0.50 has
its 8-bit optimizers too).

bitsandbytes imports triton, so it is imported when a test runs, never at collection:
there it would fix triton's mode before the kernel test modules turn its interpreter on
(tests/support/triton_mode.py)."""

from __future__ import annotations

import copy
import importlib

import pytest
import torch

SEED = 0


def bitsandbytes_own(groups, **kw):
    return importlib.import_module("bitsandbytes").optim.AdamW8bit(groups, **kw)


def ours(groups, **kw):
    return importlib.import_module("ten.train.adamw8bit").AdamW8bit(groups, **kw)


def _params(device: str = "cpu") -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(SEED)
    # a matrix past bitsandbytes' 4096-element threshold for 8-bit states, and a vector
    return [torch.nn.Parameter(torch.randn(96, 64, generator=g).to(device)),
            torch.nn.Parameter(torch.randn(64, generator=g).to(device))]


def _groups(params):
    return [{"params": params[:1], "weight_decay": 0.1},
            {"params": params[1:], "weight_decay": 0.0}]


def _steps(opt, params, steps: int, first: int = 0) -> None:
    for i in range(first, first + steps):
        g = torch.Generator().manual_seed(1000 + i)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g).to(p.device)
        opt.step()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_updates_and_state_equal_bitsandbytes_own_bit_for_bit(device):
    print(f"seed {SEED}")
    mine, theirs = _params(device), _params(device)
    opt_mine = ours(_groups(mine), lr=1e-2, betas=(0.9, 0.95))
    opt_theirs = bitsandbytes_own(_groups(theirs), lr=1e-2, betas=(0.9, 0.95))
    _steps(opt_mine, mine, 5)
    _steps(opt_theirs, theirs, 5)
    for a, b in zip(mine, theirs, strict=True):
        assert torch.equal(a, b)
    for a, b in zip(mine, theirs, strict=True):
        state_a, state_b = opt_mine.state[a], opt_theirs.state[b]
        assert state_a.keys() == state_b.keys() and state_a["step"] == state_b["step"] == 5
        for k, v in state_a.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(state_b[k])), k


def test_a_checkpoint_of_bitsandbytes_own_optimizer_resumes_the_same():
    """Runs checkpointed with bitsandbytes' AdamW8bit, before this class, resume here."""
    params = _params()
    before = bitsandbytes_own(_groups(params), lr=1e-2)
    _steps(before, params, 3)
    saved = copy.deepcopy({"params": [p.detach() for p in params], "opt": before.state_dict()})
    _steps(before, params, 2, first=3)

    resumed = [torch.nn.Parameter(p.clone()) for p in saved["params"]]
    after = ours(_groups(resumed), lr=1e-2)
    after.load_state_dict(saved["opt"])
    _steps(after, resumed, 2, first=3)
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
    params = _params(device)
    _steps(bitsandbytes_own(_groups(params), lr=1e-2), params, 2)
    assert len(syncs) == 2 * len(params)  # what bitsandbytes' own step does
    syncs.clear()
    _steps(ours(_groups(params), lr=1e-2), params, 2)
    assert syncs == []


def test_paged_states_keep_bitsandbytes_step_and_its_syncs(syncs):
    params = _params()
    with pytest.warns(UserWarning):  # on a CPU paged states fall back to plain ones
        opt = ours(_groups(params), lr=1e-2, is_paged=True)
        _steps(opt, params, 1)
    assert len(syncs) >= len(params)


@pytest.mark.gpu
def test_on_another_stream_bitsandbytes_step_keeps_its_syncs(syncs):
    """bitsandbytes launches on stream 0: from another stream only its syncs order the
    updates after the gradients, so its own step runs."""
    params = _params("cuda")
    with torch.cuda.stream(torch.cuda.Stream()):
        _steps(ours(_groups(params), lr=1e-2), params, 1)
    assert len(syncs) == len(params)
