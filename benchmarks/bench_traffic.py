"""Memory traffic of one flagship micro-batch, traced on a CPU, and the MFU it allows.

Every aten operator of a training step of the job (forward and backward of the objective
under its autocast dtype, gradient checkpointing's recompute, the gradients added into
``.grad`` by every micro-batch after the first, the gradient clip once a step), reported
per micro-batch (the step's sum over ``grad_accum``), runs under ``FakeTensorMode``:
shapes, dtypes and strides, no data, so the real T = 32768 step traces in seconds on any
machine. A ``TorchDispatchMode`` counts, per operator that is a kernel on a GPU (views
are not): the bytes it reads and writes (each input and output once, a broadcast input
at its storage's size), its matmul FLOPs, and whether it is a dtype cast or a host sync
(``.item()``). The optimizer, which runs outside torch for 8-bit AdamW, is added by its
known traffic per parameter.

From those it prints the floor of a step's time on a datasheet GPU (every kernel at its
own roofline: max(bytes / bandwidth, FLOPs / peak), kernels not overlapping, launches
free) and the MFU ceiling that floor implies: what the eager hot path allows at best.

    python benchmarks/bench_traffic.py                         # the flagship job, as configured
    python benchmarks/bench_traffic.py --set model.scan_backend=chunked
    python benchmarks/bench_traffic.py --json                  # for scripts

The scan is reported on its own line (traced alone at the same shapes: its forward twice,
once for the recompute, and its backward per layer) and the rest is "outside the scan".
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
import torch  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402

from ten.cards import CARDS  # noqa: E402

# The fused ops trace on a CPU under Triton's interpreter (they never run). Not on a GPU,
# where the suite's bandwidth section runs the kernels in the process that imports this.
if not torch.cuda.is_available():  # before anything imports triton
    os.environ.setdefault("TRITON_INTERPRET", "1")

FLAGSHIP_JOB = ROOT / "jobs" / "l40s-small-32k.yaml"
GB = 1e9
ADAMW8BIT_MIN_SIZE = 4096  # bitsandbytes keeps float32 moments for tensors smaller than this


@dataclass(frozen=True)
class Gpu:
    name: str
    bandwidth: float  # bytes/s, datasheet
    bf16: float  # FLOP/s, dense tensor cores
    tf32: float  # FLOP/s: fp32 matmuls run as TF32 (the trainer allows it)
    fp8: float  # FLOP/s: float8 operands (_scaled_mm; model.fp8)

    def peak(self, operands: torch.dtype) -> float:
        """The dense tensor-core rate of a matmul whose operands are in ``operands``."""
        if operands == torch.float32:
            return self.tf32
        return self.fp8 if operands.itemsize == 1 else self.bf16


GPUS = (Gpu("H100 SXM", CARDS["H100"].bandwidth, 989e12, 494e12, 1979e12),
        Gpu("L40S", CARDS["L40S"].bandwidth, 362e12, 181e12, 733e12))

# Operators that launch nothing on a GPU: allocation and metadata.
NO_KERNEL = {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
             "lift_fresh", "_local_scalar_dense", "resize_", "set_", "is_same_size",
             "_has_compatible_shallow_copy_type", "sym_size", "sym_stride", "sym_numel",
             "sym_storage_offset", "size", "stride", "dim", "is_contiguous",
             "_unsafe_view", "_reshape_alias"}
MATMULS = {"mm", "addmm", "addmm_", "bmm", "baddbmm", "_addmm_activation", "addbmm",
           "_scaled_mm"}
_BIAS_FIRST = {"addmm", "addmm_", "baddbmm", "_addmm_activation", "addbmm"}  # (c, a, b)
SYNCS = {"_local_scalar_dense", "nonzero", "equal", "is_nonzero", "item", "_assert_async"}


@dataclass
class Tally:
    """What one group of kernels costs."""

    kernels: int = 0
    bytes: float = 0.0
    flops: float = 0.0
    floor_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))

    def add(self, nbytes: float, flops: float, operands: torch.dtype) -> None:
        """One kernel; ``flops`` at the tensor cores' rate for ``operands``."""
        self.kernels += 1
        self.bytes += nbytes
        self.flops += flops
        for gpu in GPUS:
            self.floor_s[gpu.name] += max(nbytes / gpu.bandwidth, flops / gpu.peak(operands))

    def merge(self, other: Tally, times: float = 1.0) -> None:
        self.kernels += round(other.kernels * times)
        self.bytes += other.bytes * times
        self.flops += other.flops * times
        for k, v in other.floor_s.items():
            self.floor_s[k] += v * times


