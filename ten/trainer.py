"""The training loop: a plain step function and a loop that fits on a screen.

Everything that must survive a restart — model, optimizer, scheduler, scaler, RNG
states, the data cursor, step and tokens seen — is saved together in one atomic
checkpoint (ten.checkpoint), and restoring it continues the run exactly: the same
batches, the same per-step losses, bit-identical weights.

Host syncs are deliberate: the loss is accumulated on the device and read (``.item()``)
only at the logging interval, evaluation and checkpoints.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import json
import math
import random
import resource
import signal
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from ten import checkpoint as ckpt
from ten.distributed import (
    DistInfo,
    all_reduce_mean,
    barrier,
    broadcast_flag,
    init_from_env,
    shutdown,
)
from ten.lm import LanguageModel
from ten.metrics import MetricsWriter
from ten.mfu import mfu, peak_flops
from ten.presets import build_model
from ten.schedule import lr_multiplier

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adamw8bit")


@dataclass(frozen=True)
class TrainConfig:
    max_steps: int | None = 300
    max_tokens: int | None = None
    batch_size: int = 8  # sequences per micro-batch per process
    grad_accum: int = 1
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 30
    schedule: str = "cosine"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    precision: str = "auto"
    optimizer: str = "adamw"
    compile: bool = False
    grad_clip: float = 1.0  # 0 disables clipping (the norm is still logged)
    eval_every: int = 100
    eval_batches: int = 20
    log_every: int = 10
    seed: int = 1234
    device: str = "auto"
    num_workers: int = 2
    checkpoint_every: int = 100
    keep_last: int = 3


class Outcome(enum.Enum):
    DONE = "done"
    PREEMPTED = "preempted"


class ResumeError(Exception):
    """The newest checkpoint cannot be resumed with this configuration (one line)."""


# --- set-up helpers (pure or nearly so) ---------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("train.device is 'cuda' but no CUDA device is visible; "
                           "use device: auto or cpu")
    return torch.device(name)


def resolve_precision(precision: str, device: torch.device) -> torch.dtype | None:
    """The autocast dtype (None: plain fp32). auto = bf16 on GPUs that have it, fp16 on
    older GPUs, fp32 on CPU (bf16 autocast on CPU is slower than fp32)."""
    if precision == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]


def build_optimizer(model: LanguageModel, cfg: TrainConfig, device: torch.device):
    groups = model.optimizer_groups(cfg.weight_decay)
    if cfg.optimizer == "adamw8bit":
        import bitsandbytes as bnb  # optional heavy dependency, only when asked for

        return bnb.optim.AdamW8bit(groups, lr=cfg.lr, betas=cfg.betas)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=device.type == "cuda")


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(),
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def config_diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted-path differences between two JSON-like values, as 'path: old -> new'."""
    if isinstance(old, dict) and isinstance(new, dict):
        out = []
        for key in sorted(set(old) | set(new)):
            path = f"{prefix}.{key}" if prefix else str(key)
            out += config_diff(old.get(key), new.get(key), path)
        return out
    return [] if old == new else [f"{prefix}: {old!r} -> {new!r}"]


class StopSignal:
    """Turns the first SIGTERM/SIGINT into a flag the loop checks after each step; a
    second SIGINT interrupts at once (the user insists). ``request`` raises the same
    flag from another thread (a preemption-notice watcher)."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.requested: str | None = None
        self._old: dict[int, Any] = {}

    @property
    def reason(self) -> str | None:
        if self.signum is not None:
            return signal.Signals(self.signum).name
        return self.requested

    def request(self, reason: str) -> None:
        if self.requested is None:
            self.requested = reason

    def __enter__(self) -> StopSignal:
        with contextlib.suppress(ValueError):  # not the main thread: no handlers
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signum = signum


# --- the step -------------------------------------------------------------------------------

def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer,
               scaler: torch.amp.GradScaler, micro_batches: list[torch.Tensor],
               amp_dtype: torch.dtype | None, grad_clip: float,
               ddp_no_sync: Callable[[], Any] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One optimizer step over ``grad_accum`` micro-batches of (B, T + 1) token ids.

    Returns (mean loss, grad norm before clipping) as device tensors: no host sync.
    """
    device_type = micro_batches[0].device.type
    total = torch.zeros((), device=micro_batches[0].device)
    n = len(micro_batches)
    for i, batch in enumerate(micro_batches):
        inputs, targets = batch[:, :-1], batch[:, 1:]
        sync_ctx = ddp_no_sync() if ddp_no_sync is not None and i < n - 1 \
            else contextlib.nullcontext()
        with sync_ctx:
            with torch.autocast(device_type, dtype=amp_dtype or torch.float32,
                                enabled=amp_dtype is not None):
                logits, _ = model(inputs)
            loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten()) / n
            scaler.scale(loss).backward()
        total += loss.detach()
    scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total, norm


