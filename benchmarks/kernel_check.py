"""Every Triton kernel of the project, compiled ahead of time for the GPUs it runs on, with
no GPU: registers, spills, shared memory, programs per SM and the issue and byte floors of
its loop, per kernel and architecture.

Triton compiles for a named target without a device (``triton.compile`` of an
``ASTSource`` for ``GPUTarget("cuda", 89 | 90, 32)``), and its bundled ``ptxas -v``
reports each kernel's registers, stack frame and spill traffic (the assembler and target
Triton used for the cubin). The variants are the flagship's (small_32k: K = 128, fp32
scan, bf16 activations, d = 1024, the SwiGLU width): the ones a run compiles first,
specialised as Triton's launcher specialises them (16-byte aligned pointers, sizes that
are multiples of 16). "Loop exchanges" counts what moves values between threads inside a
loop (layout changes, reductions, scans), read off the kernel's Triton GPU IR.

The floors come from the kernel's machine code (SASS, disassembled with the bundled
``nvdisasm``): the instructions one warp issues per pass of its main loop (the whole
kernel when it has none), with the cold paths left out (libdevice's sin/cos argument
reduction for angles past ~1e5 rad: a branch around an inner loop), and the bytes its
global loads and stores move in that pass. An SM issues at most 4 warp-instructions a
cycle, so "issue / bytes" is the time to issue a pass over the time its bytes take at
datasheet bandwidth: above 1 the kernel is bound by issuing instructions, not by memory.
The bytes count every global access (repeated reads of a lane's value hit the cache), so
the ratio errs low only for kernels that re-read what they read.

    python benchmarks/kernel_check.py              # the table, exit 1 on a problem
    python benchmarks/kernel_check.py --markdown   # the table for BENCHMARKS.md
    python benchmarks/kernel_check.py --only "scan summary"   # some kernels

A problem is a kernel that does not compile, one that spills registers, or one that fits
fewer than 4 programs on an SM (from its registers, threads and shared memory;
FEWER_PROGRAMS names the kernels allowed less); a stack frame alone is not one
(libdevice's sin and cos keep their argument reduction there).
sm_89 is the L40S, sm_90 the H100 and H200. tests/test_kernel_check.py runs it in CI.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import subprocess
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import ten.cards  # noqa: E402


@dataclass(frozen=True)
class Card:
    """What bounds a kernel on the card an architecture stands for (datasheets)."""

    name: str
    sms: int
    clock_hz: float  # boost SM clock
    bandwidth: float  # bytes/s (ten.cards)
    issue_per_sm: int = 4  # warp-instructions a cycle: one per scheduler, 4 schedulers

    def issue_over_bytes(self, instructions: int, nbytes: int) -> float:
        """Time to issue ``instructions`` (warp-level) over time to move ``nbytes``."""
        issue_s = instructions / (self.sms * self.issue_per_sm * self.clock_hz)
        return issue_s / (nbytes / self.bandwidth)


CARDS = {89: Card("L40S", 142, 2.52e9, ten.cards.CARDS["L40S"].bandwidth),
         90: Card("H100", 132, 1.98e9, ten.cards.CARDS["H100"].bandwidth)}
ARCHS = {arch: card.name for arch, card in CARDS.items()}
# Per SM: registers, threads, shared memory (bytes) a block may use (CUDA's tables).
SM_LIMITS = {89: (65536, 1536, 100 * 1024), 90: (65536, 2048, 228 * 1024)}
MIN_PROGRAMS_PER_SM = 4
# Kernels that hold more than a scan's lanes, with the programs an SM must fit instead.
# The matrix state's keep a block of the state (forward, states) or of its gradient
# (dstates) in registers, or a (16, 16, N) tile of decays (backward): at the flagship's
# head 2 programs of 4 warps, or 1 of 8 (backward). Whether that hides their
# latency is for a GPU to measure (benchmarks/bench_scan.py --state matrix).
FEWER_PROGRAMS = {"matrix scan forward": 2, "matrix scan states": 2,
                  "matrix scan dstates": 2, "matrix scan backward": 1}
NUM_WARPS = 4  # every launch in ten/ uses 4 warps

K, D, H = 128, 1024, 2752  # the flagship's eigenstates, width and SwiGLU half-width
# The matrix scan's pointers in the values' dtype (ten.kernels.matrix_scan_fused's doc)
MATRIX_NARROW = frozenset({"v_ptr", "q_ptr", "y_ptr", "dy_ptr", "dv_ptr", "dq_ptr"})


def _p(dtype: str) -> str:
    return f"*{dtype}"


def variants() -> list[tuple[str, str, dict, dict, int]]:
    """(name, module:function, signature, constexprs, warps) for every flagship kernel."""
    out = scan_variants("fp32") + matrix_scan_variants("fp32", "bf16")
    # fp64: a float64 model and the gradient checks run these on a GPU (the suite's first
    # H200 run found the LayerNorm backward refused by the compiler there, never here)
    out += [(f"{name} fp64", *rest) for name, *rest in scan_variants("fp64")]
    out += [(f"{name} fp64", *rest) for name, *rest in matrix_scan_variants("fp64", "fp64")]
    out.append(("cross-entropy rows", "ten.kernels.loss_fused:_cross_entropy_rows_kernel",
                {"x_ptr": _p("bf16"), "stride": "i32", "target_ptr": _p("i64"),
                 "scale_ptr": _p("fp32"), "loss_ptr": _p("fp32"), "V": "i32"},
                {"BV": 1024, "GRAD": True}, NUM_WARPS))
    import torch

    from ten.kernels import fp8_kernels, loss_fused

    fmt, top, mant, emin = fp8_kernels.FORMATS[torch.float8_e5m2]  # the head's gradient
    out.append(("cross-entropy rows float8", "ten.kernels.loss_fused:"
                "_cross_entropy_rows_float8_kernel",
                {"x_ptr": _p("bf16"), "stride": "i32", "target_ptr": _p("i64"),
                 "scale_ptr": _p("fp32"), "g_scale_ptr": _p("fp32"), "loss_ptr": _p("fp32"),
                 "g_ptr": _p("fp8e5"), "g_t_ptr": _p("fp8e5"), "R": "i32", "Rp": "i32",
                 "V": "i32"},
                {"OUT": fmt, "TOP": top, "MANT": mant, "EMIN": emin, "BR": loss_fused.BLOCK_R,
                 "BV": loss_fused.BLOCK_RV},
                NUM_WARPS))
    out += element_wise_variants("fp32", "bf16")
    out += [(f"{name} fp64", *rest) for name, *rest in element_wise_variants("fp64", "fp64")]
    out += fp8_variants()
    out += optimizer_variants()
    return out


def optimizer_variants() -> list[tuple[str, str, dict, dict, int]]:
    """8-bit AdamW's step over many tensors (train.optimizer: adamw8bit), float32 weights:
    the 8-bit moments, and the float32 ones of tensors under bitsandbytes' threshold."""
    import triton.language as tl

    from ten.kernels import multi_tensor_adamw as k

    sig = {"table_ptr": _p("i64"), "chunk_ptr": _p("i64"), "map1_ptr": _p("fp32"),
           "map2_ptr": _p("fp32"), "steps_ptr": _p("fp32"), "skip_ptr": _p("fp32"),
           "lr": "fp32", "decay": "fp32", "beta1": "fp32", "beta2": "fp32", "eps": "fp32"}
    return [(f"adamw step, {kind} moments", "ten.kernels.multi_tensor_adamw:_adamw_kernel",
             sig, {"P_DTYPE": tl.float32, "EIGHT_BIT": eight_bit, "FIELDS": k.FIELDS,
                   "BLOCK": k.BLOCK}, k.NUM_WARPS)
            for kind, eight_bit in (("8-bit", True), ("float32", False))]


