"""Checks that span fields, or need the model and data code (imported lazily: torch).

Each returns ``[(path, message), ...]`` so the caller can name the line.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from runner.job.errors import describe_hidden, shorten, show, suggest
from runner.job.schema import JobSchema, ModelSection, model_fields
from ten.config import FP8_HEAD_LOSSES, FieldError, budget_problem

Path_ = tuple[str | int, ...]
Found = list[tuple[Path_, str]]
_PATH_MAX = 4096  # Linux's; longer is no path on any system we run on


def budget(data: dict[str, Any]) -> Found:
    """Exactly one of train.max_steps / train.max_tokens (checked on the raw mapping, so
    it is reported alongside every other problem)."""
    train = data.get("train")
    if not isinstance(train, dict):
        return []
    broken = budget_problem(train.get("max_steps"), train.get("max_tokens"))
    if broken is None:
        return []
    field, why = broken
    return [(("train", field) if field else ("train",), why)]


def cross(job: JobSchema) -> Found:
    found: Found = []
    t, d = job.train, job.data
    step_tokens = t.batch_size * t.grad_accum * d.seq_len
    if t.max_tokens is not None and t.max_tokens < step_tokens:
        found.append((("train", "max_tokens"),
                      f"{t.max_tokens} is less than one optimizer step (batch_size × grad_accum "
                      f"× data.seq_len = {step_tokens} tokens)"))
    if t.optimizer == "adamw8bit" and t.device == "cpu":
        found.append((("train", "optimizer"), "adamw8bit needs a CUDA device (hint: use adamw "
                      "with device: cpu)"))
    found += _seq_warmup(t, d.seq_len)
    if job.model.overrides.get("fp8_head") and t.loss not in FP8_HEAD_LOSSES:
        found.append((("train", "loss"), f"{t.loss} runs the head in the autocast dtype; "
                      "model.fp8_head needs loss chunked, fused or auto"))
    if d.tokenizer.path is not None and "vocab_size" in d.tokenizer.model_fields_set:
        found.append((("data", "tokenizer", "vocab_size"), "give either tokenizer.path or "
                      "tokenizer.vocab_size, not both (the .model file fixes the vocabulary)"))
    return found


def card_memory(job: Any) -> Found:
    """A job that trains on GPUs (resources.gpus >= 1) whose estimated memory exceeds its
    resources.accelerator's: what ``run`` would refuse once on the card (ten.train.memory, the
    same estimate and margin), said before one is rented. Imports torch; seconds."""
    from runner.keys import in_job_terms

    resources, train = job.resources, job.train
    if resources.gpus < 1 or train.device == "cpu":
        return []
    from ten.train.execution import planned_for_cuda
    from ten.train.memory import DeviceMemoryError, check_fits_card

    cfg = job.model_settings(job.data.tokenizer.vocab_size)
    plan = planned_for_cuda(cfg, train.precision, train.loss)
    try:
        check_fits_card(cfg, train.batch_size, job.data.seq_len, plan.amp_dtype,
                        train.optimizer, resources.accelerator, plan.scan or "chunked",
                        plan.loss)
    except DeviceMemoryError as e:
        return [(("resources", "accelerator"), in_job_terms(str(e)))]
    return []


def _seq_warmup(train: Any, seq_len: int) -> Found:
    """The sequence-length warm-up's start against data.seq_len, and its steps."""
    from runner.keys import in_job_terms
    from ten.train.seqwarmup import lengths

    start = train.seq_warmup_start
    if start is None:
        return []
    try:
        lengths(seq_len, start)
    except ValueError as e:
        return [(("train", "seq_warmup_start"), f"{in_job_terms(str(e))}, got {start}")]
    if train.seq_warmup_steps < 1:
        return [(("train", "seq_warmup_steps"), "must be >= 1 with seq_warmup_start (the "
                 "steps the warm-up lasts)")]
    return []


