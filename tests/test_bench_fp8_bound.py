"""benchmarks/bench_fp8_bound.py, which BENCHMARKS.md quotes for the float8 gradient's
bounded scale: on a small TEN's SwiGLU blocks it captures every block's backward, and the
bound it reports covers the true amax, costing the gradient no digits."""

import sys
from pathlib import Path

import torch

from ten.model.ten import TENLM, TENConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import bench_fp8_bound  # noqa: E402

SEED = 3


def test_every_blocks_bound_covers_its_gradient_and_costs_it_no_digits():
    torch.manual_seed(SEED)
    print(f"seed {SEED}")
    model = TENLM(TENConfig(vocab_size=200, d_model=64, n_layers=2, n_eigenstates=16,
                            n_heads=2, seq_len=64))
    blocks = bench_fp8_bound.capture(model, torch.randint(0, 200, (4, 64)))
    assert len(blocks) == 2 and all(b["dz"].shape == (256, 64) for b in blocks)
    for block in blocks:
        m = bench_fp8_bound.measure(block)
        assert m["bound_over_amax"] >= m["dy_bound_over_amax"] >= 1.0
        assert m["bounded_flushed"] == 0.0
        for err in ("dab", "dx", "dw"):
            assert m[f"bounded_{err}"] < 1.2 * m[f"own_{err}"] + 0.005
