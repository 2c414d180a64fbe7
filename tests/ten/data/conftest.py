"""Tiny synthetic corpora for the data-layer tests (never the network, never ~/.cache)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from ten.data import DataConfig, TokenizerConfig

WORDS = ("the a of to and in is it that for on with as was by at from this be or an are "
         "data model token shard stream batch cursor epoch seed worker process file text "
         "river mountain cloud quiet bright green small large early late open close read "
         "write train learn value state eigen wave phase decay signal noise order chaos "
         "north south east west alpha beta gamma delta kappa sigma omega").split()


def make_docs(n: int, seed: int = 0, min_words: int = 5, max_words: int = 120) -> list[str]:
    """Deterministic English-like documents, some with line breaks, digits and accents."""
    rng = random.Random(seed)
    docs = []
    for i in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(min_words, max_words))]
        for j in range(8, len(words), rng.randint(9, 30)):
            words[j] += rng.choice([".", ",", ".\n", "\n"])
        words.append(f"doc{i} café {rng.randint(0, 9999)}.")
        docs.append(" ".join(words).replace("\n ", "\n"))
    return docs


def write_jsonl(path: Path, docs: list[str], field: str = "text") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for i, doc in enumerate(docs):
            f.write(json.dumps({field: doc, "id": i}) + "\n")
    return path


# The helpers are handed out as fixtures, so tests never import this file (which works
# the same under every pytest import mode).
@pytest.fixture(scope="session", name="make_docs")
def make_docs_fixture():
    return make_docs


@pytest.fixture(scope="session", name="write_jsonl")
def write_jsonl_fixture():
    return write_jsonl


@pytest.fixture
def docs() -> list[str]:
    return make_docs(240)


@pytest.fixture
def corpus(tmp_path: Path, docs: list[str]) -> Path:
    return write_jsonl(tmp_path / "corpus" / "docs.jsonl", docs)


@pytest.fixture
def cfg(tmp_path: Path, corpus: Path) -> DataConfig:
    """Small, fast, unshuffled: 240 docs, vocab 400, seq_len 32, 10% held out."""
    return DataConfig(dataset=str(corpus), seq_len=32, num_proc=1,
                      tokenizer=TokenizerConfig(vocab_size=400),
                      val_fraction=0.1, shuffle=False, cache_dir=str(tmp_path / "cache"),
                      progress=False)