def scan_variants(f: str) -> list[tuple[str, str, dict, dict, int]]:
    """The fused scan's kernels with every tensor in ``f`` (``scan()`` passes float32, or
    float64 for a float64 model)."""
    out = []
    scan = "ten.kernels.scan_fused"
    for sel in (False, True):
        mode = "selective" if sel else "fixed"
        base = {"BT": 32, "BK": 32, "SELECTIVE": sel}
        out.append((f"scan forward {mode}", f"{scan}:_scan_forward_kernel",
                    {"x_ptr": _p(f), "ll_ptr": _p(f), "sin_ptr": _p(f),
                     "c_ptr": _p(f), "T": "i32", "K": "i32", "G": "i32", "tiles": "i32"},
                    base, NUM_WARPS))
        for h0 in (False, True):
            out.append((f"scan backward {mode}{' h0' if h0 else ''}",
                        f"{scan}:_scan_backward_kernel",
                        {"dc_ptr": _p(f), "ll_ptr": _p(f), "c_ptr": _p(f),
                         "h0_ptr": _p(f), "sin_ptr": _p(f), "dx_ptr": _p(f),
                         "dll_ptr": _p(f), "T": "i32", "K": "i32", "G": "i32",
                         "tiles": "i32"}, {**base, "HAS_H0": h0}, NUM_WARPS))
        for rev in (False, True):
            out.append((f"scan summary {mode}{' reverse' if rev else ''}",
                        f"{scan}:_scan_summary_kernel",
                        {"x_ptr": _p(f), "ll_ptr": _p(f), "end_ptr": _p(f),
                         "dec_ptr": _p(f), "T": "i32", "K": "i32", "G": "i32",
                         "tiles": "i32"}, {**base, "REVERSE": rev}, NUM_WARPS))
    out.append(("scan carry", f"{scan}:_scan_carry_kernel",
                {"end_ptr": _p(f), "dec_ptr": _p(f), "h0_ptr": _p(f),
                 "sin_ptr": _p(f), "K": "i32", "G": "i32"},
                {"BG": 32, "BK": 32, "HAS_H0": True}, NUM_WARPS))
    return out


