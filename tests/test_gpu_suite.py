"""benchmarks/gpu_suite.py: its --smoke run (every section, tiny sizes, CPU) must work
before a GPU ever runs it; a run killed or short of a package keeps what finished and
says what did not; and what it concludes from a GPU's numbers."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_suite  # noqa: E402

SUITE = [sys.executable, str(ROOT / "benchmarks" / "gpu_suite.py")]


def suite(*args, env=None, **kw):
    # from /, with the project off sys.path: the suite must find it from its own location
    return subprocess.run([*SUITE, *args], capture_output=True, text=True, timeout=600,
                          cwd="/", env=env, **kw)


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    out = tmp_path_factory.mktemp("suite")
    proc = suite("--smoke", "--out", str(out))
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (path,) = out.glob("cpu-*.json")
    return out, json.loads(path.read_text())


# The smoke run (~3.5 CPU-minutes) checks the device recipe: with --device-recipe.
@pytest.mark.slow
@pytest.mark.device_recipe
def test_smoke_runs_every_section_without_error(smoke):
    out, r = smoke
    assert r["device"] == "cpu" and r["smoke"] is True and r["torch"] and r["triton"]
    for name in gpu_suite.SECTIONS:
        assert name in r and "error" not in r[name], (name, r[name])
        assert r["seconds"][name] > 0  # each ran in its own process, timed
    assert (out / f"cpu-{r['date']}.md").read_text().startswith("### GPU suite: cpu")


@pytest.mark.slow
@pytest.mark.device_recipe
def test_smoke_measures_what_the_gpu_run_reports(smoke):
    out, r = smoke
    fl = r["flagship"]
    assert fl["job"] == "l40s-small-32k.yaml"  # the job itself, not a copy of its settings
    assert fl["config"]["grad_checkpointing"] is False and fl["config"]["scan_backend"] == "auto"
    assert fl["train"]["optimizer"] == "adamw"  # smoke: no 8-bit AdamW off CUDA (the job check)
    job = fl["as_configured"]  # the job's own batch and accumulation (the MFU target's)
    assert (job["batch"], job["grad_accum"]) == (4, 1) and job["tokens_per_s"] > 0
    assert fl["batch_1"]["batch"] == 1 and fl["batch_1"]["tokens_per_s"] > 0  # memory target
    assert fl["largest"]["batch"] == 2 and fl["largest"]["grad_accum"] == 1
    tvt = dict(r["ten_vs_transformer"])
    base = tvt.pop("baseline")  # the fair baseline (issue 43): what it was
    assert set(tvt) == {"32", "64"} and all(row["ratio"] > 0 for row in tvt.values())
    assert base["mlp_hidden"] % 64 == 0 and base["repeats"] == 3  # (matched within 1% at
    assert base["params"] > 0 and base["ten_params"] > 0  # GPU sizes: tests/ten/test_presets)
    assert set(base["attention_backend"]) == {"32", "64"}
    assert all(base["attention_backend"][T] in gpu_suite.ATTENTION_BACKENDS for T in tvt)
    for row in tvt.values():  # the median of three windows, their spread kept
        assert len(row["transformer"]["tokens_per_s_runs"]) == 3
        assert row["transformer"]["spread"] >= 0 and len(row["ten"]["tokens_per_s_runs"]) == 3
    assert set(r["chunk"]["fixed"]) == {"16", "32"} and r["chunk"]["selective"]["16"]["ms"] > 0
    tiles = r["conv"]["backward_tiles"]  # issue 48: the conv backward at each candidate tile
    from ten.kernels.block_kernels import CONV_BACKWARD_CANDIDATES
    assert [row["tiles"] for row in tiles["rows"]] == list(map(str, CONV_BACKWARD_CANDIDATES))
    assert all(row["dx_equal"] and row["gbps"] > 0 for row in tiles["rows"])
    wg = r["weight_grad"]  # issue 48: the loss's weight gradient, in the GEMM where offered
    assert wg["path"] == "product rounded, then an fp32 add"  # (never on a CPU)
    assert wg["as_the_loss_does"]["rel_error"] == wg["rounded_then_added"]["rel_error"] > 0
    assert wg["chunks"] >= 1 and wg["speedup"] > 0
    for mode in ("fixed", "selective"):
        scan = r["scan"][mode]
        assert scan["fused_speedup_at_T"] > 0  # interpreted on CPU: slow, but it ran
        assert max(scan["fused_max_error"].values()) < 1e-4  # fused agrees with ref
    assert r["compile"]["on"]["tokens_per_s"] > 0 and r["compile"]["compile_s"] > 0
    assert r["selective"]["fused"]["tokens_per_s"] > 0 and r["selective"]["fused"]["fits"] is None
    assert r["selective"]["fixed_fused"]["tokens_per_s"] > 0  # what selective costs
    assert r["memory"]["batch_1"]["estimate_gb"] > 0 and r["memory"]["as_configured"]["batch"] == 4
    rec = r["recompute"]["by_blocks"]  # 0 to n_layers blocks recomputed, each measured
    assert list(rec) == [str(n) for n in range(fl["config"]["n_layers"] + 1)]
    assert all(x["tokens_per_s"] > 0 and x["estimate_gb"] > 0 for x in rec.values())
    assert r["profile"]["share"]["gemm"] > 0
    assert sum(r["profile"]["share"].values()) == pytest.approx(1.0)
    opt = r["optimizer"]  # bitsandbytes' 8-bit AdamW step against ten.train.adamw8bit's, timed
    assert opt["tensors"] > 1 and opt["speedup"] > 0 and opt["torch_adamw"]["ms"] > 0
    assert opt["ten_adamw8bit_per_parameter"]["ms"] > 0
    assert opt["ten_adamw8bit"]["launches"] is False  # on CUDA only; here: the CPU's loop
    e2e = r["e2e"]  # the job run whole: a bucket here (boto3 and rclone are installed)
    assert e2e["store"].startswith("s3 (rclone serve s3 at http://127.0.0.1:")
    assert e2e["exit_codes"] == [75, -9, 0] and e2e["resumed_ok"]  # SIGTERM, kill -9, end
    assert e2e["losses_equal"] and e2e["losses_compared"] == e2e["steps"]
    assert e2e["tokens_per_s"] > 0 and e2e["step_tokens_per_s"] > 0 and e2e["goodput"] > 0
    assert e2e["first_step_s_cold"] > 0 and e2e["first_step_s_warm"] > 0
    assert e2e["checkpoint_commit_s"] > 0 and e2e["upload_s"] is not None
    assert any("scan backend: auto -> chunked" in line for line in e2e["gate"])
    assert e2e["heartbeat_state"] == "done" and e2e["eval"]["loss"] > 0
    assert (out / e2e["report"]["png"]).read_bytes()[:4] == b"\x89PNG"
    tests = r["gpu_tests"]  # collected without boto3 or moto; skipped on CPU
    assert tests["exit_code"] == 0 and tests["skipped"] > 0 and "failed" not in tests
    mat = r["matrix"]  # issue 47: the matrix state's step against the vector state's
    assert mat["matrix_over_vector"] > 0 and mat["matrix"]["tokens_per_s"] > 0
    assert mat["fused_speedup_at_T"] > 0  # interpreted on CPU: slow, but it ran
    assert max(mat["fused_max_error"].values()) < 1e-4  # fused agrees with ref
    plans = mat["blocks"]["plans"]  # the fused kernels' blocks, each plan timed
    assert plans["default"]["vs_default"] == 1 and len(plans) >= 4
    assert all(p["ms"] > 0 and p["vs_default"] > 0 for p in plans.values())
    fp8 = r["fp8"]  # issue 48: each linear layer in bf16 and float8, the step, the loss
    assert set(fp8["layers"]) == {"mlp up", "mlp down", "gate", "drive", "out"}
    assert all(row["fp8 tensor"]["ms"] > 0 and max(row["fp8 row"]["errors"]) < 0.15
               for row in fp8["layers"].values())
    assert fp8["bf16"]["tokens_per_s"] > 0 and "mfu" not in fp8  # no FP8 tensor cores here:
    assert fp8["tensor"]["refused"].startswith("TENConfig.fp8 runs float8 GEMMs")  # refused
    assert fp8["loss_steps"] == 3 and abs(fp8["loss_delta"]) < 0.01  # the emulation trains
    bw = r["bandwidth"]  # issue 48: our operators' traced bytes over their profiled time
    assert bw["rows"] and all(x["gbps"] > 0 and x["of_datasheet"] is None for x in bw["rows"])
    # the trace sees every operator the profiled step runs, as often
    assert bw["untraced"] == [] and bw["unprofiled"] == []
    assert all(x["calls"] == x["traced_calls"] for x in bw["rows"])
    assert {"ten::swiglu_backward", "ten::causal_conv_backward",
            "ten::add_layer_norm_backward"} <= {x["op"] for x in bw["rows"]}
    # and of the float8 step where the card runs one (the casts' rates): refused here
    assert bw["fp8"]["refused"].startswith("TENConfig.fp8 runs float8 GEMMs")
    assert set(r["targets"]) == {"flagship_mfu", "flagship_peak_mem_gb_batch_1",
                                 "ten_over_transformer_32768", "ten_over_transformer_2048",
                                 "fused_over_chunked_scan", "matrix_over_vector_tokens_per_s",
                                 "fp8_mfu", "fp8_abs_loss_delta",
                                 "slowest_kernel_of_bandwidth"}


@pytest.mark.slow
def test_a_killed_run_keeps_every_finished_section(tmp_path):
    out = tmp_path / "out"
    proc = subprocess.Popen([*SUITE, "--smoke", "--out", str(out), "--sections", "chunk",
                             "scan"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    deadline = time.monotonic() + 300
    path = None
    while time.monotonic() < deadline and proc.poll() is None:
        found = list(out.glob("cpu-*.json"))
        if found and "chunk" in json.loads(found[0].read_text()):
            path = found[0]
            break
        time.sleep(0.2)
    assert path is not None, proc.communicate()[0][-2000:]
    os.killpg(proc.pid, signal.SIGKILL)  # the device's 10-minute limit, say
    proc.wait()
    r = json.loads(path.read_text())
    assert r["chunk"]["fixed"] and "error" not in r["chunk"]
    assert "scan" not in r  # never half a section


@pytest.mark.slow  # the suite and its section: two processes
def test_a_missing_package_is_an_error_not_an_empty_success(tmp_path):
    shadow = tmp_path / "site" / "pydantic"  # the lent image has no pydantic
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError(\"No module named 'pydantic'\")\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site")}
    proc = suite("--smoke", "--out", str(tmp_path / "out"), "--sections", "chunk", env=env)
    assert proc.returncode == 1 and "sections failed: chunk" in proc.stderr
    (path,) = (tmp_path / "out").glob("cpu-*.json")
    assert "No module named 'pydantic'" in json.loads(path.read_text())["chunk"]["error"]


def test_a_section_past_its_time_is_stopped_and_recorded(tmp_path):
    r = gpu_suite.run_child("scan", True, tmp_path, "stem", {}, timeout_s=1)
    assert r["error"] == "timed out after 1 s"


def test_a_section_past_its_time_keeps_what_it_finished_before(tmp_path):
    """Part 5's recall runs take most of a call: those finished when the call's time
    ran out are kept beside the error (they were lost with the section)."""
    kept = tmp_path / "result.json"
    gpu_suite.write_json(kept, {"T64_pairs4": {"chance": 0.016, "transformer": {"steps": 9}}})
    r = gpu_suite.timed_out(kept, 540, "step 1 ...")
    assert r["error"] == "timed out after 540 s (what it finished before is kept)"
    assert r["T64_pairs4"]["transformer"] == {"steps": 9} and r["output"] == "step 1 ..."
    assert gpu_suite.timed_out(tmp_path / "none.json", 540, "")["error"] == \
        "timed out after 540 s"


@pytest.mark.slow
def test_fp8_keeps_its_steps_before_its_loss_runs(tmp_path):
    """The loss runs (200 steps each way on a GPU) come last: a call whose time runs out
    in them keeps the layers and the steps (before, the section kept nothing)."""
    import torch

    saves = []
    suite_ = gpu_suite.Suite(True, torch.device("cpu"), tmp_path, "stem",
                             keep=lambda partial: saves.append(json.loads(json.dumps(partial))))
    r = suite_.fp8()
    (kept,) = saves
    assert {"layers", "bf16", "tensor", "row"} <= set(kept) and "loss_fp8" not in kept
    assert kept["bf16"]["tokens_per_s"] > 0 and "loss_fp8" in r
    assert "loss_fp8_head" in r and r["head_in_float8"] is False  # no step timed here


def test_the_fp8_sections_figures_take_the_head_only_where_it_holds_the_loss():
    fp8 = {"speedup": 1.10, "mfu": 0.50, "loss_fp8": 3.03, "loss_delta": 0.003,
           "head": {"speedup": 1.25, "mfu": 0.57}, "loss_fp8_head": 3.05,
           "loss_delta_head": 0.009}
    r = gpu_suite.with_head_if_it_holds(fp8)
    assert r["head_in_float8"] and (r["speedup"], r["mfu"], r["loss_fp8"], r["loss_delta"]) \
        == (1.25, 0.57, 3.05, 0.009)
    lossy = gpu_suite.with_head_if_it_holds({**fp8, "loss_delta_head": -0.011})
    assert not lossy["head_in_float8"] and (lossy["speedup"], lossy["mfu"]) == (1.10, 0.50)
    slower = gpu_suite.with_head_if_it_holds({**fp8, "head": {"speedup": 1.05, "mfu": 0.48}})
    assert not slower["head_in_float8"] and slower["loss_delta"] == 0.003


def test_recall_keeps_each_run_as_it_finishes(tmp_path):
    """Run after run (the transformer at its budget first, then each TEN), every one
    kept as it ends, with its steps and each seed's accuracy."""
    import torch

    saves = []
    suite_ = gpu_suite.Suite(True, torch.device("cpu"), tmp_path, "stem",
                             keep=lambda partial: saves.append(json.loads(json.dumps(partial))))
    r = suite_.recall()
    assert [list(s["T32_pairs4"]) for s in saves] == [["chance", "transformer"],
                                                       ["chance", "transformer", "ten_matrix"]]
    assert saves[-1] == json.loads(json.dumps(r))
    for row in (r["T32_pairs4"]["transformer"], r["T32_pairs4"]["ten_matrix"]):
        assert (row["steps"], row["batch"]) == (2, 4) and len(row["by_seed"]) == 1
        assert row["ms_per_step"] > 0
    table = gpu_suite.markdown({**gpu_suite.environment(torch.device("cpu")), "smoke": True,
                                "recall": gpu_suite.timed_out(tmp_path / "none", 1, "")
                                | r})
    assert "| T32_pairs4 |" in table and "(2 steps of 4, " in table


