"""Next-token loss without the B×T×V fp32 logits (DESIGN rule 12).

The LM head is ``logits = h Wᵀ`` with h (N, d) the final hidden states and W (V, d) the
(tied) embedding. The plain loss materializes all N×V logits in fp32, then their
log-softmax and its gradient: at T = 32K that was 15 of 18 GB. Four backends, one
signature ``(hidden (N, d), weight (V, d), targets (N,)) -> mean loss (fp32 scalar)``:

* ``reference``: the plain ``F.cross_entropy(F.linear(h, W).float(), t)``; what the
  others are tested against.
* ``chunked``: the N rows in chunks; per chunk the logits in the autocast dtype, the
  log-softmax in fp32, and — in the same pass — the gradients w.r.t. h and W, kept for
  backward. Peak memory is one chunk's logits plus grad_h (N×d) and grad_W (V×d, fp32),
  never N×V. Any device; torch ops (~58 bytes of traffic per logit).
* ``fused``: the same chunks, each chunk's log-softmax and gradient one Triton kernel in
  place on its logits (``ten.kernels.loss_fused``: 6 bytes per logit, no fp32 copy, so chunks 8x
  larger in the same memory and fewer fp32 grad_W additions). CUDA (or the interpreter).
* ``liger``: Liger-Kernel's fused linear cross-entropy (Triton, CUDA only), the same
  idea in fused kernels, with a host sync per call. Optional: ``pip install
  'ten-runner[gpu]'``.

``chunked`` and ``fused`` also run the head's GEMMs in float8 where the model sets
``fp8_head`` (``ten.kernels.loss_float8``).

``auto`` picks ``fused`` on CUDA when triton imports, else ``chunked``, and says which and
why; naming a backend that cannot run here raises with the fix, never falls back.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ten.config import FP8_HEAD_LOSSES, LOSSES
from ten.kernels import loss_float8

LOSS_BACKENDS = LOSSES  # declared with the training settings (ten.config)
IGNORE_INDEX = -100  # as F.cross_entropy; the data never pads, but the loss honours it
# A chunk's logits hold at most max(N·d, 2**24) elements (64 MiB in fp32): never more
# than the hidden states themselves once those are large, and big enough chunks that the
# matmuls stay efficient when they are small. The fused kernel keeps one buffer in the
# matmul's dtype where torch ops keep an fp32 copy and its temporaries, and takes 16x the
# elements (512 MiB of bf16): every chunk adds its V x d weight gradient into the fp32 sum
# and reads the weight twice, so fewer chunks move less (the flagship's micro-batch of 4:
# 16 chunks, 8.4 GB and 144 launches less than 32 at 2**27, for 256 MiB more).
MIN_CHUNK_ELEMENTS = 2**24
FUSED_CHUNK_ELEMENTS = 2**28

# (logits (R, V), targets (R,), scale (R,) or None) -> (per-row loss (R,), d/d logits or
# None): d(Σ_r scale_r · loss_r)/d logits in the logits' dtype when scale is given.
RowsFn = Callable[[Tensor, Tensor, "Tensor | None"], "tuple[Tensor, Tensor | None]"]


def reference_linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor,
                                   ignore_index: int = IGNORE_INDEX) -> Tensor:
    """The plain loss: all (N, V) logits, fp32 log-softmax. Mean over non-ignored rows."""
    logits = F.linear(hidden, weight)  # (N, V) in the autocast dtype
    return F.cross_entropy(logits.float(), targets, ignore_index=ignore_index)


def default_chunk_rows(n: int, d: int, v: int, elements: int = MIN_CHUNK_ELEMENTS) -> int:
    return max(1, min(n, max(n * d, elements) // v))


def chunked_linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor,
                                 ignore_index: int = IGNORE_INDEX,
                                 chunk_rows: int | None = None, fp8: bool = False) -> Tensor:
    """The same loss as :func:`reference_linear_cross_entropy`, one chunk of rows at a time.

    Under autocast the logits are computed in the autocast dtype (as ``F.linear`` would),
    everything after in fp32; with ``fp8`` the head's GEMMs in float8
    (ten.kernels.loss_float8). No host sync.
    """
    rows = chunk_rows or default_chunk_rows(*hidden.shape[-2:], weight.shape[0])
    return _linear_cross_entropy(hidden, weight, targets, ignore_index, rows, _rows_torch,
                                 fp8)


def fused_linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor,
                               ignore_index: int = IGNORE_INDEX,
                               chunk_rows: int | None = None, fp8: bool = False) -> Tensor:
    """:func:`chunked_linear_cross_entropy` with each chunk's softmax and gradient one
    Triton kernel (``ten.kernels.loss_fused``). No host sync."""
    rows = chunk_rows or default_chunk_rows(*hidden.shape[-2:], weight.shape[0],
                                            FUSED_CHUNK_ELEMENTS)
    return _linear_cross_entropy(hidden, weight, targets, ignore_index, rows, _rows_fused,
                                 fp8)


def _linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor,
                          ignore_index: int, rows: int, rows_fn: RowsFn, fp8: bool) -> Tensor:
    if hidden.dim() != 2 or weight.dim() != 2 or targets.shape != hidden.shape[:1]:
        raise ValueError(f"need hidden (N, d), weight (V, d), targets (N,); got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)}, {tuple(targets.shape)}")
    if rows < 1:
        raise ValueError(f"chunk_rows must be >= 1, got {rows}")
    dev = hidden.device.type
    compute = (torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev)
               else torch.promote_types(hidden.dtype, weight.dtype))
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return _ChunkedLinearCE.apply(hidden, weight, targets, ignore_index, rows, compute,
                                      rows_fn, fp8)
    with torch.autocast(dev, enabled=False):
        loss_sum, n_valid = _chunks(hidden, weight, targets, ignore_index, rows, compute,
                                    rows_fn, None, None, fp8)
    return loss_sum / n_valid


def _chunks(hidden: Tensor, weight: Tensor, targets: Tensor, ignore_index: int, rows: int,
            compute: torch.dtype, rows_fn: RowsFn, grad_h: Tensor | None,
            grad_w: Tensor | None, fp8: bool) -> tuple[Tensor, Tensor]:
    """(sum of per-row losses, number of non-ignored rows); fills grad_h / grad_w (when
    given) with d(mean loss)/dh and d(mean loss)/dW; with ``fp8`` the head's GEMMs in
    float8 (ten.kernels.loss_float8)."""
    acc = torch.promote_types(compute, torch.float32)  # fp32 (fp64 in gradient checks)
    valid = targets != ignore_index  # (N,)
    n_valid = valid.sum()
    # 1/n for the gradient of the mean; 0 rows for ignored targets (no 0/0 when all are)
    row_scale = valid.to(acc) / n_valid.clamp(min=1).to(acc)  # (N,)
    safe_t = torch.where(valid, targets, 0)
    need_grad = grad_h is not None or grad_w is not None
    chunk_losses = loss_float8.chunk_losses if fp8 else _chunk_losses
    loss_sum = chunk_losses(hidden, weight, safe_t, valid, row_scale if need_grad else None,
                            rows, compute, rows_fn, grad_h, grad_w)
    return loss_sum, n_valid


def _chunk_losses(hidden: Tensor, weight: Tensor, targets: Tensor, valid: Tensor,
                  row_scale: Tensor | None, rows: int, compute: torch.dtype, rows_fn: RowsFn,
                  grad_h: Tensor | None, grad_w: Tensor | None) -> Tensor:
    """The sum of the per-row losses, the head's GEMMs in ``compute`` (the autocast dtype),
    ``rows`` rows a chunk; with ``row_scale`` (the rows' weights in the mean) fills grad_h
    and adds into grad_w the gradients of Σ_r w_r · loss_r."""
    w = weight.to(compute)
    loss_sum = torch.zeros((), dtype=torch.promote_types(compute, torch.float32),
                           device=hidden.device)
    for start in range(0, hidden.shape[0], rows):
        sl = slice(start, start + rows)
        h = hidden[sl].to(compute)  # (R, d)
        logits = h @ w.t()  # (R, V) in the matmul's dtype: the chunk's V-wide buffer
        row_loss, dlogits = rows_fn(logits, targets[sl],
                                    None if row_scale is None else row_scale[sl])
        loss_sum += (row_loss.to(loss_sum.dtype) * valid[sl]).sum()
        if grad_h is not None:
            grad_h[sl].copy_(dlogits @ w)  # (R, d), a view of the (N, d) buffer
        if grad_w is not None:  # (V, d), accumulated in fp32
            add_weight_grad(grad_w, dlogits, h)
        del logits, dlogits  # before the next chunk's matmul: one chunk's buffer at a time
    return loss_sum


def add_weight_grad(grad_w: Tensor, dlogits: Tensor, h: Tensor) -> None:
    """grad_w (V, d) += dlogitsᵀ h, the chunk's weight gradient added into the sum.

    In one precision it is one in-place ``addmm``. A bf16 chunk into the fp32 sum goes into
    the GEMM's epilogue where torch offers it (:func:`widening_addmm`): the GEMM reads and
    writes the sum itself, its fp32 accumulator unrounded. Elsewhere the product is rounded
    to bf16, written, and read again by a separate add (12 bytes an element of W for 8)."""
    if dlogits.dtype == grad_w.dtype:
        grad_w.addmm_(dlogits.t(), h)
    elif widening_addmm(grad_w.device.type, dlogits.dtype, grad_w.dtype):
        torch.addmm(grad_w, dlogits.t(), h, grad_w.dtype, out=grad_w)
    else:  # the add widens the product as it reads it: no fp32 copy of it
        grad_w += dlogits.t() @ h


@functools.cache
def widening_addmm(device_type: str, product: torch.dtype, total: torch.dtype) -> bool:
    """Whether ``torch.addmm(total, a, b, out_dtype, out=total)`` runs here with a and b in
    ``product``: a GEMM that adds a bf16 product into an fp32 matrix in place. CUDA only
    (torch has no CPU kernel for it), and builds differ: some refuse an accumulator wider
    than the operands. Asked once per process with a 2 x 2 call, which raises before it
    launches anything where it is refused, and reads nothing back (no host sync)."""
    if device_type != "cuda":
        return False
    a = torch.zeros(2, 2, dtype=product, device=device_type)
    acc = torch.zeros(2, 2, dtype=total, device=device_type)
    try:
        torch.addmm(acc, a, a, total, out=acc)
    except (RuntimeError, TypeError):  # TORCH_CHECK's refusal; an older signature
        return False
    return True


def weight_grad_path(device_type: str, product: torch.dtype, total: torch.dtype) -> str:
    """How :func:`add_weight_grad` adds a chunk here, in words (for the benchmarks)."""
    if product == total:
        return "addmm_ in place"
    if widening_addmm(device_type, product, total):
        return "in the GEMM's epilogue (addmm into fp32)"
    return "product rounded, then an fp32 add"


def _rows_torch(logits: Tensor, t: Tensor, scale: Tensor | None
                ) -> tuple[Tensor, Tensor | None]:
    """The chunk's log-softmax and gradient in torch ops, on an fp32 copy (fp64 stays)."""
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (R, V)
    t = t[:, None]
    target_logit = x.gather(1, t).squeeze(1)  # (R,)
    # log-sum-exp in place: one (R, V) buffer, which then becomes the softmax
    top = x.amax(dim=-1, keepdim=True)  # (R, 1)
    sum_exp = x.sub_(top).exp_().sum(dim=-1, keepdim=True)  # (R, 1)
    loss = (top + sum_exp.log()).squeeze(1) - target_logit  # (R,)
    if scale is None:
        return loss, None
    # d loss_row / d logits = softmax - onehot(target), times the row's weight, written
    # back into the logits' buffer (the caller still holds it: no second one)
    d = x.div_(sum_exp)
    d.scatter_add_(1, t, torch.full_like(t, -1, dtype=d.dtype))
    d.mul_(scale[:, None].to(d.dtype))
    return loss, logits if d is logits else logits.copy_(d)


def _rows_fused(logits: Tensor, t: Tensor, scale: Tensor | None
                ) -> tuple[Tensor, Tensor | None]:
    """The chunk's log-softmax and gradient as one kernel, the gradient in place."""
    loss = _fused_module().cross_entropy_rows(logits, t, scale)
    return loss, None if scale is None else logits


def _fused_module():
    """ten.kernels.loss_fused, imported on first use so that ``import ten.kernels.loss``
    needs no triton."""
    try:
        return importlib.import_module("ten.kernels.loss_fused")
    except ImportError as err:
        why = str(err).splitlines()[0] if str(err) else type(err).__name__
        raise ValueError(f"loss backend 'fused' needs triton, which does not import here "
                         f"({why}): use loss 'chunked' (or 'auto')") from None


class _ChunkedLinearCE(torch.autograd.Function):
    """Forward computes the loss and both gradients chunk by chunk (as Liger does): the
    same three matmuls as a plain forward + backward, and nothing V-wide is saved.
    Backward only scales the saved gradients by the incoming one."""

    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, targets: Tensor,
                ignore_index: int, rows: int, compute: torch.dtype, rows_fn: RowsFn,
                fp8: bool) -> Tensor:
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if need_h else None
        acc = torch.promote_types(compute, torch.float32)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        with torch.autocast(hidden.device.type, enabled=False):
            loss_sum, n_valid = _chunks(hidden, weight, targets, ignore_index, rows, compute,
                                        rows_fn, grad_h, grad_w, fp8)
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_h, grad_w)
        return loss_sum / n_valid

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        grad_h, grad_w = ctx.saved_tensors
        gh = None if grad_h is None else grad_h * grad_out.to(grad_h.dtype)
        gw = None if grad_w is None else (grad_w * grad_out.to(grad_w.dtype)).to(ctx.weight_dtype)
        return gh, gw, None, None, None, None, None, None


