"""The training loop: a plain step function and a loop that fits on a screen.

Everything that must survive a restart — model, optimizer, scheduler, scaler, RNG
states, the data cursor, step and tokens seen — is saved together in one atomic
checkpoint (ten.checkpoint), and restoring it continues the run exactly: the same
batches, the same per-step losses, bit-identical weights.

Host syncs are deliberate: the loss is accumulated on the device and read (``.item()``)
only at the logging interval, evaluation and checkpoints; under DDP the ranks agree on
stopping every ``STOP_AGREE_EVERY`` steps and at those points, never every step.

The loss never materializes B×T×V fp32 logits: the model's hidden states and head weight
go to ten.loss (chunked, or Liger's fused kernel on CUDA), in training and evaluation.

A step whose loss or gradient norm is not finite is skipped (no optimizer update), and
counted on the device; more than ``max_nonfinite_steps`` in a row, or non-finite weights
at a checkpoint, end the run with :class:`DivergedError` and nothing non-finite committed.
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

from ten import checkpoint as ckpt
from ten.distributed import (
    DistInfo,
    StopAgreement,
    all_reduce_mean,
    barrier,
    init_from_env,
    shutdown,
)
from ten.lm import LanguageModel
from ten.loss import NextTokenLoss, resolve_loss_backend
from ten.memory import check_fits
from ten.metrics import MetricsWriter
from ten.mfu import hfu, mfu, peak_flops, peak_note
from ten.nonfinite import NonFiniteCounter, NonFiniteStats, step_unless
from ten.presets import EXECUTION_FIELDS, build_model
from ten.progress import eta_seconds, progress_line
from ten.scan import backend_note
from ten.schedule import lr_multiplier

PRECISIONS = ("auto", "bf16", "fp16", "fp32")
OPTIMIZERS = ("adamw", "adamw8bit")
# Under DDP the ranks agree on a stop signal every this many steps (and at log, checkpoint
# and last steps): a stop is taken at most STOP_AGREE_EVERY - 1 steps after the step in
# flight when it came, for one host sync per 8 steps instead of one per step.
STOP_AGREE_EVERY = 8


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
    # Steps with a non-finite loss or grad norm are skipped; one more than this many in a
    # row stops the run (DivergedError). Checked at log intervals, so up to log_every
    # steps more may be skipped first (no per-step host sync).
    max_nonfinite_steps: int = 5
    # ten.loss backend: auto (Liger's fused kernel on CUDA when installed, else chunked),
    # chunked, liger (raises where it cannot run) or reference (the plain B×T×V loss).
    loss: str = "auto"


class Outcome(enum.Enum):
    DONE = "done"
    PREEMPTED = "preempted"


class ResumeError(Exception):
    """The newest checkpoint cannot be resumed with this configuration (one line)."""


class CompileError(Exception):
    """``train.compile: true`` and torch.compile failed (one line with its reason, naming
    the field to turn off)."""


class DivergedError(Exception):
    """Training went non-finite and stayed so (one line naming the step, what was not
    finite, and to lower train.lr). Nothing non-finite was committed."""


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
    """Every RNG's state as tensors and plain containers, so a checkpoint loads with
    ``weights_only=True`` (numpy's own state holds an ndarray, which would not)."""
    np_state = np.random.get_state(legacy=False)
    state = {"python": random.getstate(),
             "numpy": {"bit_generator": np_state["bit_generator"],
                       # the MT19937 key is uint32: int64 holds it exactly
                       "key": torch.from_numpy(np_state["state"]["key"].astype(np.int64)),
                       "pos": int(np_state["state"]["pos"]),
                       "has_gauss": int(np_state["has_gauss"]),
                       "gauss": float(np_state["gauss"])},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    version, internal, gauss_next = state["python"]
    random.setstate((version, tuple(internal), gauss_next))
    n = state["numpy"]
    np.random.set_state({"bit_generator": n["bit_generator"],
                         "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
                         "has_gauss": n["has_gauss"], "gauss": n["gauss"]})
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
               ddp_no_sync: Callable[[], Any] | None = None,
               any_rank: Callable[[torch.Tensor], None] | None = None,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One optimizer step over ``grad_accum`` micro-batches of (B, T + 1) token ids.

    ``model`` is the objective: ``model(inputs, targets) -> mean loss`` (a
    :class:`ten.loss.NextTokenLoss`, possibly DDP-wrapped or compiled). Returns (mean
    loss, grad norm before clipping, non-finite flags) as device tensors: no host sync on
    the fused-optimizer path (see :func:`step_unless`). The flags are
    ``[loss not finite, grad norm not finite]`` (int32, 0/1); a flagged step is skipped:
    the optimizer does not update. ``any_rank`` (an in-place max over ranks) makes every
    rank skip the same steps.
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
                loss = model(inputs, targets) / n  # fp32: the loss computes in fp32
            scaler.scale(loss).backward()
        total += loss.detach()
    scaler.unscale_(optimizer)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else math.inf)
    flags = torch.stack([~torch.isfinite(total), ~torch.isfinite(norm)]).int()
    if scaler.is_enabled():
        # fp16: overflowing gradients are the GradScaler's routine (it skips the step and
        # lowers its scale), not divergence; only a non-finite loss is flagged.
        flags[1] = 0
    if any_rank is not None:
        any_rank(flags)
    if scaler.is_enabled():
        scaler.step(optimizer)  # a non-finite loss has non-finite grads: skipped here too
    else:
        step_unless(optimizer, flags.any())
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return total, norm, flags


@torch.no_grad()
def evaluate(model: torch.nn.Module, batches: Iterator[torch.Tensor], device: torch.device,
             amp_dtype: torch.dtype | None) -> float:
    """Mean next-token loss over held-out batches; ``model`` is the objective, as in
    :func:`train_step` (a bare language model is evaluated with the chunked loss)."""
    if isinstance(model, LanguageModel):
        model = NextTokenLoss(model, "chunked")
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), device=device), 0
    for batch in batches:
        batch = batch.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=amp_dtype or torch.float32,
                            enabled=amp_dtype is not None):
            total += model(batch[:, :-1], batch[:, 1:])
        count += 1
    model.train(was_training)
    return (total / max(count, 1)).item()  # host sync: once per evaluation


