"""ten.kernels.multi_tensor_adamw: one launch steps many tensors as its module doc writes
the arithmetic, the same as one launch each, and a skipped step changes nothing.

Where it runs: tests/support/triton_mode.py (compiled on CUDA, interpreted on CPU). The
reference below is the module doc's arithmetic in torch ops, float32, with each moment
coded as its map's nearest value (an argmin over the 256 values); bitsandbytes' own
optimizer is held to the launches in tests/ten/train/test_adamw8bit_launches.py."""

from __future__ import annotations

import math

import pytest
import torch
from triton_mode import DEVICE, HAVE_TRITON, NO_TRITON, interpret_without_cuda, kernel_module

interpret_without_cuda()
pytestmark = [pytest.mark.cuda_kernels, pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)]

SEED = 0
HYPER = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


@pytest.fixture(scope="module")
def k():
    return kernel_module("ten.kernels.multi_tensor_adamw")


def dynamic_maps() -> tuple[torch.Tensor, torch.Tensor]:
    """bitsandbytes' signed and unsigned dynamic maps (imported here, at run time: it
    imports triton, whose mode the collection above must set first)."""
    import bitsandbytes.functional as F

    return (F.create_dynamic_map(signed=True).to(DEVICE),
            F.create_dynamic_map(signed=False).to(DEVICE))


