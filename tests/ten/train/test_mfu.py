"""ten.train.mfu: the peak table by exact device name, HFU beside MFU, recomputation FLOPs."""

import pytest
import torch

from ten.model.ten import TENLM, TENConfig
from ten.model.transformer import TransformerConfig, TransformerLM
from ten.train import mfu as mfu_mod
from ten.train.mfu import hfu, mfu, peak_flops, peak_note, peak_tflops_for


@pytest.mark.parametrize("name,tflops", [
    # torch.cuda.get_device_name() strings as the drivers report them
    ("NVIDIA H100 80GB HBM3", 989.0),  # SXM5
    ("NVIDIA H100 PCIe", 756.0),  # the substring table gave it the SXM peak
    ("NVIDIA H100 NVL", 835.0),
    ("NVIDIA H200", 989.0),
    ("NVIDIA H200 NVL", 835.0),
    ("NVIDIA GH200 480GB", 989.0),
    ("NVIDIA B200", 2250.0),
    ("NVIDIA L40S", 362.0),
    ("NVIDIA L40", 181.0),  # not the L40S, nor the L4
    ("NVIDIA L4", 121.0),
    ("NVIDIA A100-SXM4-80GB", 312.0),
    ("NVIDIA A100-SXM4-40GB", 312.0),
    ("NVIDIA A100-PCIE-40GB", 312.0),
    ("NVIDIA A100 80GB PCIe", 312.0),
    ("NVIDIA A10G", 70.0),
    ("NVIDIA A10", 125.0),
    ("NVIDIA GeForce RTX 4090", 165.2),  # fp32 accumulate: half the fp16-accumulate rate
    ("NVIDIA GeForce RTX 3090", 71.0),
    ("  NVIDIA L40S \n", 362.0),  # surrounding whitespace only
    # unknown: no peak, so MFU is omitted rather than guessed
    ("NVIDIA H100 80GB HBM3 MIG 3g.40gb", None),  # a slice has a fraction of the SMs
    ("NVIDIA H800", None),
    ("Tesla T4", None),
    ("NVIDIA GeForce RTX 4090 D", None),
    ("AMD Instinct MI300X", None),
    ("", None),
])
def test_peak_by_exact_device_name(name, tflops):
    assert peak_tflops_for(name) == tflops


def test_peak_and_note_on_cpu_and_on_gpus(monkeypatch):
    assert peak_flops("cpu") is None and peak_note("cpu") is None
    names = {"cuda": "NVIDIA H100 PCIe"}
    monkeypatch.setattr(mfu_mod.torch.cuda, "get_device_name", lambda d: names["cuda"])
    assert peak_flops(torch.device("cuda", 0)) == 756e12 and peak_note("cuda") is None
    names["cuda"] = "NVIDIA Imaginary 1"
    assert peak_flops("cuda") is None
    assert peak_note("cuda") == "MFU omitted: unknown peak for NVIDIA Imaginary 1"


@pytest.mark.parametrize("fpt,recompute,tok_s,peak,want_mfu,want_hfu", [
    (6e9, 0.0, 100.0, 1e12, 0.6, 0.6),  # no checkpointing: HFU = MFU
    (6e9, 2e9, 100.0, 1e12, 0.6, 0.8),  # blocks at 4x forward instead of 3x
    (6e9, 2e9, 100.0, None, None, None),  # unknown peak: both omitted
    (6e9, 2e9, 100.0, 0.0, None, None),
])
def test_mfu_and_hfu(fpt, recompute, tok_s, peak, want_mfu, want_hfu):
    got_mfu, got_hfu = mfu(fpt, tok_s, peak), hfu(fpt, recompute, tok_s, peak)
    assert got_mfu == (None if want_mfu is None else pytest.approx(want_mfu))
    assert got_hfu == (None if want_hfu is None else pytest.approx(want_hfu))


def ten(ckpt, blocks=None):
    return TENLM(TENConfig(vocab_size=100, d_model=32, n_layers=2, n_eigenstates=8,
                           n_heads=2, seq_len=16, chunk_size=8, grad_checkpointing=ckpt,
                           checkpoint_blocks=blocks))


def gpt(ckpt):
    return TransformerLM(TransformerConfig(vocab_size=100, d_model=32, n_layers=2, n_heads=2,
                                           seq_len=16, mlp_hidden=64,
                                           grad_checkpointing=ckpt))


@pytest.mark.parametrize("build", [ten, gpt], ids=["ten", "transformer"])
def test_recompute_flops_are_one_more_forward_of_the_blocks(build):
    plain, ckpt = build(False), build(True)
    assert plain.recompute_flops_per_token(16) == 0.0
    total = ckpt.flops_per_token(16)
    head = 6.0 * ckpt.output_weight.numel()  # the head is not checkpointed
    assert total == plain.flops_per_token(16)  # MFU's count does not change
    assert ckpt.recompute_flops_per_token(16) == pytest.approx((total - head) / 3)
    # so the blocks count 4x their forward FLOPs, the head 3x
    assert total + ckpt.recompute_flops_per_token(16) == pytest.approx(
        head + 4 * (total - head) / 3)


def test_recompute_flops_count_only_the_checkpointed_blocks():
    half, whole = ten(True, blocks=1), ten(True)
    assert half.recompute_flops_per_token(16) == pytest.approx(
        whole.recompute_flops_per_token(16) / 2)
    assert ten(True, blocks=0).recompute_flops_per_token(16) == 0.0
