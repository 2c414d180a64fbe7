"""The GPU sampler: clock-event reason decoding (pure), the no-NVML path on this CPU
machine, and sampling through a fake pynvml whose queries partly fail."""

import sys
import time
import types

import pytest

from runner.monitor.nvml import GpuSampler, decode_clock_reasons, summarize


@pytest.mark.parametrize("mask, names", [
    (None, []),
    (0x0, []),
    (0x1, ["gpu_idle"]),
    (0x4, ["sw_power_cap"]),
    (0x60, ["sw_thermal", "hw_thermal"]),
    (0x4 | 0x80, ["sw_power_cap", "hw_power_brake"]),
    (0x8 | 0x40, ["hw_slowdown", "hw_thermal"]),
    (0x200 | 0x400, ["board_limit", "reliability"]),
    (0x1000, ["unknown_0x1000"]),
])
def test_decode_clock_reasons(mask, names):
    assert decode_clock_reasons(mask) == names


def test_decode_matches_pynvml_constants():
    pynvml = pytest.importorskip("pynvml")
    assert decode_clock_reasons(pynvml.nvmlClocksEventReasonSwPowerCap) == ["sw_power_cap"]
    assert decode_clock_reasons(pynvml.nvmlClocksEventReasonHwThermalSlowdown) == ["hw_thermal"]
    assert decode_clock_reasons(pynvml.nvmlClocksThrottleReasonSwThermalSlowdown) == \
        ["sw_thermal"]


def test_no_gpu_means_one_info_line_and_monitoring_off(monkeypatch):
    class LibraryNotFound(Exception):
        pass

    def init():
        raise LibraryNotFound("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(nvmlInit=init))
    lines = []
    sampler = GpuSampler(0.01, lines.append)
    assert sampler.start() is False
    assert lines == ["GPU monitoring off: NVML unavailable (NVML Shared Library Not Found)"]
    assert sampler.latest() is None and not sampler.running
    sampler.stop()  # harmless


def test_real_pynvml_without_gpu_does_not_raise():
    lines = []
    sampler = GpuSampler(0.01, lines.append)
    started = sampler.start()
    try:
        if not started:
            assert len(lines) == 1 and lines[0].startswith("GPU monitoring off")
    finally:
        sampler.stop()


class NotSupported(Exception):
    pass


NotSupported.__name__ = "NVMLError_NotSupported"


def fake_pynvml():
    ns = types.SimpleNamespace(
        NVML_TEMPERATURE_GPU=0, NVML_CLOCK_SM=1, NVML_PCIE_UTIL_TX_BYTES=0,
        NVML_PCIE_UTIL_RX_BYTES=1, NVML_MEMORY_ERROR_TYPE_CORRECTED=0,
        NVML_MEMORY_ERROR_TYPE_UNCORRECTED=1, NVML_VOLATILE_ECC=0)
    ns.nvmlInit = ns.nvmlShutdown = lambda: None
    ns.nvmlDeviceGetCount = lambda: 1
    ns.nvmlDeviceGetHandleByIndex = lambda i: "h"
    ns.nvmlDeviceGetName = lambda h: b"NVIDIA L40S"
    ns.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=93, memory=40)
    ns.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=30 * 10**9,
                                                                 total=48 * 10**9)
    ns.nvmlDeviceGetPowerUsage = lambda h: 300_000
    ns.nvmlDeviceGetEnforcedPowerLimit = lambda h: 350_000
    ns.nvmlDeviceGetTemperature = lambda h, s: 66
    ns.nvmlDeviceGetClockInfo = lambda h, c: 2400
    ns.nvmlDeviceGetMaxClockInfo = lambda h, c: 2520
    ns.nvmlDeviceGetCurrentClocksEventReasons = lambda h: 0x4

    def unsupported(*a):
        raise NotSupported("Not Supported")

    def broken(*a):
        raise RuntimeError("GPU is lost")

    ns.nvmlDeviceGetPcieThroughput = unsupported
    ns.nvmlDeviceGetTotalEccErrors = unsupported
    ns.nvmlEventSetCreate = broken  # no XID events in this container
    return ns


def test_sampling_through_fake_nvml(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml())
    lines = []
    sampler = GpuSampler(0.01, lines.append)
    assert sampler.start() is True
    deadline = time.time() + 5
    while len(sampler.samples) < 3 and time.time() < deadline:
        time.sleep(0.01)
    sampler.stop()
    s = sampler.latest()
    assert s["util"] == 93 and s["power_w"] == 300.0 and s["power_limit_w"] == 350.0
    assert s["throttle"] == ["sw_power_cap"] and s["name"] == "NVIDIA L40S"
    assert s["pcie_tx"] is None and s["ecc"] is None and s["xid"] == []
    assert lines == ["GPU monitoring: NVIDIA L40S (GPU 0) every 0.01 s"]  # unsupported: silent
    assert summarize(s) == "util 93% mem 30/48 GB 300/350 W 66°C throttle sw_power_cap"


def test_failing_queries_are_logged_rate_limited_and_sampling_goes_on(monkeypatch):
    nv = fake_pynvml()

    def lost(h):
        raise RuntimeError("GPU is lost")

    nv.nvmlDeviceGetUtilizationRates = lost
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    lines = []
    sampler = GpuSampler(0.005, lines.append)
    assert sampler.start()
    deadline = time.time() + 5
    while len(sampler.samples) < 5 and time.time() < deadline:
        time.sleep(0.01)
    sampler.stop()
    assert len(sampler.samples) >= 5 and sampler.latest()["util"] is None
    assert [line for line in lines if "GPU is lost" in line] == ["GPU monitoring: GPU is lost"]