@torch.no_grad()
def evaluate(model: LanguageModel, batches: Iterator[torch.Tensor], device: torch.device,
             amp_dtype: torch.dtype | None) -> float:
    """Mean next-token loss over held-out batches."""
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device), 0
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            logits, _ = model(batch[:, :-1])
        total += F.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
        count += 1
    model.train(was_training)
    return (total / max(count, 1)).item()  # host sync: once per evaluation


# --- the loop --------------------------------------------------------------------------------

class Trainer:
    """Trains one run in ``run_dir``; resumes from its newest valid checkpoint.

    ``data`` is an object from ``ten.data.open_data``. ``identity`` holds what must not
    change across a resume (model shape, tokenizer, seq_len, ...); ``resolved`` is the
    full (secret-free) job, saved with every checkpoint. ``on_commit(path, seconds)`` is
    called on the main rank after each committed checkpoint; ``stop.request(reason)``
    (thread-safe) ends the run after the current step with a checkpoint, like SIGTERM.
    """

    def __init__(self, model_config: Any, data: Any, cfg: TrainConfig, run_dir: Path,
                 identity: dict[str, Any], resolved: dict[str, Any],
                 log: Callable[[str], None] = print,
                 on_commit: Callable[[Path, float], None] | None = None) -> None:
        self.model_config, self.data, self.cfg = model_config, data, cfg
        self.run_dir, self.identity, self.resolved = Path(run_dir), identity, resolved
        self.log, self.on_commit = log, on_commit
        self.ckpt_root = self.run_dir / "checkpoints"
        self.stop = StopSignal()
        self.device = resolve_device(cfg.device)
        self.dist: DistInfo = init_from_env(self.device.type)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.backends.cuda.matmul.allow_tf32 = True  # TF32 on Ampere+
            torch.backends.cudnn.allow_tf32 = True
        self.amp_dtype = resolve_precision(cfg.precision, self.device)
        self.tokens_per_step = (cfg.batch_size * data.cfg.seq_len * cfg.grad_accum
                                * self.dist.world_size)
        if cfg.max_steps is not None:
            self.total_steps = cfg.max_steps
        else:
            self.total_steps = math.ceil(cfg.max_tokens / self.tokens_per_step)

    # -- state that survives a restart ----------------------------------------------------
    def _save(self, step: int, tokens: int, loader: Any, last_loss: float | None) -> float:
        t0 = time.perf_counter()
        if self.dist.is_main:
            config = {"identity": self.identity, "resolved": self.resolved,
                      "model_config": dataclasses.asdict(self.model_config),
                      "model_class": type(self.raw_model).__name__}
            files = {
                "model.pt": self.raw_model.state_dict(),
                "optimizer.pt": self.optimizer.state_dict(),
                "trainer.pt": {"step": step, "tokens": tokens,
                               "scheduler": self.scheduler.state_dict(),
                               "scaler": self.scaler.state_dict(), "rng": rng_state(),
                               "data": loader.state_dict(),
                               "world_size": self.dist.world_size},
                "config.json": json.dumps(config, indent=1, default=str).encode(),
            }
            path = ckpt.save(self.ckpt_root, step, files,
                             meta={"step": step, "tokens": tokens, "loss": last_loss})
            ckpt.prune(self.ckpt_root, self.cfg.keep_last)
            if self.on_commit is not None:
                self.on_commit(path, time.perf_counter() - t0)
        barrier(self.dist)
        return time.perf_counter() - t0

    def _resume(self, loader: Any) -> tuple[int, int]:
        if self.dist.is_main:
            ckpt.cleanup(self.ckpt_root, self.log)
        barrier(self.dist)
        found = ckpt.latest_valid(self.ckpt_root, self.log)
        if found is None:
            return 0, 0
        saved = json.loads((found.path / "config.json").read_text())
        unsafe = config_diff(saved["identity"], self.identity)
        if unsafe:
            raise ResumeError(f"cannot resume {self.run_dir} from {found.path.name}: unsafe "
                              f"changes ({'; '.join(unsafe)}); restore those settings or "
                              "use a new job name")
        changed = config_diff(saved["resolved"], self.resolved)
        if changed:
            self.log(f"resuming with changed settings: {'; '.join(changed)}")
        self.raw_model.load_state_dict(ckpt.load(found.path, "model.pt", self.device))
        self.optimizer.load_state_dict(ckpt.load(found.path, "optimizer.pt", self.device))
        state = ckpt.load(found.path, "trainer.pt")
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        loader.load_state_dict(state["data"])
        self.log(f"resumed from {found.path} (step {state['step']}, "
                 f"{state['tokens']:,} tokens)")
        return state["step"], state["tokens"]

    # -- the run --------------------------------------------------------------------------
    def run(self) -> Outcome:
        cfg = self.cfg
        seed_everything(cfg.seed)
        self.raw_model = build_model(self.model_config).to(self.device)
        self.optimizer = build_optimizer(self.raw_model, cfg, self.device)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_multiplier(s, self.total_steps, cfg.warmup_steps,
                                                    cfg.schedule, cfg.min_lr_ratio))
        self.scaler = torch.amp.GradScaler(self.device.type,
                                           enabled=self.amp_dtype == torch.float16)
        loader = self.data.train_loader(cfg.batch_size, cfg.num_workers, self.dist.rank,
                                        self.dist.world_size,
                                        pin_memory=self.device.type == "cuda")
        step, tokens = self._resume(loader)
        model: torch.nn.Module = self.raw_model
        no_sync = None
        if self.dist.enabled:
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda"
                        else None)
            no_sync = model.no_sync
        if cfg.compile:
            model = torch.compile(model)
        model.train()

        metrics = MetricsWriter(self.run_dir) if self.dist.is_main else None
        flops = self.raw_model.flops_per_token(self.data.cfg.seq_len)
        peak = peak_flops(self.device)
        if metrics:
            metrics.write("start", step, {"params": self.raw_model.num_params(),
                                          "tokens_per_step": self.tokens_per_step,
                                          "total_steps": self.total_steps,
                                          "world_size": self.dist.world_size,
                                          "device": str(self.device), "resumed": step > 0})
        if cfg.warmup_steps >= self.total_steps:
            self.log(f"note: warmup_steps={cfg.warmup_steps} >= the {self.total_steps}-step "
                     "budget, so the lr never reaches its peak")
        outcome = Outcome.DONE
        loss_acc = torch.zeros((), device=self.device)
        window = {"data": 0.0, "compute": 0.0, "checkpoint": 0.0, "steps": 0}
        last_loss: float | None = None
        t_window = time.perf_counter()
        batches = iter(loader)
        with self.stop as stop:
            while step < self.total_steps:
                t0 = time.perf_counter()
                micro = [next(batches).to(self.device, non_blocking=True)
                         for _ in range(cfg.grad_accum)]
                t1 = time.perf_counter()
                lr = self.scheduler.get_last_lr()[0]  # the lr this step uses
                loss, norm = train_step(model, self.optimizer, self.scaler, micro,
                                        self.amp_dtype, cfg.grad_clip, no_sync)
                self.scheduler.step()
                step += 1
                tokens += self.tokens_per_step
                loss_acc += loss
                window["data"] += t1 - t0
                window["compute"] += time.perf_counter() - t1
                window["steps"] += 1
                stopping = broadcast_flag(stop.reason is not None, self.dist, self.device)

                if step % cfg.log_every == 0 or step == self.total_steps or stopping:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()  # host sync: once per logging interval
                    elapsed = time.perf_counter() - t_window
                    all_reduce_mean(loss_acc, self.dist)  # the global batch's loss
                    last_loss = (loss_acc / window["steps"]).item()  # host sync (logging)
                    tok_s = window["steps"] * self.tokens_per_step / elapsed
                    rec = {"loss": last_loss, "lr": lr,
                           "grad_norm": norm.item(), "tokens": tokens, "tokens_per_s": tok_s,
                           "mfu": mfu(flops, tok_s / self.dist.world_size, peak),
                           "data_wait_frac": window["data"] / elapsed,
                           "compute_frac": window["compute"] / elapsed,
                           "checkpoint_frac": window["checkpoint"] / elapsed,
                           "step_time_s": elapsed / window["steps"]}
                    if self.device.type == "cuda":
                        rec["peak_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
                    else:  # ru_maxrss is in KiB on Linux
                        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                        rec["peak_rss_gb"] = rss_kib / 2**20
                    if metrics:
                        metrics.write("train", step, rec)
                        self.log(progress_line(step, self.total_steps, rec))
                    loss_acc.zero_()
                    window = {"data": 0.0, "compute": 0.0, "checkpoint": 0.0, "steps": 0}
                    t_window = time.perf_counter()

                if cfg.eval_every and step % cfg.eval_every == 0 and step < self.total_steps:
                    self._eval(step, metrics)
                    t_window = time.perf_counter()

                if stopping or step % cfg.checkpoint_every == 0 or step == self.total_steps:
                    window["checkpoint"] += self._save(step, tokens, loader, last_loss)
                if stopping:
                    self.log(f"stopped by {stop.reason or 'a peer'} after step {step}: "
                             "checkpoint committed, run again to resume")
                    outcome = Outcome.PREEMPTED
                    break
        if outcome is Outcome.DONE:
            self.final_loss = self._eval(step, metrics)
        if metrics:
            metrics.write("end", step, {"outcome": outcome.value, "tokens": tokens})
            metrics.close()
        shutdown(self.dist)
        return outcome

    def _eval(self, step: int, metrics: MetricsWriter | None) -> float:
        batches = self.data.val_batches(self.cfg.batch_size, self.cfg.eval_batches)
        loss = evaluate(self.raw_model, batches, self.device, self.amp_dtype)
        ppl = math.exp(min(loss, 50.0))
        if metrics:
            metrics.write("eval", step, {"loss": loss, "perplexity": ppl})
            self.log(f"eval step {step}: held-out loss {loss:.4f}, perplexity {ppl:.2f}")
        return loss


def progress_line(step: int, total: int, rec: dict[str, Any]) -> str:
    eta = (total - step) * rec["step_time_s"]
    util = "-" if rec["mfu"] is None else f"{100 * rec['mfu']:.1f}%"
    return (f"step {step:>{len(str(total))}}/{total} | loss {rec['loss']:.4f} | "
            f"lr {rec['lr']:.2e} | {rec['tokens_per_s']:,.0f} tok/s | MFU {util} | "
            f"data {100 * rec['data_wait_frac']:.1f}% | ETA {_hms(eta)}")


def _hms(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def load_model(checkpoint_dir: Path, device: str | torch.device = "cpu") -> LanguageModel:
    """Rebuild the model a checkpoint was saved from and load its weights."""
    from ten.model import TENConfig
    from ten.transformer import TransformerConfig

    saved = json.loads((Path(checkpoint_dir) / "config.json").read_text())
    cls = TENConfig if saved["model_class"] == "TENLM" else TransformerConfig
    fields = saved["model_config"]
    model = build_model(cls(**fields)).to(device)
    model.load_state_dict(ckpt.load(Path(checkpoint_dir), "model.pt", device))
    return model.eval()
