"""The project's torch operators (``torch.ops.ten.*``): one namespace, defined with torch's
Library API: a schema, an implementation for every device, a fake (shapes only, for
``FakeTensorMode``: ten.train.memory, benchmarks/bench_traffic.py), an autograd formula, and a
CUDA kernel where there is one (the dispatcher prefers it on CUDA tensors).

Why not ``torch.library.custom_op``: in eager mode its first call imports ``torch._dynamo``,
about 2 s in every process (each ``ten-runner run``, each test that starts one); this API
does not. Each function is registered through a trampoline, so a module that redefines its
operators (a test reloading it to switch Triton to its interpreter) replaces them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

__all__ = ["define", "register_cuda"]

_LIB = torch.library.Library("ten", "DEF")
_FNS: dict[tuple[str, str], Callable[..., Any]] = {}


def _trampoline(name: str, role: str) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        return _FNS[(name, role)](*args, **kwargs)

    call.__name__ = f"{name}_{role}"
    return call


def define(schema: str, impl: Callable[..., Any], fake: Callable[..., Any], *,
           backward: Callable[..., Any] | None = None,
           setup_context: Callable[..., Any] | None = None) -> Any:
    """``ten::<name>`` from its schema (``"name(Tensor x, ...) -> Tensor"``): ``impl`` runs
    on every device, ``fake`` gives the outputs' shapes, ``backward(ctx, *grads)`` with
    ``setup_context(ctx, inputs, output)`` is its autograd. Returns the callable operator."""
    name = schema.split("(", 1)[0]
    new = (name, "impl") not in _FNS
    _FNS.update({(name, "impl"): impl, (name, "fake"): fake})
    if backward is not None:
        _FNS.update({(name, "backward"): backward, (name, "setup"): setup_context})
    if new:
        _LIB.define(schema)
        _LIB.impl(name, _trampoline(name, "impl"), "CompositeExplicitAutograd")
        torch.library.register_fake(f"ten::{name}", _trampoline(name, "fake"), lib=_LIB)
        if backward is not None:
            torch.library.register_autograd(f"ten::{name}", _trampoline(name, "backward"),
                                            setup_context=_trampoline(name, "setup"),
                                            lib=_LIB)
    return getattr(torch.ops.ten, name).default


def register_cuda(name: str, kernel: Callable[..., Any]) -> None:
    """``ten::<name>``'s implementation on CUDA tensors (a Triton kernel's launcher)."""
    new = (name, "cuda") not in _FNS
    _FNS[(name, "cuda")] = kernel
    if new:
        _LIB.impl(name, _trampoline(name, "cuda"), "CUDA")