def matrix_scan_variants(f: str, narrow: str) -> list[tuple[str, str, dict, dict, int]]:
    """The matrix state's fused scan at the flagship's head (``state: matrix`` on
    small_32k: N = 128 / 4 = 32 eigenstates, P = 1024 / 4 = 256 values), its blocks and
    warps as the launchers pick them: keys, log λ and states in ``f``, values, queries,
    y and their gradients in ``narrow`` (bf16 under the job's autocast)."""
    from ten.kernels import matrix_scan_fused as m

    where = "ten.kernels.matrix_scan_fused"
    sizes = {"T": "i32", "K": "i32", "H": "i32", "N": "i32", "P": "i32", "ll_sb": "i32",
             "ll_st": "i32", "n_chunks": "i32"}

    def pointers(*names: str) -> dict:
        return {a: _p(narrow if a in MATRIX_NARROW else f) for a in names}

    def blocks(block: tuple[int, int]) -> tuple[dict, int]:
        return {"BT": m.BLOCK_T, "BN": m._block_n(32), "BP": m._block_p(256, block[0])}, block[1]

    forward = {**pointers("k_ptr", "v_ptr", "q_ptr", "ll_ptr", "s0_ptr", "sc_ptr", "y_ptr",
                          "send_ptr", "st_ptr"), **sizes}
    fwd, fwd_warps = blocks(m.FORWARD_BLOCK)
    dst, dst_warps = blocks(m.DSTATES_BLOCK)
    bwd, bwd_warps = blocks(m.BACKWARD_BLOCK)
    scores = {**pointers("k_ptr", "q_ptr", "ll_ptr", "sc_ptr"),
              **{a: sizes[a] for a in ("T", "K", "H", "N", "ll_sb", "ll_st", "n_chunks")}}
    return [
        ("matrix scan scores", f"{where}:_matrix_scores_kernel", scores,
         {"BT": m.BLOCK_T, "BN": m._block_n(32)}, m.SCORES_WARPS),
        ("matrix scan forward", f"{where}:_matrix_forward_kernel", forward,
         {**fwd, "HAS_S0": False, "WRITE_Y": True, "WRITE_STATES": False}, fwd_warps),
        ("matrix scan states", f"{where}:_matrix_forward_kernel", forward,
         {**fwd, "HAS_S0": False, "WRITE_Y": False, "WRITE_STATES": True}, fwd_warps),
        ("matrix scan dstates", f"{where}:_matrix_dstates_kernel",
         {**pointers("k_ptr", "q_ptr", "ll_ptr", "dy_ptr", "dsend_ptr", "dst_ptr", "ds0_ptr"),
          **sizes}, {**dst, "HAS_DSEND": False}, dst_warps),
        ("matrix scan backward", f"{where}:_matrix_backward_kernel",
         {**pointers("k_ptr", "v_ptr", "q_ptr", "ll_ptr", "sc_ptr", "st_ptr", "dst_ptr",
                     "dy_ptr", "dk_ptr", "dv_ptr", "dq_ptr", "within_ptr", "total_ptr"), **sizes},
         bwd, bwd_warps),
    ]