def liger_linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor,
                               ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Liger-Kernel's fused linear cross-entropy (CUDA). Note: it reads the number of
    non-ignored targets with ``.item()``, one host sync per call."""
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    loss = liger_fused_linear_cross_entropy(hidden, weight, targets,
                                            ignore_index=ignore_index, reduction="mean")
    return loss.float()


def liger_available() -> bool:
    """Whether Liger's kernel imports here (a broken Triton install counts as missing)."""
    try:
        import liger_kernel.transformers.functional  # noqa: F401
    except Exception:  # ImportError, or a Triton/driver error raised while importing
        return False
    return True


def resolve_loss_backend(name: str, device: torch.device | str) -> tuple[str, str]:
    """(backend, one line saying which and why). ``auto``: fused on CUDA when triton
    imports, else chunked. An explicit backend that cannot run here raises ValueError with
    the fix."""
    device = torch.device(device)
    if name not in LOSS_BACKENDS:
        raise ValueError(f"loss backend must be one of {LOSS_BACKENDS}, got {name!r}")
    if name == "liger":
        return _liger_here(device)
    if name == "fused":
        interpreted = _fused_module().INTERPRETED
        if device.type != "cuda" and not interpreted:
            raise ValueError(f"loss backend 'fused' runs a Triton kernel on a CUDA device, "
                             f"this run is on {device.type}; use loss 'chunked' (or 'auto')")
        return "fused", "loss: fused linear cross-entropy (asked for)"
    if name != "auto":
        return name, f"loss: {name} linear cross-entropy (asked for)"
    return _auto(device)


