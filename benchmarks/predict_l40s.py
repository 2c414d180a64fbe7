"""The flagship job's MFU on an L40S, predicted from the H100's measured micro-batch (the
L40S is the card the job is named for; no session has been lent one).

    python benchmarks/predict_l40s.py            # the table, from benchmarks/results/
    python benchmarks/predict_l40s.py --json

Method. The newest committed H100 profile of the job's micro-batch splits its time into
GEMMs, memory-bound kernels (element-wise, scan, loss) and the device's idle time. On the
L40S:

* the GEMMs do the same FLOPs at a share ``e`` of its datasheet bf16 peak (362 TFLOP/s):
  the H100 reached ``e_H100`` of its 989, and what the L40S reaches under its 350 W cap is
  the largest unknown, so the prediction is given as a function of ``e``;
* the memory-bound kernels move the same bytes at the same share of bandwidth: their time
  scales by 3.35 / 0.864 TB/s;
* the idle time (the host launching kernels) stays as it was.

MFU = the model's FLOPs over (that time × the L40S's peak). The GEMM FLOPs are taken as
the model's (MFU counts model FLOPs only, and the job recomputes nothing), from the H100's
measured MFU, its peak and its micro-batch time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from ten.cards import CARDS  # noqa: E402  (torch-free)

RESULTS = Path(__file__).resolve().parent / "results"
PEAK = {"H100": 989e12, "L40S": 362e12}  # bf16 dense, datasheets (ten.train.mfu)
BANDWIDTH = {name: CARDS[name].bandwidth for name in ("H100", "L40S")}  # bytes/s, datasheets
TARGET = 0.35  # the L40S's MFU target (benchmarks/gpu_suite.py)


def commit_order(commit: str | None) -> int:
    """How many commits lead to ``commit`` (0 when git does not know it): several
    results files share a date."""
    if not commit:
        return 0
    out = subprocess.run(["git", "rev-list", "--count", commit.split("+")[0]],
                         capture_output=True, text=True, cwd=RESULTS)
    return int(out.stdout) if out.returncode == 0 else 0


def newest(section: str, key: str) -> tuple[str, dict]:
    """The newest H100 results holding ``section`` with ``key`` in it: (file, results)."""
    found = []
    for path in RESULTS.glob("nvidia-h100-*.json"):
        data = json.loads(path.read_text())
        if key in (data.get(section) or {}):
            found.append((data["date"], commit_order(data.get("commit")), path.name, data))
    if not found:
        raise SystemExit(f"predict_l40s: no H100 results with {section}.{key}")
    *_, name, data = max(found, key=lambda f: f[:3])
    return name, data


def predict(efficiencies: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9)) -> dict:
    profile_file, profiled = newest("profile", "timeline")
    flagship_file, measured = newest("flagship", "as_configured")
    ms = profiled["profile"]["ms"]
    idle_s = profiled["profile"]["timeline"]["idle_ms"] / 1e3
    span_s = profiled["profile"]["timeline"]["span_ms"] / 1e3
    gemm_s = ms["gemm"] / 1e3
    memory_s = (ms["elementwise"] + ms["scan"] + ms["loss"]) / 1e3
    job = measured["flagship"]["as_configured"]
    flops = job["mfu"] * PEAK["H100"] * span_s  # a micro-batch's model FLOPs, as profiled
    e_h100 = flops / gemm_s / PEAK["H100"]
    memory_l40s = memory_s * BANDWIDTH["H100"] / BANDWIDTH["L40S"]

    def mfu(e: float) -> float:
        return flops / ((flops / (e * PEAK["L40S"]) + memory_l40s + idle_s) * PEAK["L40S"])

    # the GEMM share that meets the target: flops / (TARGET * peak) = GEMM + the rest
    rest = flops / (TARGET * PEAK["L40S"]) - memory_l40s - idle_s
    return {"from": {"profile": profile_file, "flagship": flagship_file},
            "h100": {"mfu": job["mfu"], "gemm_share_of_peak": e_h100,
                     "micro_batch_ms": {"gemm": gemm_s * 1e3, "memory_bound": memory_s * 1e3,
                                        "idle": idle_s * 1e3}},
            "l40s_memory_bound_ms": memory_l40s * 1e3,
            "l40s_mfu_by_gemm_share": {f"{e:.2f}": mfu(e)
                                       for e in sorted({*efficiencies, round(e_h100, 2)})},
            "gemm_share_for_target": flops / (rest * PEAK["L40S"]) if rest > 0 else None}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", action="store_true")
    r = predict()
    if ap.parse_args().json:
        print(json.dumps(r, indent=1))
        return
    h = r["h100"]
    print(f"H100 ({r['from']['flagship']}, profile {r['from']['profile']}): MFU "
          f"{h['mfu']:.1%}, GEMMs at {h['gemm_share_of_peak']:.0%} of peak; a micro-batch "
          f"{h['micro_batch_ms']['gemm']:.1f} ms GEMMs, {h['micro_batch_ms']['memory_bound']:.1f}"
          f" ms memory-bound, {h['micro_batch_ms']['idle']:.1f} ms idle")
    print(f"L40S: memory-bound kernels {r['l40s_memory_bound_ms']:.0f} ms a micro-batch")
    print("| L40S GEMMs at this share of 362 TFLOP/s | predicted MFU |\n|---|---|")
    for e, m in r["l40s_mfu_by_gemm_share"].items():
        print(f"| {e} | {m:.1%} |")
    print(f"the {TARGET:.0%} target needs GEMMs at {r['gemm_share_for_target']:.0%} of peak")


if __name__ == "__main__":
    main()
