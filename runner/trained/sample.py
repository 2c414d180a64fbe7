"""Text from a trained model: the end-of-run sample and ``ten-runner sample``."""

from __future__ import annotations

import sys
import unicodedata
from pathlib import Path
from typing import Any


def ppl(loss: float) -> float:
    import math

    return math.exp(min(loss, 50.0))


def shown_text(text: str) -> str:
    """Generated text for a log line: as text, not a Python repr; its further lines
    indented under the first; control characters (which a terminal would act on) shown
    as U+FFFD."""
    clean = "".join("\ufffd" if unicodedata.category(c) == "Cc" and c not in "\n\t" else c
                    for c in text)
    return clean.replace("\n", "\n  ")


def generate_text(model: Any, tokenizer: Any, prompt: str, max_new_tokens: int,
                  temperature: float, top_k: int | None, seed: int) -> str:
    import torch

    device = next(model.parameters()).device
    ids = tokenizer.encode(prompt) or [tokenizer.eos_id]
    gen = torch.Generator(device=device).manual_seed(seed)
    out = model.generate(torch.tensor([ids], device=device), max_new_tokens,
                         temperature=temperature, top_k=top_k, generator=gen)
    return tokenizer.decode(out[0].tolist())


def sample_run(where: str | Path, prompt: str, max_new_tokens: int, temperature: float,
               top_k: int, seed: int, job: str | None = None,
               endpoint_url: str | None = None, step: int | None = None) -> str:
    """Text generated from the newest valid checkpoint (or ``step``'s) of a run: a run
    directory, a local store and ``job``, or a bucket run (``s3://bucket/prefix/JOB``, or
    the store URL and ``job``), whose checkpoint and tokenizer are downloaded first."""
    run_dir, name, found, model = trained_model(where, job, endpoint_url, step)
    text = generate_text(model, run_tokenizer(run_dir, found), prompt, max_new_tokens,
                         temperature, top_k, seed)
    return f"[{name} step {found.step}] {text}"


def run_tokenizer(run_dir: Path, found: Any) -> Any:
    """The run's tokenizer.model, checked to be the one the checkpoint ``found`` was
    trained with (the fingerprint its identity records): the same ids decode to other
    words under any other. UserError (exit 3, one line naming the file) when it is
    damaged or another tokenizer."""
    from runner.errors import UserError
    from runner.exit_codes import ExitCode
    from ten.data import DataError, Tokenizer
    from ten.train.trainstate import read_config

    path = run_dir / "tokenizer.model"
    try:
        tokenizer = Tokenizer(path)
    except DataError:
        raise UserError(f"{path} is not a sentencepiece model: the run's tokenizer is "
                        "damaged; bring back the one it was trained with (the bucket's "
                        "copy, or the prepared data's)", ExitCode.DATA) from None
    trained_with = (read_config(found.path)["identity"].get("data") or {}).get("tokenizer")
    if trained_with is not None and tokenizer.fingerprint != trained_with:
        raise UserError(f"{path} is not the tokenizer step {found.step} was trained with "
                        f"(fingerprint {tokenizer.fingerprint}, the checkpoint's "
                        f"{trained_with}); bring back that one", ExitCode.DATA)
    return tokenizer


def trained_checkpoint(where: str | Path, job: str | None = None,
                       endpoint_url: str | None = None, step: int | None = None):
    """(run directory, job name, the checkpoint) of a trained run: a run directory, a local
    store and ``job``, or a bucket run (``s3://bucket/prefix/JOB``, or the store URL and
    ``job``) brought here first. The newest committed checkpoint, or ``step``'s; the run's
    tokenizer.model is checked to be there. UserError (one line) when something is not."""
    from runner.errors import UserError
    from ten.train import checkpoint as ckpt

    if "://" in str(where):
        run_dir, name = fetch_remote_run(str(where), job, endpoint_url, step)
    else:
        run_dir = Path(where) / job if job else Path(where)
        name = run_dir.name
    root = run_dir / "checkpoints"
    try:
        found = ckpt.find(root, step, report=lambda s: print(s, file=sys.stderr))
    except ckpt.CheckpointError as e:
        first = "; run the job first (ten-runner run JOB.yaml)" if step is None else ""
        raise UserError(f"{e}{first}") from None
    if not (run_dir / "tokenizer.model").is_file():
        raise UserError(f"{run_dir / 'tokenizer.model'} is missing; it is written when the "
                        "job starts")
    _refuse_foreign(run_dir, name, found)
    return run_dir, name, found