def test_no_section_starts_without_the_time_to_run(tmp_path):
    proc = suite("--smoke", "--out", str(tmp_path), "--part", "3", "--budget-s", "10")
    assert proc.returncode == 1
    (path,) = tmp_path.glob("cpu-*-part3.json")
    r = json.loads(path.read_text())
    for name in gpu_suite.PARTS[3]:
        assert r[name]["error"].startswith("not started: 10 s left"), r[name]


def test_parts_cover_every_section_once():
    names = [n for part in gpu_suite.PARTS.values() for n in part]
    assert sorted(names) == sorted(gpu_suite.SECTIONS)
    # memory reads the flagship's numbers: same call, after it
    part = next(p for p in gpu_suite.PARTS.values() if "memory" in p)
    assert part.index("flagship") < part.index("memory")


def test_a_call_without_a_part_runs_the_open_issues_sections_first():
    """A lent GPU gives a session ~15 minutes, one full call: before, that call ran parts
    1-4 in SECTIONS' order and never reached the matrix state or float8 (parts 6 and 7),
    the open issues' figures. The job run whole stays first: it has not run on a GPU."""
    one = gpu_suite.ONE_CALL
    assert one[:5] == ("e2e", "flagship", "memory", "matrix", "fp8")
    assert sorted(one) == sorted(set(gpu_suite.SECTIONS) - {"recall"})  # each once
    assert one.index("gpu_tests") < one.index("ten_vs_transformer")


