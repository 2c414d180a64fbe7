"""What survives a restart: :class:`TrainState` (the weights, the optimizer and its
schedule, the data position, the RNGs, the step) and :class:`CheckpointManager`, which
saves, restores and prunes it; RNG states as tensors, a checkpoint's config and trainer
state checked before use, the identity a resume must keep, and a model rebuilt from a
checkpoint. The training loop never touches a file.

Everything here loads with ``weights_only=True`` (ten.train.checkpoint): a damaged or tampered
file raises ``CheckpointError`` in one line, never a KeyError or a pickle that runs code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ten.model.lm import LanguageModel
from ten.model.presets import CONFIG_OF_CLASS, EXECUTION_FIELDS, build_model, config_of
from ten.train import checkpoint as ckpt
from ten.train.distributed import barrier
from ten.train.nonfinite import NonFiniteCounter, NonFiniteStats
from ten.train.optimizer_state import for_optimizer
from ten.train.schedule import Schedule


class ResumeError(Exception):
    """The newest checkpoint cannot be resumed with this configuration (one line)."""


class DivergedError(Exception):
    """Training went non-finite and stayed so (one line naming the step, what was not
    finite, and to lower TrainConfig.lr). Nothing non-finite was committed."""


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


def read_config(path: Path) -> dict[str, Any]:
    """A checkpoint's ``config.json``; CheckpointError (one line) when it is unreadable or
    lacks a field, so a damaged one counts as a corrupt checkpoint, never a KeyError."""
    try:
        saved = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError, RecursionError) as e:
        raise ckpt.CheckpointError(f"{path}: unreadable config.json "
                                   f"({type(e).__name__}: {first_line(e)})") from None
    fields = (("identity", dict), ("resolved", dict), ("model_config", dict),
              ("model_class", str))
    if not isinstance(saved, dict):
        raise ckpt.CheckpointError(f"{path}: config.json is not a JSON object (corrupt)")
    bad = [name for name, kind in fields if not isinstance(saved.get(name), kind)]
    if bad:
        raise ckpt.CheckpointError(f"{path}: config.json lacks {', '.join(bad)} (corrupt)")
    return saved


def check_trainer_state(path: Path, state: Any, step: int) -> None:
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


def model_proper(identity: dict[str, Any]) -> dict[str, Any]:
    """The identity without the model fields that change how it computes, not what
    (ten.model.presets.EXECUTION_FIELDS): a resume may turn on checkpointing to fit a smaller
    GPU, or land where another scan backend runs."""
    model = identity.get("model")
    if not isinstance(model, dict):
        return identity
    return {**identity, "model": {k: v for k, v in model.items() if k not in EXECUTION_FIELDS}}


def with_new_fields(saved: dict[str, Any], model_class: Any,
                    current: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's identity with each model field it does not record, and ``current``
    has, at the field's default: a field added to the model's config after the
    checkpoint was made defaults to what the model did before it, so an older run
    resumes (a value other than the default is still a change)."""
    model, now = saved.get("model"), current.get("model")
    cls = CONFIG_OF_CLASS.get(model_class) if isinstance(model_class, str) else None
    if not isinstance(model, dict) or not isinstance(now, dict) or cls is None:
        return saved
    defaults = {f.name: f.default for f in dataclasses.fields(cls)
                if f.default is not dataclasses.MISSING}
    added = {k: defaults[k] for k in now if k not in model and k in defaults}
    return {**saved, "model": {**model, **added}} if added else saved


def refuse_unsafe_resume(run_dir: Path, known: dict[str, Any]) -> None:
    """Before the data is prepared: ResumeError when the newest committed checkpoint in
    ``run_dir`` was made with another value of a key that ``known`` holds (the part of
    the identity a caller knows without the data: arch, model, seq_len, mode, batch
    size), so a changed job is refused in seconds, not after tokenizing. The full check,
    the data's fingerprint included, still comes at the resume; a checkpoint whose
    config cannot be read is left to it."""
    root = Path(run_dir) / "checkpoints"
    steps = ckpt.committed_steps(root)
    if not steps:
        return
    path = root / ckpt.step_name(steps[-1])
    try:
        config = read_config(path)
    except ckpt.CheckpointError:
        return
    saved = model_proper(with_new_fields(config["identity"], config["model_class"], known))
    _refuse_changes(run_dir, path, config_diff(_restricted(saved, known), model_proper(known)))


