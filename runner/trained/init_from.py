"""``train.init_from``: the trained model a new run starts from (fine-tuning).

A run directory (or a run's name in ./runs), a bucket run (``s3://bucket/prefix/JOB``,
its newest committed checkpoint brought here as ``ten-runner sample`` does) or a folder
``export-model`` wrote. What comes back is the model and its tokenizer: the new run
tokenizes its data with that tokenizer (another would give the ids other meanings), and
its model must be the source's, which :func:`check_fits` says before any data is
prepared.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode


class InitFromError(UserError):
    """The source cannot start this run: the job's fix, one line (exit 2)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"train.init_from {where}: {message}", exit_code=ExitCode.CONFIG)


@dataclass(frozen=True)
class Source:
    model: Any  # the trained LanguageModel, on the CPU
    tokenizer: Any  # its ten.data.Tokenizer
    folder: Path  # on this machine: the run directory or the exported folder
    label: str  # for the log: "runs/base step 200"


def load_source(where: str, endpoint_url: str | None = None) -> Source:
    """The model and tokenizer ``where`` names; InitFromError when it names none, or
    StorageError (exit 4, a relaunch retries) when its bucket cannot be read."""
    from runner.storage import StorageError
    from runner.trained.hf_folder import is_export, load_exported
    from runner.trained.sample import run_tokenizer, trained_model

    run = where
    if "://" not in where:
        folder = _local(where)
        if is_export(folder):
            try:
                model, tokenizer = load_exported(folder)
            except UserError as e:
                raise InitFromError(where, e.message) from None
            return Source(model, tokenizer, folder, f"{where} (exported)")
        run = str(folder)
    try:
        run_dir, _, found, model = trained_model(run, None, endpoint_url)
        tokenizer = run_tokenizer(run_dir, found)
    except StorageError:
        raise
    except UserError as e:
        raise InitFromError(where, e.message) from None
    return Source(model, tokenizer, run_dir, f"{where} step {found.step}")


def _local(where: str) -> Path:
    """A path here, or a run's name in the default store."""
    from runner.storage import DEFAULT_STORE, run_by_name

    folder = Path(where).expanduser()
    if folder.is_dir():
        return folder
    found = run_by_name(where)
    if found is not None:
        return found
    raise InitFromError(where, f"no such run directory or exported folder (nor a run of "
                               f"that name in {DEFAULT_STORE})")


# Model fields a fine-tune may set otherwise: the length it trains at (no weight depends
# on it), those read only to make the first weights (ten.model.presets.INIT_FIELDS) and those
# that change how the model computes, not what (EXECUTION_FIELDS).
FREE_FIELDS = frozenset({"seq_len"})


def check_fits(where: str, source: Source, model_config: Any) -> None:
    """InitFromError unless this job's model (``model_config``, with the source's
    vocabulary) is the source's: the same architecture, and every field that shapes a
    weight or gives it its meaning (``selective`` reads the same tensors another way) the
    same; the message names each that differs."""
    import torch

    from ten.model.config import MODEL_CONFIGS
    from ten.model.presets import EXECUTION_FIELDS, INIT_FIELDS, build_model
    from ten.train.trainstate import weight_mismatches

    theirs = source.model.config
    if type(theirs) is not type(model_config):
        arch = {cls: name for name, cls in MODEL_CONFIGS.items()}
        raise InitFromError(where, f"it is a {arch[type(theirs)]} model, this job's a "
                                   f"{arch[type(model_config)]}; set model.arch: "
                                   f"{arch[type(theirs)]}")
    ours = dataclasses.asdict(model_config)
    differ = [f"model.{k} {v} there, {ours[k]} here"
              for k, v in dataclasses.asdict(theirs).items()
              if k not in EXECUTION_FIELDS | INIT_FIELDS | FREE_FIELDS and ours.get(k) != v]
    if differ:
        raise InitFromError(where, f"its model does not fit this job's ({'; '.join(differ)}"
                                   "); give the job the model it was trained with")
    with torch.device("meta"):  # shapes only: no memory, no time
        wrong = weight_mismatches(build_model(model_config), source.model.state_dict())
    if wrong:  # the same settings, other tensors: the runner's versions differ
        raise InitFromError(where, f"its weights do not fit this job's model "
                                   f"({'; '.join(wrong[:4])})")


def check_tokenizer(where: str, source: Source, job_tokenizer: Path | None) -> None:
    """A job that names its own tokenizer must name the source's: the weights know its
    ids and no other's."""
    if job_tokenizer is None:
        return
    from ten.data import Tokenizer

    if Tokenizer(job_tokenizer).fingerprint != source.tokenizer.fingerprint:
        raise InitFromError(where, f"data.tokenizer.path {job_tokenizer} is not the tokenizer "
                                   f"{source.label} was trained with; leave data.tokenizer.path "
                                   "unset to use that one")
