"""bitsandbytes' AdamW step (8-bit blockwise moments, or float32 ones for small tensors)
over many tensors in one Triton launch, the decision to skip it read on the device.

bitsandbytes updates one tensor per kernel, and its Python around each launch (a config
dict, state lookups, the op dispatch) is what its step costs: 5.11 ms for the flagship's
139 tensors on an H100, where the bytes it moves (16 a parameter, 1.83 GB) take 0.55 ms
(BENCHMARKS.md, "The optimizer's trade"). Here one program updates one block of ``BLOCK``
elements of one tensor; a table on the device gives each tensor's addresses and size,
another each program's tensor and block, so a launch covers any number of
tensors of one dtype and one state kind. The states stay bitsandbytes' own, in its layout
(``state1`` / ``state2`` uint8 codes into the dynamic maps ``qmap1`` / ``qmap2``, scaled
per block of 256 by ``absmax1`` / ``absmax2``; float32 moments under its 4,096-element
threshold), so checkpoints load into either optimizer.

The arithmetic is that of bitsandbytes' CUDA kernels (0.50), element by element:

    m <- β1·m + (1-β1)·g             v <- β2·v + (1-β2)·g²
    p <- p - lr·(√(1-β2ᵗ)/(1-β1ᵗ)) · m / (√v + ε·√(1-β2ᵗ)),   then   p <- p·(1 - lr·wd)

and, for the 8-bit states, each block's new scale its largest |moment|, each moment coded
as the nearest value of its map (a mean that would change sign moved one code outward, as
bitsandbytes does), and a non-finite gradient element zeroing its moments and leaving its
weight. The step count ``t`` of each tensor lives on the device (``steps``) with the flag
``skip`` (a 0-dim float, 1 to skip, as a GradScaler's ``found_inf``): a skipped step leaves
weights, moments and counts exactly as they were, and no host sync decides it. The caller
counts the step first (``count_step``). Under ``TRITON_INTERPRET=1`` the kernel runs on CPU
tensors, which is how the tests hold it to bitsandbytes' own CPU step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["BLOCK", "INTERPRETED", "Launch", "count_step"]

BLOCK = 256  # bitsandbytes' quantization block, and a program's elements
FIELDS = 7  # a tensor's entry: weight, gradient, moment 1, moment 2, their scales, numel
# Four elements a thread, no spills under Triton 3.6 (the lent GPUs') and 3.7.1 (the
# image's). Four blocks a program took 157 registers under 3.6, 3 programs an SM; one block
# in 4 warps spilled 16 B on the L40S under 3.7.1 (benchmarks/kernel_check.py).
NUM_WARPS = 2

_TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _nearest_code(map_ptr, x, SIGNED: tl.constexpr):
    """The index of the value of the sorted 256-entry map nearest ``x``; for a signed map,
    moved one step outward where the nearest value's sign is not ``x``'s."""
    i = tl.zeros(x.shape, tl.int32)  # the largest index whose value is <= x (0 below them all)
    for bit in tl.static_range(7, -1, -1):
        j = i + (1 << bit)
        i = tl.where(tl.load(map_ptr + j) <= x, j, i)
    up = tl.minimum(i + 1, 255)
    i = tl.where(tl.load(map_ptr + up) - x < x - tl.load(map_ptr + i), up, i)
    if SIGNED:
        q = tl.load(map_ptr + i)
        i = tl.where((x < 0) & (q >= 0), i - 1, tl.where((x > 0) & (q < 0), i + 1, i))
    return i


@triton.jit
def _adamw_kernel(table_ptr, chunk_ptr, map1_ptr, map2_ptr, steps_ptr, skip_ptr,
                  lr, decay, beta1, beta2, eps,
                  P_DTYPE: tl.constexpr, EIGHT_BIT: tl.constexpr, FIELDS: tl.constexpr,
                  BLOCK: tl.constexpr):
    if tl.load(skip_ptr) == 0:
        c = tl.program_id(0)
        t = tl.load(chunk_ptr + 2 * c)
        entry = table_ptr + t * FIELDS
        p_ptr = tl.load(entry).to(tl.pointer_type(P_DTYPE))
        g_ptr = tl.load(entry + 1).to(tl.pointer_type(P_DTYPE))
        n = tl.load(entry + 6)
        block = tl.load(chunk_ptr + 2 * c + 1)  # int64
        idx = block * BLOCK + tl.arange(0, BLOCK)
        inside = idx < n
        step = tl.load(steps_ptr + t)
        correction1 = 1.0 - tl.exp2(step * tl.log2(beta1))
        correction2 = tl.sqrt(1.0 - tl.exp2(step * tl.log2(beta2)))
        step_size = -lr * correction2 / correction1

        g = tl.load(g_ptr + idx, mask=inside, other=0.0).to(tl.float32)
        p = tl.load(p_ptr + idx, mask=inside, other=0.0).to(tl.float32)
        if EIGHT_BIT:
            m_ptr = tl.load(entry + 2).to(tl.pointer_type(tl.uint8))
            v_ptr = tl.load(entry + 3).to(tl.pointer_type(tl.uint8))
            m_scale_ptr = tl.load(entry + 4).to(tl.pointer_type(tl.float32))
            v_scale_ptr = tl.load(entry + 5).to(tl.pointer_type(tl.float32))
            m_code = tl.load(m_ptr + idx, mask=inside, other=0).to(tl.int32)
            v_code = tl.load(v_ptr + idx, mask=inside, other=0).to(tl.int32)
            m = tl.load(map1_ptr + m_code) * tl.load(m_scale_ptr + block)
            v = tl.load(map2_ptr + v_code) * tl.load(v_scale_ptr + block)
        else:
            m_ptr = tl.load(entry + 2).to(tl.pointer_type(tl.float32))
            v_ptr = tl.load(entry + 3).to(tl.pointer_type(tl.float32))
            m = tl.load(m_ptr + idx, mask=inside, other=0.0)
            v = tl.load(v_ptr + idx, mask=inside, other=0.0)
        m = m * beta1 + (1.0 - beta1) * g
        v = v * beta2 + (1.0 - beta2) * (g * g)
        new_p = (p + step_size * (m / (tl.sqrt(v) + eps * correction2))) * decay
        if EIGHT_BIT:
            finite = tl.abs(g) < float("inf")  # false for inf and nan
            m = tl.where(finite & inside, m, 0.0)
            v = tl.where(finite & inside, v, 0.0)
            new_p = tl.where(finite, new_p, p)
            m_max = tl.max(tl.abs(m), axis=0)
            v_max = tl.max(v, axis=0)
            # a block of zeros (scale 0) decodes to zeros whatever its codes: code 0 / 1
            m_code = _nearest_code(map1_ptr, m / tl.where(m_max > 0, m_max, 1.0), True)
            v_code = _nearest_code(map2_ptr, v / tl.where(v_max > 0, v_max, 1.0), False)
            tl.store(m_ptr + idx, m_code.to(tl.uint8), mask=inside)
            tl.store(v_ptr + idx, v_code.to(tl.uint8), mask=inside)
            tl.store(m_scale_ptr + block, m_max)
            tl.store(v_scale_ptr + block, v_max)
        else:
            tl.store(m_ptr + idx, m, mask=inside)
            tl.store(v_ptr + idx, v, mask=inside)
        tl.store(p_ptr + idx, new_p.to(P_DTYPE), mask=inside)


INTERPRETED = type(_adamw_kernel).__name__ == "InterpretedFunction"


def count_step(steps: Tensor, skip: Tensor) -> None:
    """Each tensor's step count advanced unless ``skip`` (on the device: no sync)."""
    steps.add_(1.0 - skip)


