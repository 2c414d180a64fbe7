"""benchmarks/kernel_check.py in CI: every Triton kernel of the project compiles ahead of
time for the L40S (sm_89) and the H100 (sm_90a) with no GPU, and the block's, loss's
and selective drive's kernels neither spill nor fit fewer than 4 programs on an SM (their
fp64 variants, the checking path, need only compile).

(The interpreter runs kernels the compiler refuses: a non-constexpr global read inside a
kernel passed every interpreted test and failed only here.) The scan kernels' shortfall
(a 16-byte spill in the H100 fixed-mode backward, 3 programs per SM for the backward with
a carried state) is measured and reported in BENCHMARKS.md, not hidden here: this test
holds the kernels that meet the bar to it."""

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    importlib.util.find_spec("triton") is None, reason="triton is not installed")]


@pytest.fixture(scope="module")
def rows():
    import kernel_check

    return kernel_check.check()


def test_every_kernel_compiles_for_the_l40s_and_the_h100(rows):
    assert {r.arch for r in rows} == {89, 90}
    assert len(rows) == 2 * len(__import__("kernel_check").variants())
    failed = [(r.name, r.arch, r.error) for r in rows if r.error]
    assert not failed


def test_the_non_scan_kernels_neither_spill_nor_starve_an_sm(rows):
    others = [r for r in rows if not r.name.startswith("scan") and r.speed_matters]
    assert len(others) == 2 * 13  # per arch: the loss, 10 block kernels, the drive's 2
    assert [(r.name, r.arch, r.problems()) for r in others if r.problems()] == []
    assert all(r.programs_per_sm >= 4 and r.spills == 0 for r in others)


def test_the_fp64_kernels_a_float64_model_runs_compile(rows):
    """The gradient checks and a float64 model run the element-wise kernels in fp64 on a
    GPU; before, the LayerNorm backward did not compile there (fp32 accumulators)."""
    fp64 = [r for r in rows if not r.speed_matters]
    assert len(fp64) == 2 * 12  # the 10 block kernels and the drive's 2
    assert all(r.name.endswith("fp64") and r.error is None for r in fp64)


def test_the_convolution_backward_exchanges_nothing_between_threads_in_its_loop(rows):
    """Its first version changed layouts and summed across rows 9 times per tile (each
    through shared memory, behind a barrier) and ran 5x slower than torch's convolution
    on an H200; nothing in the compiled IR here, with no GPU, had said so."""
    conv = [r for r in rows if r.name.startswith("causal conv")]
    assert len(conv) == 2 * 4
    assert [(r.name, r.arch) for r in conv if r.loop_exchanges != 0] == []
