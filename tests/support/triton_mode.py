"""Where the Triton kernel tests (marked ``cuda_kernels``) run: the compiled kernels on a
CUDA device, else Triton's interpreter on CPU tensors (numpy underneath, float64 too).

Triton takes the mode from ``TRITON_INTERPRET`` once per process: its own library is
decorated when ``triton`` is first imported, and the interpreter must still be on at the
first launch. So, on a machine without CUDA, a kernel test module calls
:func:`interpret_without_cuda` when it is collected, before anything has imported triton
(``import torch`` and the rest of the suite do not); nothing else there could use compiled
Triton anyway. By hand:
``TRITON_INTERPRET=1 python -m pytest tests/ten/kernels/test_scan_fused.py``.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType

import pytest
import torch

HAVE_TRITON = importlib.util.find_spec("triton") is not None
NO_TRITON = "triton is not installed (pip install -e '.[test]' does, on Linux)"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def interpret_without_cuda() -> None:
    """``TRITON_INTERPRET=1`` for this pytest process, where there is no CUDA and nothing
    has imported triton yet."""
    if HAVE_TRITON and DEVICE == "cpu" and "triton" not in sys.modules:
        os.environ["TRITON_INTERPRET"] = "1"


def _interpreted(module: ModuleType) -> bool:
    return any(type(v).__name__ == "InterpretedFunction" for v in vars(module).values())


def kernel_module(name: str) -> ModuleType:
    """ten's module of Triton kernels in the mode this process runs them: reloaded when it
    was imported before ``TRITON_INTERPRET`` was set; a failure when it is compiled and no
    CUDA can run it."""
    module = importlib.import_module(name)
    if not _interpreted(module) and os.environ.get("TRITON_INTERPRET") == "1":
        module = importlib.reload(module)  # imported before the variable was set
    if not _interpreted(module) and DEVICE == "cpu":
        pytest.fail("triton was imported before TRITON_INTERPRET=1 could be set and there is "
                    "no CUDA: run this file in a process of its own")
    return module


def cpu(*tensors: torch.Tensor | None) -> list[torch.Tensor | None]:
    """The tensors on the CPU, where the operators' torch implementations run (on CUDA the
    operator is the kernel under test); None (an optional input left out) stays None."""
    return [None if t is None else t.cpu() for t in tensors]