class Tensor8:
    """A weight with its 8-bit moments, as bitsandbytes' init_state makes them (codes of
    zero, scales of zero)."""

    def __init__(self, n: int, gen: torch.Generator, maps) -> None:
        self.p = torch.randn(n, generator=gen).to(DEVICE)
        zero1, zero2 = (int((m == 0).nonzero()) for m in maps)
        blocks = -(-n // 256)
        self.moments = [torch.full((n,), zero1, dtype=torch.uint8, device=DEVICE),
                        torch.full((n,), zero2, dtype=torch.uint8, device=DEVICE),
                        torch.zeros(blocks, device=DEVICE), torch.zeros(blocks, device=DEVICE)]

    def clone(self) -> Tensor8:
        c = object.__new__(Tensor8)
        c.p, c.moments = self.p.clone(), [m.clone() for m in self.moments]
        return c


def nearest(x: torch.Tensor, code_map: torch.Tensor, signed: bool) -> torch.Tensor:
    i = (x[:, None] - code_map[None, :]).abs().argmin(1)
    if signed:  # a mean that would change sign moves one code outward
        q = code_map[i]
        i = torch.where((x < 0) & (q >= 0), i - 1, torch.where((x > 0) & (q < 0), i + 1, i))
    return i.to(torch.uint8)


def reference_step(t: Tensor8, g: torch.Tensor, step: int, maps) -> None:
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    codes1, codes2, scale1, scale2 = t.moments
    n = t.p.numel()
    m = maps[0][codes1.long()] * scale1.repeat_interleave(256)[:n]
    v = maps[1][codes2.long()] * scale2.repeat_interleave(256)[:n]
    m = m * b1 + (1 - b1) * g
    v = v * b2 + (1 - b2) * (g * g)
    c1, c2 = 1 - b1 ** step, math.sqrt(1 - b2 ** step)
    t.p.copy_((t.p + (-lr * c2 / c1) * (m / (v.sqrt() + eps * c2))) * (1 - lr * wd))
    pad = -n % 256
    for x, codes, scale, code_map, signed in ((m, codes1, scale1, maps[0], True),
                                              (v, codes2, scale2, maps[1], False)):
        rows = torch.nn.functional.pad(x, (0, pad)).view(-1, 256)
        top = rows.abs().amax(1)
        scale.copy_(top)
        codes.copy_(nearest(torch.where(top[:, None] > 0, rows / top[:, None], 0).flatten()[:n],
                            code_map, signed))


def launch_of(k, tensors: list[Tensor8], steps: int = 0):
    return k.Launch([t.p for t in tensors], [t.moments for t in tensors], True,
                    [steps] * len(tensors))


def step_launch(k, launch, grads, maps, skip: float = 0.0) -> None:
    flag = torch.tensor(skip, device=DEVICE)
    k.count_step(launch.steps, flag)
    launch.step(grads, flag, maps, **HYPER)


SIZES = (5000, 256, 1300)  # blocks of 256 and programs of 1,024 cut short, one exact


def problem(seed: int = SEED):
    print(f"seed {seed}")
    gen = torch.Generator().manual_seed(seed)
    maps = dynamic_maps()
    tensors = [Tensor8(n, gen, maps) for n in SIZES]
    grads = [[torch.randn(n, generator=gen).to(DEVICE) for n in SIZES] for _ in range(3)]
    return maps, tensors, grads


def test_three_steps_are_the_documented_arithmetic(k):
    maps, tensors, grads = problem()
    mine = [t.clone() for t in tensors]
    launch = launch_of(k, mine)
    for step, gs in enumerate(grads, 1):
        step_launch(k, launch, gs, maps)
        for t, g in zip(tensors, gs, strict=True):
            reference_step(t, g, step, maps)
    for a, b in zip(mine, tensors, strict=True):
        # the moments and their codes do not depend on the bias corrections: exact
        for x, y in zip(a.moments, b.moments, strict=True):
            assert torch.equal(x, y)
        # the corrections: exp2(t log2 b) on the device, b ** t here (a few ulps apart)
        torch.testing.assert_close(a.p, b.p, rtol=1e-6, atol=1e-7)
    assert launch.steps.tolist() == [3.0] * len(SIZES)


def test_one_launch_for_many_tensors_equals_one_launch_each(k):
    maps, tensors, grads = problem(1)
    together = [t.clone() for t in tensors]
    launch = launch_of(k, together)
    alone = [launch_of(k, [t]) for t in tensors]
    for gs in grads:
        step_launch(k, launch, gs, maps)
        for one, g in zip(alone, gs, strict=True):
            step_launch(k, one, [g], maps)
    for a, b in zip(together, tensors, strict=True):
        assert torch.equal(a.p, b.p)
        assert all(torch.equal(x, y) for x, y in zip(a.moments, b.moments, strict=True))


def test_a_skipped_step_changes_nothing_and_the_next_is_the_one_never_skipped(k):
    maps, tensors, grads = problem(2)
    skipped = [t.clone() for t in tensors]
    plain, with_skip = launch_of(k, tensors), launch_of(k, skipped)
    step_launch(k, plain, grads[0], maps)
    step_launch(k, with_skip, grads[0], maps)
    before = [(t.p.clone(), [m.clone() for m in t.moments]) for t in skipped]
    step_launch(k, with_skip, grads[1], maps, skip=1.0)
    for t, (p, moments) in zip(skipped, before, strict=True):
        assert torch.equal(t.p, p)
        assert all(torch.equal(x, y) for x, y in zip(t.moments, moments, strict=True))
    assert with_skip.steps.tolist() == plain.steps.tolist() == [1.0] * len(SIZES)
    step_launch(k, plain, grads[2], maps)
    step_launch(k, with_skip, grads[2], maps)
    for a, b in zip(skipped, tensors, strict=True):
        assert torch.equal(a.p, b.p)


def test_a_gradient_in_new_memory_is_read_where_it_now_is(k):
    """The backward pass allocates the gradients anew each step; the launch's table of
    addresses follows them."""
    maps, tensors, grads = problem(3)
    mine = [t.clone() for t in tensors]
    launch = launch_of(k, mine)
    for step, gs in enumerate(grads, 1):
        step_launch(k, launch, [g.clone() for g in gs], maps)  # new memory each step
        for t, g in zip(tensors, gs, strict=True):
            reference_step(t, g, step, maps)
    for a, b in zip(mine, tensors, strict=True):
        torch.testing.assert_close(a.p, b.p, rtol=1e-6, atol=1e-7)


def test_a_non_finite_gradient_element_zeroes_its_moments_and_keeps_its_weight(k):
    maps, tensors, grads = problem(4)
    launch = launch_of(k, tensors)
    step_launch(k, launch, grads[0], maps)
    p0 = tensors[0].p.clone()
    g = grads[1][0].clone()
    g[7], g[300] = float("nan"), float("inf")
    step_launch(k, launch, [g, *grads[1][1:]], maps)
    t = tensors[0]
    for i in (7, 300):
        assert t.p[i] == p0[i]
        assert maps[0][t.moments[0][i].long()] == 0 and maps[1][t.moments[1][i].long()] == 0
    assert torch.isfinite(t.p).all() and (t.p != p0).sum() == t.p.numel() - 2


def test_float32_moments_step_as_bitsandbytes_writes_them(k):
    """Tensors under bitsandbytes' 8-bit threshold keep float32 moments: the same update
    without codes."""
    gen = torch.Generator().manual_seed(SEED)
    p = torch.randn(700, generator=gen).to(DEVICE)
    g = torch.randn(700, generator=gen).to(DEVICE)
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    want = p.clone()
    launch = k.Launch([p], [[m, v]], False, [0])
    step_launch(k, launch, [g], None)
    lr, (b1, b2), eps, wd = HYPER["lr"], HYPER["betas"], HYPER["eps"], HYPER["weight_decay"]
    m_want, v_want = (1 - b1) * g, (1 - b2) * (g * g)
    c1, c2 = 1 - b1, math.sqrt(1 - b2)
    want = (want + (-lr * c2 / c1) * (m_want / (v_want.sqrt() + eps * c2))) * (1 - lr * wd)
    assert torch.equal(m, m_want) and torch.equal(v, v_want)
    torch.testing.assert_close(p, want, rtol=1e-6, atol=1e-7)


def test_a_mean_far_below_its_blocks_largest_keeps_its_sign(k):
    """A negative one's nearest code is zero (a positive sign bit): bitsandbytes moves it
    one code outward, so the mean keeps its direction; a positive one may stay zero."""
    maps, tensors, grads = problem(5)
    g = grads[0][0].clone()
    g[0], g[1], g[2] = 1e4, -1e-3, 1e-3
    launch = launch_of(k, tensors)
    step_launch(k, launch, [g, *grads[0][1:]], maps)
    codes, scale = tensors[0].moments[0], tensors[0].moments[2]
    decoded = maps[0][codes[:3].long()] * scale[0]
    assert decoded[0] > 0 and decoded[1] < 0 and decoded[2] >= 0


def test_a_weight_whose_storage_was_replaced_is_stepped_where_it_now_is(k):
    """``p.data = ...`` between steps, the gradients where they were."""
    maps, tensors, grads = problem(6)
    mine = [t.clone() for t in tensors]
    launch = launch_of(k, mine)
    held = [g.clone() for g in grads[0]]  # one gradient buffer for every step
    for step, gs in enumerate(grads, 1):
        if step == 2:
            mine[1].p.data = mine[1].p.data.clone()
        for h, g in zip(held, gs, strict=True):
            h.copy_(g)
        step_launch(k, launch, held, maps)
        for t, g in zip(tensors, gs, strict=True):
            reference_step(t, g, step, maps)
    for a, b in zip(mine, tensors, strict=True):
        torch.testing.assert_close(a.p, b.p, rtol=1e-6, atol=1e-7)