def _refuse_foreign(run_dir: Path, name: str, found: Any) -> None:
    """UserError when the checkpoint ``found`` belongs to another run (its recorded job
    has another name than the run's job.json, or than the bucket run's): one copied in
    would be sampled or exported as this run's."""
    import json

    from runner.errors import UserError
    from ten.train import checkpoint as ckpt
    from ten.train.trainstate import read_config

    try:
        owner = read_config(found.path)["resolved"].get("name")
    except ckpt.CheckpointError:
        return  # damaged: loading it says so
    try:
        name = json.loads((run_dir / "job.json").read_text())["name"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # a bucket run's copy here has none: the name it was asked by
    if owner is not None and owner != name:
        raise UserError(f"{found.path} is a checkpoint of run {owner!r}, not of {name!r}: "
                        "it was put there from another run; remove it, or name one of "
                        "this run's steps with --step")


def trained_model(where: str | Path, job: str | None = None, endpoint_url: str | None = None,
                  step: int | None = None, attempts: int = 3):
    """(run directory, job name, checkpoint, model) of a trained run (see
    :func:`trained_checkpoint`). A run in progress prunes old checkpoints while it is
    read: the newest one vanishing between being found and being loaded (or downloaded)
    is a race, not damage, so the newest is looked up again."""
    from runner.errors import UserError
    from runner.storage import StorageError

    for attempt in range(attempts):
        try:
            run_dir, name, found = trained_checkpoint(where, job, endpoint_url, step)
            return run_dir, name, found, load_trained_model(found.path)
        except (UserError, StorageError):
            if step is not None or attempt + 1 == attempts:
                raise
    raise AssertionError("unreachable")


def load_trained_model(path: Path) -> Any:
    """The model of a checkpoint folder, on the CPU, in eval mode; UserError (one line
    naming the folder) when it does not load."""
    from runner.errors import UserError
    from ten.train import checkpoint as ckpt
    from ten.train.trainstate import load_model

    try:
        return load_model(path)
    except ckpt.CheckpointError as e:
        raise UserError(str(e)) from None


def sample_cache_dir(store_url: str, job: str) -> Path:
    """Where a bucket run's checkpoint is kept for sampling: under ``$TEN_CACHE_DIR`` (or
    ~/.cache/ten), apart from any training working copy (``<cache>/runs/<store>/<job>``) so
    sampling never touches a run in progress on this machine."""
    from runner.storage import StoreURL
    from ten.data.config import cache_root

    return cache_root() / "samples" / StoreURL.parse(store_url).key() / job


def fetch_remote_run(url: str, job: str | None, endpoint_url: str | None = None,
                     step: int | None = None) -> tuple[Path, str]:
    """Bring a bucket run's newest committed checkpoint (or ``step``'s) and
    ``<job>/tokenizer.model`` to :func:`sample_cache_dir`; returns (that directory, the
    job's name). Only that checkpoint is kept there."""
    import os
    import shutil

    from runner.errors import UserError
    from runner.storage import COMMAND_SETTINGS, StorageError, open_store
    from runner.storage.checkpoints import (
        NoWholeCheckpoint,
        download_checkpoint,
        restore_latest,
    )
    from ten.train import checkpoint as ckpt

    if job is None:  # s3://bucket/prefix/JOB
        parent, _, name = url.rstrip("/").rpartition("/")
        if not name or parent.endswith(":/"):
            raise UserError(f"{url}: name the run, as s3://bucket/prefix/JOB or with --job")
        url, job = parent, name
    store = open_store(url, endpoint_url or None, names=COMMAND_SETTINGS)
    where = f"{store.url.rstrip('/')}/{job}"
    run_dir = sample_cache_dir(store.url, job)
    root = run_dir / "checkpoints"
    if step is not None:
        try:
            download_checkpoint(store, job, step, root)
        except StorageError as e:
            raise UserError(f"step {step} of {where} cannot be had: {e}") from None
    else:
        try:
            step = restore_latest(store, job, root, report=lambda s: print(s, file=sys.stderr))
        except NoWholeCheckpoint as e:
            raise StorageError(f"{e} (a running job replaces its checkpoints as it goes: "
                               "try again)") from None
    if step is None:
        raise UserError(f"no committed checkpoint under {where}/checkpoints; the run has "
                        "not committed one yet (or the URL names no run)")
    for old in ckpt.committed_steps(root):  # keep only what is sampled
        if old != step:
            shutil.rmtree(root / ckpt.step_name(old), ignore_errors=True)
    data = store.get_bytes(f"{job}/tokenizer.model")
    if data is None:
        raise UserError(f"{where}/tokenizer.model is missing; a run puts it there when it "
                        "starts, so restart the job once with this runner version")
    tmp = run_dir / f".tokenizer.model.{os.getpid()}"
    tmp.write_bytes(data)
    os.replace(tmp, run_dir / "tokenizer.model")
    return run_dir, job
