"""Hand-written recordings of runs, shaped like what the trainer (metrics.jsonl) and the
GPU sampler write: a healthy L40S run, a data-bound one, a thermally throttled one, a
hang, a GPU with XID errors, and a run preempted twice."""

from __future__ import annotations

import math

T0 = 1_767_225_600.0  # 2026-01-01 00:00:00 UTC
GB = 10**9
TOKENS_PER_STEP = 8 * 512


def train_run(steps=range(10, 310, 10), t0=T0 + 60, every_s=30.0, data_wait=0.03,
              ckpt=0.01, mfu=0.42, tok_s=34_000.0, loss0=7.0, start_step=0, resumed=False):
    """A start record then a train record every ``every_s`` seconds."""
    records = [{"kind": "start", "step": start_step, "time": t0 - 5, "tokens_per_step":
                TOKENS_PER_STEP, "total_steps": 1000, "resumed": resumed, "device": "cuda:0"}]
    for i, step in enumerate(steps):
        records.append({"kind": "train", "step": step, "time": t0 + i * every_s,
                        "loss": loss0 - 0.01 * step, "lr": 3e-3, "grad_norm": 0.9,
                        "tokens": step * TOKENS_PER_STEP,
                        "tokens_per_s": tok_s * (1 + 0.03 * math.sin(i)),
                        "mfu": mfu * (1 + 0.05 * math.cos(0.7 * i)),
                        "data_wait_frac": data_wait, "compute_frac": 1 - data_wait - ckpt,
                        "checkpoint_frac": ckpt, "step_time_s": every_s / 10,
                        "peak_mem_gb": 30.0})
    return records


def gpu_run(t0=T0 + 60, n=90, every_s=10.0, util=97, mem_used=40 * GB, mem_total=48 * GB,
            power=345.0, temp=71, clock=2520, throttle=("sw_power_cap",), xid=(),
            hot_from=None):
    """GPU samples; from sample ``hot_from`` on, thermally throttled at 89 C."""
    out = []
    for i in range(n):
        hot = hot_from is not None and i >= hot_from
        out.append({"time": t0 + i * every_s, "index": 0, "name": "NVIDIA L40S",
                    "util": util, "mem_util": 60, "mem_used": mem_used,
                    "mem_total": mem_total, "power_w": power - 3 * (i % 5), "power_limit_w": 350.0,
                    "temp_c": 89 if hot else temp, "sm_clock_mhz": 1410 if hot else clock,
                    "sm_clock_max_mhz": 2520,
                    "throttle": ["sw_thermal", "hw_thermal"] if hot else list(throttle),
                    "pcie_tx": 1200, "pcie_rx": 90000,
                    "ecc": {"corrected": 0, "uncorrected": 0},
                    "xid": list(xid) if i == n - 1 else []})
    return out


def last_time(records):
    return max(r["time"] for r in records)


def preempted_twice():
    """Session 1 reaches step 260 (checkpoint at 200), preempted; session 2 resumes at
    200, reaches 530 (checkpoint 500), preempted; session 3 resumes at 500 and finishes
    at 1000. Each session starts 120 s before its first metrics (data prep)."""
    s1 = train_run(steps=range(10, 270, 10), t0=T0 + 120)
    e1 = last_time(s1)
    t2 = e1 + 600  # a new spot instance ten minutes later
    s2 = train_run(steps=range(210, 540, 10), t0=t2 + 120, start_step=200, resumed=True)
    e2 = last_time(s2)
    t3 = e2 + 600
    s3 = train_run(steps=range(510, 1010, 10), t0=t3 + 120, start_step=500, resumed=True)
    s3.append({"kind": "end", "step": 1000, "time": last_time(s3) + 5, "outcome": "done",
               "tokens": 1000 * TOKENS_PER_STEP})
    events = [
        {"kind": "start", "time": T0},
        {"kind": "checkpoint", "time": T0 + 120 + 19 * 30, "step": 200},
        {"kind": "preemption_notice", "time": e1 - 1},
        {"kind": "start", "time": t2},
        {"kind": "resume", "time": t2 + 116, "from_step": 200, "reached_step": 260,
         "lost_steps": 60, "lost_tokens": 60 * TOKENS_PER_STEP},
        {"kind": "checkpoint", "time": t2 + 120 + 29 * 30, "step": 500},
        {"kind": "preemption_notice", "time": e2 - 1},
        {"kind": "start", "time": t3},
        {"kind": "resume", "time": t3 + 116, "from_step": 500, "reached_step": 530,
         "lost_steps": 30, "lost_tokens": 30 * TOKENS_PER_STEP},
        {"kind": "checkpoint", "time": last_time(s3), "step": 1000},
        {"kind": "stop", "time": last_time(s3) + 6, "state": "done"},
    ]
    return s1 + s2 + s3, events, (t2, t3)
