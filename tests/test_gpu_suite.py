"""benchmarks/gpu_suite.py: its --smoke run (every section, tiny sizes, CPU) must work
before a GPU ever runs it; and what it concludes from a GPU's numbers."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_suite  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py"),
                           "--smoke", "--out", str(out)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = out.glob("cpu-*.json")
    return out, json.loads(path.read_text())


@pytest.mark.slow  # the smoke run: ~40 s
def test_smoke_runs_every_section_without_error(smoke):
    out, r = smoke
    assert r["device"] == "cpu" and r["smoke"] is True and r["torch"] and r["triton"]
    for name in gpu_suite.SECTIONS:
        assert name in r and "error" not in r[name], (name, r[name])
    assert (out / f"cpu-{r['date']}.md").read_text().startswith("### GPU suite: cpu")


@pytest.mark.slow
def test_smoke_measures_what_the_gpu_run_reports(smoke):
    out, r = smoke
    fl = r["flagship"]
    assert fl["batch_1"]["batch"] == 1 and fl["batch_1"]["tokens_per_s"] > 0
    assert fl["largest"]["batch"] == 2 and fl["config"]["grad_checkpointing"] is True
    assert set(r["ten_vs_transformer"]) == {"32", "64"}
    assert all(row["ratio"] > 0 for row in r["ten_vs_transformer"].values())
    assert set(r["chunk"]["fixed"]) == {"16", "32"} and r["chunk"]["selective"]["16"]["ms"] > 0
    for mode in ("fixed", "selective"):
        scan = r["scan"][mode]
        assert scan["fused_speedup_at_T"] > 0  # interpreted on CPU: slow, but it ran
        assert max(scan["fused_max_error"].values()) < 1e-4  # fused agrees with ref
    assert r["compile"]["on"]["tokens_per_s"] > 0 and r["compile"]["compile_s"] > 0
    assert r["selective"]["fused"]["tokens_per_s"] > 0 and r["selective"]["fused"]["fits"] is None
    assert r["selective"]["fixed_fused"]["tokens_per_s"] > 0  # what selective costs
    assert r["memory"]["batch_1"]["estimate_gb"] > 0
    assert r["profile"]["share"]["gemm"] > 0
    assert sum(r["profile"]["share"].values()) == pytest.approx(1.0)
    mon = r["monitor"]
    assert mon["exit_code"] == 0 and any("health gate" in line for line in mon["gate"])
    assert (out / mon["report_png"]).read_bytes()[:4] == b"\x89PNG"
    assert set(r["targets"]) == {"flagship_mfu", "flagship_peak_mem_gb_batch_1",
                                 "ten_over_transformer_32768", "ten_over_transformer_2048",
                                 "fused_over_chunked_scan"}


def test_targets_from_a_gpu_run():
    run = {"device": "NVIDIA L40S",
           "flagship": {"batch_1": {"peak_mem_gb": 9.5}, "largest": {"mfu": 0.36}},
           "ten_vs_transformer": {"2048": {"ratio": 0.8}, "32768": {"ratio": 3.1}},
           "scan": {"fixed": {"fused_speedup_at_T": 6.0}}}
    t = gpu_suite.check_targets(run)
    assert t["flagship_mfu"] == {"target": ">= 0.35", "measured": 0.36, "met": True}  # L40S
    assert t["flagship_peak_mem_gb_batch_1"]["met"] is True
    assert t["ten_over_transformer_2048"]["met"] is False
    assert t["ten_over_transformer_32768"]["met"] is True
    run["device"] = "NVIDIA H100 80GB HBM3"
    assert gpu_suite.check_targets(run)["flagship_mfu"]["met"] is False  # 40% there
    assert gpu_suite.check_targets({})["flagship_mfu"]["met"] is None  # not measured


@pytest.mark.parametrize("name, kind", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("ampere_bf16_s16816gemm_bf16_128x64_ldg8_f2f_tn", "gemm"),
    ("_scan_forward_kernel", "scan"),
    ("_liger_cross_entropy_kernel", "loss"),
    ("aten::bmm", "gemm"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::mul>", "elementwise"),
])
def test_kernel_kinds(name, kind):
    assert gpu_suite.kernel_kind(name) == kind