# --- the loop --------------------------------------------------------------------------------

class Trainer:
    """Trains one run in ``run_dir``; resumes from its newest usable checkpoint.

    ``data`` is an object from ``ten.data.open_data``. ``identity`` holds what must not
    change across a resume (model shape, tokenizer, seq_len, ...); ``resolved`` is the
    full (secret-free) job, saved with every checkpoint. ``on_commit(path, seconds)`` is
    called on the main rank after each committed checkpoint, ``on_log(record)`` with each
    train record written to the metrics, ``on_step(step)`` after every step (cheap: it
    runs on the hot path; a liveness watchdog); ``stop.request(reason)`` (thread-safe)
    ends the run after the current step with a checkpoint, like SIGTERM.
    """

    def __init__(self, model_config: Any, data: Any, cfg: TrainConfig, run_dir: Path,
                 identity: dict[str, Any], resolved: dict[str, Any],
                 log: Callable[[str], None] = print,
                 on_commit: Callable[[Path, float], None] | None = None,
                 on_log: Callable[[dict[str, Any]], None] | None = None,
                 on_step: Callable[[int], None] | None = None) -> None:
        self.model_config, self.data, self.cfg = model_config, data, cfg
        self.run_dir, self.identity, self.resolved = Path(run_dir), identity, resolved
        self.log, self.on_commit, self.on_log, self.on_step = log, on_commit, on_log, on_step
        self.ckpt_root = self.run_dir / "checkpoints"
        self.stop = StopSignal()
        self.device = resolve_device(cfg.device)
        self.dist: DistInfo = init_from_env(self.device.type)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
            torch.backends.cuda.matmul.allow_tf32 = True  # TF32 on Ampere+
            torch.backends.cudnn.allow_tf32 = True
        self.amp_dtype = resolve_precision(cfg.precision, self.device)
        # explicit: an asked-for backend that cannot run raises here, before any work
        self.loss_backend, self.loss_note = resolve_loss_backend(cfg.loss, self.device)
        self.tokens_per_step = (cfg.batch_size * data.cfg.seq_len * cfg.grad_accum
                                * self.dist.world_size)
        if cfg.max_steps is not None:
            self.total_steps = cfg.max_steps
        else:
            self.total_steps = math.ceil(cfg.max_tokens / self.tokens_per_step)
        self.nonfinite = NonFiniteCounter(self.device)
        self.save_s = 0.0  # seconds spent checkpointing, for the log's checkpoint_frac

    # -- state that survives a restart ----------------------------------------------------
    def _save(self, step: int, tokens: int, loader: Any, last_loss: float | None) -> bool:
        """Commit a checkpoint of ``step``; False when it is not committed because the
        latest step was skipped as non-finite. Adds its seconds to ``self.save_s``."""
        t0 = time.perf_counter()
        # Every rank holds the same weights and flags, so every rank decides alike.
        stats = self.nonfinite.read()  # host sync: once per checkpoint
        self._check_divergence(step, stats)
        self._check_weights_finite(step)
        if stats.streak:
            # Weights whose latest steps gave a non-finite loss are suspect even when they
            # are finite: committing them could push good checkpoints out (keep_last) and
            # a relaunch with a lower lr would resume from them.
            if self.dist.is_main:
                self.log(f"not committing a checkpoint at step {step}: its last "
                         f"{stats.streak} step(s) had a non-finite "
                         f"{stats.what(streak=True)} "
                         f"({self._last_committed()})")
            self.save_s += time.perf_counter() - t0
            return False
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
                               "world_size": self.dist.world_size,
                               "nonfinite_streak": stats.streak},
                "config.json": json.dumps(config, indent=1, default=str).encode(),
            }
            path = ckpt.save(self.ckpt_root, step, files,
                             meta={"step": step, "tokens": tokens, "loss": last_loss})
            ckpt.prune(self.ckpt_root, self.cfg.keep_last)
            if self.on_commit is not None:
                self.on_commit(path, time.perf_counter() - t0)
        barrier(self.dist)
        self.save_s += time.perf_counter() - t0
        return True

    def _check_divergence(self, step: int, stats: NonFiniteStats) -> None:
        limit = self.cfg.max_nonfinite_steps
        if stats.worst > limit:
            raise DivergedError(
                f"training diverged: {stats.worst} steps in a row had a non-finite "
                f"{stats.what(streak=stats.streak > 0)} (by step {step}; "
                f"train.max_nonfinite_steps is {limit}); their updates were skipped and "
                f"nothing non-finite was committed ({self._last_committed()}); lower "
                f"train.lr (now {self.cfg.lr:g})")

    def _check_weights_finite(self, step: int) -> None:
        with torch.no_grad():
            finite = torch.stack([torch.isfinite(p).all() for p in self.raw_model.parameters()])
        if not bool(finite.all()):  # host sync: once per checkpoint
            raise DivergedError(
                f"training diverged: the weights are not finite at step {step}, so they are "
                f"not committed ({self._last_committed()}); lower train.lr "
                f"(now {self.cfg.lr:g})")

    def _last_committed(self) -> str:
        steps = ckpt.committed_steps(self.ckpt_root)
        return f"the last checkpoint is step {steps[-1]}" if steps else "no checkpoint yet"

    def _resume(self, loader: Any) -> tuple[int, int]:
        """Restore the newest checkpoint that verifies and loads; an unusable one (corrupt,
        malformed, refused by weights_only) is reported in one line and the one before it
        tried. Committed checkpoints of which none is usable raise ResumeError: a run is
        never silently restarted from scratch over its own checkpoints."""
        if self.dist.is_main:
            ckpt.cleanup(self.ckpt_root, self.log)
        barrier(self.dist)
        for found in ckpt.valid_checkpoints(self.ckpt_root, self.log):
            try:
                return self._restore(found, loader)
            except ckpt.CheckpointError as e:
                self.log(f"skipping unusable checkpoint: {e}")
        committed = ckpt.committed_steps(self.ckpt_root)
        if committed:
            raise ResumeError(f"cannot resume {self.run_dir}: none of its {len(committed)} "
                              "committed checkpoint(s) is usable (see above); restore one "
                              f"from a trusted copy, or move {self.ckpt_root} away to start "
                              "over")
        return 0, 0

    def _restore(self, found: ckpt.Found, loader: Any) -> tuple[int, int]:
        path = found.path
        saved = read_config(path)
        unsafe = config_diff(_model_proper(saved["identity"]), _model_proper(self.identity))
        if unsafe:
            raise ResumeError(f"cannot resume {self.run_dir} from {path.name}: unsafe "
                              f"changes ({'; '.join(unsafe)}); restore those settings or "
                              "use a new job name")
        # Load everything before changing anything, so a refused file leaves no trace.
        model_state = ckpt.load(path, "model.pt", self.device)
        optim_state = ckpt.load(path, "optimizer.pt", self.device)
        state = ckpt.load(path, "trainer.pt")
        _check_trainer_state(path, state, found.step)
        changed = config_diff(saved["resolved"], self.resolved)
        if changed:
            self.log(f"resuming with changed settings: {'; '.join(changed)}")
        for what, apply in (("model.pt", lambda: self.raw_model.load_state_dict(model_state)),
                            ("optimizer.pt", lambda: self.optimizer.load_state_dict(optim_state)),
                            ("trainer.pt", lambda: self._apply_trainer_state(state, loader))):
            try:
                apply()
            except (KeyError, TypeError, ValueError, RuntimeError, IndexError,
                    AttributeError) as e:  # a malformed state; DataError (cursor) passes
                raise ckpt.CheckpointError(f"{path}: {what} does not fit this run "
                                           f"({type(e).__name__}: {_first_line(e)})") from None
        self.log(f"resumed from {path} (step {state['step']}, {state['tokens']:,} tokens)")
        return state["step"], state["tokens"]

    def _apply_trainer_state(self, state: dict[str, Any], loader: Any) -> None:
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        loader.load_state_dict(state["data"])  # a mismatched cursor raises DataError
        self.nonfinite = NonFiniteCounter(self.device, int(state.get("nonfinite_streak", 0)))

    # -- the run --------------------------------------------------------------------------
    def run(self) -> Outcome:
        try:
            return self._run()
        except torch._dynamo.exc.TorchDynamoException as e:
            if not self.cfg.compile:
                raise
            raise CompileError(f"torch.compile failed ({type(e).__name__}: "
                               f"{_first_line(e)}); set train.compile: false to train "
                               "without it") from None

    def _run(self) -> Outcome:
        cfg = self.cfg
        seed_everything(cfg.seed)
        scan_backend = getattr(self.model_config, "scan_backend", None)
        if scan_backend is not None:
            # before any work: a backend that cannot run here raises ScanBackendError
            note = backend_note(scan_backend, self.device)
            if self.dist.is_main:
                self.log(note)
        # before any weight is placed: a job the device cannot hold raises DeviceMemoryError
        note = check_fits(self.model_config, cfg.batch_size, self.data.cfg.seq_len,
                          self.amp_dtype, cfg.optimizer, self.device)
        if note and self.dist.is_main:
            self.log(note)
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
        # The objective (model + loss head) is what DDP and compile wrap: DDP sees every
        # parameter used in its own forward; the model keeps returning logits elsewhere.
        self.objective = NextTokenLoss(self.raw_model, self.loss_backend)
        model: torch.nn.Module = self.objective
        no_sync = any_rank = None
        if self.dist.enabled:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda"
                        else None)
            no_sync = model.no_sync

            def any_rank(t: torch.Tensor) -> None:  # every rank skips the same steps
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
        if cfg.compile:
            # Regional: each block is compiled in place (its state_dict keys unchanged) and
            # the blocks share one compiled graph, so compile time does not grow with depth;
            # the loss head is already fused (ten.loss). Errors surface at the first call.
            self.raw_model.compile_blocks()
            if self.dist.is_main:
                self.log("compile: every block with torch.compile (train.compile)")
        model.train()

        metrics = MetricsWriter(self.run_dir) if self.dist.is_main else None
        flops = self.raw_model.flops_per_token(self.data.cfg.seq_len)
        recompute = self.raw_model.recompute_flops_per_token(self.data.cfg.seq_len)
        peak = peak_flops(self.device)
        if self.dist.is_main:
            self.log(self.loss_note)
            note = peak_note(self.device)  # said once: MFU/HFU are None from here on
            if note:
                self.log(note)
        if metrics:
            metrics.write("start", step, {"params": self.raw_model.num_params(),
                                          "tokens_per_step": self.tokens_per_step,
                                          "total_steps": self.total_steps,
                                          "world_size": self.dist.world_size,
                                          "device": str(self.device), "resumed": step > 0,
                                          "loss_backend": self.loss_backend,
                                          "peak_flops": peak})
        if cfg.warmup_steps >= self.total_steps:
            self.log(f"note: warmup_steps={cfg.warmup_steps} >= the {self.total_steps}-step "
                     "budget, so the lr never reaches its peak")
        outcome = Outcome.DONE
        loss_acc = torch.zeros((), device=self.device)  # over the window's unskipped steps
        agree = StopAgreement(self.dist, self.device, STOP_AGREE_EVERY)
        window = _new_window()
        last_loss: float | None = None
        first_step, first_step_s = step, 0.0
        t_start = t_window = time.perf_counter()
        batches = iter(loader)
        with self.stop as stop:
            while step < self.total_steps:
                t0 = time.perf_counter()
                micro = [next(batches).to(self.device, non_blocking=True)
                         for _ in range(cfg.grad_accum)]
                t1 = time.perf_counter()
                lr = self.scheduler.get_last_lr()[0]  # the lr this step uses
                loss, norm, flags = train_step(model, self.optimizer, self.scaler, micro,
                                               self.amp_dtype, cfg.grad_clip, no_sync, any_rank)
                self.scheduler.step()
                step += 1
                tokens += self.tokens_per_step
                if self.on_step is not None:
                    self.on_step(step)
                self.nonfinite.add(flags)
                loss_acc += loss.masked_fill(flags.any(), 0.0)
                window["data"] += t1 - t0
                window["compute"] += time.perf_counter() - t1
                window["steps"] += 1
                if step == first_step + 1:
                    first_step_s = time.perf_counter() - t_start
                log_due = step % cfg.log_every == 0 or step == self.total_steps
                save_due = step % cfg.checkpoint_every == 0 or step == self.total_steps
                # single process: every step, no sync; DDP: at agreement points only
                stopping = agree(step, stop.reason is not None, force=log_due or save_due)

                if log_due or stopping:
                    if self.device.type == "cuda":
                        torch.cuda.synchronize()  # host sync: once per logging interval
                    now = time.perf_counter()
                    # The window's wall time less evaluation; checkpoint saves stay in
                    # (they are part of training's cost; their share is checkpoint_frac).
                    elapsed = now - t_window - window["eval"]
                    stats = self.nonfinite.read()  # host sync (logging)
                    self._check_divergence(step, stats)
                    all_reduce_mean(loss_acc, self.dist)  # the global batch's loss
                    good = window["steps"] - stats.skipped
                    last_loss = (loss_acc / good).item() if good else math.nan  # host sync
                    tok_s = window["steps"] * self.tokens_per_step / elapsed
                    rec = {"loss": last_loss, "lr": lr,
                           "grad_norm": norm.item(), "tokens": tokens, "tokens_per_s": tok_s,
                           "mfu": mfu(flops, tok_s / self.dist.world_size, peak),
                           "hfu": hfu(flops, recompute, tok_s / self.dist.world_size, peak),
                           "data_wait_frac": window["data"] / elapsed,
                           "compute_frac": window["compute"] / elapsed,
                           "checkpoint_frac": window["checkpoint"] / elapsed,
                           "step_time_s": elapsed / window["steps"],
                           "eta_s": eta_seconds(self.total_steps - step, step - first_step,
                                                now - t_start, first_step_s),
                           "skipped_steps": stats.skipped}
                    if self.device.type == "cuda":
                        rec["peak_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
                    else:  # ru_maxrss is in KiB on Linux
                        rss_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                        rec["peak_rss_gb"] = rss_kib / 2**20
                    if metrics:
                        metrics.write("train", step, rec)
                        if stats.skipped:
                            self.log(f"skipped {stats.skipped} of steps "
                                     f"{step - window['steps'] + 1}-{step}: non-finite "
                                     f"{stats.what()}, no update applied")
                        self.log(progress_line(step, self.total_steps, rec))
                        if self.on_log is not None:
                            self.on_log(rec)
                    loss_acc.zero_()
                    self.nonfinite.new_window()
                    window = _new_window()
                    t_window = time.perf_counter()

                if cfg.eval_every and step % cfg.eval_every == 0 and step < self.total_steps:
                    t_eval = time.perf_counter()
                    self._eval(step, metrics)
                    window["eval"] += time.perf_counter() - t_eval  # not in tokens/s

                committed = False
                if stopping or save_due:
                    save_s = self.save_s
                    committed = self._save(step, tokens, loader, last_loss)
                    window["checkpoint"] += self.save_s - save_s
                if stopping:
                    self.log(f"stopped by {stop.reason or 'a peer'} after step {step}: " + (
                        "checkpoint committed, run again to resume" if committed else
                        f"not committed, {self._last_committed()}; run again to resume"))
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
        loss = evaluate(self.objective, batches, self.device, self.amp_dtype)
        ppl = math.exp(min(loss, 50.0))
        if metrics:
            metrics.write("eval", step, {"loss": loss, "perplexity": ppl})
            self.log(f"eval step {step}: held-out loss {loss:.4f}, perplexity {ppl:.2f}")
        return loss


def _new_window() -> dict[str, Any]:
    """Seconds the logging window spent waiting for data, computing, checkpointing and
    evaluating (the last is left out of its elapsed time), and its step count."""
    return {"data": 0.0, "compute": 0.0, "checkpoint": 0.0, "eval": 0.0, "steps": 0}


def _model_proper(identity: dict[str, Any]) -> dict[str, Any]:
    """The identity without the model fields that change how it computes, not what
    (ten.presets.EXECUTION_FIELDS): a resume may turn on checkpointing to fit a smaller
    GPU, or land where another scan backend runs."""
    model = identity.get("model")
    if not isinstance(model, dict):
        return identity
    return {**identity, "model": {k: v for k, v in model.items() if k not in EXECUTION_FIELDS}}


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def read_config(path: Path) -> dict[str, Any]:
    """A checkpoint's ``config.json``; CheckpointError (one line) when it is unreadable or
    lacks a field, so a damaged one counts as a corrupt checkpoint, never a KeyError."""
    try:
        saved = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ckpt.CheckpointError(f"{path}: unreadable config.json "
                                   f"({type(e).__name__}: {_first_line(e)})") from None
    fields = (("identity", dict), ("resolved", dict), ("model_config", dict),
              ("model_class", str))
    if not isinstance(saved, dict):
        raise ckpt.CheckpointError(f"{path}: config.json is not a JSON object (corrupt)")
    bad = [name for name, kind in fields if not isinstance(saved.get(name), kind)]
    if bad:
        raise ckpt.CheckpointError(f"{path}: config.json lacks {', '.join(bad)} (corrupt)")
    return saved


def _check_trainer_state(path: Path, state: Any, step: int) -> None:
    """trainer.pt's fields and types, before any is used (a damaged file is corrupt)."""
    fields = (("step", int), ("tokens", int), ("scheduler", dict), ("scaler", dict),
              ("rng", dict), ("data", dict))
    if not isinstance(state, dict):
        raise ckpt.CheckpointError(f"{path}: trainer.pt is not a dict (corrupt)")
    bad = [name for name, kind in fields if not isinstance(state.get(name), kind)]
    if bad:
        raise ckpt.CheckpointError(f"{path}: trainer.pt lacks {', '.join(bad)} (corrupt)")
    if state["step"] != step:
        raise ckpt.CheckpointError(f"{path}: trainer.pt is for step {state['step']} (corrupt)")



def load_model(checkpoint_dir: Path, device: str | torch.device = "cpu") -> LanguageModel:
    """Rebuild the model a checkpoint was saved from and load its weights; a damaged or
    refused checkpoint raises CheckpointError (one line)."""
    from ten.model import TENConfig
    from ten.transformer import TransformerConfig

    path = Path(checkpoint_dir)
    saved = read_config(path)
    cls = TENConfig if saved["model_class"] == "TENLM" else TransformerConfig
    try:
        model = build_model(cls(**saved["model_config"])).to(device)
        model.load_state_dict(ckpt.load(path, "model.pt", device))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ckpt.CheckpointError(f"{path}: the model does not load "
                                   f"({type(e).__name__}: {_first_line(e)})") from None
    return model.eval()
