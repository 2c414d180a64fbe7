"""The training loop: build, a loop that fits on a screen, and its logging window.

Everything that must survive a restart — model, optimizer, scheduler, scaler, RNG
states, the data cursor, step and tokens seen — is saved together in one atomic
checkpoint (ten.train.trainstate, ten.train.checkpoint), and restoring it continues the run exactly:
the same batches, the same per-step losses, bit-identical weights. The step itself is
ten.train.step; the configuration, ten.config.

Host syncs are deliberate: the loss is accumulated on the device and read (``.item()``)
only at the logging interval, evaluation and checkpoints; under DDP the ranks agree on
stopping every ``STOP_AGREE_EVERY`` steps and at those points, never every step.

The loss never materializes B×T×V fp32 logits: the model's hidden states and head weight
go to ten.kernels.loss (chunked, or Liger's fused kernel on CUDA), in training and evaluation.

A step whose loss or gradient norm is not finite is skipped (no optimizer update), and
counted on the device; more than ``max_nonfinite_steps`` in a row, or non-finite weights
at a checkpoint, end the run with :class:`DivergedError` and nothing non-finite committed.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import os
import resource
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ten.config import FieldError, TrainConfig
from ten.kernels.loss import NextTokenLoss
from ten.model.lm import LanguageModel
from ten.model.presets import build_model
from ten.model.probes import repeat_recall
from ten.model.statehealth import state_health
from ten.train import seqwarmup
from ten.train.distributed import (
    DistInfo,
    StopAgreement,
    all_reduce_mean,
    init_from_env,
    shutdown,
)
from ten.train.execution import resolve_execution
from ten.train.memory import check_fits
from ten.train.metrics import MetricKind, MetricsWriter, Sink
from ten.train.mfu import hfu, mfu, peak_flops, peak_note
from ten.train.nonfinite import NonFiniteCounter
from ten.train.progress import eta_seconds, progress_line
from ten.train.schedule import Schedule
from ten.train.step import evaluate, train_step
from ten.train.stop import Stop
from ten.train.trainstate import (
    CheckpointManager,
    Pretrained,
    TrainState,
    first_line,
    seed_everything,
    weight_mismatches,
)

# A first loss after a resume above recorded * RESUME_JUMP[0] + RESUME_JUMP[1] (nats) is
# warned about: far past the step-to-step noise, a changed sequence length's or lr's jump.
RESUME_JUMP = (1.5, 1.0)

# Under DDP the ranks agree on a stop signal every this many steps (and at log, checkpoint
# and last steps): a stop is taken at most STOP_AGREE_EVERY - 1 steps after the step in
# flight when it came, for one host sync per 8 steps instead of one per step.
STOP_AGREE_EVERY = 8


class Outcome(enum.Enum):
    DONE = "done"
    PREEMPTED = "preempted"


@dataclass(frozen=True)
class RunResult:
    """What :meth:`Trainer.run` hands back: how it ended, where, the held-out loss at the
    end (None when stopped early), and the trained model (unwrapped)."""

    outcome: Outcome
    step: int
    tokens: int
    final_loss: float | None
    model: LanguageModel


class CompileError(Exception):
    """``TrainConfig.compile: true`` and torch.compile failed (one line with its reason, naming
    the field to turn off)."""


# --- set-up helpers (pure or nearly so) ---------------------------------------------------

def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("TrainConfig.device is 'cuda' but no CUDA device is visible; "
                           "use device: auto or cpu")
    return torch.device(name)


def make_deterministic() -> None:
    """``TrainConfig.deterministic``: the same inputs give the same bits on a GPU too, so a
    resumed run's steps equal those of a run never stopped (on a CPU they already do).
    cuBLAS keeps a fixed workspace only when told before its first handle is made (hence
    the runner calls this before its health gate's matmul), cuDNN stops benchmarking
    algorithms, and torch picks deterministic kernels, warning once for an op that has
    none. The project's own Triton kernels use no atomics: they are deterministic as
    they are."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True, warn_only=True)
    torch.backends.cudnn.benchmark = False


def build_optimizer(model: LanguageModel, cfg: TrainConfig, device: torch.device):
    groups = model.optimizer_groups(cfg.weight_decay)
    if cfg.optimizer == "adamw8bit":
        from ten.train.adamw8bit import AdamW8bit  # bitsandbytes: imported only when asked for

        return AdamW8bit(groups, lr=cfg.lr, betas=cfg.betas)
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, fused=device.type == "cuda")