class Launch:
    """One launch's tensors: weights of one dtype with their moments, all 8-bit
    (``moments``: per weight the codes and scales of both, bitsandbytes' ``state1``,
    ``state2``, ``absmax1``, ``absmax2``) or all float32 (``state1``, ``state2``, no scales).

    The programs' table depends only on the sizes and is made once. The addresses are
    the gradients' too, which the backward pass allocates anew each step: the table of
    addresses is remade on the device when a gradient or a weight moved (a pinned copy,
    no sync)."""

    def __init__(self, params: Sequence[Tensor], moments: Sequence[Sequence[Tensor]],
                 eight_bit: bool, steps: Sequence[int]) -> None:
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1 or not all(p.is_contiguous() for p in params):
            raise ValueError("one launch takes contiguous weights of one dtype")
        self.params, self.moments, self.eight_bit = list(params), list(moments), eight_bit
        self.dtype = _TL_DTYPES[dtypes.pop()]
        self.device = params[0].device
        chunks = [(t, b) for t, p in enumerate(params)
                  for b in range(-(-p.numel() // BLOCK))]
        self.chunks = _on(self.device, torch.tensor(chunks, dtype=torch.int64))
        self.steps = _on(self.device, torch.tensor(steps, dtype=torch.float32))
        self._addresses: tuple[int, ...] = ()
        self.table = torch.empty(0)

    def step(self, grads: Sequence[Tensor], skip: Tensor, maps: tuple[Tensor, Tensor] | None,
             *, lr: float, betas: tuple[float, float], eps: float, weight_decay: float) -> None:
        """One AdamW step of every weight (``count_step`` first), unless ``skip``.
        ``maps``: the signed and unsigned dynamic maps of the 8-bit moments (``qmap1``,
        ``qmap2``); None for float32 ones."""
        addresses = tuple(t.data_ptr() for t in (*self.params, *grads))  # p.data may be set
        if addresses != self._addresses:
            if any(g.dtype != p.dtype or g.shape != p.shape or not g.is_contiguous()
                   for g, p in zip(grads, self.params, strict=True)):
                raise ValueError("a gradient is not its weight's dtype and shape, contiguous")
            rows = [[p.data_ptr(), g.data_ptr(), *(s.data_ptr() for s in ms),
                     *[0] * (4 - len(ms)), p.numel()]
                    for p, g, ms in zip(self.params, grads, self.moments, strict=True)]
            self.table = _on(self.device, torch.tensor(rows, dtype=torch.int64))
            self._addresses = addresses
        unread = (self.steps, self.steps)  # any pointers: float32 moments read no map
        _adamw_kernel[(self.chunks.shape[0],)](
            self.table, self.chunks, *(maps or unread), self.steps, skip,
            lr, 1.0 - lr * weight_decay, betas[0], betas[1], eps,
            P_DTYPE=self.dtype, EIGHT_BIT=self.eight_bit, FIELDS=FIELDS, BLOCK=BLOCK,
            num_warps=NUM_WARPS)


def _on(device: torch.device, host: Tensor) -> Tensor:
    """A host-made table on ``device``: from pinned memory without a host sync on CUDA
    (torch's pinned allocator keeps the buffer until the copy has run)."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)
