"""Checks that span fields, or need the model and data code (imported lazily: torch).

Each returns ``[(path, message), ...]`` so the caller can name the line.
"""

from __future__ import annotations

import re
from typing import Any

from runner.job.errors import describe_hidden, show, suggest
from runner.job.schema import ARCHS, PRESETS, JobSchema

Path_ = tuple[str | int, ...]
Found = list[tuple[Path_, str]]


def budget(data: dict[str, Any]) -> Found:
    """Exactly one of train.max_steps / train.max_tokens (checked on the raw mapping, so
    it is reported alongside every other problem)."""
    train = data.get("train")
    if not isinstance(train, dict):
        return []
    given = [k for k in ("max_steps", "max_tokens") if train.get(k) is not None]
    if len(given) == 2:
        return [(("train", "max_tokens"), "give either max_steps or max_tokens, not both")]
    if not given:
        return [(("train",), "no budget: set max_steps or max_tokens (e.g. max_steps: 300)")]
    return []


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
    if d.tokenizer.path is not None and "vocab_size" in d.tokenizer.model_fields_set:
        found.append((("data", "tokenizer", "vocab_size"), "give either tokenizer.path or "
                      "tokenizer.vocab_size, not both (the .model file fixes the vocabulary)"))
    return found


def _override_type_problem(name: str, value: Any, default: Any) -> str | None:
    if isinstance(default, bool):
        ok, want = isinstance(value, bool), "true or false"
    elif isinstance(default, int):
        ok, want = isinstance(value, int) and not isinstance(value, bool), "an integer"
    elif isinstance(default, float):
        ok, want = isinstance(value, int | float) and not isinstance(value, bool), "a number"
    elif isinstance(default, str):
        ok, want = isinstance(value, str), "a string"
    else:
        return None
    return None if ok else f"expected {want}"


def _unknown_field(name: str, arch: str, known: dict[str, Any]) -> str:
    close = suggest(name, known)
    return f"unknown model field {name!r} for arch {arch}" + (
        f" (did you mean {close!r}?)" if close else f" (known: {', '.join(sorted(known))})")


def model(section: Any, data_seq_len: Any, written: dict[Path_, str]) -> Found:
    """Build the model config from preset + overrides (no weights) and map its
    ValueErrors to the offending key. Imports torch."""
    if not isinstance(section, dict):
        return []
    arch, preset = section.get("arch", "ten"), section.get("preset")
    if arch not in ARCHS:
        return []  # the schema reports it
    names_only = preset not in PRESETS  # the schema reports it; still check the names
    preset = "tiny" if names_only else preset
    overrides = {k: v for k, v in section.items() if k not in ("arch", "preset")}
    from ten import presets

    base: dict[str, Any] = vars(presets.PRESETS[preset]).copy()
    if arch == "transformer":
        base.update(vars(presets.model_config(arch, preset)))
    found: Found = []
    for name, value in overrides.items():
        path = ("model", name)
        if name not in base:
            found.append((path, _unknown_field(name, arch, base)))
            continue
        why = _override_type_problem(name, value, base[name])
        if why:
            got = describe_hidden(value, written[path]) if path in written else show(value)
            found.append((path, f"{why}, got {got}"))
    if names_only or found:  # a wrong preset is reported by the schema
        return found
    try:
        cfg = presets.model_config(arch, preset, **overrides)
    except (ValueError, TypeError) as err:
        message = str(err)
        unknown = re.match(r"unknown (?:TEN )?model field '([^']+)'", message)
        if unknown:
            name = unknown.group(1)
            return [(("model", name), _unknown_field(name, arch, base))]
        field = re.match(r"([a-z_][a-z0-9_]*): (.*)", message, re.S)
        if field and field.group(1) in base:
            path, why = ("model", field.group(1)), field.group(2)
            if path in written:
                value = overrides[field.group(1)]
                why = re.sub(r", got .*$", f", got {describe_hidden(value, written[path])}", why)
            return [(path, why)]
        if "scan backend" in message and "scan_backend" in overrides:
            return [(("model", "scan_backend"), message)]
        return [(("model",), message)]
    if getattr(cfg, "pos", None) == "learned" and isinstance(data_seq_len, int) \
            and data_seq_len > cfg.seq_len:
        found.append((("data", "seq_len"), f"{data_seq_len} is longer than the model's learned "
                      f"positions ({cfg.seq_len}) (hint: set model.seq_len or pos: rope)"))
    return found


def dataset(section: Any, written: str | None) -> Found:
    """A known name, builtin, or something that looks like a local path (existence is
    checked when the job runs: the path may only exist inside the container)."""
    if not isinstance(section, dict) or not isinstance(section.get("dataset"), str):
        return []
    name: str = section["dataset"]
    if not name:
        return []
    from ten.data import builtin
    from ten.data.sources import KNOWN, LOCAL_SUFFIXES

    hidden = written is not None
    shown = f"(the value from {written})" if hidden else repr(name)
    if name.startswith("builtin:"):
        if name != builtin.NAME:
            return [(("data", "dataset"), f"unknown builtin dataset {shown} (hint: the builtin "
                     f"one is {builtin.NAME})")]
        return []
    if name in KNOWN:
        return []
    found: Found = []
    if section.get("data_files") is not None:
        found.append((("data", "data_files"), "only applies to a known hub dataset "
                      f"({', '.join(KNOWN)})"))
    looks_local = ("/" in name or any(c in name for c in "*?[") or name.startswith(".")
                   or any(name.endswith(s) for s in LOCAL_SUFFIXES))
    if not looks_local:
        from pathlib import Path

        looks_local = Path(name).expanduser().exists()
    if not looks_local:
        close = None if hidden else suggest(name, KNOWN)
        found.append((("data", "dataset"),
                       f"unknown dataset {shown}" + (f" (did you mean {close!r}?)" if close else
                       f" (hint: one of {', '.join(KNOWN)}, {builtin.NAME}, or a local "
                       ".txt/.jsonl/.parquet path, glob or directory)")))
    return found
