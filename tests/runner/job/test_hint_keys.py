"""Every job key a message names exists. Scans the string literals of runner/
and ten/ for dotted keys (``data.tokenizer.path``, ``train.max_steps``, ...) and checks
each against the job schema, so a hint like "fix data.tokenizer_path" cannot come back."""

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


def mentioned_keys() -> list[tuple[str, str]]:
    """(file:line, dotted key) for every key named in a string literal (f-strings too)."""
    found = []
    for package in ("runner", "ten"):
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(), str(path))
            skip = _docstrings(tree)
            for node in ast.walk(tree):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                        and id(node) not in skip:
                    for m in KEY.finditer(node.value):
                        found.append((f"{path.relative_to(ROOT)}:{node.lineno}", m.group(0)))
    return found


def model_fields() -> set[str]:
    from ten import presets

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
