"""The lint config holds: ruff clean, and no function in ``ten/`` or ``runner/`` branches
more than mccabe's 10 (pyproject.toml's ``[tool.ruff.lint]``): what a reader must hold in
mind, which line counts never measured."""

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _ruff() -> list[str]:
    exe = shutil.which("ruff")
    if exe is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return [exe]


def test_ruff_passes_with_the_complexity_limit():
    done = subprocess.run([*_ruff(), "check", "--no-cache", "--output-format", "concise",
                           str(ROOT)], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_complexity_limit_reaches_ten_and_runner():
    # The limit is live for the library and the runner: a function with 11 branches
    # written into ten/ is refused (a config that excluded them would pass the test above).
    branches = "\n".join(f"    if x == {i}:\n        return {i}" for i in range(11))
    source = f"def f(x):\n{branches}\n    return -1\n"
    for where in ("ten/probe.py", "runner/probe.py"):
        done = subprocess.run([*_ruff(), "check", "--no-cache", "--select", "C901",
                               "--stdin-filename", str(ROOT / where), "-"], input=source,
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert done.returncode == 1 and "C901" in done.stdout, (where, done.stdout)
