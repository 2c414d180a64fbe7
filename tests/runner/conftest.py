"""Shared by the runner tests: a small corpus and the subprocess helpers in
runhelpers.py (importable because this folder is put on sys.path here)."""

import json
import random
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from runhelpers import WORDS  # noqa: E402


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(1)
    with open(root / "docs.jsonl", "w") as f:
        for _ in range(500):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS)
                                                 for _ in range(rng.randint(10, 90)))}) + "\n")
    return root