def _bytes(t: Any) -> float:
    if not isinstance(t, torch.Tensor):
        return 0.0
    whole = t.numel() * t.element_size()
    try:  # a broadcast (stride-0) input is read at its storage's size, not its view's
        return float(min(whole, t.untyped_storage().nbytes()))
    except (RuntimeError, NotImplementedError):
        return float(whole)


def _matmul_flops(name: str, args: tuple, out: Any) -> tuple[float, torch.dtype]:
    """(FLOPs, the operands' dtype) of a matmul; (0, bf16) for any other operator."""
    if name not in MATMULS or not isinstance(out, torch.Tensor):
        return 0.0, torch.bfloat16
    a = args[1] if name in _BIAS_FIRST else args[0]
    flops = 2.0 * out.numel() * a.shape[-1] * (a.shape[0] if name == "addbmm" else 1)
    return flops, a.dtype


class TrafficMode(TorchDispatchMode):
    """Counts every kernel dispatched inside it into ``tallies[kind]``."""

    def __init__(self) -> None:
        super().__init__()
        self.tallies: dict[str, Tally] = defaultdict(Tally)
        self.by_op: dict[str, Tally] = defaultdict(Tally)  # "kind: operator"
        self.operators: dict[str, Tally] = defaultdict(Tally)  # "ten::swiglu", "aten::mm"
        self.syncs: dict[str, int] = defaultdict(int)
        self.region: str | None = None  # a label set around a call (the loss)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.__name__.split(".")[0]
        if name in SYNCS:
            self.syncs[name] += 1
            if name == "_local_scalar_dense":  # a fake tensor has no value: say "no"
                return 0
        out = func(*args, **kwargs)
        if func.namespace == "prim" or name in NO_KERNEL or _is_view(func):
            return out
        # an ``out=`` tensor is written, not read (counted once, as an output)
        ins, _ = tree_flatten((args, {k: v for k, v in kwargs.items() if k != "out"}))
        outs, _ = tree_flatten(out)
        nbytes = sum(map(_bytes, ins)) + sum(map(_bytes, outs))
        returned = {id(t) for t in outs}
        for arg, value in zip(func._schema.arguments, args, strict=False):
            if arg.alias_info is not None and arg.alias_info.is_write and \
                    id(value) not in returned:  # aten's x.add_() returns x: counted already
                nbytes += _bytes(value)  # an input written in place is also written
        if func.namespace == "ten" and name in ("cross_entropy_rows",
                                                "cross_entropy_rows_float8"):
            nbytes += _bytes(args[0])  # its two passes read the logits twice
        if name in ("zero_", "fill_", "zeros", "full", "ones", "zeros_like", "ones_like",
                    "full_like", "copy_"):
            nbytes = sum(map(_bytes, outs)) + (sum(map(_bytes, ins[1:2])) if name == "copy_"
                                              else 0)
        flops, operands = _matmul_flops(name, args, out)
        kind = self._kind(name, args, kwargs, out)
        self.tallies[kind].add(nbytes, flops, operands)
        self.by_op[f"{kind}: {name}"].add(nbytes, flops, operands)
        self.operators[f"{func.namespace}::{name}"].add(nbytes, flops, operands)
        return out

    def _kind(self, name: str, args: tuple, kwargs: dict, out: Any) -> str:
        if self.region:
            return self.region
        if name in MATMULS:
            return "matmul"
        if name == "convolution" or name == "convolution_backward":
            return "conv"
        if name == "_to_copy" and isinstance(out, torch.Tensor) and \
                isinstance(args[0], torch.Tensor) and args[0].dtype != out.dtype:
            return "cast"
        return "elementwise"