def test_merge_joins_the_parts_of_one_run(tmp_path):
    env = {"device": "NVIDIA H100 80GB HBM3", "smoke": False, "date": "2026-11-25",
           "torch": "2.11.0", "triton": "3.6.0", "commit": "abc1234"}
    one = {**env, "flagship": {"as_configured": {"mfu": 0.41}}, "memory": {"error": "x"}}
    two = {**env, "scan": {"fixed": {"fused_speedup_at_T": 6.0}}, "memory": {}}
    paths = []
    for i, part in enumerate((one, two), 1):
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_text(json.dumps(part))
    r = gpu_suite.merge(paths, tmp_path / "merged")
    assert r["targets"]["flagship_mfu"]["met"] is True
    assert r["targets"]["fused_over_chunked_scan"]["met"] is True
    assert r["memory"] == {}  # the later part's run of a section wins
    assert json.loads((tmp_path / "merged" / "nvidia-h100-80gb-hbm3-2026-11-25.json")
                      .read_text())["parts"] == ["part1.json", "part2.json"]
    assert r["part_commits"] == ["abc1234", "abc1234"]
    paths[1].write_text(json.dumps({**two, "device": "NVIDIA L40S"}))
    with pytest.raises(SystemExit, match="not one run"):
        gpu_suite.merge(paths, tmp_path / "merged")


