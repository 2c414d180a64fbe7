"""ten.kernels.fp8_kernels: the float8 scale and cast kernels give the operators' torch
versions (``ten::fp8_scale``, ``ten::fp8_cast``, ``ten::fp8_cast_both``: to_fp8 of the
padded tensor, in the layouts asked) to the bit — the scales, the float8 values, the
layout — for both formats, each scaling, transposed, both or neither, padded or not, from
bf16 and fp32, at sizes that are not multiples of a tile, with values in the subnormals
and exact ties.

Where they run: tests/support/triton_mode.py (compiled on CUDA, interpreted on CPU).
"""

from __future__ import annotations

import pytest
import torch
from operator_layout import assert_fake_layout
from triton_mode import DEVICE, HAVE_TRITON, NO_TRITON, cpu, interpret_without_cuda, kernel_module

from ten.kernels import fp8

interpret_without_cuda()
pytestmark = pytest.mark.cuda_kernels

SEED = 0


@pytest.fixture(scope="module")
def kernels():
    if not HAVE_TRITON:
        pytest.skip(NO_TRITON)
    return kernel_module("ten.kernels.fp8_kernels")


def spread(rows, cols, dtype, seed=SEED):
    """Magnitudes over ~20 binades (the small ones land in float8's subnormals once scaled)
    and both signs, one row of zeros."""
    g = torch.Generator().manual_seed(seed)
    print(f"seed {seed}")
    t = torch.randn(rows, cols, generator=g) * torch.exp2(torch.randint(-20, 3, (rows, cols),
                                                                        generator=g).float())
    t[rows // 2] = 0.0
    return t.to(dtype).to(DEVICE)


def assert_same_bits(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))


def kernel_cast(kernels, t, dtype, dim, transpose, rows_to):
    """(scale, t8) from the kernels, each held to its operator's torch version on the way."""
    scale = kernels.fp8_scale(t, dtype, dim, tiny=fp8.TINY)
    want = torch.ops.ten.fp8_scale.default(*cpu(t), dtype, dim)
    assert scale.shape == want.shape and torch.equal(scale.cpu(), want)
    t8 = kernels.fp8_cast(t, scale, dtype, transpose, rows_to)
    assert_same_bits(t8, torch.ops.ten.fp8_cast.default(*cpu(t, scale), dtype, transpose,
                                                        rows_to))
    assert_fake_layout("fp8_scale", (t, dtype, dim), scale)
    assert_fake_layout("fp8_cast", (t, scale, dtype, transpose, rows_to), t8)
    return scale, t8


# (rows, cols, transpose, rows_to): not multiples of a tile; zero rows appended under a
# scale a tensor or a column only (a scale a row would have none for them)
LAYOUTS = [(40, 72, False, 1), (130, 24, True, 1), (40, 72, True, 16)]
CASES = [(dim, *layout) for dim in (None, 0, 1) for layout in LAYOUTS
         if dim != 1 or layout[3] == 1]


@pytest.mark.parametrize("dtype", [fp8.E4M3, fp8.E5M2])
@pytest.mark.parametrize("dim, rows, cols, transpose, rows_to", CASES)
def test_the_cast_kernels_give_the_operators_bits_scales_and_layout(kernels, dtype, dim, rows,
                                                                    cols, transpose, rows_to):
    kernel_cast(kernels, spread(rows, cols, torch.bfloat16), dtype, dim, transpose, rows_to)


@pytest.mark.parametrize("dim", [None, 0])
def test_both_layouts_from_one_read_are_the_two_casts(kernels, dim):
    t = spread(40, 72, torch.bfloat16)
    scale, t8_t = kernel_cast(kernels, t, fp8.E5M2, dim, True, 16)
    rows8, cols8_t = kernels.fp8_cast_both(t, scale, fp8.E5M2, 16)
    assert_same_bits(cols8_t, t8_t)
    assert_same_bits(rows8, kernels.fp8_cast(t, scale, fp8.E5M2, False, 16))
    assert_fake_layout("fp8_cast_both", (t, scale, fp8.E5M2, 16), (rows8, cols8_t))


def test_zero_rows_under_a_scale_a_row_are_refused_not_given_a_made_up_scale(kernels):
    t = spread(40, 32, torch.bfloat16)
    scale = kernels.fp8_scale(t, fp8.E4M3, 1, tiny=fp8.TINY)
    with pytest.raises(ValueError, match="not a row"):
        kernels.fp8_cast(t, scale, fp8.E4M3, True, 16)
    with pytest.raises(ValueError, match="not a row"):
        torch.ops.ten.fp8_cast.default(*cpu(t, scale), fp8.E4M3, True, 16)


def assert_casts_as_torch(kernels, t, dtype):
    for dim in (None, 0, 1):
        kernel_cast(kernels, t, dtype, dim, True, 16 if dim != 1 else 1)


@pytest.mark.parametrize("dtype", [fp8.E4M3, fp8.E5M2])
def test_partial_maxima_of_many_programs_reduce_to_torchs_scales(kernels, dtype, monkeypatch):
    """fp32 input (no bf16 rounding to hide a misrounding) over several amax programs
    down the columns and along the rows, and several partials per scale: the tiles made
    small (16 x 16, 2 a program) so the interpreter runs it in a moment."""
    for name, value in (("BR", 16), ("BC", 16), ("STEPS", 2), ("SCALE_BP", 4),
                        ("SCALE_BS", 8)):
        monkeypatch.setattr(kernels, name, value)
    assert_casts_as_torch(kernels, spread(150, 90, torch.float32, seed=1), dtype)


@pytest.mark.slow
def test_at_the_kernels_own_tiles_a_tensor_past_a_programs_stretch_casts_as_torch(kernels):
    """As above at the tiles the GPU runs: more rows than one amax program reduces
    (64 x 8) and more columns than one takes along a row."""
    assert_casts_as_torch(kernels, spread(1100, 600, torch.float32, seed=1), fp8.E4M3)


@pytest.mark.parametrize("dtype", [fp8.E4M3, fp8.E5M2])
def test_ties_round_to_even_and_the_largest_value_stays_finite(kernels, dtype):
    """Every value halfway between two float8 neighbours (normal and subnormal), each
    neighbour itself, and ± the format's largest: with one scale of exactly 1 (the amax is
    the largest value), what is written is IEEE's round-to-nearest-even."""
    top = torch.finfo(dtype).max
    grid = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    grid = grid[grid.isfinite() & (grid.abs() <= top)].unique()  # every finite value, sorted
    halves = (grid[1:] + grid[:-1]) / 2
    t = torch.cat([grid, halves, torch.tensor([top, -top])])
    t = torch.cat([t, t.new_zeros(-t.numel() % 16)]).view(-1, 16).to(DEVICE)
    scale, _ = kernel_cast(kernels, t, dtype, None, False, 1)
    assert scale.item() == 1.0  # the scale is exact: t / scale is t


def test_a_tensor_of_zeros_gets_the_floor_scale_and_zeros(kernels):
    t = torch.zeros(20, 32, dtype=torch.bfloat16, device=DEVICE)
    scale, t8 = kernel_cast(kernels, t, fp8.E4M3, None, True, 16)
    assert t8.shape == (32, 32) and not t8.cpu().view(torch.uint8).any()
    assert scale.item() == pytest.approx(fp8.TINY / 448.0)
