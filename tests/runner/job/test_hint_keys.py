"""Every key or field a message names exists. Scans the string literals of runner/ for
dotted job keys (``data.tokenizer.path``, ``train.max_steps``, ...) and checks each
against the job schema, so a hint like "fix data.tokenizer_path" cannot come back; and
those of ten/, which names no job key, only its configs' fields (``DataConfig.seq_len``),
each a real field that the runner shows as a real job key."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from runner.job.errors import section_fields
from runner.job.schema import JobSchema

ROOT = Path(__file__).resolve().parents[3]
SECTIONS = ("model", "data", "train", "checkpoint", "storage", "resources", "monitor")
# A section name, a dot, a key; not part of a longer name ("job.data.x", "my_data.x") or
# a path ("/data/x", "runs/model.pt").
KEY = re.compile(rf"(?<![\w./-])({'|'.join(SECTIONS)})((?:\.[a-z_][a-z0-9_]*)+)")
# Dotted words that are not job keys, each with why.
NOT_KEYS = {
    "model.pt": "the checkpoint's weights file",
    "model.safetensors": "the weights file of a folder `export-model` writes",
    "model.generate": "transformers' generate(), in the exported model card's example",
    "resources.infra": "a SkyPilot task key, in the task `export --to skypilot` writes",
    **dict.fromkeys(("model.embed_tokens.weight", "model.layers", "model.norm.weight",
                     "model.norm.bias"), "StableLM's parameter names (hf_model/layouts.py)"),
}


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of docstring nodes: they describe code (``data.train_loader(...)``), not keys."""
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def mentioned(package: str, pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    """(file:line, match) for every ``pattern`` in a string literal of ``package``
    (f-strings too)."""
    found = []
    for path in sorted((ROOT / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                    and id(node) not in skip:
                for m in pattern.finditer(node.value):
                    found.append((f"{path.relative_to(ROOT)}:{node.lineno}", m.group(0)))
    return found


def mentioned_keys() -> list[tuple[str, str]]:
    return mentioned("runner", KEY)


def model_fields() -> set[str]:
    from ten.model import presets

    fields = {"arch", "preset"}
    for arch in ("ten", "transformer"):
        fields |= set(vars(presets.model_config(arch, "tiny")))
    return fields


def is_job_key(dotted: str) -> bool:
    parts = tuple(dotted.split("."))
    if parts[0] == "model":
        return len(parts) == 2 and parts[1] in model_fields()
    for depth in range(1, len(parts)):
        known = section_fields(JobSchema, parts[:depth])
        if known is None or parts[depth] not in known:
            return False
    return True


def test_the_scan_finds_keys():
    keys = {k for _, k in mentioned_keys()}
    assert {"storage.url", "resources.gpus", "train.max_steps", "data.dataset"} <= keys


@pytest.mark.parametrize("dotted,ok", [
    ("data.tokenizer.path", True), ("data.tokenizer.vocab_size", True), ("model.d_model", True),
    ("data.tokenizer_path", False), ("data.vocab_size", False), ("train.lr.x", False),
    ("model.nope", False),
])
def test_is_job_key(dotted, ok):
    assert is_job_key(dotted) is ok


def test_every_key_named_in_a_message_exists():
    wrong = [f"{where}: {key}" for where, key in mentioned_keys()
             if key not in NOT_KEYS and not is_job_key(key)]
    assert not wrong, "messages name job keys that do not exist:\n" + "\n".join(wrong)


def test_the_library_names_no_job_key():
    found = [f"{where}: {key}" for where, key in mentioned("ten", KEY) if key not in NOT_KEYS]
    assert not found, "ten/ names job keys (name the config's field instead):\n" + \
        "\n".join(found)


def test_every_library_field_named_in_a_message_exists_and_has_its_job_key():
    """``DataConfig.tokenizer.path`` in ten/'s messages: a real field, which
    runner.keys.in_job_terms shows as a job key that exists (or leaves as it is,
    for a field no job sets)."""
    import dataclasses
    import typing

    import ten.data.config
    import ten.model.ten
    import ten.model.transformer
    from runner.keys import LIBRARY_CONFIGS, in_job_terms

    classes = {name: getattr(module, name) for module in (ten.config, ten.data.config,
                                                          ten.model.ten, ten.model.transformer)
               for name in LIBRARY_CONFIGS if hasattr(module, name)}
    field = re.compile(rf"\b({'|'.join(LIBRARY_CONFIGS)})((?:\.[a-z_][a-z0-9_]*)+)")
    named = mentioned("ten", field)
    assert len(named) > 20, named
    wrong = []
    for where, dotted in named:
        config, *parts = dotted.split(".")
        owner = classes[config]
        for part in parts:
            names = {f.name for f in dataclasses.fields(owner)}
            if part not in names:
                wrong.append(f"{where}: {dotted} (no field {part})")
                break
            owner = typing.get_type_hints(owner).get(part)
        else:
            shown = in_job_terms(dotted)
            if shown != dotted and not is_job_key(shown):
                wrong.append(f"{where}: {dotted} is shown as {shown}, not a job key")
    assert not wrong, "\n".join(wrong)