def element_wise_variants(f: str, act: str) -> list[tuple[str, str, dict, dict, int]]:
    """The block's and the selective drive's kernels with parameters and statistics in
    ``f`` and activations in ``act``; the compute dtype as the launchers pick it."""
    import triton.language as tl

    acc = tl.float64 if "fp64" in (f, act) else tl.float32
    blk, sel, out = "ten.kernels.block_kernels", "ten.kernels.selective_kernels", []
    # the residual stream in the parameters' dtype, or in the activations' (residual_dtype:
    # bf16, the flagship's)
    for s in dict.fromkeys((f, act)):
        # LayerNorm alone; of a residual sum h = x + r it writes; of x + σ(g)·r (a TEN
        # block's second norm, which applies the mixer's gate)
        for name, add, gate in (("layer norm", False, False), ("add layer norm", True, False),
                                ("gated add layer norm", True, True)):
            name += "" if s == f else f" ({s} stream)"
            forward = {"x_ptr": _p(s), "r_ptr": _p(act), "g_ptr": _p(act), "h_ptr": _p(s),
                       "w_ptr": _p(f), "b_ptr": _p(f), "y_ptr": _p(act), "mean_ptr": _p(f),
                       "rstd_ptr": _p(f), "part_ptr": _p(f), "d": "i32", "eps": "fp32"}
            ln = {"BD": D, "ACC": acc, "ADD": add, "GATE": gate}
            out.append((f"{name} forward", f"{blk}:_ln_forward_kernel", forward,
                        {**ln, "AMAX": False}, NUM_WARPS))
            if add and s == act:  # the job's (a bf16 stream): before a float8 SwiGLU block
                out.append((f"{name} forward taking its float8 maxima",
                            f"{blk}:_ln_forward_kernel", {**forward, "part_ptr": _p("fp32")},
                            {**ln, "AMAX": True}, NUM_WARPS))
            out.append((f"{name} backward", f"{blk}:_ln_backward_kernel",
                        {"dy_ptr": _p(act), "x_ptr": _p(s), "w_ptr": _p(f), "mean_ptr": _p(f),
                         "rstd_ptr": _p(f), "dh_ptr": _p(s), "dx_ptr": _p(s),
                         "dr_ptr": _p(act), "r_ptr": _p(act), "g_ptr": _p(act),
                         "dg_ptr": _p(act), "dw_ptr": _p(f), "db_ptr": _p(f), "n": "i32",
                         "d": "i32"},
                        {"ROWS": 16, "BD": D, "ACC": acc, "DH": add,
                         "DR": add and (gate or act != s), "GATE": gate}, NUM_WARPS))
    for amax in (False, True):  # with the maxima of what it writes: the float8 block's
        scaled = " taking its float8 maxima" if amax else ""
        part = _p("fp32") if amax else _p(act)  # without: the output passed in its place
        out.append((f"swiglu forward{scaled}", f"{blk}:_swiglu_forward_kernel",
                    {"ab_ptr": _p(act), "y_ptr": _p(act), "part_ptr": part, "h": "i32"},
                    {"BH": 1024, "ACC": acc, "AMAX": amax}, NUM_WARPS))
    out.append(("swiglu backward", f"{blk}:_swiglu_backward_kernel",
                {"dy_ptr": _p(act), "ab_ptr": _p(act), "dab_ptr": _p(act), "h": "i32"},
                {"BH": 1024, "ACC": acc}, NUM_WARPS))
    from ten.kernels import block_kernels as bk
    from ten.kernels import fp8_kernels
    from ten.kernels.fp8 import E4M3, E5M2

    y8, y_top, y_mant, y_emin = fp8_kernels.FORMATS[E4M3]  # the product's format
    g8, g_top, g_mant, g_emin = fp8_kernels.FORMATS[E5M2]  # its gradient's
    out.append(("swiglu backward in float8", f"{blk}:_swiglu_backward_float8_kernel",
                {"dy_ptr": _p(act), "ab_ptr": _p(act), "dab8_ptr": _p(g8.name),
                 "dab8_t_ptr": _p(g8.name), "grad_scale_ptr": _p("fp32"),
                 "y_scale_ptr": _p("fp32"), "y8_t_ptr": _p(y8.name),
                 "M": "i32", "Mp": "i32", "h": "i32"},
                {"G8": g8, "G_TOP": g_top, "G_MANT": g_mant, "G_EMIN": g_emin, "Y8": y8,
                 "Y_TOP": y_top, "Y_MANT": y_mant, "Y_EMIN": y_emin, "BR": bk.SWIGLU_F8_BR,
                 "BC": bk.SWIGLU_F8_BC}, bk.SWIGLU_F8_WARPS))
    for tail in (False, True):  # training starts every sequence from zeros; a tail when
        # generating continues from the last inputs
        conv = {"W": 4, "TAIL": tail, "BD": bk.CONV_BD, "ACC": acc}  # the presets' width
        after = " after a tail" if tail else ""
        out.append((f"causal conv forward{after}", f"{blk}:_conv_forward_kernel",
                    {"x_ptr": _p(act), "tail_ptr": _p(act), "w_ptr": _p(f), "b_ptr": _p(f),
                     "y_ptr": _p(act), "T": "i32", "d": "i32"}, {**conv, "BT": bk.CONV_BT},
                    NUM_WARPS))
        # the shipped tile; in fp32 at a sequence's start (training's case) also the
        # candidates the GPU suite's `conv` section times beside it
        timed = not tail and acc == tl.float32
        for tiles in bk.CONV_BACKWARD_CANDIDATES[:None if timed else 1]:
            shape = "" if tiles == bk.CONV_BACKWARD else f", {tiles}"
            out.append((f"causal conv backward{after}{shape}", f"{blk}:_conv_backward_kernel",
                        {"dy_ptr": _p(act), "x_ptr": _p(act), "tail_ptr": _p(act),
                         "w_ptr": _p(f), "dx_ptr": _p(act), "dtail_ptr": _p(act),
                         "dw_ptr": _p(f), "db_ptr": _p(f), "T": "i32", "d": "i32"},
                        {**conv, "BT": tiles.bt, "TILES": tiles.tiles, "BD": tiles.bd},
                        tiles.warps))
    consts = {"BK": K, "STEP": 0.01, "FLOOR": 1e-24, "ACC": acc}
    out.append(("selective drive", f"{sel}:_drive_kernel",
                {"pz_ptr": _p(act), "bias_ptr": _p(f), "nu_ptr": _p(f), "theta_ptr": _p(f),
                 "ll_ptr": _p(f), "beta_ptr": _p(f), "n": "i32", "K": "i32"}, consts,
                NUM_WARPS))
    out.append(("selective drive backward", f"{sel}:_drive_backward_kernel",
                {"dll_ptr": _p(f), "dbeta_ptr": _p(f), "pz_ptr": _p(act), "bias_ptr": _p(f),
                 "nu_ptr": _p(f), "theta_ptr": _p(f), "dpz_ptr": _p(act), "dbias_ptr": _p(f),
                 "dnu_ptr": _p(f), "dtheta_ptr": _p(f), "n": "i32", "K": "i32"}, consts,
                NUM_WARPS))
    return out