# --- the loop --------------------------------------------------------------------------------

class Trainer:
    """Trains one run in ``run_dir``; resumes from its newest usable checkpoint.

    ``data`` is an object from ``ten.data.open_data``. ``identity`` holds what must not
    change across a resume (model shape, tokenizer, seq_len, ...); ``resolved`` is the
    full (secret-free) job, saved with every checkpoint. ``on_commit(path, seconds)`` is
    called on the main rank after each committed checkpoint, ``on_log(record)`` with each
    train record written to the metrics, ``on_step(step)`` after every step (cheap: it
    runs on the hot path; a liveness watchdog). ``stop``: the process's
    :class:`ten.train.stop.Stop` when a runner owns one (else the trainer's own, whose signal
    handlers are installed for the loop only); ``stop.request(reason)`` (thread-safe) ends
    the run after the current step with a checkpoint, like SIGTERM. ``pretrained``: the
    weights a run with no checkpoint of its own starts from (``TrainConfig.init_from``,
    loaded by the caller). ``sinks``: where the main rank's figures go besides
    metrics.jsonl and TensorBoard (:class:`ten.train.metrics.Sink`; closed with the run's).
    """

    def __init__(self, model_config: Any, data: Any, cfg: TrainConfig, run_dir: Path,
                 identity: dict[str, Any], resolved: dict[str, Any],
                 log: Callable[[str], None] = print,
                 on_commit: Callable[[Path, float], None] | None = None,
                 on_log: Callable[[dict[str, Any]], None] | None = None,
                 on_step: Callable[[int], None] | None = None,
                 stop: Stop | None = None, pretrained: Pretrained | None = None,
                 sinks: Sequence[Sink] = ()) -> None:
        self.model_config, self.data, self.cfg = model_config, data, cfg
        self.pretrained, self.sinks = pretrained, sinks
        self.run_dir, self.identity, self.resolved = Path(run_dir), identity, resolved
        self.log, self.on_commit, self.on_log, self.on_step = log, on_commit, on_log, on_step
        self.stop = Stop() if stop is None else stop
        if cfg.deterministic:
            make_deterministic()
        self.device = resolve_device(cfg.device)
        self.dist: DistInfo = init_from_env(self.device.type)
        if self.device.type == "cuda":
            self.device = torch.device("cuda", self.dist.local_rank)
        # explicit: an asked-for backend that cannot run raises here, before any work
        self.execution = resolve_execution(model_config, cfg.precision, cfg.loss, self.device)
        self.execution.set_torch_flags()
        self.tokens_per_step = (cfg.batch_size * data.cfg.seq_len * cfg.grad_accum
                                * self.dist.world_size)
        if cfg.seq_warmup_start is not None:
            try:
                seqwarmup.lengths(data.cfg.seq_len, cfg.seq_warmup_start)
            except ValueError as e:
                raise FieldError("seq_warmup_start", str(e), cfg.seq_warmup_start) from None
        if cfg.max_steps is not None:
            self.total_steps = cfg.max_steps
        else:
            self.total_steps = math.ceil(cfg.max_tokens / self.tokens_per_step)
        self.checkpoints = CheckpointManager(self.run_dir, cfg, self.dist, self.device, identity,
                                             resolved, model_config, log, on_commit)
        self.state: TrainState | None = None  # from run() on: what survives a restart
        self.no_sync: Callable[[], Any] | None = None  # DDP: skip the all-reduce
        self.any_rank: Callable[[torch.Tensor], None] | None = None  # DDP: max over ranks
        self.metrics: MetricsWriter | None = None  # the main rank's, from run() on
        self.length = data.cfg.seq_len  # the sequence length of the latest step
        self._flops_at: dict[int, tuple[float, float]] = {}  # length -> FLOPs per token


    @property
    def raw_model(self) -> LanguageModel:
        """The model being trained (unwrapped), once :meth:`run` has built it."""
        return self.state.model

    # -- the run --------------------------------------------------------------------------
    def run(self) -> RunResult:
        """Train to the budget or a stop request; the result says which, with the model."""
        try:
            return self._run()
        except torch._dynamo.exc.TorchDynamoException as e:
            if not self.cfg.compile:
                raise
            raise CompileError(f"torch.compile failed ({type(e).__name__}: "
                               f"{first_line(e)}); set TrainConfig.compile: false to train "
                               "without it") from None

    def _run(self) -> RunResult:
        model, loader, step, tokens = self._build()
        self.metrics = MetricsWriter(self.run_dir, sinks=self.sinks) \
            if self.dist.is_main else None
        self._start_record(step)
        with self.stop.in_loop():
            outcome, step, tokens = self._loop(model, loader, step, tokens)
        final_loss = None
        if outcome is Outcome.DONE:
            self.stop.set_phase("the final evaluation")  # what a stop now interrupts
            final_loss = self._eval(step)
        if self.metrics:
            self.metrics.write(MetricKind.END, step, {"outcome": outcome.value, "tokens": tokens})
            self.metrics.close()
        shutdown(self.dist)
        return RunResult(outcome, step, tokens, final_loss, self.state.model)

    def _build(self) -> tuple[torch.nn.Module, Any, int, int]:
        """Model, optimizer, schedule and data, resumed; returns the objective as trained
        (DDP-wrapped when distributed), the loader, and the step and tokens resumed at."""
        cfg = self.cfg
        seed_everything(cfg.seed)
        run = self.execution
        for note in run.notes:
            self._say(note)
        # before any weight is placed: a job the device cannot hold raises DeviceMemoryError
        self._say(check_fits(self.model_config, cfg.batch_size, self.data.cfg.seq_len,
                             run.amp_dtype, cfg.optimizer, self.device,
                             scan_backend=run.scan or "chunked", loss_backend=run.loss))
        self.data.check_splits(cfg.batch_size)  # before any step, not at the first eval
        model = build_model(run.model_config(self.model_config), self.device)
        optimizer = build_optimizer(model, cfg, self.device)
        self.state = TrainState(
            model=model, optimizer=optimizer,
            schedule=Schedule(cfg.schedule, self.total_steps, cfg.warmup_steps,
                              cfg.min_lr_ratio, cfg.decay_fraction),
            scaler=torch.amp.GradScaler(self.device.type,
                                        enabled=run.amp_dtype == torch.float16),
            loader=self.data.train_loader(cfg.batch_size, cfg.num_workers, self.dist.rank,
                                          self.dist.world_size,
                                          pin_memory=self.device.type == "cuda"),
            nonfinite=NonFiniteCounter(self.device))
        resumed = self.checkpoints.resume(self.state)
        if self.pretrained is not None and not resumed:
            self._start_from(self.pretrained)
        loader, step, tokens = self.state.loader, self.state.step, self.state.tokens
        anchor = self.state.schedule.anchor
        if anchor is not None and anchor.step == step and step < self.total_steps:
            self._say(self._schedule_changed(anchor.multiplier))
        # The objective (model + loss head) is what DDP wraps: DDP sees every parameter
        # used in its own forward; the model keeps returning logits elsewhere.
        self.objective = NextTokenLoss(self.state.model, self.execution.loss)
        model = self.objective
        if self.dist.enabled:
            import torch.distributed as dist
            from torch.nn.parallel import DistributedDataParallel as DDP

            model = DDP(model, device_ids=[self.device.index] if self.device.type == "cuda"
                        else None)
            self.no_sync = model.no_sync

            def any_rank(t: torch.Tensor) -> None:  # every rank skips the same steps
                dist.all_reduce(t, op=dist.ReduceOp.MAX)
            self.any_rank = any_rank
        if cfg.compile:
            # Regional: each block is compiled in place (its state_dict keys unchanged) and
            # the blocks share one compiled graph, so compile time does not grow with depth;
            # the loss head is already fused (ten.kernels.loss). Errors surface at the first call.
            self.state.model.compile_blocks()
            self._say("compile: every block with torch.compile (TrainConfig.compile)")
        model.train()
        return model, loader, step, tokens

    def _start_from(self, pretrained: Pretrained) -> None:
        """A new run's weights from a trained model (strict: every tensor, its shape)."""
        wrong = weight_mismatches(self.state.model, pretrained.weights)
        if wrong:
            raise ValueError(f"the weights of {pretrained.source} do not fit this model "
                             f"({'; '.join(wrong[:4])})")
        self.state.model.load_state_dict(pretrained.weights)
        self._say(f"starting from the weights of {pretrained.source}: its model, with a "
                  "fresh optimizer and lr schedule (TrainConfig.init_from)")

    def _schedule_changed(self, multiplier: float) -> str:
        """Said when a resume changed the budget or schedule (ten.train.schedule.Schedule)."""
        cfg, schedule = self.cfg, self.state.schedule
        hint = ("" if cfg.schedule == "wsd" else "; TrainConfig.schedule wsd keeps the peak lr "
                "until a final decay, so a budget extended before it goes on at the peak")
        return (f"lr: the budget or schedule changed at this resume, so the lr goes on from "
                f"{cfg.lr * multiplier:.3g}, where step {self.state.step} left it, to "
                f"{cfg.lr * schedule.min_ratio:.3g} at step {self.total_steps} "
                f"({cfg.schedule}), never jumping back up{hint}")

    def _start_record(self, step: int) -> None:
        """The FLOP counts MFU needs, the start record, and the notes said once."""
        cfg, seq_len = self.cfg, self.data.cfg.seq_len
        self.peak = peak_flops(self.device)
        self._say(peak_note(self.device))  # MFU/HFU are None from here on
        self._say(self._what_is_trained(step))
        if cfg.seq_warmup_start is not None and step < cfg.seq_warmup_steps:
            shorter = seqwarmup.lengths(seq_len, cfg.seq_warmup_start)[:-1]
            self._say(f"sequence-length warm-up: {', '.join(map(str, shorter))} tokens for "
                      f"steps 1-{cfg.seq_warmup_steps}, then {seq_len} (the same "
                      f"{self.tokens_per_step:,} tokens a step)")
        if self.metrics:
            self.metrics.write(MetricKind.START, step, {
                "params": self.state.model.num_params(), "tokens_per_step": self.tokens_per_step,
                "total_steps": self.total_steps, "world_size": self.dist.world_size,
                "device": str(self.device), "resumed": step > 0,
                "loss_backend": self.execution.loss, "peak_flops": self.peak})
        if self.cfg.warmup_steps >= self.total_steps:
            self.log(f"note: warmup_steps={self.cfg.warmup_steps} >= the {self.total_steps}"
                     "-step budget, so the lr never reaches its peak")

    def _what_is_trained(self, step: int) -> str:
        """The first screen's line: the model's size, the tokens a step and in all, the
        device, and the loss a uniform guess scores (ln V), to read the first losses by."""
        cfg, seq_len = self.cfg, self.data.cfg.seq_len
        params = self.state.model.num_params()
        where = str(self.device) + (f" ({torch.get_num_threads()} threads)"
                                    if self.device.type == "cpu" else "")
        ranks = f" x {self.dist.world_size} ranks" if self.dist.world_size > 1 else ""
        accum = f" x {cfg.grad_accum}" if cfg.grad_accum > 1 else ""
        vocab = self.model_config.vocab_size
        left = f"steps {step + 1}-{self.total_steps}" if step else f"{self.total_steps:,} steps"
        size = f"{params / 1e6:,.1f}M" if params >= 1e6 else f"{params / 1e3:,.1f}K"
        return (f"training {size} parameters on {where}: "
                f"{cfg.batch_size} x {seq_len}{accum}{ranks} = {self.tokens_per_step:,} tokens "
                f"a step, {left}, {self.total_steps * self.tokens_per_step:,} tokens in all; "
                f"a uniform guess scores loss ln {vocab:,} = {math.log(vocab):.2f}")

    def _loop(self, model: torch.nn.Module, loader: Any, step: int,
              tokens: int) -> tuple[Outcome, int, int]:
        cfg, stop, state = self.cfg, self.stop, self.state
        agree = StopAgreement(self.dist, self.device, STOP_AGREE_EVERY)
        window, last_loss = _Window(torch.zeros((), device=self.device)), None
        self.pace = _Pace(step)
        batches = iter(loader)
        while step < self.total_steps:
            t0 = time.perf_counter()
            micro = [next(batches).to(self.device, non_blocking=True)
                     for _ in range(cfg.grad_accum)]
            self.length = seqwarmup.length_at(step + 1, self.data.cfg.seq_len,
                                              cfg.seq_warmup_start, cfg.seq_warmup_steps)
            micro = [seqwarmup.split_rows(b, self.length) for b in micro]
            t1 = time.perf_counter()
            lr = state.lr  # the lr this step uses
            loss, norm, flags = train_step(model, state.optimizer, state.scaler, micro,
                                           self.execution.amp_dtype, cfg.grad_clip,
                                           self.no_sync, self.any_rank)
            state.scheduler.step()
            step += 1
            tokens += self.tokens_per_step
            if self.on_step is not None:
                self.on_step(step)
            state.nonfinite.add(flags)
            window.add_step(loss.masked_fill(flags.any(), 0.0), t1 - t0,
                            time.perf_counter() - t1)
            self.pace.stepped(step)
            log_due = step % cfg.log_every == 0 or step == self.total_steps
            if step == self.pace.first_step + 1 and not log_due:  # not silence till log_every
                self._say(f"first step done in {self.pace.first_step_s:.2f} s, loss "
                          f"{loss.item():.4f}; a line every {cfg.log_every} steps from here")
            save_due = step % cfg.checkpoint_every == 0 or step == self.total_steps
            # single process: every step, no sync; DDP: at agreement points only
            stopping = agree(step, stop.reason is not None, force=log_due or save_due)
            if log_due or stopping:
                last_loss = self._log_window(step, tokens, lr, norm, window)
                self._check_resumed_loss(last_loss)
                window = _Window(window.loss.zero_())
            if cfg.eval_every and step % cfg.eval_every == 0 and step < self.total_steps:
                t_eval = time.perf_counter()
                self._eval(step)
                window.eval += time.perf_counter() - t_eval  # not in tokens/s
            committed = False
            if stopping or save_due:
                before = self.checkpoints.seconds
                state.step, state.tokens = step, tokens
                committed = self.checkpoints.save(state, last_loss)
                window.checkpoint += self.checkpoints.seconds - before
            if stopping:
                self.log(f"stopped by {stop.reason or 'a peer'} after step {step}: " + (
                    f"checkpoint committed, {stop.then}" if committed else
                    f"not committed, {self.checkpoints.last_committed()}; {stop.then}"))
                return Outcome.PREEMPTED, step, tokens
        return Outcome.DONE, step, tokens

    def _check_resumed_loss(self, loss: float) -> None:
        """Once, at the first logged loss after a resume: one far above the loss the
        checkpoint recorded means weights that are not what was trained (replaced or
        damaged after the checkpoint was sealed, or a bug), which nothing else catches
        while they are finite."""
        resumed, self.checkpoints.resumed_at = self.checkpoints.resumed_at, None
        if resumed is None or not math.isfinite(loss):
            return
        step, recorded = resumed
        if loss > recorded * RESUME_JUMP[0] + RESUME_JUMP[1]:
            self._say(f"warning: the first loss after the resume, {loss:.4f}, is far above the "
                      f"{recorded:.4f} step {step} recorded: its weights may not be what was "
                      "trained (replaced or damaged after it was written); if the loss does "
                      "not come back down, resume from an earlier checkpoint (move this one "
                      "away)")

    def _log_window(self, step: int, tokens: int, lr: float, norm: torch.Tensor,
                    window: _Window) -> float:
        """The logging interval's record (metrics, progress line, on_log); returns the
        global batch's mean loss over its unskipped steps. Host syncs: here only."""
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # host sync: once per logging interval
        now = time.perf_counter()
        # The window's wall time less evaluation; checkpoint saves stay in (they are part
        # of training's cost; their share is checkpoint_frac).
        elapsed = now - window.start - window.eval
        stats = self.state.nonfinite.read()  # host sync (logging)
        self.checkpoints.check_divergence(step, stats)
        all_reduce_mean(window.loss, self.dist)  # the global batch's loss
        good = window.steps - stats.skipped
        last_loss = (window.loss / good).item() if good else math.nan  # host sync
        tok_s = window.steps * self.tokens_per_step / elapsed
        per_rank = tok_s / self.dist.world_size
        flops, recompute = self._flops(self.length)
        rec = {"loss": last_loss, "lr": lr, "grad_norm": norm.item(), "tokens": tokens,
               "tokens_per_s": tok_s, "mfu": mfu(flops, per_rank, self.peak),
               "hfu": hfu(flops, recompute, per_rank, self.peak),
               "data_wait_frac": window.data / elapsed,
               "compute_frac": window.compute / elapsed,
               "checkpoint_frac": window.checkpoint / elapsed,
               "step_time_s": elapsed / window.steps,
               "eta_s": self.pace.eta(step, self.total_steps, now),
               "skipped_steps": stats.skipped}
        if self.cfg.seq_warmup_start is not None:
            rec["seq_len"] = self.length  # the last step's
        if self.device.type == "cuda":
            rec["peak_mem_gb"] = torch.cuda.max_memory_allocated(self.device) / 2**30
        else:  # ru_maxrss is in KiB on Linux
            rec["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        if self.metrics:
            self.metrics.write(MetricKind.TRAIN, step, rec)
            if stats.skipped:
                self.log(f"skipped {stats.skipped} of steps {step - window.steps + 1}-{step}: "
                         f"non-finite {stats.what()}, no update applied")
            self.log(progress_line(step, self.total_steps, rec))
            if self.on_log is not None:
                self.on_log(rec)
        self.state.nonfinite.new_window()
        return last_loss

    def _flops(self, length: int) -> tuple[float, float]:
        """FLOPs per token at sequence length ``length``: the model's, and its
        recomputation's (MFU and HFU); counted once per length."""
        if length not in self._flops_at:
            model = self.state.model
            self._flops_at[length] = (model.flops_per_token(length),
                                      model.recompute_flops_per_token(length))
        return self._flops_at[length]

    def _say(self, note: str | None) -> None:
        """Log a set-up note once (the main rank), if there is one."""
        if note and self.dist.is_main:
            self.log(note)

    def _eval(self, step: int) -> float:
        batches = self.data.val_batches(self.cfg.batch_size, self.cfg.eval_batches)
        loss = evaluate(self.objective, batches, self.device, self.execution.amp_dtype)
        ppl = math.exp(min(loss, 50.0))
        if self.metrics:  # the main rank
            rec = {"loss": loss, "perplexity": ppl}
            said = f"eval step {step}: held-out loss {loss:.4f}, perplexity {ppl:.2f}"
            if self.cfg.recall_probe:
                rec["recall_repeat"] = repeat_recall(self.state.model, self.data.cfg.seq_len,
                                                     self.device, self.execution.amp_dtype)
                said += f", recalls {100 * rec['recall_repeat']:.1f}% of a repeat"
            self.metrics.write(MetricKind.EVAL, step, rec)
            self.log(said)
            if self.cfg.state_health:
                self._log_state(step)
        return loss

    def _log_state(self, step: int) -> None:
        """The state's health per layer (ten.model.statehealth) on the first held-out batch."""
        batch = next(iter(self.data.val_batches(self.cfg.batch_size, 1)))
        with torch.autocast(self.device.type, dtype=self.execution.amp_dtype or torch.float32,
                            enabled=self.execution.amp_dtype is not None):
            health = state_health(self.state.model, batch[:, :-1].to(self.device))
        if health:
            self.metrics.write(MetricKind.STATE, step, health)


@dataclass
class _Window:
    """One logging interval: the loss summed over its unskipped steps (on the device),
    seconds spent waiting for data, computing, checkpointing and evaluating (the last is
    left out of its elapsed time), its step count, and when it started."""

    loss: torch.Tensor
    data: float = 0.0
    compute: float = 0.0
    checkpoint: float = 0.0
    eval: float = 0.0
    steps: int = 0
    start: float = dataclasses.field(default_factory=lambda: time.perf_counter())

    def add_step(self, loss: torch.Tensor, data_s: float, compute_s: float) -> None:
        self.loss += loss
        self.data += data_s
        self.compute += compute_s
        self.steps += 1


class _Pace:
    """The run's pace for the ETA: steps done since (re)start, and how long the first of
    them took (compile, allocator warm-up) apart from the rest."""

    def __init__(self, first_step: int) -> None:
        self.first_step, self.first_step_s = first_step, 0.0
        self.t_start = time.perf_counter()

    def stepped(self, step: int) -> None:
        if step == self.first_step + 1:
            self.first_step_s = time.perf_counter() - self.t_start

    def eta(self, step: int, total: int, now: float) -> float | None:
        return eta_seconds(total - step, step - self.first_step, now - self.t_start,
                           self.first_step_s)


