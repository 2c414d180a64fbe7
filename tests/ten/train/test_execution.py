"""ten.train.execution: the one decision of a run's precision and scan and loss backends for its
device, taken before any work (the trainer, its memory check and the GPU suite share it)."""

import sys
from types import SimpleNamespace

import pytest
import torch

from ten.kernels.scan import ScanBackendError
from ten.model.config import TENConfig, TransformerConfig
from ten.train.execution import Execution, resolve_execution

CPU = torch.device("cpu")


def test_auto_on_a_cpu_is_fp32_chunked_and_says_which():
    run = resolve_execution(TENConfig(), "auto", "auto", CPU)
    assert (run.amp_dtype, run.tf32, run.scan, run.loss) == (None, False, "chunked", "chunked")
    assert run.notes[0] == "scan backend: auto -> chunked (no CUDA)"
    assert run.notes[1].startswith("loss: chunked")


def test_a_model_without_a_scan_has_none_and_only_the_loss_note():
    run = resolve_execution(TransformerConfig(), "bf16", "chunked", CPU)
    assert run == Execution(torch.bfloat16, False, None, "chunked", run.notes)
    assert len(run.notes) == 1 and run.notes[0].startswith("loss: chunked")


def test_the_model_is_built_with_the_decided_scan_and_the_saved_config_keeps_auto():
    from ten.model.presets import build_model

    job = TENConfig(vocab_size=64, d_model=16, n_layers=1, n_eigenstates=4, n_heads=1)
    run = Execution(None, False, "ref", "chunked", ())  # a decision auto would not make here
    model = build_model(run.model_config(job), CPU)
    assert {b.mixer.cfg.scan_backend for b in model.blocks} == {"ref"}  # not decided again
    assert job.scan_backend == "auto"  # what a checkpoint records: the job's own setting
    assert run.model_config(TransformerConfig()) == TransformerConfig()


def test_a_fused_scan_that_cannot_run_here_raises_before_any_work(monkeypatch):
    # triton installed, its kernels built for a GPU: the fused scan cannot take CPU tensors
    monkeypatch.setitem(sys.modules, "ten.kernels.scan_fused", SimpleNamespace(INTERPRETED=False))
    with pytest.raises(ScanBackendError, match="TENConfig.scan_backend to auto or chunked"):
        resolve_execution(TENConfig(scan_backend="fused"), "auto", "auto", CPU)


def test_an_unknown_loss_backend_is_named():
    with pytest.raises(ValueError, match="loss backend must be one of"):
        resolve_execution(TENConfig(), "auto", "fastest", CPU)


def test_on_a_gpu_fp32_matmuls_run_as_tf32_as_every_run_sets(tf32_off):
    run = resolve_execution(TransformerConfig(), "bf16", "chunked", torch.device("cuda"))
    assert run.tf32  # (resolving sets nothing: a run applies it)
    assert not torch.backends.cuda.matmul.allow_tf32
    run.set_torch_flags()
    assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32


def test_float8_on_a_device_without_fp8_tensor_cores_is_refused_naming_the_field():
    from ten.kernels.fp8 import FP8Error

    for config in (TENConfig(fp8="tensor"), TransformerConfig(fp8="row")):
        name = type(config).__name__
        with pytest.raises(FP8Error, match=rf"^{name}.fp8 runs float8 GEMMs on a GPU with "
                           rf"FP8 tensor cores .* this run is on the cpu: set {name}.fp8 "
                           "to off$"):
            resolve_execution(config, "auto", "auto", CPU)
    assert not any("fp8" in n for n in resolve_execution(TENConfig(), "auto", "auto",
                                                         CPU).notes)
