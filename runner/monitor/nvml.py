"""GPU samples from NVML (nvidia-ml-py) in a background thread.

The sampler can never crash or slow training: every NVML call is guarded, a metric the
GPU does not support is simply absent (None), errors are logged at most once a minute,
and with no NVML library or no GPU :meth:`GpuSampler.start` logs one info line and
returns False (monitoring off). pynvml is imported only inside :meth:`start`.

A sample is a flat dict (JSON-ready)::

    time           unix seconds
    index, name    the device
    util           GPU utilisation, % (kernel busy time over NVML's window)
    mem_util       memory-controller utilisation, %
    mem_used, mem_total              bytes
    power_w, power_limit_w           watts
    temp_c, sm_clock_mhz, sm_clock_max_mhz
    throttle       decoded clock-event reasons, e.g. ["sw_power_cap", "hw_thermal"]
    pcie_tx, pcie_rx                 KB/s (NVML's 20 ms window)
    ecc            {"corrected": n, "uncorrected": n} (volatile counts) or None
    xid            XID error codes seen since the previous sample (list)
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from typing import Any

# Clock-event ("throttle") reason bits, as in nvml.h (nvmlClocksEventReason*). Kept here
# so decoding is a pure function that needs neither pynvml nor a GPU.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x001: "gpu_idle",
    0x002: "applications_clocks",
    0x004: "sw_power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
    0x200: "board_limit",
    0x400: "reliability",
}
THERMAL_REASONS = frozenset({"sw_thermal", "hw_thermal"})
POWER_REASONS = frozenset({"sw_power_cap", "hw_power_brake", "hw_slowdown"})

XID_EVENT = 0x8  # nvmlEventTypeXidCriticalError


def decode_clock_reasons(mask: int | None) -> list[str]:
    """Names of the set bits of a clock-event reason mask, in bit order; unknown bits
    come out as ``"unknown_0x..."`` so nothing is silently dropped."""
    if not mask:
        return []
    names = []
    bit = 1
    while bit <= mask:
        if mask & bit:
            names.append(CLOCK_EVENT_REASONS.get(bit, f"unknown_{bit:#x}"))
        bit <<= 1
    return names


class GpuSampler:
    """Samples one GPU every ``period_s`` seconds into :attr:`samples` (bounded)."""

    def __init__(self, period_s: float = 10.0, log: Callable[[str], None] = print,
                 index: int = 0, maxlen: int = 4096) -> None:
        self.period_s = float(period_s)
        self.log = log
        self.index = index
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=maxlen)
        self.name: str | None = None
        self._nvml: Any = None
        self._handle: Any = None
        self._events: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_error_at = 0.0
        self._lock = threading.Lock()  # a deque iterated while appended to raises

    # -- life cycle -------------------------------------------------------------------
    def start(self) -> bool:
        """Initialise NVML and start the thread; False (one info line) when there is no
        NVML library, no GPU, or anything else goes wrong."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception as e:  # noqa: BLE001 - NVMLError_LibraryNotFound, ImportError, ...
            self.log(f"GPU monitoring off: NVML unavailable ({_short(e)})")
            return False
        try:
            count = pynvml.nvmlDeviceGetCount()
            if count <= self.index:
                raise RuntimeError(f"{count} GPU(s) visible, need index {self.index}")
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(self.index)
            self.name = _text(pynvml.nvmlDeviceGetName(self._handle))
        except Exception as e:  # noqa: BLE001
            self.log(f"GPU monitoring off: {_short(e)}")
            _quiet(pynvml.nvmlShutdown)
            return False
        self._nvml = pynvml
        self._events = self._xid_event_set()
        self._thread = threading.Thread(target=self._loop, name="gpu-sampler", daemon=True)
        self._thread.start()
        self.log(f"GPU monitoring: {self.name} (GPU {self.index}) every {self.period_s:g} s")
        return True

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.period_s + 5)
            self._thread = None
        if self._nvml is not None:
            if self._events is not None:
                _quiet(self._nvml.nvmlEventSetFree, self._events)
            _quiet(self._nvml.nvmlShutdown)
            self._nvml = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def latest(self) -> dict[str, Any] | None:
        with self._lock:
            return self.samples[-1] if self.samples else None

    def snapshot(self) -> list[dict[str, Any]]:
        """A copy of the samples, safe to take from another thread."""
        with self._lock:
            return list(self.samples)

    # -- the thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self.sample_once()
                with self._lock:
                    self.samples.append(sample)
            except Exception as e:  # noqa: BLE001 - never let the thread die loudly
                self._error(e)
            self._stop.wait(self.period_s)

    def sample_once(self) -> dict[str, Any]:
        n, h = self._nvml, self._handle
        s: dict[str, Any] = {"time": time.time(), "index": self.index, "name": self.name}
        util = self._get(n.nvmlDeviceGetUtilizationRates, h)
        s["util"] = None if util is None else util.gpu
        s["mem_util"] = None if util is None else util.memory
        mem = self._get(n.nvmlDeviceGetMemoryInfo, h)
        s["mem_used"] = None if mem is None else mem.used
        s["mem_total"] = None if mem is None else mem.total
        power = self._get(n.nvmlDeviceGetPowerUsage, h)  # milliwatts
        s["power_w"] = None if power is None else power / 1000.0
        limit = self._get(n.nvmlDeviceGetEnforcedPowerLimit, h)
        s["power_limit_w"] = None if limit is None else limit / 1000.0
        s["temp_c"] = self._get(n.nvmlDeviceGetTemperature, h, n.NVML_TEMPERATURE_GPU)
        s["sm_clock_mhz"] = self._get(n.nvmlDeviceGetClockInfo, h, n.NVML_CLOCK_SM)
        s["sm_clock_max_mhz"] = self._get(n.nvmlDeviceGetMaxClockInfo, h, n.NVML_CLOCK_SM)
        reasons = getattr(n, "nvmlDeviceGetCurrentClocksEventReasons", None) \
            or n.nvmlDeviceGetCurrentClocksThrottleReasons
        s["throttle"] = decode_clock_reasons(self._get(reasons, h))
        s["pcie_tx"] = self._get(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_TX_BYTES)
        s["pcie_rx"] = self._get(n.nvmlDeviceGetPcieThroughput, h, n.NVML_PCIE_UTIL_RX_BYTES)
        corrected = self._get(n.nvmlDeviceGetTotalEccErrors, h,
                              n.NVML_MEMORY_ERROR_TYPE_CORRECTED, n.NVML_VOLATILE_ECC)
        uncorrected = self._get(n.nvmlDeviceGetTotalEccErrors, h,
                                n.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, n.NVML_VOLATILE_ECC)
        s["ecc"] = (None if corrected is None and uncorrected is None
                    else {"corrected": corrected, "uncorrected": uncorrected})
        s["xid"] = self._drain_xids()
        return s

    def _get(self, fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML query; None when unsupported or failing (logged, rate-limited)."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001
            if type(e).__name__ != "NVMLError_NotSupported":
                self._error(e)
            return None

    def _xid_event_set(self) -> Any:
        """An NVML event set registered for XID errors, or None where unsupported."""
        n = self._nvml
        try:
            events = n.nvmlEventSetCreate()
            n.nvmlDeviceRegisterEvents(self._handle, XID_EVENT, events)
            return events
        except Exception:  # noqa: BLE001 - containers and MIG often forbid it
            return None

    def _drain_xids(self) -> list[int]:
        xids: list[int] = []
        if self._events is None:
            return xids
        for _ in range(64):  # bounded: never spin
            try:
                data = self._nvml.nvmlEventSetWait(self._events, 0)
            except Exception:  # noqa: BLE001 - NVMLError_Timeout: nothing pending
                break
            xids.append(int(data.eventData))
        return xids

    def _error(self, e: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_error_at >= 60.0:
            self._last_error_at = now
            self.log(f"GPU monitoring: {_short(e)}")


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text[:200]


def _quiet(fn: Callable[..., Any], *args: Any) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001
        pass


def summarize(sample: dict[str, Any] | None) -> str:
    """One short line for a status table: 'util 97% mem 61/80 GB 298/300 W 71°C'."""
    if not sample:
        return "-"
    parts = []
    if sample.get("util") is not None:
        parts.append(f"util {sample['util']:.0f}%")
    if sample.get("mem_used") is not None and sample.get("mem_total"):
        parts.append(f"mem {sample['mem_used'] / 1e9:.0f}/{sample['mem_total'] / 1e9:.0f} GB")
    if sample.get("power_w") is not None:
        limit = sample.get("power_limit_w")
        parts.append(f"{sample['power_w']:.0f}/{limit:.0f} W" if limit
                     else f"{sample['power_w']:.0f} W")
    if sample.get("temp_c") is not None:
        parts.append(f"{sample['temp_c']:.0f}°C")
    throttled = [r for r in sample.get("throttle") or () if r != "gpu_idle"]
    if throttled:
        parts.append("throttle " + ",".join(throttled))
    return " ".join(parts) or "-"