def _refuse_changes(run_dir: Path, path: Path, unsafe: list[str]) -> None:
    if unsafe:
        raise ResumeError(f"cannot resume {run_dir} from {path.name}: unsafe changes "
                          f"({'; '.join(unsafe)}); restore those settings or use a new "
                          "job name")


def _restricted(value: Any, keys: Any) -> Any:
    """``value`` with only the (nested) keys that ``keys`` has."""
    if isinstance(value, dict) and isinstance(keys, dict):
        return {k: _restricted(value.get(k), v) for k, v in keys.items()}
    return value


@dataclass(frozen=True)
class Pretrained:
    """A trained model's weights that a new run starts from instead of random ones
    (fine-tuning; ``TrainConfig.init_from``), and where they came from (for the log).
    A run that has a checkpoint of its own resumes that instead."""

    weights: dict[str, torch.Tensor]
    source: str


def weight_mismatches(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> list[str]:
    """How ``weights`` do not fit ``model``: each tensor missing, extra, or of another
    shape, as 'name: shape -> shape' ('-' for none); empty when they load."""
    have = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    given = {k: tuple(v.shape) for k, v in weights.items()}
    return [f"{k}: {given.get(k, '-')} -> {have.get(k, '-')}"
            for k in sorted(set(have) | set(given)) if have.get(k) != given.get(k)]


# The software a checkpoint was made with: recorded in it, compared at a resume.
STACK = ("ten-runner", "torch", "triton", "numpy", "sentencepiece")


def stack_versions() -> dict[str, str]:
    """Python's, CUDA's (as torch was built for it) and each of :data:`STACK`'s installed
    versions ('-' for one not installed)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    return {"python": platform.python_version(), "cuda": torch.version.cuda or "-",
            **{name: installed(name) for name in STACK}}


def stack_changes(saved: dict[str, Any] | None, now: dict[str, str]) -> list[str]:
    """'torch 2.11.0 -> 2.13.0' for each version in ``now`` (:func:`stack_versions`) that
    differs from a checkpoint's recorded ``saved`` (none for one that recorded none)."""
    return [f"{name} {was} -> {now.get(name, '-')}" for name, was in (saved or {}).items()
            if now.get(name, "-") != was]


def first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


def load_model(checkpoint_dir: Path, device: str | torch.device = "cpu") -> LanguageModel:
    """Rebuild the model a checkpoint was saved from and load its weights; a damaged or
    refused checkpoint raises CheckpointError (one line)."""
    path = Path(checkpoint_dir)
    saved = read_config(path)
    try:
        model = build_model(config_of(saved["model_class"], saved["model_config"]), device)
        model.load_state_dict(ckpt.load(path, "model.pt", device))
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ckpt.CheckpointError(f"{path}: the model does not load "
                                   f"({type(e).__name__}: {first_line(e)})") from None
    return model.eval()


@dataclass(frozen=True)
class TrainedRun:
    """A trained run's model (eval mode) and the tokenizer it was trained with."""

    model: LanguageModel
    tokenizer: Any  # ten.data.Tokenizer
    step: int


def load_run(run_dir: str | Path, step: int | None = None,
             device: str | torch.device = "cpu") -> TrainedRun:
    """The model of a run directory (what ``ten-runner run`` leaves in
    ``runs/<name>``) at its newest committed checkpoint, or at ``step``'s, with the
    run's ``tokenizer.model``. A missing, damaged or unknown step raises CheckpointError
    (one line naming what is there)."""
    from ten.data import Tokenizer

    run_dir = Path(run_dir)
    quiet = lambda line: None  # noqa: E731 - a damaged newer one is skipped, as on resume
    found = ckpt.find(run_dir / "checkpoints", step, quiet)
    if not (run_dir / "tokenizer.model").is_file():
        raise ckpt.CheckpointError(f"{run_dir / 'tokenizer.model'} is missing: the run's "
                                   "tokenizer is copied there when training starts")
    return TrainedRun(load_model(found.path, device), Tokenizer(run_dir / "tokenizer.model"),
                      found.step)


@dataclass
class TrainState:
    """What survives a restart: the weights, the optimizer and its schedule, the loss
    scaler, the data position, the RNGs, the non-finite streak, and how far training got
    (``step``, ``tokens``). The loop trains it; :class:`CheckpointManager` saves and
    restores it through :meth:`state_dict` / :meth:`load_state_dict`. ``scheduler``
    (a LambdaLR over ``schedule``) is made here, so a resume that anchors the schedule
    changes what it computes."""

    model: LanguageModel
    optimizer: Any
    schedule: Schedule
    scaler: Any
    loader: Any
    nonfinite: NonFiniteCounter
    step: int = 0
    tokens: int = 0
    scheduler: Any = dataclasses.field(init=False)
    peak_lr: float = dataclasses.field(init=False)  # this run's TrainConfig.lr

    def __post_init__(self) -> None:
        if self.optimizer is not None:
            self.peak_lr = self.optimizer.param_groups[0]["lr"]  # before any resume
            self.scheduler = torch.optim.lr_scheduler.LambdaLR(
                self.optimizer, lambda step: self.schedule(step))

    @property
    def lr(self) -> float:
        """The lr the next step uses."""
        return self.optimizer.param_groups[0]["lr"]

    def state_dict(self, *, world_size: int, nonfinite_streak: int) -> dict[str, Any]:
        """The checkpoint's files by name: tensors and plain containers only."""
        return {
            "model.pt": self.model.state_dict(),
            "optimizer.pt": self.optimizer.state_dict(),
            "trainer.pt": {"step": self.step, "tokens": self.tokens,
                           "scheduler": self.scheduler.state_dict(),
                           "schedule_anchor": self.schedule.saved(),
                           "scaler": self.scaler.state_dict(), "rng": rng_state(),
                           "data": self.loader.state_dict(), "world_size": world_size,
                           "nonfinite_streak": nonfinite_streak},
        }

    def load_state_dict(self, files: dict[str, Any], where: Path) -> None:
        """Apply what :meth:`state_dict` saved (loaded already, so a refused file left no
        trace); a file that does not fit this run is a CheckpointError naming it."""
        trainer = files["trainer.pt"]
        for name, apply in (("model.pt", self.model.load_state_dict),
                            ("optimizer.pt", self._load_optimizer),
                            ("trainer.pt", self._load_trainer)):
            try:
                apply(files[name])
            except (KeyError, TypeError, ValueError, RuntimeError, IndexError,
                    AttributeError) as e:  # a malformed state; DataError (cursor) passes
                raise ckpt.CheckpointError(f"{where}: {name} does not fit this run "
                                           f"({type(e).__name__}: {first_line(e)})") from None
        self.step, self.tokens = trainer["step"], trainer["tokens"]

    def _load_optimizer(self, state: dict[str, Any]) -> None:
        """The saved moments, from either of the job's optimizers (a run may change
        ``train.optimizer`` at a resume: ten.train.optimizer_state)."""
        self.optimizer.load_state_dict(for_optimizer(state, self.optimizer))

    def _load_trainer(self, state: dict[str, Any]) -> None:
        self._load_schedule(state)
        self.scaler.load_state_dict(state["scaler"])
        set_rng_state(state["rng"])
        self.loader.load_state_dict(state["data"])  # a mismatched cursor raises DataError
        self.nonfinite = NonFiniteCounter(self.nonfinite.streak.device,
                                          int(state.get("nonfinite_streak", 0)))

    def _load_schedule(self, state: dict[str, Any]) -> None:
        """The saved schedule position, continued under this run's settings: a changed
        budget or schedule goes on from the multiplier the run had (ten.train.schedule); a
        changed peak lr takes effect at once (the saved scheduler would keep the old)."""
        self.scheduler.load_state_dict(state["scheduler"])
        saved_peak = self.scheduler.base_lrs[0]
        was = self.scheduler.get_last_lr()[0] / saved_peak
        self.schedule = self.schedule.with_saved(state.get("schedule_anchor")).continued(
            int(state["step"]), was)
        if self.peak_lr != saved_peak:
            peak = self.peak_lr
            self.scheduler.base_lrs = [peak] * len(self.optimizer.param_groups)
            for group in self.optimizer.param_groups:
                group["initial_lr"], group["lr"] = peak, peak * was


class CheckpointManager:
    """Saves, restores and prunes a run's :class:`TrainState` under
    ``<run_dir>/checkpoints`` (ten.train.checkpoint: atomic folders, manifest last). Only the
    main rank writes; every rank restores. ``identity``: what a resume must keep (the
    model's shape, the tokenizer, ...); ``resolved``: the whole job, saved with each
    checkpoint; ``on_commit(path, seconds)`` after each commit. ``seconds``: the time
    spent checkpointing so far (the log's checkpoint_frac)."""

    def __init__(self, run_dir: Path, cfg: Any, dist: Any, device: torch.device,
                 identity: dict[str, Any], resolved: dict[str, Any], model_config: Any,
                 log: Callable[[str], None],
                 on_commit: Callable[[Path, float], None] | None = None) -> None:
        self.run_dir, self.root, self.device = run_dir, run_dir / "checkpoints", device
        self.cfg, self.dist, self.log, self.on_commit = cfg, dist, log, on_commit
        self.identity, self.resolved, self.model_config = identity, resolved, model_config
        self.versions = stack_versions()  # recorded in every checkpoint (config.json)
        # (step, loss) the checkpoint resumed from recorded: the first losses after it
        # should be near (ten.train.trainer checks)
        self.resumed_at: tuple[int, float] | None = None
        self.seconds = 0.0

    def save(self, state: TrainState, last_loss: float | None) -> bool:
        """Commit a checkpoint of ``state``; False when it is not committed because the
        latest step was skipped as non-finite."""
        t0 = time.perf_counter()
        try:
            return self._save(state, last_loss, t0)
        finally:
            self.seconds += time.perf_counter() - t0

    def _save(self, state: TrainState, last_loss: float | None, t0: float) -> bool:
        # Every rank holds the same weights and flags, so every rank decides alike.
        stats = state.nonfinite.read()  # host sync: once per checkpoint
        self.check_divergence(state.step, stats)
        self._check_weights_finite(state)
        if stats.streak:
            # Weights whose latest steps gave a non-finite loss are suspect even when they
            # are finite: committing them could push good checkpoints out (keep_last) and
            # a relaunch with a lower lr would resume from them.
            if self.dist.is_main:
                self.log(f"not committing a checkpoint at step {state.step}: its last "
                         f"{stats.streak} step(s) had a non-finite "
                         f"{stats.what(streak=True)} ({self.last_committed()})")
            return False
        if self.dist.is_main:
            config = {"identity": self.identity, "resolved": self.resolved,
                      "model_config": dataclasses.asdict(self.model_config),
                      "model_class": type(state.model).__name__,
                      "versions": self.versions}
            files = state.state_dict(world_size=self.dist.world_size,
                                     nonfinite_streak=stats.streak)
            files["config.json"] = json.dumps(config, indent=1, default=str).encode()
            path = ckpt.save(self.root, state.step, files, meta={
                "step": state.step, "tokens": state.tokens, "loss": last_loss})
            ckpt.prune(self.root, self.cfg.keep_last)
            if self.on_commit is not None:
                self.on_commit(path, time.perf_counter() - t0)
        barrier(self.dist)
        return True

    def check_divergence(self, step: int, stats: NonFiniteStats) -> None:
        """DivergedError once more steps in a row than TrainConfig.max_nonfinite_steps were
        non-finite."""
        limit = self.cfg.max_nonfinite_steps
        if stats.worst > limit:
            raise DivergedError(
                f"training diverged: {stats.worst} steps in a row had a non-finite "
                f"{stats.what(streak=stats.streak > 0)} (by step {step}; "
                f"TrainConfig.max_nonfinite_steps is {limit}); their updates were skipped and "
                f"nothing non-finite was committed ({self.last_committed()}); lower "
                f"TrainConfig.lr (now {self.cfg.lr:g})")

    def _check_weights_finite(self, state: TrainState) -> None:
        with torch.no_grad():
            finite = torch.stack([torch.isfinite(p).all() for p in state.model.parameters()])
        if not bool(finite.all()):  # host sync: once per checkpoint
            raise DivergedError(
                f"training diverged: the weights are not finite at step {state.step}, so "
                f"they are not committed ({self.last_committed()}); lower TrainConfig.lr "
                f"(now {self.cfg.lr:g})")

    def last_committed(self) -> str:
        steps = ckpt.committed_steps(self.root)
        return f"the last checkpoint is step {steps[-1]}" if steps else "no checkpoint yet"

    def resume(self, state: TrainState) -> bool:
        """Restore the newest checkpoint that verifies and loads into ``state``; an
        unusable one (corrupt, malformed, refused by weights_only) is reported in one line
        and the one before it tried. Committed checkpoints of which none is usable raise
        ResumeError: a run is never silently restarted from scratch over its own
        checkpoints. Nothing committed: ``state`` stays at step 0 (returns False)."""
        if self.dist.is_main:
            ckpt.cleanup(self.root, self.log)
        barrier(self.dist)
        for found in ckpt.valid_checkpoints(self.root, self.log):
            try:
                self._restore(found, state)
                return True
            except ckpt.CheckpointError as e:
                self.log(f"skipping unusable checkpoint: {e}")
        committed = ckpt.committed_steps(self.root)
        if committed:
            raise ResumeError(f"cannot resume {self.run_dir}: none of its {len(committed)} "
                              "committed checkpoint(s) is usable (see above); restore one "
                              f"from a trusted copy, or move {self.root} away to start over")
        return False

    def _restore(self, found: ckpt.Found, state: TrainState) -> None:
        path = found.path
        saved = read_config(path)
        recorded = with_new_fields(saved["identity"], saved["model_class"], self.identity)
        _refuse_changes(self.run_dir, path, config_diff(model_proper(recorded),
                                                        model_proper(self.identity)))
        added = sorted(set(recorded["model"]) - set(saved["identity"]["model"])) \
            if recorded is not saved["identity"] else []
        if added:
            self.log(f"{path.name} predates model field(s) {', '.join(added)}: resuming with "
                     "their defaults, which keep the model as it was")
        files = {"model.pt": ckpt.load(path, "model.pt", self.device),
                 "optimizer.pt": ckpt.load(path, "optimizer.pt", self.device),
                 "trainer.pt": ckpt.load(path, "trainer.pt")}
        check_trainer_state(path, files["trainer.pt"], found.step)
        changed = config_diff(saved["resolved"], self.resolved)
        if changed:
            self.log(f"resuming with changed settings: {'; '.join(changed)}")
        moved = stack_changes(saved.get("versions"), self.versions)
        if moved:
            self.log(f"resuming on other software than {path.name} was made with: "
                     f"{', '.join(moved)} (a step may then round differently)")
        state.load_state_dict(files, path)
        loss = (found.manifest.get("meta") or {}).get("loss")
        if isinstance(loss, (int, float)) and math.isfinite(loss):
            self.resumed_at = (found.step, float(loss))
        self.log(f"resumed from {path} (step {state.step}, {state.tokens:,} tokens)")
