"""The whole GPU check in one command: speed, memory, kernels and monitoring of the flagship.

Whenever a GPU is at hand, run this first, commit its JSON under benchmarks/results/ and
update BENCHMARKS.md from its table:

    python benchmarks/gpu_suite.py --out benchmarks/results          # one GPU, < 9 minutes
    python benchmarks/gpu_suite.py --smoke --out /tmp/suite          # CPU, tiny sizes

It writes ``<out>/<device>-<date>.json``, ``<out>/<device>-<date>.md`` (the table) and
``<out>/<device>-<date>-report.png`` (``ten-runner report`` of the monitored run). Every
section runs the project's own code: the trainer's ``train_step`` on the flagship
(small_32k, T = 32768, vocab 32000, gradient checkpointing, 8-bit AdamW, bf16), the
transformer matched to it, the scan backends, ``ten.memory``'s estimate, and a real
``ten-runner run`` with the health gate, the NVML sampler and the heartbeat on. ``--smoke``
runs the same sections at tiny sizes on CPU (the fused scan under Triton's interpreter),
so CI proves the suite works before a GPU ever sees it; its numbers mean nothing.

A section that fails records ``{"error": ...}`` and the others still run; the exit code is
1 when any did. Targets are reported (``targets``), not enforced.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import gc
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GB = 1e9  # peak memory in decimal GB, as the targets are written


@dataclass(frozen=True)
class Sizes:
    """What each section runs at: the real flagship, or the smoke stand-in."""

    preset: str = "small_32k"
    model: dict[str, Any] = field(default_factory=dict)  # overrides of the preset
    vocab: int = 32000
    seq_len: int = 32768
    batches: tuple[int, ...] = (1, 2, 4, 8, 16)  # flagship: tried until one does not fit
    lengths: tuple[int, ...] = (2048, 8192, 32768)  # TEN vs transformer
    tokens_per_step: int = 32768  # TEN vs transformer: B = this // T
    chunks: tuple[int, ...] = (32, 64, 128, 256)
    ref_T: int = 2048  # the Python-loop oracle is timed (and checked against) here only
    selective_chunk: int = 32
    warmup: int = 2
    steps: int = 5
    monitor: dict[str, Any] = field(default_factory=lambda: {
        "dataset": "builtin:botocore-docs", "vocab": 8000, "steps": 60, "sample_s": 1.0})
    gpu_tests: bool = True


FULL = Sizes()
SMOKE = Sizes(model={"d_model": 64, "n_layers": 2, "n_eigenstates": 16, "n_heads": 2},
              vocab=512, seq_len=64, batches=(1, 2), lengths=(32, 64),
              tokens_per_step=128, chunks=(16, 32), ref_T=32, selective_chunk=16,
              warmup=1, steps=1,
              monitor={"dataset": "generated", "vocab": 300, "steps": 3, "sample_s": 1.0},
              gpu_tests=False)


# --- one training step of the real trainer --------------------------------------------------

class Step:
    """``ten.step.train_step`` of a freshly built model on random tokens, as training
    runs it: the job's precision, optimizer, loss backend and (optionally) compile."""

    def __init__(self, cfg: Any, batch: int, device: Any, optimizer: str = "adamw8bit",
                 compile: bool = False) -> None:
        import torch

        from ten.config import TrainConfig
        from ten.loss import NextTokenLoss, resolve_loss_backend
        from ten.presets import build_model
        from ten.trainer import build_optimizer, resolve_precision

        torch.manual_seed(0)
        self.device, self.batch, self.cfg = device, batch, cfg
        self.amp = resolve_precision("auto", device)
        self.model = build_model(cfg).to(device)
        if compile:
            self.model.compile_blocks()
        self.optimizer = build_optimizer(self.model, TrainConfig(max_steps=1, optimizer=optimizer),
                                         device)
        self.scaler = torch.amp.GradScaler(device.type, enabled=False)
        self.loss_backend = resolve_loss_backend("auto", device)[0]
        self.objective = NextTokenLoss(self.model, self.loss_backend)
        self.ids = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len + 1), device=device)

    def once(self) -> None:
        from ten.step import train_step

        train_step(self.objective, self.optimizer, self.scaler, [self.ids], self.amp, 1.0)

    def measure(self, warmup: int, steps: int) -> dict[str, Any]:
        import torch

        from ten.mfu import hfu, mfu, peak_flops

        cuda = self.device.type == "cuda"
        t0 = time.perf_counter()
        for _ in range(warmup):
            self.once()
        _sync(self.device)
        first_s = time.perf_counter() - t0
        if cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            self.once()
            _sync(self.device)
            times.append(time.perf_counter() - t0)
        sec = statistics.median(times)
        tok_s = self.batch * self.cfg.seq_len / sec
        fpt = self.model.flops_per_token(self.cfg.seq_len)
        recompute = self.model.recompute_flops_per_token(self.cfg.seq_len)
        peak = peak_flops(self.device)
        return {"batch": self.batch, "seq_len": self.cfg.seq_len, "sec_per_step": sec,
                "tokens_per_s": tok_s, "mfu": mfu(fpt, tok_s, peak),
                "hfu": hfu(fpt, recompute, tok_s, peak),
                "peak_mem_gb": torch.cuda.max_memory_allocated(self.device) / GB if cuda
                else None, "warmup_s": first_s, "loss": self.loss_backend}


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _free() -> None:
    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _oom(e: BaseException) -> bool:
    import torch

    return isinstance(e, torch.cuda.OutOfMemoryError) or "out of memory" in str(e).lower()