def fp8_variants() -> list[tuple[str, str, dict, dict, int]]:
    """The float8 cast's kernels (model.fp8: the feed-forward GEMMs' operands) from bf16:
    the maxima per tensor, row and column, the scales, and the cast to each format in
    each scaling, in the layouts ten.kernels.fp8.Float8Gemms asks for."""
    from ten.kernels import fp8_kernels as k

    where, out = "ten.kernels.fp8_kernels", []
    tile = {"BR": k.BR, "BC": k.BC}
    scalings = {"tensor": (False, False), "row": (True, False), "column": (False, True)}
    for name, (per_row, per_col) in scalings.items():
        out.append((f"fp8 amax per {name}", f"{where}:_amax_kernel",
                    {"t_ptr": _p("bf16"), "part_ptr": _p("fp32"), "R": "i32", "C": "i32"},
                    {"PER_ROW": per_row, "PER_COL": per_col, **tile, "STEPS": k.STEPS},
                    k.NUM_WARPS))
    out.append(("fp8 scales", f"{where}:_scale_kernel",
                {"part_ptr": _p("fp32"), "scale_ptr": _p("fp32"), "P": "i32", "S": "i32"},
                {"TOP": 448.0, "TINY": 1e-12, "BP": k.SCALE_BP, "BS": k.SCALE_BS},
                k.NUM_WARPS))
    # the layouts Float8Gemms asks for: row-major, transposed, both (a gradient, one scale)
    layouts = {"": (True, False), " transposed": (False, True), " both layouts": (True, True)}
    for (dtype, top, mant, emin), fmt in zip(k.FORMATS.values(), ("e4m3", "e5m2"), strict=True):
        ptr = _p(dtype.name)  # fp8e4nv, fp8e5
        for name, (per_row, per_col) in scalings.items():
            for suffix, (rows, transposed) in layouts.items():
                if rows and transposed and name != "tensor":
                    continue  # both layouts share one scale a tensor only
                out.append((f"fp8 cast {fmt} per {name}{suffix}", f"{where}:_cast_kernel",
                            {"t_ptr": _p("bf16"), "scale_ptr": _p("fp32"), "out_ptr": ptr,
                             "out_t_ptr": ptr, "R": "i32", "Rp": "i32", "C": "i32"},
                            {"OUT": dtype, "TOP": top, "MANT": mant, "EMIN": emin,
                             "PER_ROW": per_row, "PER_COL": per_col, "ROWS": rows,
                             "TRANSPOSED": transposed, **tile}, k.NUM_WARPS))
    return out