def _liger_here(device: torch.device) -> tuple[str, str]:
    if device.type != "cuda":
        raise ValueError(f"loss backend 'liger' needs a CUDA device, this run is on "
                         f"{device.type}; use loss 'chunked' (or 'auto')")
    if not liger_available():
        raise ValueError("loss backend 'liger' needs liger-kernel: pip install "
                         "'ten-runner[gpu]' (or pip install liger-kernel), or use loss "
                         "'fused'")
    return "liger", "loss: Liger fused linear cross-entropy (asked for)"


def _auto(device: torch.device) -> tuple[str, str]:
    """``auto``: the fused kernel on CUDA when Triton compiles for it, else chunked."""
    if device.type != "cuda":
        return "chunked", f"loss: chunked linear cross-entropy (auto: {device.type})"
    try:
        interpreted = _fused_module().INTERPRETED
    except ValueError:
        return "chunked", "loss: chunked linear cross-entropy (auto: triton not installed)"
    if interpreted:
        return "chunked", "loss: chunked linear cross-entropy (auto: TRITON_INTERPRET=1)"
    return "fused", "loss: fused linear cross-entropy (auto: CUDA and triton)"


_BACKEND_FNS = {"chunked": chunked_linear_cross_entropy, "fused": fused_linear_cross_entropy}


