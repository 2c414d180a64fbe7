"""Diagnoses: pure functions from the trainer's metrics records and GPU samples to a short
list of findings, each with a one-line reason a user can act on.

Inputs are what the run already writes: ``metrics.jsonl`` records (kinds start/train/
eval/end; "train" ones carry data_wait_frac, checkpoint_frac, mfu, step_time_s, ...)
and :mod:`runner.monitor.nvml` samples. No clock, no I/O: ``now`` is an argument, so
every rule is tested from recorded tables.
"""

from __future__ import annotations

import itertools
import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from runner.monitor.nvml import POWER_REASONS, THERMAL_REASONS
from ten.text import duration
from ten.train.metrics import MetricKind

INFO, WARNING, CRITICAL = "info", "warning", "critical"
_ORDER = {CRITICAL: 0, WARNING: 1, INFO: 2}

# Thresholds (fractions of wall time or of the GPU), one place to tune them.
DATA_BOUND_FRAC = 0.20  # more than this of each step waiting for batches
CHECKPOINT_FRAC = 0.10  # more than this of wall time saving checkpoints
LOW_UTIL_PCT = 60.0  # mean GPU utilisation below this while training
MEM_HEADROOM_FRAC = 0.50  # peak memory used below this: the batch can grow
RECENT_S = 300.0  # GPU samples this recent describe "now"


@dataclass(frozen=True)
class Diagnosis:
    code: str  # stalled, data-bound, checkpoint-bound, thermal, power-cap, gpu-errors, ...
    severity: str  # info | warning | critical
    message: str  # one line, with the figures and what to do

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def diagnose(train_records: list[dict[str, Any]], gpu_samples: list[dict[str, Any]],
             now: float, stall_after_s: float = 600.0,
             session_start: float | None = None,
             last_step: tuple[int, float] | None = None) -> list[Diagnosis]:
    """Findings, most severe first; an empty list means nothing to report.

    ``train_records`` may hold every metrics record (start/train/eval/end); any record
    counts as a sign of life for the stall rule, only "train" ones feed the others.
    With ``session_start`` (when this process started) older records are ignored, so a
    resumed job still preparing its data is not called stalled by its previous life.

    ``last_step`` is (step, unix time) of the newest step this process completed (the
    trainer's per-step signal, :meth:`runner.monitor.heartbeat.Heartbeat.step`). With it,
    "stalled" means no step completed for ``stall_after_s`` (or 3 usual step times);
    without it, the rule can only see logged records, which a slow run writes rarely.
    """
    records = [r for r in train_records if isinstance(r, dict) and "time" in r
               and (session_start is None or r["time"] >= session_start)]
    train = [r for r in records if r.get("kind", MetricKind.TRAIN) == MetricKind.TRAIN]
    ended = any(r.get("kind") == MetricKind.END for r in records[-1:])
    recent = [s for s in gpu_samples if now - s.get("time", 0.0) <= RECENT_S]
    if last_step is not None and session_start is not None and last_step[1] < session_start:
        last_step = None  # a previous life's step says nothing about this process
    found: list[Diagnosis] = []
    if not ended:
        found += _stalled(records, recent, now, stall_after_s, last_step)
    found += _gpu_errors(gpu_samples)
    found += _thermal(gpu_samples, recent)
    found += _power(recent)
    if train and not ended and not any(d.code == "stalled" for d in found):
        last = train[-1]
        window = [s for s in recent if s["time"] >= _window_start(train)]
        util = _mean(s.get("util") for s in (window or recent))
        found += _data_bound(last, util)
        found += _checkpoint_bound(last)
        if not any(d.code == "data-bound" for d in found):
            found += _low_util(last, util)
        found += _memory_headroom(last, recent)
    return sorted(found, key=lambda d: _ORDER.get(d.severity, 3))


# -- the rules ----------------------------------------------------------------------------

def stall_threshold(records: list[dict[str, Any]], stall_after_s: float,
                    per_step: bool = False) -> float:
    """How long without progress is a stall, from this session's metrics records.

    ``per_step``: against the time since the last completed step: ``stall_after_s``, or
    3 usual step times (a step longer than ``stall_after_s`` is slow, not hung).
    Otherwise against the time since the last record: also 3 usual gaps between train
    records when logging is sparser than that, and 3 times the gap that the step time
    and the steps between records predict (so the first train record of a slow run, 10
    steps of 30 s after its start record, is not awaited as a hang).
    """
    train = [r for r in records if r.get("kind", MetricKind.TRAIN) == MetricKind.TRAIN]
    step_times = [float(r["step_time_s"]) for r in train
                  if isinstance(r.get("step_time_s"), (int, float)) and r["step_time_s"] > 0]
    usual_step = statistics.median(step_times) if step_times else 0.0
    if per_step:
        return max(stall_after_s, 3.0 * usual_step)
    gaps = [b["time"] - a["time"] for a, b in itertools.pairwise(train)
            if b["time"] > a["time"]]
    usual = statistics.median(gaps) if gaps else 0.0
    stepped = [r for r in records
               if r.get("kind", MetricKind.TRAIN) in (MetricKind.START, MetricKind.TRAIN)
               and isinstance(r.get("step"), int)]
    strides = [b["step"] - a["step"] for a, b in itertools.pairwise(stepped)
               if b["step"] > a["step"]]
    stride = statistics.median(strides) if strides else 1
    return max(stall_after_s, 3.0 * usual, 3.0 * usual_step * stride)