@dataclass
class Row:
    name: str
    arch: int
    regs: int | None = None
    stack: int | None = None  # bytes of stack frame (libdevice's sin/cos reduction uses one)
    spills: int | None = None  # bytes of spill stores + loads
    shared: int | None = None
    programs_per_sm: int | None = None
    error: str | None = None
    speed_matters: bool = True  # False for the fp64 variants: they must only compile
    min_programs: int = MIN_PROGRAMS_PER_SM  # FEWER_PROGRAMS where it names the kernel
    loop_exchanges: int | None = None  # see loop_exchanges()
    pass_instructions: int | None = None  # see loop_pass(): per warp, one pass of the loop
    pass_bytes: int | None = None

    def issue_over_bytes(self) -> float | None:
        if not self.pass_instructions or not self.pass_bytes:
            return None
        return CARDS[self.arch].issue_over_bytes(self.pass_instructions, self.pass_bytes)

    def problems(self) -> list[str]:
        if self.error:
            return [f"does not compile: {self.error}"]
        if not self.speed_matters:
            return []
        out = []
        if self.spills:
            out.append(f"spills {self.spills} B")
        if self.programs_per_sm is not None and self.programs_per_sm < self.min_programs:
            out.append(f"{self.programs_per_sm} programs per SM (< {self.min_programs})")
        return out


def _tool(name: str) -> str:
    """A binary Triton bundles (ptxas, cuobjdump)."""
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name)


