"""What autograd keeps for backward, recorded by a saved-tensors hook: the memory tests'
one way of asking "is that activation kept?" and "how many bytes are kept?"."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


class SavedForBackward(torch.autograd.graph.saved_tensors_hooks):
    """Inside it, every tensor autograd saves is recorded: ``sizes`` their element counts
    in the order saved (to find one tensor by its size), ``total_bytes`` the bytes of the
    distinct storages they live in (two views of one buffer count once)."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self._storages: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            self.sizes.append(t.numel())
            storage = t.untyped_storage()
            self._storages[storage.data_ptr()] = storage.nbytes()
            return t

        super().__init__(pack, lambda t: t)

    @property
    def total_bytes(self) -> int:
        return sum(self._storages.values())


def saved_for_backward(fn: Callable[..., Any], *args: Any) -> SavedForBackward:
    """Run fn(*args) and return what autograd kept for its backward."""
    saved = SavedForBackward()
    with saved:
        fn(*args)
    return saved