def _cut_values(message: str, values: Any) -> str:
    """The library's messages quote the offending value whole; a 1 MB one must not be."""
    for value in values:
        if isinstance(value, str) and len(value) > 60:
            message = message.replace(repr(value), show(value)).replace(value, shorten(value))
    return message


def model(section: Any, data_seq_len: Any, written: dict[Path_, str]) -> Found:
    """Build the model config from preset + overrides (no weights) and map its
    FieldErrors to the key they name. A section the schema refuses (an unknown arch,
    preset or field, a wrongly typed value) is left to the schema. Imports torch."""
    try:
        chosen = ModelSection.model_validate(section)
    except ValidationError:
        return []
    from ten.model import presets

    overrides = chosen.overrides
    try:
        cfg = presets.model_config(chosen.arch, chosen.preset, **overrides)
    except (ValueError, TypeError) as err:
        return [_config_problem(err, model_fields(chosen.arch).model_fields, overrides,
                                written)]
    if getattr(cfg, "pos", None) == "learned" and isinstance(data_seq_len, int) \
            and data_seq_len > cfg.seq_len:
        return [(("data", "seq_len"), f"{data_seq_len} is longer than the model's learned "
                 f"positions ({cfg.seq_len}) (hint: set model.seq_len or pos: rope)")]
    return []


def _config_problem(err: Exception, known: Iterable[str], overrides: dict[str, Any],
                    written: dict[Path_, str]) -> tuple[Path_, str]:
    """The library's refusal of the model config, on the key it names where it names one
    (a transformer that cannot match the preset names none)."""
    if not isinstance(err, FieldError) or err.field not in known:
        return ("model",), _cut_values(str(err), overrides.values())
    path, why = ("model", err.field), err.problem
    if err.has_value:
        got = describe_hidden(err.value, written[path]) if path in written else show(err.value)
        why += f", got {got}"
    return path, why


def dataset(section: Any, written: str | None) -> Found:
    """A known name, builtin, or something that looks like a local path (whether the
    path exists is :func:`local_paths`: it may only exist where the job runs)."""
    if not isinstance(section, dict) or not isinstance(section.get("dataset"), str):
        return []
    name: str = section["dataset"]
    if not name:
        return []
    from ten.data import builtin
    from ten.data.sources import KNOWN, looks_local

    hidden = written is not None
    shown = f"(the value from {shorten(written)})" if hidden else show(name)
    if name.startswith("builtin:"):
        if name != builtin.NAME:
            return [(("data", "dataset"), f"unknown builtin dataset {shown} (hint: the builtin "
                     f"one is {builtin.NAME})")]
        return []
    if name in KNOWN:
        return []
    if len(name) > _PATH_MAX:
        return [_too_long_dataset(name, written)]
    found: Found = []
    if section.get("data_files") is not None:
        found.append((("data", "data_files"), "only applies to a known hub dataset "
                      f"({', '.join(KNOWN)})"))
    if not looks_local(name):
        close = None if hidden else suggest(name, KNOWN)
        found.append((("data", "dataset"),
                       f"unknown dataset {shown}" + (f" (did you mean {close!r}?)" if close else
                       f" (hint: one of {', '.join(KNOWN)}, {builtin.NAME}, or a local "
                       ".txt/.jsonl/.parquet path, glob or directory)")))
    return found


def _too_long_dataset(name: str, written: str | None) -> tuple[Path_, str]:
    """Said the same way by :func:`dataset` and :func:`local_paths`: shown once."""
    return (("data", "dataset"), f"too long for a dataset name or path ({len(name):,} "
            f"characters): {_shown(name, written)}")


def _shown(value: str, written: str | None) -> str:
    """A value for a message; one from ${VAR} shows as written, never resolved."""
    return f"the value from {shorten(written)}" if written is not None else show(value)


_PATH_HINT = ("a relative path starts from the working directory; if it exists only where "
              "the job runs, validate with --no-path-checks")