def compile_one(args: tuple[str, str, dict, dict, int, int]) -> Row:
    name, where, sig, consts, warps, arch = args
    import importlib

    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, fn = where.split(":")
    kernel = getattr(importlib.import_module(module), fn)
    signature = {**sig, **{k: "constexpr" for k in consts}}
    # As Triton's launcher specialises a call: torch's allocations are 16-byte aligned and
    # the flagship's sizes (T, d, K, the SwiGLU width) multiples of 16. Without this the
    # loads compile scalar and the layouts differ from the GPU's.
    aligned = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]]
               for a, ty in sig.items() if ty.startswith("*") or ty == "i32"}
    # the float64 variants (a float64 model, the gradient checks) must only compile
    row = Row(name, arch, speed_matters="*fp64" not in sig.values(),
              min_programs=FEWER_PROGRAMS.get(name, MIN_PROGRAMS_PER_SM))
    try:
        compiled = triton.compile(ASTSource(fn=kernel, signature=signature, constexprs=consts,
                                            attrs=aligned),
                                  target=GPUTarget("cuda", arch, 32),
                                  options={"num_warps": warps})
    except Exception as e:  # the compiler's error is the finding
        row.error = f"{type(e).__name__}: {str(e).strip().splitlines()[-1][:200]}"
        return row
    row.shared = compiled.metadata.shared
    row.loop_exchanges = loop_exchanges(compiled.asm["ttgir"])
    if not row.speed_matters:  # compiled is all it must do; the tools below take ~0.7 s
        return row
    # ptxas -v on the kernel's PTX: registers, stack frame and spill traffic, as the
    # cubin Triton built was assembled (same ptxas, same target)
    gpu = f"sm_{arch}a" if arch == 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(compiled.asm["ptx"])
        report = subprocess.run([_tool("ptxas"), "-v", f"--gpu-name={gpu}", str(ptx), "-o",
                                 str(Path(tmp) / "k.cubin")], capture_output=True, text=True,
                                check=True).stderr
        # the machine code Triton built, for loop_pass()
        cubin = Path(tmp) / "triton.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        sass = subprocess.run([_tool("nvdisasm"), "-c", str(cubin)], capture_output=True,
                              text=True, check=True).stdout
    row.regs = int(re.search(r"Used (\d+) registers", report).group(1))
    row.stack = int(re.search(r"(\d+) bytes stack frame", report).group(1))
    stores, loads = map(int, re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads",
                                       report).groups())
    row.spills = stores + loads
    row.pass_instructions, row.pass_bytes = loop_pass(sass)
    regs_sm, threads_sm, shared_sm = SM_LIMITS[arch]
    threads = 32 * warps
    by_regs = regs_sm // (max(row.regs, 1) * threads)
    by_threads = threads_sm // threads
    by_shared = shared_sm // row.shared if row.shared else by_threads
    row.programs_per_sm = min(by_regs, by_threads, by_shared)
    return row


def loop_exchanges(ttgir: str) -> int:
    """Layout changes, reductions and scans inside loops, in the kernel's Triton GPU IR:
    each exchanges values between threads, the costly ones through shared memory behind
    a barrier, on every pass. The convolution's first backward had 9 per tile and ran 5x
    slower than torch's on an H200; the scans and per-row statistics need theirs."""
    regions: list[bool] = []  # the open regions, True for a loop's
    count = 0
    for line in ttgir.splitlines():
        text = line.strip()
        in_loop = False
        if text.startswith("}"):  # "} do {" closes scf.while's condition, opens its body
            in_loop = regions.pop()
        if any(regions) and re.search(r'ttg\.convert_layout|"tt\.reduce"|"tt\.scan"', text):
            count += 1
        if text.endswith("{"):
            regions.append(in_loop if text.startswith("}") else
                           bool(re.search(r"\bscf\.(for|while)\b", text)))
    return count


_SASS_INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")
_SASS_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_SASS_BRANCH = re.compile(r"\bBRA\b[^`]*`\((\.L_x_\d+)\)")
_ACCESS_BYTES = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}  # else 4
_GLOBAL_ACCESSES = {"LDG", "STG", "LDGSTS", "RED", "ATOMG"}


def _opcode(instruction: str) -> str:
    """``STG.E.U16`` of ``@P0 STG.E.U16 desc[UR4][R2.64], R8`` (its predicate dropped)."""
    return instruction.split()[1 if instruction.startswith("@") else 0]


