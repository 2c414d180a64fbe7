"""The import rules, checked in fresh interpreters: ``ten`` (the library) never imports
the runner or a cloud library, and the CLI answers ``--help`` without torch or boto3."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _modules_after(code: str) -> set[str]:
    code += "\nimport sys\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return set(out.stdout.split())


def ten_modules() -> list[str]:
    """Every module of the library, found on disk (a new one is checked without a list
    to update)."""
    names = []
    for path in sorted((ROOT / "ten").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def test_cli_import_does_not_import_torch():
    mods = _modules_after("import runner.cli")
    assert "torch" not in mods


def test_help_lists_commands_without_importing_torch_or_boto3():
    # What keeps --help (and every mistyped command) answering at once: the CLI imports
    # torch and boto3 only inside the commands that use them.
    code = ("import sys\nfrom runner.cli import main\nsys.argv = ['ten-runner', '--help']\n"
            "try:\n    main()\nexcept SystemExit:\n    pass\n"
            "print('heavy:', 'torch' in sys.modules, 'boto3' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60, cwd=ROOT).stdout
    assert "presets" in out and "validate" in out
    assert out.splitlines()[-1] == "heavy: False False"


@pytest.mark.slow  # a fresh interpreter imports every module
def test_ten_never_imports_runner_or_cloud_libraries():
    modules = ten_modules()
    assert {"ten", "ten.train.trainer", "ten.data", "ten.data.shards"} <= set(modules)
    # torch itself imports pynvml when nvidia-ml-py is installed: that is torch's
    # business, so compare with what a bare `import torch` loads.
    baseline = {m.split(".")[0] for m in _modules_after("import torch")}
    mods = {m.split(".")[0] for m in _modules_after("\n".join(f"import {m}"
                                                              for m in modules))}
    forbidden = {"runner", "click", "boto3", "botocore", "pynvml"}
    assert not (forbidden & mods) - baseline