def measure_step(cfg: Any, batch: int, device: Any, sizes: Sizes, **kw: Any) -> dict[str, Any]:
    """A Step measured and freed; {"batch", "oom": True} when it does not fit."""
    step = None
    try:
        step = Step(cfg, batch, device, **kw)
        return step.measure(sizes.warmup, sizes.steps)
    except RuntimeError as e:
        if not _oom(e):
            raise
        return {"batch": batch, "seq_len": cfg.seq_len, "oom": True}
    finally:
        del step
        _free()


# --- the sections ---------------------------------------------------------------------------

class Suite:
    def __init__(self, sizes: Sizes, device: Any, out: Path, stem: str) -> None:
        self.sizes, self.device, self.out, self.stem = sizes, device, out, stem

    def flagship_config(self, **kw: Any) -> Any:
        from ten.presets import ten_config

        s = self.sizes
        return ten_config(s.preset, **{"vocab_size": s.vocab, "seq_len": s.seq_len,
                                       "grad_checkpointing": True, "scan_backend": "auto",
                                       **s.model, **kw})

    def flagship(self) -> dict[str, Any]:
        """Batch 1, then doubling until a batch does not fit: the largest that does."""
        cfg, tried = self.flagship_config(), []
        for batch in self.sizes.batches:
            tried.append(measure_step(cfg, batch, self.device, self.sizes))
            if tried[-1].get("oom"):
                break
        fits = [r for r in tried if not r.get("oom")]
        return {"config": _model_fields(cfg), "optimizer": "adamw8bit", "batch_1": tried[0],
                "largest": fits[-1] if fits else None, "tried": tried}

    def memory(self, flagship: dict[str, Any]) -> dict[str, Any]:
        """ten.memory's estimate against the measured peak, where one was measured."""
        from ten.memory import estimate_training_memory
        from ten.trainer import resolve_precision

        amp = resolve_precision("auto", self.device)
        rows = {}
        for key in ("batch_1", "largest"):
            run = flagship.get(key)
            if not run:
                continue
            est = estimate_training_memory(self.flagship_config(), run["batch"],
                                           self.sizes.seq_len, amp, "adamw8bit")
            measured = run.get("peak_mem_gb")
            rows[key] = {"batch": run["batch"], "estimate_gb": est.total / GB,
                         "measured_gb": measured,
                         "estimate_over_measured": est.total / GB / measured if measured
                         else None}
        return rows

    def ten_vs_transformer(self) -> dict[str, Any]:
        """tokens/s of TEN ÷ the parameter-matched SDPA transformer, equal tokens per step."""
        from ten.presets import transformer_config

        s, rows = self.sizes, {}
        for T in s.lengths:
            batch = max(1, s.tokens_per_step // T)
            ten = measure_step(self.flagship_config(seq_len=T), batch, self.device, s)
            shared = {k: v for k, v in s.model.items() if k in ("d_model", "n_layers")}
            tf_cfg = transformer_config(s.preset, vocab_size=s.vocab, seq_len=T,
                                        grad_checkpointing=True, **shared)
            tf = measure_step(tf_cfg, batch, self.device, s)
            ratio = (ten["tokens_per_s"] / tf["tokens_per_s"]
                     if "tokens_per_s" in ten and "tokens_per_s" in tf else None)
            rows[str(T)] = {"batch": batch, "ten": ten, "transformer": tf, "ratio": ratio}
        return rows

    def _scan_inputs(self, T: int, selective: bool) -> list[Any]:
        from bench_scan import make_inputs

        K = self.flagship_config().n_eigenstates
        return make_inputs(1, T, K, selective, self.device)

    def _time_scan(self, backend: str, T: int, selective: bool, chunk: int = 64,
                   repeat: int | None = None) -> dict[str, Any]:
        from bench_scan import time_backend

        from ten.scan import scan

        def fn(b, lam, st):
            return scan(b, lam, st, backend=backend, chunk_size=chunk)

        try:
            r = time_backend(fn, self._scan_inputs(T, selective), "bf16", self.device,
                             repeat or self.sizes.steps)
        except RuntimeError as e:
            if not _oom(e):
                raise
            return {"T": T, "oom": True}
        finally:
            _free()
        return {"T": T, "ms": 1e3 * r["sec"],
                "peak_mem_gb": None if math.isnan(r["peak_mb"]) else r["peak_mb"] * 2**20 / GB}

    def chunk(self) -> dict[str, Any]:
        """The chunked scan's forward + backward at the flagship's T and K per chunk size."""
        return {mode: {str(q): self._time_scan("chunked", self.sizes.seq_len, mode == "selective",
                                               chunk=q) for q in self.sizes.chunks}
                for mode in ("fixed", "selective")}

    def scan(self) -> dict[str, Any]:
        """ref / chunked / fused forward + backward, and fused's error against ref."""
        s, rows = self.sizes, {}
        for mode in ("fixed", "selective"):
            sel = mode == "selective"
            row = {"ref": self._time_scan("ref", s.ref_T, sel, repeat=1)}
            for backend in ("chunked", "fused"):
                row[backend] = {str(T): self._time_scan(backend, T, sel)
                                for T in (s.ref_T, s.seq_len)}
            long = str(s.seq_len)
            if "ms" in row["chunked"][long] and "ms" in row["fused"][long]:
                row["fused_speedup_at_T"] = row["chunked"][long]["ms"] / row["fused"][long]["ms"]
            row["fused_max_error"] = self._fused_error(sel)
            rows[mode] = row
        return rows

    def _fused_error(self, selective: bool) -> dict[str, float]:
        """Largest |fused - ref| over outputs and gradients at ref_T, fp32 (relative to the
        largest |ref| value of each)."""
        from ten.scan import scan

        out, results = {}, []
        for backend in ("ref", "fused"):
            inputs = [t.detach().clone().requires_grad_() for t in
                      self._scan_inputs(self.sizes.ref_T, selective)]
            c, last = scan(*inputs, backend=backend)
            (c.square().sum() + last.sum()).backward()
            results.append([c.detach(), *(t.grad for t in inputs)])
        for name, ref, got in zip(("c", "d_beta", "d_log_lam", "d_state"), *results,
                                  strict=True):
            out[name] = float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
        _free()
        return out

    def compile(self) -> dict[str, Any]:
        """The flagship at batch 1 with train.compile off and on (every block compiled)."""
        cfg = self.flagship_config()
        off = measure_step(cfg, 1, self.device, self.sizes)
        on = measure_step(cfg, 1, self.device, self.sizes, compile=True)
        ratio = (on["tokens_per_s"] / off["tokens_per_s"]
                 if "tokens_per_s" in on and "tokens_per_s" in off else None)
        return {"off": off, "on": on, "speedup": ratio,
                "compile_s": on.get("warmup_s")}

    def selective(self) -> dict[str, Any]:
        """The presets' selective mode (with its convolution) at the flagship's T, on the
        fused scan and the chunked one at a small chunk, against the fixed mode on the fused
        scan (what selective costs); each with ten.memory's estimate, whether that fits the
        device (None on CPU: nothing to fit), and a measured step where it does."""
        from ten.memory import device_capacity, estimate_training_memory, fit_problem
        from ten.trainer import resolve_precision

        capacity = device_capacity(self.device)
        rows = {}
        for name, kw in (("fused", {"scan_backend": "fused"}),
                         ("chunked", {"scan_backend": "chunked",
                                      "chunk_size": self.sizes.selective_chunk}),
                         ("fixed_fused", {"scan_backend": "fused", "selective": False,
                                          "conv_width": 0})):
            cfg = self.flagship_config(**{"selective": True, "conv_width": 4, **kw})
            est = estimate_training_memory(cfg, 1, cfg.seq_len,
                                           resolve_precision("auto", self.device), "adamw8bit")
            problem = capacity and fit_problem(est, capacity[1], capacity[0], cfg)
            row = {"chunk_size": cfg.chunk_size, "estimate_gb": est.total / GB,
                   "fits": None if capacity is None else not problem, "refusal": problem or None}
            if not problem:
                row.update(measure_step(cfg, 1, self.device, self.sizes))
            rows[name] = row
        return rows

    def profile(self) -> dict[str, Any]:
        """One flagship step under torch.profiler, device time split by kernel kind."""
        from torch.profiler import ProfilerActivity, profile

        step = Step(self.flagship_config(), 1, self.device)
        for _ in range(self.sizes.warmup):
            step.once()
        _sync(self.device)
        cuda = self.device.type == "cuda"
        acts = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
        with profile(activities=acts) as prof:
            step.once()
            _sync(self.device)
        del step
        _free()
        split: dict[str, float] = {}
        for event in prof.key_averages():
            us = event.self_device_time_total if cuda else event.self_cpu_time_total
            if us <= 0 or (not cuda and not event.key.startswith("aten::")):
                continue
            kind = kernel_kind(event.key)
            split[kind] = split.get(kind, 0.0) + us / 1e3
        total = sum(split.values()) or 1.0
        return {"ms": split, "share": {k: v / total for k, v in split.items()},
                "by": "CUDA kernels" if cuda else "CPU aten ops (the chunked scan's "
                "matmuls count as GEMM there)"}

    def monitor(self) -> dict[str, Any]:
        """A short real ``ten-runner run`` of the flagship with the health gate, the NVML
        sampler and the heartbeat on; then its gate verdict, GPU samples, diagnosis and
        ``ten-runner report``'s image."""
        from runner.monitor.diagnose import diagnose
        from ten.metrics import read_metrics

        m = self.sizes.monitor
        with tempfile.TemporaryDirectory(prefix="gpu-suite-") as tmp:
            tmp = Path(tmp)
            job = self._monitor_job(tmp, m)
            t0 = time.time()
            proc = subprocess.run([sys.executable, "-m", "runner.cli", "run", str(job),
                                   "--no-sample"], capture_output=True, text=True,
                                  cwd=ROOT, timeout=480)
            run_dir = tmp / "runs" / "gpu-suite-monitor"
            log = (run_dir / "run.log").read_text() if (run_dir / "run.log").exists() else ""
            samples = read_metrics(run_dir / "gpu.jsonl")  # any JSONL, torn lines skipped
            metrics = read_metrics(run_dir / "metrics.jsonl")
            report = subprocess.run([sys.executable, "-m", "runner.cli", "report",
                                     str(run_dir), "--out", str(tmp / "report")],
                                    capture_output=True, text=True, cwd=ROOT, timeout=120)
            png = next((tmp / "report").glob("*.png"), None)
            image = None
            if png is not None:
                image = self.out / f"{self.stem}-report.png"
                image.write_bytes(png.read_bytes())
        if proc.returncode != 0:
            raise RuntimeError(f"ten-runner run exited {proc.returncode}: "
                               f"{proc.stderr.strip()[-400:]}")
        gate = [line for line in log.splitlines()
                if re.search(r"health gate|bf16 matmul|no GPU|unhealthy", line)]
        return {"exit_code": proc.returncode, "seconds": time.time() - t0,
                "gate": gate, "samples": len(samples), "sampler": summarize_samples(samples),
                "diagnosis": [d.to_dict() for d in diagnose(metrics, samples, time.time())],
                "report_png": image.name if image else None,
                "report_error": report.stderr[-300:] if report.returncode else None}

    def _monitor_job(self, tmp: Path, m: dict[str, Any]) -> Path:
        dataset = m["dataset"]
        if dataset == "generated":  # smoke: a small local corpus, no tokenizer wait
            from bench_storage import make_corpus

            make_corpus(tmp / "corpus.jsonl", docs=300)
            dataset = str(tmp / "corpus.jsonl")
        overrides = ", ".join(f"{k}: {v}" for k, v in self.sizes.model.items())
        text = f"""\
name: gpu-suite-monitor
model: {{arch: ten, preset: {self.sizes.preset}, grad_checkpointing: true{
    ', ' + overrides if overrides else ''}}}
data:
  dataset: '{dataset}'
  mode: pretokenized
  seq_len: {self.sizes.seq_len}
  tokenizer: {{vocab_size: {m['vocab']}}}
  cache_dir: '{tmp / 'cache'}'
  num_workers: 0
train:
  max_steps: {m['steps']}
  batch_size: 1
  warmup_steps: 2
  optimizer: adamw8bit
  eval_every: {m['steps']}
  eval_batches: 2
  log_every: 1
  device: auto
checkpoint: {{every_steps: {m['steps']}, keep_last: 1}}
storage: {{url: '{tmp / 'runs'}'}}
monitor: {{gpu_sample_s: {m['sample_s']}, heartbeat_s: 2, health_gate: true}}
"""
        path = tmp / "monitor.yaml"
        path.write_text(text)
        return path

    def gpu_tests(self) -> dict[str, Any]:
        """The tests marked ``gpu`` (skipped without CUDA)."""
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "-p",
                               "no:cacheprovider", "tests"], capture_output=True, text=True,
                              cwd=ROOT, timeout=300)
        counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)",
                                                    proc.stdout)}
        return {"exit_code": proc.returncode, **counts,
                "tail": proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else []}


