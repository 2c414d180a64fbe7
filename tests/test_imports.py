"""The import rules from DESIGN.md, checked in fresh interpreters."""

import subprocess
import sys

import pytest


def _modules_after(code: str) -> set[str]:
    code += "\nimport sys\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_cli_import_does_not_import_torch():
    mods = _modules_after("import runner.cli")
    assert "torch" not in mods


@pytest.mark.parametrize("module", ["ten", "ten.scan", "ten.model", "ten.transformer",
                                    "ten.presets", "ten.lm"])
def test_ten_never_imports_runner_or_cloud_libraries(module):
    mods = _modules_after(f"import {module}")
    forbidden = {"runner", "click", "boto3", "botocore", "pynvml"}
    assert not forbidden & {m.split(".")[0] for m in mods}