def _is_view(func) -> bool:
    """An operator whose output aliases its input without writing: no kernel."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write
                                 for r in returns)


# --- what is traced ---------------------------------------------------------------------------

def load(sets: list[str]) -> tuple[Any, Any]:
    """The flagship job's model config and train config (runner's job loader)."""
    from runner.job import load_job
    from runner.job.library import train_config

    job = load_job(FLAGSHIP_JOB, sets)
    cfg = job.model_settings(job.data.tokenizer.vocab_size)
    if cfg.scan_backend == "auto":  # what auto picks on the GPU the job runs on
        cfg = dataclasses.replace(cfg, scan_backend="fused")
    return cfg, train_config(job)


def amp_dtype(train: Any) -> torch.dtype | None:
    # the job's dtype on a GPU: "auto" is bf16 on every GPU this project targets
    return {"auto": torch.bfloat16, "bf16": torch.bfloat16, "fp16": torch.float16,
            "fp32": None}[train.precision]


def loss_backend(train: Any) -> str:
    """The loss the job runs on a GPU (``auto``: fused); Liger's kernels cannot be traced."""
    if train.loss == "liger":
        raise SystemExit("bench_traffic: Liger's kernels are not torch operators and cannot "
                         "be traced; --set train.loss=fused traces the project's own")
    return "fused" if train.loss == "auto" else train.loss


def gpu_adds_weight_grad_in_gemm() -> bool:
    """Whether the loss adds its bf16 weight gradient into the fp32 sum inside the GEMM on
    the GPU being modelled (``ten.kernels.loss.widening_addmm``): this one's torch where a
    GPU runs the trace (the suite's bandwidth section), else a datasheet GPU's, whose torch
    is taken to offer it (a CPU torch has no kernel for it; the fake tensors trace it)."""
    from ten.kernels.loss import widening_addmm

    return not torch.cuda.is_available() or widening_addmm("cuda", torch.bfloat16,
                                                           torch.float32)


def trace_micro_batch(cfg: Any, train: Any, batch: int) -> tuple[TrafficMode, Any]:
    """The job's step as ``ten.train.step.train_step`` runs it, on fake tensors, as its average
    micro-batch: the first (forward + backward of the objective), one of the other
    ``grad_accum - 1`` (traced next on the same model: they also add their gradients into
    ``.grad``), and the step's end once (the gradient clip and the non-finite flags), the
    sum divided by ``grad_accum``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    import ten.kernels.loss as loss_mod
    from ten.kernels.loss import NextTokenLoss
    from ten.model.presets import build_model

    backend = loss_backend(train)
    in_gemm = gpu_adds_weight_grad_in_gemm()
    first, other, end = TrafficMode(), TrafficMode(), TrafficMode()
    with FakeTensorMode(allow_non_fake_inputs=True), torch.device("cpu"):
        model = build_model(cfg)
        objective = NextTokenLoss(model, backend)
        ids = torch.zeros(batch, cfg.seq_len + 1, dtype=torch.long)
        inner = loss_mod.linear_cross_entropy
        mode = first  # the mode `labelled` labels: the loop below rebinds it per micro-batch

        def labelled(*a, **k):  # the chunked loss does all its work in forward
            mode.region = "loss"
            try:
                return inner(*a, **k)
            finally:
                mode.region = None

        probe = loss_mod.widening_addmm  # the fake tensors are on the CPU: ask as the GPU
        loss_mod.linear_cross_entropy = labelled
        loss_mod.widening_addmm = lambda _device, *dtypes: in_gemm
        try:
            dt = amp_dtype(train)
            # one autocast region for the step's forwards, backward outside autocast
            with torch.autocast("cpu", dtype=dt or torch.float32, enabled=dt is not None):
                for mode in (first, other):
                    with mode:
                        loss = objective(ids[:, :-1], ids[:, 1:])
                        with torch.autocast("cpu", enabled=False):
                            loss.backward()
            with end:
                params = [p for p in model.parameters()]
                norm = torch.nn.utils.clip_grad_norm_(params, train.grad_clip or math.inf)
                torch.stack([~torch.isfinite(loss), ~torch.isfinite(norm)]).int()
        finally:
            loss_mod.linear_cross_entropy = inner
            loss_mod.widening_addmm = probe
    accum = train.grad_accum
    return average(((first, 1.0), (other, accum - 1.0), (end, 1.0)), accum), model


def average(parts: tuple[tuple[TrafficMode, float], ...], n: int) -> TrafficMode:
    """The traced parts, each counted ``times``, per one of ``n``: a step's tallies as
    its average micro-batch (kernel counts rounded)."""
    out = TrafficMode()
    for part, times in parts:
        for key, tally in part.tallies.items():
            out.tallies[key].merge(tally, times / n)
        for key, tally in part.by_op.items():
            out.by_op[key].merge(tally, times / n)
        for key, tally in part.operators.items():
            out.operators[key].merge(tally, times / n)
        for key, count in part.syncs.items():
            out.syncs[key] += count * times / n
    return out


def trace_scan(cfg: Any, batch: int, recomputed: bool,
               act: torch.dtype = torch.float32) -> Tally:
    """One layer's scan as the model runs it (forward, the recompute's forward when its
    block is checkpointed, backward), on fake tensors shaped as in the flagship; the
    drive arrives in fp32, as the model's does (γ is fp32). A matrix state's values and
    queries come from linear layers, in the activations' dtype ``act``."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from ten.kernels.matrix_scan import matrix_scan
    from ten.kernels.scan import scan

    K2, T = 2 * cfg.n_eigenstates, cfg.seq_len
    total = Tally()
    with FakeTensorMode(), torch.device("cpu"):
        beta = torch.empty(batch, T, K2, requires_grad=True)
        shape = (batch, T, K2) if cfg.selective else (K2,)
        log_lam = torch.empty(shape, requires_grad=True)
        if cfg.state == "matrix":
            v = torch.empty(batch, T, cfg.n_heads * cfg.head_value_dim, dtype=act,
                            requires_grad=True)
            q = torch.empty(batch, T, K2, dtype=act, requires_grad=True)
        for backward in (False, True) if recomputed else (True,):
            mode = TrafficMode()
            with mode:
                if cfg.state == "matrix":
                    c, _ = matrix_scan(beta, v, q, log_lam, None, heads=cfg.n_heads,
                                       backend=cfg.scan_backend, chunk_size=cfg.chunk_size)
                else:
                    c, _ = scan(beta, log_lam, None, backend=cfg.scan_backend,
                                chunk_size=cfg.chunk_size)
                if backward:
                    c.backward(torch.empty_like(c))
            for t in mode.tallies.values():
                total.merge(t)
    return total


