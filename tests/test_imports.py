"""The import rules from DESIGN.md, checked in fresh interpreters."""

import subprocess
import sys


def _modules_after(code: str) -> set[str]:
    code += "\nimport sys\nprint(' '.join(sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_cli_import_does_not_import_torch():
    mods = _modules_after("import runner.cli")
    assert "torch" not in mods


TEN_MODULES = ["ten", "ten.scan", "ten.model", "ten.transformer", "ten.presets", "ten.lm",
               "ten.trainer", "ten.checkpoint", "ten.metrics", "ten.data", "ten.data.__main__"]


def test_ten_never_imports_runner_or_cloud_libraries():
    # torch itself imports pynvml when nvidia-ml-py is installed: that is torch's
    # business, so compare with what a bare `import torch` loads.
    baseline = {m.split(".")[0] for m in _modules_after("import torch")}
    mods = {m.split(".")[0] for m in _modules_after("\n".join(f"import {m}"
                                                              for m in TEN_MODULES))}
    forbidden = {"runner", "click", "boto3", "botocore", "pynvml"}
    assert not (forbidden & mods) - baseline
