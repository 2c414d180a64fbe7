"""The pre-flight health gate's policy from tables (and its CPU path), and run logs
read and followed from a store."""

import pytest

from runner.errors import UserError
from runner.exit_codes import ExitCode
from runner.monitor.health import expected_peak_tflops, judge, judge_unusable, preflight
from runner.monitor.logs import follow_log, read_log
from runner.monitor.source import open_run
from runner.storage import open_store

GIB = 2**30
L40S = {"name": "NVIDIA L40S", "driver": "550.54.15", "cuda": "12.4",
        "total_bytes": 48 * GIB, "free_bytes": 47 * GIB, "tflops": 250.0, "peak_tflops": 362.0}


@pytest.mark.parametrize("facts, ok, reason", [
    (L40S, True, None),
    ({**L40S, "tflops": 90.0}, False, "bf16 matmul 90 TFLOP/s is under 35% of its 362"),
    ({**L40S, "free_bytes": 10 * GIB}, False, "only 10.0 of 48.0 GiB free"),
    ({**L40S, "error": "CUDA error: uncorrectable ECC error encountered"}, False,
     "uncorrectable ECC"),
    ({**L40S, "name": "Tesla T4", "peak_tflops": None, "tflops": 20.0}, True, None),
])
def test_judge(facts, ok, reason):
    report = judge(facts)
    assert report.ok is ok
    assert report.lines[0] == f"GPU {facts['name']}, driver 550.54.15, CUDA 12.4"
    if ok:
        assert report.reason is None and report.lines[-1] == "health gate passed"
    else:
        assert reason in report.reason and report.reason.startswith("health gate failed: ")
        assert report.reason.endswith("move to another host") and "\n" not in report.reason


def test_expected_peaks_come_from_the_mfu_table():
    assert expected_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert expected_peak_tflops("NVIDIA L40S") == 362.0
    assert expected_peak_tflops("Tesla T4") is None
    # by exact name, as MFU: a PCIe H100 is not judged against the SXM part's 989, and a
    # MIG slice (a fraction of the SMs) against no peak at all
    assert expected_peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert expected_peak_tflops("NVIDIA H100 80GB HBM3 MIG 1g.10gb") is None


def test_preflight_on_cpu_is_skipped():
    report = preflight("cpu")
    assert report.ok and report.lines == ["no GPU: health gate skipped"]


UNSEEN = {"nvml_gpus": 1, "name": "NVIDIA L40S", "driver": "535.104.05", "driver_cuda": "12.2",
          "torch_version": "2.13.0+cu130", "torch_cuda": "13.0",
          "error": "The NVIDIA driver on your system is too old (found version 12020)."}


@pytest.mark.parametrize("facts, says", [
    # CUDA 13 image on a CUDA 12 driver: the driver it needs, and the CUDA 12 build
    (UNSEEN, ["driver 535.104.05 runs CUDA up to 12.2, this image's torch needs CUDA 13.0 "
              "(driver >= 580.65.06)", "build the image for CUDA 12 (README: Older drivers)"]),
    # a CUDA 12 image on a CUDA 11 driver: only a newer driver helps
    ({**UNSEEN, "driver": "470.82.01", "driver_cuda": "11.4", "torch_cuda": "12.8"},
     ["needs CUDA 12.8 (driver >= 525.60.13) — use a host or machine image with driver "
      ">= 525.60.13"]),
    # a CPU-only torch beside a working GPU
    ({**UNSEEN, "driver_cuda": "13.0", "torch_cuda": None}, ["this torch is a CPU-only build",
                                                              "train.device: cpu"]),
    # the driver is new enough: the GPUs are hidden from torch
    ({**UNSEEN, "driver_cuda": "13.0", "error": "no CUDA-capable device is detected"},
     ["(no CUDA-capable device is detected)", "CUDA_VISIBLE_DEVICES", "--gpus all"]),
])
def test_a_gpu_torch_cannot_use_is_named_with_its_fix_and_not_retried(facts, says):
    report = judge_unusable(facts)
    assert not report.ok and report.exit_code == ExitCode.GPU_UNUSABLE
    assert report.reason.startswith("GPU unusable: NVML sees 1 GPU(s) (NVIDIA L40S")
    assert "\n" not in report.reason
    for text in says:
        assert text in report.reason


def test_device_auto_refuses_the_cpu_when_nvml_sees_a_gpu(monkeypatch):
    """This machine's torch is a CPU build; an NVML that reports a GPU (an old driver's,
    as inside a container on such a host) turns auto's quiet CPU run into a refusal."""
    import types

    nvml = types.SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None, nvmlDeviceGetCount=lambda: 2,
        nvmlSystemGetDriverVersion=lambda: b"535.104.05",
        nvmlSystemGetCudaDriverVersion=lambda: 12020,
        nvmlDeviceGetHandleByIndex=lambda i: i, nvmlDeviceGetName=lambda h: b"NVIDIA L40S")
    monkeypatch.setitem(__import__("sys").modules, "pynvml", nvml)
    report = preflight("auto")
    assert not report.ok and report.exit_code == ExitCode.GPU_UNUSABLE
    assert report.lines == ["NVIDIA L40S, driver 535.104.05 (CUDA 12.2); torch "
                            f"{__import__('torch').__version__} built for CUDA none (CPU)"]
    assert "NVML sees 2 GPU(s)" in report.reason
    assert preflight("cpu").ok  # asked for on purpose


def test_device_auto_without_any_gpu_trains_on_the_cpu():
    assert preflight("auto").lines == ["no GPU: health gate skipped"]


@pytest.mark.gpu
def test_preflight_on_the_gpu():
    report = preflight("cuda", matmul_n=4096, seconds=0.3)
    assert report.ok, report.reason
    assert any("TFLOP/s" in line for line in report.lines)


def test_logs_from_a_store_and_followed(tmp_path):
    store = open_store(str(tmp_path / "store"))
    store.put_bytes("j/run.log", b"line 1\n")
    assert read_log(str(tmp_path / "store"), "j") == "line 1\n"
    out, polls = [], []

    def sleep(_):
        polls.append(1)
        if len(polls) == 1:
            store.put_bytes("j/run.log", b"line 1\nline 2\n")
        elif len(polls) == 2:  # a new machine started a fresh log
            store.put_bytes("j/run.log", b"new 1\n")

    follow_log(open_run(str(tmp_path / "store"), "j"), out.append, 0.0,
               stop=lambda: len(polls) >= 3, sleep=sleep)
    assert out == ["line 1\n", "line 2\n", "new 1\n"]
    with pytest.raises(UserError, match="no run.log for"):
        read_log(str(tmp_path / "store"), "other")