def optimizer_tally(model: Any, optimizer: str) -> tuple[Tally, int]:
    """The optimizer step by its known traffic (it is not traced: its kernels are not
    torch's operators), and its host syncs. Per parameter, fp32 weights and gradients:
    ``adamw`` (fused, multi-tensor): read w, g, m, v, write w, m, v = 28 bytes, a few
    launches; ``adamw8bit`` (``ten.train.adamw8bit`` on CUDA, the launches of
    ``ten.kernels.multi_tensor_adamw``): 8-bit moments, read w, g, m, v and write w, m, v =
    4+4+1+1+4+1+1 = 16 bytes (float32 moments, 28 bytes, for tensors under bitsandbytes'
    4,096 elements), one launch and a step count per parameter group and state kind, and
    no host sync (the non-finite skip is read on the device)."""
    n = sum(p.numel() for p in model.parameters())
    tally = Tally()
    if optimizer == "adamw8bit":
        for group in model.optimizer_groups(0.0):
            sizes = [p.numel() for p in group["params"]]
            for eight_bit in (True, False):
                numel = sum(s for s in sizes if (s >= ADAMW8BIT_MIN_SIZE) == eight_bit)
                if numel:
                    tally.add(0.0, 0.0, torch.float32)  # the step count's add
                    tally.add((16.0 if eight_bit else 28.0) * numel, 0.0, torch.bfloat16)
        return tally, 0
    for _ in range(2):
        tally.add(28.0 * n / 2, 0.0, torch.bfloat16)
    return tally, 0