def check_fp8_head(backend: str) -> None:
    """ValueError naming the fix unless ``backend`` can run the head's GEMMs in float8
    (a model's ``fp8_head``): chunked and fused can (``auto`` picks one of them)."""
    if backend not in FP8_HEAD_LOSSES:
        raise ValueError(f"loss {backend!r} runs the head in the autocast dtype; the model's "
                         "fp8_head needs loss chunked, fused or auto")


def linear_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor,
                         ignore_index: int = IGNORE_INDEX, backend: str = "chunked",
                         chunk_rows: int | None = None, fp8: bool = False) -> Tensor:
    """Mean cross-entropy of ``hidden @ weight.T`` against ``targets``; hidden (..., d) and
    targets (...) are flattened. ``backend``: chunked, fused, liger or reference (resolve
    ``auto`` with :func:`resolve_loss_backend` first); ``fp8``: the head's GEMMs in float8
    (ten.kernels.loss_float8), chunked and fused only."""
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if backend in _BACKEND_FNS:
        return _BACKEND_FNS[backend](hidden, weight, targets, ignore_index, chunk_rows, fp8)
    if fp8:
        check_fp8_head(backend)
    if backend == "liger":
        return liger_linear_cross_entropy(hidden, weight, targets, ignore_index)
    if backend == "reference":
        return reference_linear_cross_entropy(hidden, weight, targets, ignore_index)
    raise ValueError(f"loss backend must be chunked, fused, liger or reference, got "
                     f"{backend!r}")