def kernel_kind(name: str) -> str:
    """GEMM / scan / loss / elementwise for a CUDA kernel or an aten op name."""
    n = name.lower()
    if re.search(r"_scan|scan_|chunk_state", n):
        return "scan"
    if re.search(r"cross_entropy|liger|log_softmax|nll_loss|_ce_", n):
        return "loss"
    if re.search(r"gemm|cutlass|xmma|wgmma|matmul|cublas|sm\d\d_|aten::(mm|addmm|bmm|baddbmm"
                 r"|linear|einsum)\b", n):
        return "gemm"
    return "elementwise"


def summarize_samples(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The NVML readings of a run, reduced: mean/max utilisation, memory, power, clocks,
    every throttle reason seen."""
    if not samples:
        return {}

    def values(key: str) -> list[float]:
        return [s[key] for s in samples if isinstance(s.get(key), (int, float))]

    out: dict[str, Any] = {"name": samples[-1].get("name")}
    for key in ("util", "mem_util", "power_w", "temp_c", "sm_clock_mhz"):
        v = values(key)
        if v:
            out[key] = {"mean": statistics.fmean(v), "max": max(v)}
    used = values("mem_used")
    if used:
        out["mem_used_gb_max"] = max(used) / GB
    out["power_limit_w"] = samples[-1].get("power_limit_w")
    out["sm_clock_max_mhz"] = samples[-1].get("sm_clock_max_mhz")
    out["throttle"] = sorted({r for s in samples for r in (s.get("throttle") or [])})
    return out


def check_targets(results: dict[str, Any]) -> dict[str, Any]:
    """The issue's targets against this run's numbers (None where not measured)."""
    device = results.get("device") or ""
    flagship = results.get("flagship") or {}
    b1 = flagship.get("batch_1") or {}
    best = flagship.get("largest") or {}
    tvt = results.get("ten_vs_transformer") or {}
    scan = (results.get("scan") or {}).get("fixed") or {}
    mfu_goal = 0.35 if "L40S" in device else 0.40
    rows = {
        "flagship_mfu": (mfu_goal, best.get("mfu"), ">="),
        "flagship_peak_mem_gb_batch_1": (12.0, b1.get("peak_mem_gb"), "<="),
        "ten_over_transformer_32768": (2.5, (tvt.get("32768") or {}).get("ratio"), ">="),
        "ten_over_transformer_2048": (0.9, (tvt.get("2048") or {}).get("ratio"), ">="),
        "fused_over_chunked_scan": (5.0, scan.get("fused_speedup_at_T"), ">="),
    }
    out = {}
    for name, (goal, got, op) in rows.items():
        met = None if got is None else (got >= goal if op == ">=" else got <= goal)
        out[name] = {"target": f"{op} {goal}", "measured": got, "met": met}
    return out


# --- helpers --------------------------------------------------------------------------------

def _model_fields(cfg: Any) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(cfg).items()
            if k in ("vocab_size", "d_model", "n_layers", "n_eigenstates", "seq_len",
                     "chunk_size", "scan_backend", "selective", "grad_checkpointing")}


def device_slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def environment(device: Any) -> dict[str, Any]:
    import torch

    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=ROOT).stdout.strip() or None
    return {"device": name, "torch": torch.__version__, "triton": triton_version,
            "cuda": torch.version.cuda, "commit": commit,
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")}


SECTIONS = ("flagship", "memory", "ten_vs_transformer", "chunk", "scan", "compile",
            "selective", "profile", "monitor", "gpu_tests")


def run_suite(sizes: Sizes, device: Any, out: Path, sections: tuple[str, ...] = SECTIONS,
              log: Any = print) -> dict[str, Any]:
    results = environment(device)
    results["smoke"] = sizes is SMOKE
    stem = f"{device_slug(results['device'])}-{results['date']}"
    out.mkdir(parents=True, exist_ok=True)
    suite = Suite(sizes, device, out, stem)
    for name in sections:
        if name == "gpu_tests" and not sizes.gpu_tests:
            results[name] = {"skipped": "smoke: the suite's own run of the tests is enough"}
            continue
        log(f"[gpu_suite] {name} ...")
        t0 = time.perf_counter()
        try:
            args = (results.get("flagship") or {},) if name == "memory" else ()
            results[name] = getattr(suite, name)(*args)
        except Exception as e:  # a section's failure is a result; the others still run
            results[name] = {"error": f"{type(e).__name__}: {e}"[:500],
                             "where": traceback.format_exc(limit=-3)[-800:]}
        log(f"[gpu_suite] {name}: {time.perf_counter() - t0:.1f} s")
    results["targets"] = check_targets(results)
    (out / f"{stem}.json").write_text(json.dumps(results, indent=1, default=str))
    (out / f"{stem}.md").write_text(markdown(results))
    results["_paths"] = [str(out / f"{stem}.json"), str(out / f"{stem}.md")]
    return results


def markdown(r: dict[str, Any]) -> str:
    """The table for BENCHMARKS.md."""
    def f(x: Any, spec: str = ".3g") -> str:
        if x is None or isinstance(x, bool):
            return {None: "—", True: "yes", False: "no"}[x]
        return format(x, spec) if isinstance(x, (int, float)) else str(x)

    smoke = ", SMOKE: the numbers mean nothing" if r.get("smoke") else ""
    lines = [f"### GPU suite: {r['device']} ({r['date']}, torch {r['torch']}, triton "
             f"{r['triton']}, commit {r['commit']}{smoke})",
             "", "| what | measured | target | met |", "|---|---|---|---|"]
    for name, t in (r.get("targets") or {}).items():
        lines.append(f"| {name} | {f(t['measured'])} | {t['target']} | {f(t['met'])} |")
    fl = r.get("flagship") or {}
    lines += ["", "| flagship | batch | tokens/s | MFU | HFU | peak GB |",
              "|---|---|---|---|---|---|"]
    for key in ("batch_1", "largest"):
        x = fl.get(key) or {}
        lines.append(f"| {key} | {f(x.get('batch'))} | {f(x.get('tokens_per_s'), '.0f')} | "
                     f"{f(x.get('mfu'))} | {f(x.get('hfu'))} | {f(x.get('peak_mem_gb'))} |")
    tvt = r.get("ten_vs_transformer") or {}
    if tvt and "error" not in tvt:
        lines += ["", "| T | batch | TEN tokens/s | transformer tokens/s | TEN ÷ transformer |",
                  "|---|---|---|---|---|"]
        for T, x in tvt.items():
            lines.append(f"| {T} | {x['batch']} | {f(x['ten'].get('tokens_per_s'), '.0f')} | "
                         f"{f(x['transformer'].get('tokens_per_s'), '.0f')} | {f(x['ratio'])} |")
    errors = [k for k, v in r.items() if isinstance(v, dict) and "error" in v]
    if errors:
        lines += ["", "Sections that failed: " + ", ".join(errors) + " (see the JSON)."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, type=Path, help="folder for the JSON, table, image")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (CI)")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    args = p.parse_args(argv)
    if args.smoke:
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # the CPU path, even on a GPU host
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is first imported
    # the sibling scripts it borrows from: bench_scan, bench_storage
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch

    device = torch.device("cpu" if args.smoke else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_suite: no CUDA device; run with --smoke for the CPU check", file=sys.stderr)
        return 2
    results = run_suite(SMOKE if args.smoke else FULL, device, args.out, tuple(args.sections))
    for path in results.pop("_paths"):
        print(f"wrote {path}")
    print(markdown(results))
    failed = [k for k, v in results.items() if isinstance(v, dict) and "error" in v]
    if failed:
        print(f"gpu_suite: sections failed: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