def test_on_the_lent_machine_the_commit_is_the_bundles_stamp(tmp_path, monkeypatch):
    """device_run.sh sets TEN_DEVSITE; a git found there named the session's starting
    commit for a later tree (the first H200 run). Elsewhere git's HEAD."""
    (tmp_path / "COMMIT").write_text("1234abc+dirty\n")
    monkeypatch.setenv("TEN_DEVSITE", str(tmp_path))
    assert gpu_suite.source_commit() == "1234abc+dirty"
    monkeypatch.delenv("TEN_DEVSITE")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, cwd=ROOT).stdout.strip()
    assert gpu_suite.source_commit() == head


@pytest.mark.parametrize("code, stdout, error", [
    (0, "3 passed, 2 skipped in 1.0s", None),
    (0, "8 skipped, 71 deselected in 2.0s", None),
    (1, "1 failed, 2 passed in 1.0s", "pytest exited 1"),
    (2, "1 error in 0.5s", "pytest exited 2"),  # a module that cannot be collected
    (5, "no tests ran in 0.1s", "pytest exited 5"),
    (0, "", "pytest exited 0"),  # nothing counted is no success
])
def test_pytest_outcome(code, stdout, error):
    assert gpu_suite.pytest_outcome(code, stdout).get("error", "").split(" (")[0] == \
        (error or "")


