"""The flagship job's L40S prediction (benchmarks/predict_l40s.py) from the committed H100
results, and the job file saying it as predicted."""

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import predict_l40s  # noqa: E402


def test_the_prediction_falls_with_the_l40s_gemm_share_and_names_its_inputs():
    r = predict_l40s.predict()
    by_share = [m for _, m in sorted(r["l40s_mfu_by_gemm_share"].items())]
    assert by_share == sorted(by_share) and 0 < by_share[0] < by_share[-1] < 1
    assert 0.5 < r["h100"]["gemm_share_of_peak"] < 1  # the H100 profile it starts from
    assert 0 < r["gemm_share_for_target"] < 1
    assert r["from"]["profile"].startswith("nvidia-h100")


def test_the_job_file_states_the_prediction_the_script_makes():
    """The header's L40S figures are the script's, marked predicted (not measured)."""
    r = predict_l40s.predict()
    header = "".join(line for line in (ROOT / "jobs" / "l40s-small-32k.yaml").read_text()
                     .splitlines(keepends=True) if line.startswith("#"))
    assert re.search(r"Predicted, not measured, on the L40S", header)
    at_h100 = r["l40s_mfu_by_gemm_share"][f"{round(r['h100']['gemm_share_of_peak'], 2):.2f}"]
    assert f"{at_h100:.0%} MFU if its GEMMs reach" in header
    assert f"({r['h100']['gemm_share_of_peak']:.0%})" in header
    assert f"target needs {r['gemm_share_for_target']:.0%}" in header.replace("\n# ", " ")