def loop_pass(sass: str) -> tuple[int, int]:
    """(instructions, bytes of global loads and stores) one warp issues in one pass of the
    kernel's main loop (its widest backward branch), or in the whole kernel without one.

    Cold paths are left out: code that a predicated branch jumps over when it holds a loop
    of its own and stores nothing to global memory. That is libdevice's sin/cos argument
    reduction for huge angles (past ~1e5 rad), which the common path branches around and
    the scans' angles never need; a loop that stores is the kernel's own, behind the check
    that it runs at all (a ``while`` over a runtime bound)."""
    code: list[str] = []
    labels: dict[str, int] = {}
    for line in sass.splitlines():
        if m := _SASS_LABEL.match(line):
            labels[m.group(1)] = len(code)
        elif m := _SASS_INSTRUCTION.search(line):
            code.append(m.group(1))
    branches = [(i, labels[m.group(1)]) for i, text in enumerate(code)
                if (m := _SASS_BRANCH.search(text)) and m.group(1) in labels]
    # (first, last) instruction of each loop; the branch-to-itself after EXIT is not one
    loops = [(to, at) for at, to in branches if to < at]
    cold: set[int] = set()
    for at, to in branches:
        if (code[at].startswith("@") and any(at < a and b < to for a, b in loops)
                and not any(_opcode(code[i]).startswith("STG") for i in range(at + 1, to))):
            cold.update(range(at + 1, to))
    hot_loops = [lp for lp in loops if lp[0] not in cold]
    first, last = (max(hot_loops, key=lambda lp: lp[1] - lp[0]) if hot_loops
                   else (0, len(code) - 1))
    instructions, nbytes = 0, 0
    for i in range(first, last + 1):
        if i in cold:
            continue
        op = _opcode(code[i])
        if op.startswith("NOP"):
            continue
        instructions += 1
        name, *suffixes = op.split(".")
        if name in _GLOBAL_ACCESSES:
            width = next((_ACCESS_BYTES[x] for x in suffixes if x in _ACCESS_BYTES), 4)
            nbytes += 32 * width  # a warp's 32 threads
    return instructions, nbytes


def _compiled_mode() -> None:
    """In each worker, before triton is imported: kernels built for the compiler."""
    os.environ.pop("TRITON_INTERPRET", None)


def check(archs: tuple[int, ...] = (89, 90), workers: int = 2, only: str = "") -> list[Row]:
    """Compiles in fresh processes (spawned, not forked): a caller that already imported
    the kernels for Triton's interpreter (a test session) cannot hand those over.
    ``only``: the kernels whose names start with it."""
    jobs = [(*v, arch) for v in variants() if v[0].startswith(only) for arch in archs]
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_compiled_mode) as pool:
        return list(pool.map(compile_one, jobs))


def table(rows: list[Row], markdown: bool = False) -> str:
    head = ["kernel", "arch", "registers", "spill B", "stack B", "shared B", "programs/SM",
            "loop exchanges", "instr/pass", "bytes/pass", "issue / bytes", "problems"]
    lines = []
    for r in rows:
        ratio = r.issue_over_bytes()
        cells = [r.name, f"sm_{r.arch} ({ARCHS[r.arch]})", str(r.regs), str(r.spills),
                 str(r.stack), str(r.shared), str(r.programs_per_sm), str(r.loop_exchanges),
                 str(r.pass_instructions), str(r.pass_bytes),
                 "-" if ratio is None else f"{ratio:.2f}", "; ".join(r.problems()) or "-"]
        lines.append(cells)
    if markdown:
        out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        out += ["| " + " | ".join(c) + " |" for c in lines]
        return "\n".join(out)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head), *(fmt.format(*c) for c in lines)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--arch", type=int, nargs="+", choices=sorted(ARCHS), default=sorted(ARCHS))
    p.add_argument("--only", default="", metavar="PREFIX",
                   help="the kernels whose names start with PREFIX (e.g. 'scan summary')")
    args = p.parse_args(argv)
    rows = check(tuple(args.arch), only=args.only)
    if not rows:
        p.error(f"no kernel's name starts with {args.only!r} (the names: the table's first "
                "column, e.g. 'causal conv backward')")
    print(table(rows, args.markdown))
    bad = [f"{r.name} sm_{r.arch}: {p}" for r in rows for p in r.problems()]
    for line in bad:
        print(f"kernel_check: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
