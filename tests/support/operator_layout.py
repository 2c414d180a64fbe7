"""A kernel's outputs against its operator's fake: the same shapes and strides."""

from __future__ import annotations

import torch


def assert_fake_layout(op: str, inputs, outputs) -> None:
    """A kernel's outputs have the shapes and strides of the operator's fake for the same
    inputs (what torch.compile plans with, and checks on every call)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fakes = getattr(torch.ops.ten, op).default(
            *(mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in inputs))
    fakes = fakes if isinstance(fakes, tuple) else (fakes,)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    for fake, out in zip(fakes, outputs, strict=True):
        assert (tuple(out.shape), out.stride()) == (tuple(fake.shape), fake.stride()), op