def test_targets_from_a_gpu_run():
    # the MFU target is the job as configured, not the largest batch that fits; the memory
    # target is batch 1
    run = {"device": "NVIDIA L40S",
           "flagship": {"as_configured": {"peak_mem_gb": 33.6, "mfu": 0.36},
                        "batch_1": {"peak_mem_gb": 9.5, "mfu": 0.30}, "largest": {"mfu": 0.5}},
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


def test_float8s_targets_are_its_mfu_and_its_loss_either_side_of_bf16s():
    run = {"fp8": {"mfu": 0.56, "loss_delta": -0.012}}
    t = gpu_suite.check_targets(run)
    assert t["fp8_mfu"] == {"target": ">= 0.55", "measured": 0.56, "met": True}
    assert t["fp8_abs_loss_delta"] == {"target": "<= 0.01", "measured": 0.012, "met": False}
    run["fp8"]["loss_delta"] = 0.004  # lower or higher: within 1% either way
    assert gpu_suite.check_targets(run)["fp8_abs_loss_delta"]["met"] is True
    assert gpu_suite.check_targets({})["fp8_mfu"]["met"] is None


def test_the_kernel_table_compares_per_call_slowest_first():
    # the trace counted 8 calls, the profile 16 (a step that recomputes): rates per call
    traced = {"ten::conv_backward": (8, 8e9), "ten::swiglu": (8, 16e9), "ten::only_traced": (1, 1)}
    profiled = {"ten::conv_backward": (16, 0.010), "ten::swiglu": (8, 0.004),
                "ten::only_profiled": (1, 0.1)}
    rows = gpu_suite.kernel_table(traced, profiled, copy_bps=3e12, datasheet_bps=4e12)
    assert [r["op"] for r in rows] == ["ten::conv_backward", "ten::swiglu"]  # 10 ms, 4 ms
    conv, swiglu = rows
    assert conv["gbps"] == pytest.approx(1600.0)  # 1 GB a call in 0.625 ms
    assert conv["of_copy"] == pytest.approx(1.6e12 / 3e12)
    assert conv["of_datasheet"] == pytest.approx(0.4)
    assert swiglu["gbps"] == pytest.approx(4000.0) and swiglu["of_datasheet"] == pytest.approx(1.0)
    unlisted = gpu_suite.kernel_table(traced, profiled, copy_bps=3e12, datasheet_bps=None)
    assert all(r["of_datasheet"] is None for r in unlisted)


def test_the_bandwidth_target_is_the_slowest_kernel_of_ours():
    rows = [{"op": "ten::a", "of_datasheet": 0.72}, {"op": "ten::b", "of_datasheet": 0.41}]
    t = gpu_suite.check_targets({"bandwidth": {"rows": rows}})["slowest_kernel_of_bandwidth"]
    assert t == {"target": ">= 0.6", "measured": 0.41, "met": False}
    rows[1]["of_datasheet"] = 0.65
    assert gpu_suite.check_targets({"bandwidth": {"rows": rows}})[
        "slowest_kernel_of_bandwidth"]["met"] is True
    unlisted = {"rows": [{"op": "ten::a", "of_datasheet": None}]}  # a card not in ten.cards
    assert gpu_suite.check_targets({"bandwidth": unlisted})[
        "slowest_kernel_of_bandwidth"]["met"] is None


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


def test_device_timeline_merges_overlaps_and_counts_the_gaps():
    # kernels at 0-10 and 5-20 overlap (busy 20), then a 30 µs gap, 50-60, a 10 µs gap, 70-100
    t = gpu_suite.device_timeline([(50, 60), (0, 10), (5, 20), (70, 100)], syncs=2)
    assert t["span_ms"] == pytest.approx(0.1) and t["busy_ms"] == pytest.approx(0.06)
    assert t["idle_ms"] == pytest.approx(0.04) and t["idle_share"] == pytest.approx(0.4)
    assert t["gaps_over_20us"] == 1 and t["longest_gaps_ms"] == [pytest.approx(0.03)]
    assert t["kernels"] == 4 and t["syncs"] == 2
    assert gpu_suite.device_timeline([], syncs=0) == {"kernels": 0, "syncs": 0}


def test_device_kernels_leave_out_user_annotations():
    """The optimizer's record_function range lies on the device's timeline over its
    kernels; counted as one, it added its 10.4 ms span to the H200 profile at bc09682."""
    from torch.autograd import DeviceType
    from torch.autograd.profiler_util import FunctionEvent

    def event(name, start, end, device=DeviceType.CUDA, annotation=False):
        return FunctionEvent(id=start, name=name, thread=0, start_us=start, end_us=end,
                             device_type=device, is_user_annotation=annotation)

    events = [event("Optimizer.step#AdamW8bit.step", 0, 100, annotation=True),
              event("kOptimizerStatic8bit2StateBlockwise", 10, 30),
              event("kOptimizerStatic8bit2StateBlockwise", 60, 80),
              event("aten::add_", 0, 5, device=DeviceType.CPU)]
    assert [e.time_range.start for e in gpu_suite.device_kernels(events)] == [10, 60]
    timeline = gpu_suite.profiled_timeline(events)
    assert timeline["kernels"] == 2 and timeline["busy_ms"] == pytest.approx(0.04)


def test_sync_calls_are_the_waiting_ones():
    waits = ["cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
             "cudaMemcpy"]
    queued = ["cudaMemcpyAsync", "cudaLaunchKernel", "cudaStreamWaitEvent", "aten::copy_"]
    assert [bool(gpu_suite.SYNC_CALL.search(n)) for n in waits + queued] == [True] * 4 + [False] * 4


def test_the_suites_step_applies_the_runs_torch_flags_as_the_trainer_does(monkeypatch,
                                                                        tf32_off):
    """TF32 for fp32 matmuls on a GPU: the H100 profile at 600a887 ran the job's one fp32
    GEMM (the coupling's gradient) on FFMA because the suite's step, unlike the trainer,
    never turned it on. Forced here on a CPU through the execution both take."""
    import dataclasses

    import torch

    import ten.train.execution
    from runner.job.library import train_config

    real = ten.train.execution.resolve_execution
    monkeypatch.setattr(ten.train.execution, "resolve_execution",
                        lambda *a: dataclasses.replace(real(*a), tf32=True))
    job = gpu_suite.flagship_job(smoke=True)
    gpu_suite.Step(gpu_suite.flagship_model(job), train_config(job), torch.device("cpu"),
                   batch=1)
    assert torch.backends.cuda.matmul.allow_tf32


def test_the_gpu_tests_collect_where_pytest_xdist_is_not_installed():
    """The lent machines have no pytest-xdist: the gpu_tests section's pytest must still
    take the suite's conftest (a hook of xdist's it declares, not optional, stopped every
    collection there with "unknown hook")."""
    files = [str(f.relative_to(ROOT)) for f in gpu_suite.gpu_test_files()][:2]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p",
                           "no:cacheprovider", "--collect-only", "-q", *files],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-800:]
