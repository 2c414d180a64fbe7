"""benchmarks/bench_traffic.py: the traced traffic of one micro-batch of the flagship job,
at a tiny size here, and what it says about the hot path's choices."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_traffic  # noqa: E402

TINY = ["model.d_model=64", "model.n_layers=2", "model.n_eigenstates=16", "model.n_heads=2",
        "data.seq_len=256", "data.tokenizer.vocab_size=1000"]


def analyse(*sets):
    return bench_traffic.analyse(*bench_traffic.load([*TINY, *sets]))


@pytest.fixture(scope="module")
def job():
    return analyse()


def test_the_job_is_traced_as_it_runs_on_a_gpu(job):
    assert job["scan_backend"] == "fused" and job["loss_traced"] == "fused"  # auto on CUDA
    assert job["optimizer"] == "adamw8bit"
    assert (job["batch"], job["grad_accum"]) == (4, 2)  # jobs/l40s-small-32k.yaml's
    kinds = job["by_kind"]
    assert kinds["matmul"]["tflop"] > 0 and kinds["loss"]["gb"] > 0
    total = sum(k["gb"] for k in kinds.values())
    assert 0 < job["bytes_outside_scan_gb"] < total  # the scan is inside the total
    assert 0 < job["mfu_ceiling_h100"] < 1 and 0 < job["mfu_ceiling_l40s"] < 1
    assert job["mfu_ceiling_l40s"] < job["mfu_ceiling_h100"]  # less bandwidth per FLOP


def test_the_fused_loss_moves_a_fraction_of_the_chunked_ones_bytes(job):
    chunked = analyse("train.loss=chunked")
    assert job["by_kind"]["loss"]["gb"] < 0.5 * chunked["by_kind"]["loss"]["gb"]
    assert job["by_kind"]["loss"]["kernels"] < chunked["by_kind"]["loss"]["kernels"]


def test_a_matrix_state_is_traced_through_its_own_scan(job):
    """Its scan reads values and queries besides the drive, and its backward writes the
    chunks' states: more bytes than the vector scan's (the vector scan's trace stood in
    for it before, and the matrix state's line equalled the vector state's)."""
    matrix = analyse("model.state=matrix")
    assert matrix["scan_backend"] == "fused"
    assert matrix["scan"]["gb"] > 1.5 * job["scan"]["gb"]
    assert 0 < matrix["bytes_outside_scan_gb"] < sum(k["gb"] for k in matrix["by_kind"].values())


def test_host_syncs_are_the_optimizers(job):
    fused_adamw = analyse("train.optimizer=adamw")
    assert fused_adamw["host_syncs_per_step"] == 0  # the fused AdamW skips on the device
    # 8-bit AdamW (ten.train.adamw8bit's launches on CUDA) reads the skip on the device too
    assert job["optimizer_per_step"]["host_syncs"] == 0
    assert job["host_syncs_per_step"] == 0
    # one launch and one step count per parameter group and state kind, not per tensor
    # (2 groups x 2 kinds x 2 at most; bitsandbytes' step launched one per tensor, 139)
    assert 2 <= job["optimizer_per_step"]["kernels"] <= 8


def test_liger_is_refused_with_the_fix():
    with pytest.raises(SystemExit, match="train.loss=fused"):
        analyse("train.loss=liger")


def test_an_in_place_operator_reads_and_writes_its_tensor_once_each():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = bench_traffic.TrafficMode()
    with FakeTensorMode(), mode:
        x, y = torch.empty(1000), torch.empty(1000)
        x.add_(y)  # aten returns x itself: read x, read y, write x
    assert mode.tallies["elementwise"].bytes == 3 * 4000
    assert mode.tallies["elementwise"].kernels == 1


def test_a_step_counts_its_clip_once_and_every_later_micro_batchs_gradient_sum():
    """Per micro-batch as the job's step runs them: each micro-batch after the first adds
    its gradient into every parameter's ``.grad`` in place; the clip scales every
    gradient once a step (it was counted with every micro-batch)."""
    cfg, train = bench_traffic.load(TINY)
    g = train.grad_accum  # the job's
    assert g > 1
    step, model = bench_traffic.trace_micro_batch(cfg, train, train.batch_size)
    single, _ = bench_traffic.trace_micro_batch(
        *bench_traffic.load([*TINY, "train.grad_accum=1"]), train.batch_size)
    n = len(list(model.parameters()))
    assert single.by_op["elementwise: add_"].kernels == 0  # nothing to add to yet
    assert step.by_op["elementwise: add_"].kernels == round(n * (g - 1) / g)
    assert single.by_op["elementwise: mul_"].kernels == n  # the clip's scale
    assert step.by_op["elementwise: mul_"].kernels == round(n / g)


def test_a_float8_matmul_counts_its_flops_at_the_cards_float8_rate():
    """_scaled_mm is a matmul (it was counted as an element-wise kernel without FLOPs):
    2·M·N·K at the float8 dense rate, where the same bf16 product takes the bf16 rate."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    M, K, N = 4096, 4096, 4096
    modes = {"fp8": bench_traffic.TrafficMode(), "bf16": bench_traffic.TrafficMode()}
    with FakeTensorMode():
        a8 = torch.empty(M, K, dtype=torch.float8_e4m3fn)
        b8 = torch.empty(N, K, dtype=torch.float8_e4m3fn).t()
        one = torch.ones(())
        with modes["fp8"]:
            torch._scaled_mm(a8, b8, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        with modes["bf16"]:
            torch.empty(M, K, dtype=torch.bfloat16) @ torch.empty(K, N, dtype=torch.bfloat16)
    fp8, bf16 = modes["fp8"].tallies["matmul"], modes["bf16"].tallies["matmul"]
    assert fp8.flops == bf16.flops == 2.0 * M * N * K
    for gpu in bench_traffic.GPUS:
        assert fp8.floor_s[gpu.name] == pytest.approx(2.0 * M * N * K / gpu.fp8)
        assert gpu.fp8 == pytest.approx(2 * gpu.bf16, rel=0.02)  # the datasheets' 2x
        assert bf16.floor_s[gpu.name] == pytest.approx(2.0 * M * N * K / gpu.bf16)


def test_an_out_tensor_is_counted_as_written_not_also_read():
    """``torch.addmm(c, a, b, out_dtype, out=c)`` reads c, a, b and writes c: an ``out=``
    tensor was counted as an input too (12 bytes an fp32 element for 8)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = bench_traffic.TrafficMode()
    with FakeTensorMode():
        c = torch.empty(1000, 100)
        a = torch.empty(1000, 50, dtype=torch.bfloat16)
        b = torch.empty(50, 100, dtype=torch.bfloat16)
        with mode:
            torch.addmm(c, a, b, torch.float32, out=c)
    assert mode.tallies["matmul"].bytes == 2 * c.numel() * 4 + (a.numel() + b.numel()) * 2
    assert mode.tallies["matmul"].flops == 2.0 * 1000 * 100 * 50


def test_the_loss_adds_its_weight_gradient_inside_each_chunks_gemm():
    """On a GPU whose torch offers it, every chunk's bf16 weight gradient goes into the
    fp32 sum in its GEMM's epilogue: one kernel a chunk, no separate fp32 add (16 of
    them, 5.24 GB a flagship micro-batch, before)."""
    mode, _ = bench_traffic.trace_micro_batch(
        *bench_traffic.load([*TINY, "train.grad_accum=1"]), 4)
    chunks = mode.by_op["loss: cross_entropy_rows"].kernels
    assert chunks > 0
    assert mode.by_op["loss: addmm"].kernels == chunks  # the weight gradient's GEMMs
    vocab, d = 1000, 64  # TINY's: the fp32 sum is V x d
    assert mode.by_op["loss: add_"].bytes < vocab * d * 4  # the loss's own running sum only