class NextTokenLoss(nn.Module):
    """The training objective around a language model: ``forward(inputs (B, T), targets
    (B, T)) -> mean loss``. What the trainer wraps in DDP / torch.compile, so the head's
    logits never exist as a whole; the model itself keeps ``model(ids) -> logits``.

    ``reference`` calls the model for its logits (any module returning ``(logits, state)``);
    the others need ``lm.hidden_states(ids)`` and ``lm.output_weight``.
    """

    def __init__(self, lm: nn.Module, backend: str = "chunked",
                 chunk_rows: int | None = None) -> None:
        super().__init__()
        if backend not in LOSS_BACKENDS or backend == "auto":
            raise ValueError(f"backend must be chunked, fused, liger or reference, got "
                             f"{backend!r} (resolve auto with resolve_loss_backend)")
        if backend != "reference" and not hasattr(lm, "hidden_states"):
            raise ValueError(f"loss backend {backend!r} needs a model with hidden_states() "
                             f"and output_weight; {type(lm).__name__} has none: use "
                             "'reference'")
        self.lm, self.backend, self.chunk_rows = lm, backend, chunk_rows
        self.fp8_head = getattr(getattr(lm, "config", None), "fp8_head", False)
        if self.fp8_head:
            check_fp8_head(backend)

    def forward(self, inputs: Tensor, targets: Tensor) -> Tensor:
        if self.backend == "reference":
            logits, _ = self.lm(inputs)  # (B, T, V)
            return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(),
                                   ignore_index=IGNORE_INDEX)
        hidden, _ = self.lm.hidden_states(inputs)  # (B, T, d)
        return linear_cross_entropy(hidden, self.lm.output_weight, targets,
                                    backend=self.backend, chunk_rows=self.chunk_rows,
                                    fp8=self.fp8_head)