def _stalled(records, recent, now, stall_after_s, last_step=None) -> list[Diagnosis]:
    if last_step is not None:
        step, at = last_step
        # A record newer than the last step (an eval, a checkpoint's metrics) is a sign
        # of life too.
        idle = now - max([at] + [r["time"] for r in records[-1:]])
        if idle <= stall_threshold(records, stall_after_s, per_step=True):
            return []
        what = f"no step for {duration(idle)}"
        where = f" (last step {step} at {_clock(at)})"
    else:
        if not records:
            return []
        last = records[-1]
        idle = now - last["time"]
        if idle <= stall_threshold(records, stall_after_s):
            return []
        # Only records are known here: say so, a slow run logs rarely.
        what = f"nothing logged for {duration(idle)}"
        where = f" (last record: step {last.get('step', '?')} at {_clock(last['time'])})"
    util = _mean(s.get("util") for s in recent)
    gpu = "" if util is None else f", GPU util {util:.0f}%"
    hint = (" — the data loader or a collective may be hung; the job should be restarted"
            if util is None or util < 10 else " — the GPU is busy but no step finished; "
            "check for a very long eval or a hung rank")
    return [Diagnosis("stalled", CRITICAL, f"stalled: {what}{gpu}{where}{hint}")]


def _data_bound(last, util) -> list[Diagnosis]:
    frac = last.get("data_wait_frac")
    if frac is None or frac < DATA_BOUND_FRAC:
        return []
    gpu = "" if util is None else f", GPU util {util:.0f}%"
    return [Diagnosis("data-bound", WARNING,
                      f"data-bound: {100 * frac:.0f}% of step waiting for batches{gpu} — "
                      "use pretokenized mode or more workers")]


def _checkpoint_bound(last) -> list[Diagnosis]:
    frac = last.get("checkpoint_frac")
    if frac is None or frac < CHECKPOINT_FRAC:
        return []
    return [Diagnosis("checkpoint-bound", WARNING,
                      f"checkpoint-heavy: {100 * frac:.0f}% of time saving checkpoints — "
                      "raise checkpoint.every_steps")]


def _low_util(last, util) -> list[Diagnosis]:
    if util is None or util >= LOW_UTIL_PCT:
        return []
    mfu = last.get("mfu")
    mfu_txt = "" if mfu is None else f", MFU {100 * mfu:.0f}%"
    return [Diagnosis("low-util", WARNING,
                      f"GPU underused: util {util:.0f}%{mfu_txt} with little data wait — "
                      "the model or batch is small for this GPU (larger batch, or "
                      "train.compile)")]


def _memory_headroom(last, recent) -> list[Diagnosis]:
    fracs = [s["mem_used"] / s["mem_total"] for s in recent
             if s.get("mem_used") is not None and s.get("mem_total")]
    if not fracs:
        return []
    frac = max(fracs)
    if frac >= MEM_HEADROOM_FRAC:
        return []
    return [Diagnosis("memory-headroom", INFO,
                      f"GPU memory {100 * frac:.0f}% used — batch can grow")]


def _thermal(samples, recent) -> list[Diagnosis]:
    if not recent or not THERMAL_REASONS & set(recent[-1].get("throttle") or ()):
        return []
    since = recent[-1]["time"]  # walk back over the unbroken throttled run
    for s in reversed(samples):
        if not THERMAL_REASONS & set(s.get("throttle") or ()):
            break
        since = s["time"]
    last = recent[-1]
    detail = []
    if last.get("temp_c") is not None:
        detail.append(f"{last['temp_c']:.0f}°C")
    if last.get("sm_clock_mhz") is not None:
        detail.append(f"SM {last['sm_clock_mhz']:.0f} MHz")
    extra = f" ({', '.join(detail)})" if detail else ""
    return [Diagnosis("thermal", WARNING,
                      f"thermal throttling since {_clock(since)}{extra} — clocks are "
                      "reduced; ask the provider for another host if it persists")]


def _power(recent) -> list[Diagnosis]:
    if not recent:
        return []
    last = recent[-1]
    reasons = POWER_REASONS & set(last.get("throttle") or ())
    if not reasons:
        return []
    watts = ""
    if last.get("power_w") is not None and last.get("power_limit_w"):
        watts = f" at {last['power_w']:.0f}/{last['power_limit_w']:.0f} W"
    if reasons == {"sw_power_cap"}:  # normal for a GPU at full load
        return [Diagnosis("power-cap", INFO, f"power-capped{watts}: the GPU is at its "
                          "power limit (expected under full load)")]
    return [Diagnosis("power-brake", WARNING,
                      f"hardware slowdown ({', '.join(sorted(reasons))}){watts} — a power "
                      "or cooling fault on the host; consider moving")]


def _gpu_errors(samples) -> list[Diagnosis]:
    xids = sorted({x for s in samples for x in (s.get("xid") or ())})
    uncorrected = max((s["ecc"].get("uncorrected") or 0 for s in samples
                       if isinstance(s.get("ecc"), dict)), default=0)
    if not xids and not uncorrected:
        return []
    parts = []
    if xids:
        parts.append("XID " + ", ".join(str(x) for x in xids))
    if uncorrected:
        parts.append(f"{uncorrected} uncorrected ECC errors")
    return [Diagnosis("gpu-errors", CRITICAL,
                      f"GPU errors: {'; '.join(parts)} — this host is unhealthy; "
                      "move the job to another one")]


# -- helpers ------------------------------------------------------------------------------

def _window_start(train: list[dict[str, Any]]) -> float:
    """The start of the latest logging window (the previous train record)."""
    return train[-2]["time"] if len(train) >= 2 else train[-1]["time"] - RECENT_S


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _clock(t: float) -> str:
    return time.strftime("%H:%M", time.gmtime(t)) + " UTC"