def local_paths(section: Any, written: dict[Path_, str]) -> Found:
    """The local files the job reads must be there: a local ``data.dataset`` (same rule
    as ``ten.data.sources.open_source``: not builtin or a known hub name) or the
    ``data.data_files`` of a hub name must match supported files, a
    ``data.tokenizer.path`` must be a file. Works on the raw ``data`` mapping, so it is
    reported beside every other problem; called only where the job will run (see
    ``load_job(check_paths=...)``)."""
    if not isinstance(section, dict):
        return []
    from ten.data.sources import KNOWN, LOCAL_SUFFIXES, is_local

    found: Found = []
    name = section.get("dataset")
    specs: list[tuple[Path_, Any]] = []
    if name in KNOWN:
        specs.append((("data", "data_files"), section.get("data_files")))
    elif isinstance(name, str) and len(name) > _PATH_MAX:
        found.append(_too_long_dataset(name, written.get(("data", "dataset"))))
    elif isinstance(name, str) and name and is_local(name):  # else checks.dataset says it
        specs.append((("data", "dataset"), name))
    for path, spec in specs:
        if not isinstance(spec, str) or not spec:
            continue  # the schema reports it
        why = _files_problem(spec, LOCAL_SUFFIXES)
        if why:
            hint = _PATH_HINT if why.startswith("no ") else ""
            found.append((path, _with_value(why, spec, written.get(path), hint)))
    tokenizer = section.get("tokenizer")
    tok = tokenizer.get("path") if isinstance(tokenizer, dict) else None
    if isinstance(tok, str):
        path = ("data", "tokenizer", "path")
        why = _file_problem(tok)
        if why:
            hint = "an existing sentencepiece .model file, relative to the working " \
                "directory; or drop path and set vocab_size to train one" \
                if why.startswith(("no ", "a directory")) else ""
            found.append((path, _with_value(why, tok, written.get(path), hint)))
    return found


def _with_value(why: str, value: str, written: str | None, hint: str) -> str:
    """``why: VALUE (hint: ...)``."""
    return f"{why}: {_shown(value, written)}" + (f" (hint: {hint})" if hint else "")


# Walk at most this many entries of a dataset directory looking for one supported file:
# validating must stay fast even when data.dataset is / by mistake.
_WALK_LIMIT = 10_000


def _files_problem(spec: str, suffixes: tuple[str, ...]) -> str | None:
    """Why ``spec`` (a file, directory or glob, as ``ten.data.sources.resolve_files``
    reads it) yields no files, or None."""
    if len(spec) > _PATH_MAX:  # the OS would only say "File name too long"
        return f"too long for a path ({len(spec):,} characters)"
    try:
        path = Path(spec).expanduser()
        if any(c in spec for c in "*?[") and not path.exists():
            if any(Path(p).is_file() for p in glob.iglob(str(path), recursive=True)):
                return None
            return "no files match the glob"
        if path.is_file():
            return None if path.suffix in suffixes else \
                f"unsupported file type {path.suffix or '(none)'!r}, use {'/'.join(suffixes)}"
        if path.is_dir():
            seen = 0
            for _, _, names in os.walk(path):
                if any(n.endswith(suffixes) for n in names):
                    return None
                seen += len(names) + 1
                if seen > _WALK_LIMIT:
                    return None  # too big to search here; the run reports it
            return f"no {'/'.join(suffixes)} files in the directory"
        return "no such file or directory"
    except (OSError, ValueError) as e:
        return f"cannot be read ({getattr(e, 'strerror', None) or 'invalid path'})"


def _file_problem(spec: str) -> str | None:
    if len(spec) > _PATH_MAX:
        return f"too long for a path ({len(spec):,} characters)"
    try:
        path = Path(spec).expanduser()
        if path.is_file():
            return None
        return "a directory, not a file" if path.is_dir() else "no such file"
    except (OSError, ValueError) as e:
        return f"cannot be read ({getattr(e, 'strerror', None) or 'invalid path'})"