def analyse(cfg: Any, train: Any) -> dict[str, Any]:
    from ten.model.lm import recomputed_blocks

    batch = train.batch_size
    mode, model = trace_micro_batch(cfg, train, batch)
    recomputed = recomputed_blocks(cfg)
    scan_all = Tally()
    act = amp_dtype(train) or torch.float32
    scan_all.merge(trace_scan(cfg, batch, True, act), recomputed)
    scan_all.merge(trace_scan(cfg, batch, False, act), cfg.n_layers - recomputed)
    opt, opt_syncs = optimizer_tally(model, train.optimizer)
    accum = train.grad_accum

    total = Tally()
    for t in mode.tallies.values():
        total.merge(t)
    outside = Tally()
    outside.merge(total)
    outside.merge(scan_all, -1.0)  # the traced micro-batch includes every layer's scan
    tokens = batch * cfg.seq_len
    model_flops = model.flops_per_token(cfg.seq_len) * tokens
    traced_syncs = sum(mode.syncs.values())

    # A step: grad_accum micro-batches, then one optimizer update.
    rows = {k: v for k, v in sorted(mode.tallies.items())}
    per_step_floor = {g.name: total.floor_s[g.name] + opt.floor_s[g.name] / accum
                      for g in GPUS}
    ceilings = {g.name: model_flops / per_step_floor[g.name] / g.bf16 for g in GPUS}
    return {
        "job": FLAGSHIP_JOB.name, "batch": batch, "seq_len": cfg.seq_len,
        "grad_accum": accum, "scan_backend": cfg.scan_backend,
        "loss_traced": loss_backend(train),
        "optimizer": train.optimizer,
        "by_kind": {k: {"kernels": v.kernels, "gb": v.bytes / GB, "tflop": v.flops / 1e12}
                    for k, v in rows.items()},
        "top_ops": {k: {"kernels": v.kernels, "gb": v.bytes / GB} for k, v in sorted(
            mode.by_op.items(), key=lambda kv: -kv[1].bytes)[:20]},
        "scan": {"kernels": scan_all.kernels, "gb": scan_all.bytes / GB},
        "optimizer_per_step": {"kernels": opt.kernels, "gb": opt.bytes / GB,
                               "host_syncs": opt_syncs},
        "bytes_outside_scan_gb": outside.bytes / GB,
        "kernels": total.kernels + math.ceil(opt.kernels / accum),
        "casts": mode.tallies["cast"].kernels if "cast" in mode.tallies else 0,
        # ten.train.nonfinite.step_unless: both optimizers skip a step on the device
        "host_syncs_per_step": round(accum * traced_syncs) + opt_syncs,
        "model_tflop": model_flops / 1e12,
        "floor_ms": {k: 1e3 * v for k, v in per_step_floor.items()},
        "mfu_ceiling_h100": ceilings["H100 SXM"], "mfu_ceiling_l40s": ceilings["L40S"],
    }


def report(r: dict[str, Any]) -> str:
    lines = [f"{r['job']}: batch {r['batch']} x T {r['seq_len']} (x{r['grad_accum']} "
             f"accumulated), scan {r['scan_backend']}, loss traced {r['loss_traced']}, "
             f"optimizer {r['optimizer']}",
             f"{'kind':12} {'kernels':>8} {'GB':>9} {'TFLOP':>8}"]
    for k, v in r["by_kind"].items():
        lines.append(f"{k:12} {v['kernels']:>8} {v['gb']:>9.2f} {v['tflop']:>8.2f}")
    lines.append(f"{'(scan)':12} {r['scan']['kernels']:>8} {r['scan']['gb']:>9.2f}   (inside "
                 "the rows above)")
    o = r["optimizer_per_step"]
    lines.append(f"{'optimizer':12} {o['kernels']:>8} {o['gb']:>9.2f}   per step, "
                 f"{o['host_syncs']} host syncs (modelled)")
    lines += [f"bytes outside the scan: {r['bytes_outside_scan_gb']:.1f} GB per micro-batch; "
              f"kernels {r['kernels']} (casts {r['casts']}); host syncs per step "
              f"{r['host_syncs_per_step']}",
              f"model FLOPs per micro-batch: {r['model_tflop']:.1f} TFLOP; floor per "
              f"micro-batch: " + ", ".join(f"{k} {v:.0f} ms" for k, v in r["floor_ms"].items()),
              f"MFU ceiling (eager, every kernel at its roofline): H100 "
              f"{r['mfu_ceiling_h100']:.1%}, L40S {r['mfu_ceiling_l40s']:.1%}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="override a field of the job, as ten-runner run --set does")
    p.add_argument("--json", action="store_true", help="print the numbers as JSON")
    p.add_argument("--top", type=int, default=0, help="also list the N costliest operators")
    args = p.parse_args(argv)
    cfg, train = load(args.sets)
    r = analyse(cfg, train)
    if args.json:
        print(json.dumps(r, indent=1))
        return 0
    print(report(r))
    for name, v in list(r["top_ops"].items())[:args.top]:
        print(f"  {name:40} {v['kernels']:>7} kernels {v['gb']:>8.2f} GB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
