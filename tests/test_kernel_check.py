"""benchmarks/kernel_check.py in CI: every Triton kernel of the project compiles ahead of
time for the L40S (sm_89) and the H100 (sm_90a) with no GPU; none of the float32/bf16
kernels spills or fits fewer than 4 programs on an SM (the matrix scan's fewer, as
kernel_check.FEWER_PROGRAMS says; their fp64 variants, the checking path, need only
compile); and the selective scan's kernels, by their machine code, issue
their instructions on an H100 no slower than their bytes move.

(The interpreter runs kernels the compiler refuses: a non-constexpr global read inside a
kernel passed every interpreted test and failed only here.)"""

import sys
from pathlib import Path

import pytest
from triton_mode import HAVE_TRITON, NO_TRITON

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))


def compiling(test):
    """A test of the compiled kernels: a check of the device recipe (~90 CPU-s for every
    variant on both cards, with ``--device-recipe``), and needs triton."""
    test = pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)(test)
    return pytest.mark.device_recipe(pytest.mark.slow(test))


@pytest.fixture(scope="module")
def rows(tmp_path_factory):
    """Every variant compiled once per run: pytest-xdist may send this module's tests to
    several workers, and each would compile them all (~40 s of the 2 cores each). The
    first compiles under a lock in the run's shared temporary folder; the others wait and
    read its rows."""
    import fcntl
    import os
    import pickle

    import kernel_check

    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: nothing to share
        return kernel_check.check()
    shared = tmp_path_factory.getbasetemp().parent  # this run's, above each worker's
    with open(shared / "kernel_check.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / "kernel_check.pickle"
        if done.exists():
            return pickle.loads(done.read_bytes())
        result = kernel_check.check()
        done.write_bytes(pickle.dumps(result))
        return result


@compiling
def test_every_kernel_compiles_for_the_l40s_and_the_h100(rows):
    assert {r.arch for r in rows} == {89, 90}
    assert len(rows) == 2 * len(__import__("kernel_check").variants())
    failed = [(r.name, r.arch, r.error) for r in rows if r.error]
    assert not failed


@compiling
def test_no_kernel_spills_or_starves_an_sm(rows):
    """The scan kernels too, since they compute sin and cos themselves: libdevice's kept a
    stack frame for huge angles, and the H100 fixed-mode backward with a carried state
    spilled 32 B."""
    fast = [r for r in rows if r.speed_matters]
    assert len(fast) == 2 * 64  # per arch: 11 scan, 5 matrix scan, the loss's 2 (the bf16
    # head's and the float8 head's), 24 block kernels (3 norms, each of a bf16 stream
    # too, one gated: the mixer's gate applied as it adds; 2 norms, a SwiGLU forward and
    # backward for the float8 block; 2 candidate tiles of the conv backward), the drive's
    # 2, float8's 18 (3 amax, the scales, 7 casts a format), and 8-bit AdamW's step
    # (8-bit and float32 moments)
    assert [(r.name, r.arch, r.problems()) for r in fast if r.problems()] == []
    assert all(r.programs_per_sm >= r.min_programs and r.spills == 0 for r in fast)
    assert {r.name for r in fast if r.min_programs < 4} == {
        "matrix scan forward", "matrix scan states", "matrix scan dstates",
        "matrix scan backward"}


@compiling
def test_the_selective_scan_issues_no_slower_than_its_bytes_move_on_an_h100(rows):
    """The flagship's scan kernels, per pass of their loop (benchmarks/kernel_check.py's
    "issue / bytes"): the summary pass was 1.21 (libdevice's sin/cos, then the tile's
    steps composed as complex pairs); it now composes them in log space."""
    selective = [r for r in rows if r.name.startswith("scan") and "selective" in r.name
                 and r.arch == 90 and r.speed_matters]
    assert len(selective) == 5
    assert {r.name: round(r.issue_over_bytes(), 2) for r in selective
            if r.issue_over_bytes() > 1.0} == {}


@compiling
def test_the_fp64_kernels_a_float64_model_runs_compile(rows):
    """The gradient checks and a float64 model run the scan's and the element-wise kernels
    in fp64 on a GPU; before, the LayerNorm backward did not compile there (fp32
    accumulators)."""
    fp64 = [r for r in rows if not r.speed_matters]
    assert len(fp64) == 2 * 34  # the 11 scan kernels, the 5 matrix scan kernels, the 16
    # block kernels (4 for the float8 block), the drive's 2
    assert all(r.name.endswith("fp64") and r.error is None for r in fp64)


@compiling
def test_the_convolution_backward_exchanges_nothing_between_threads_in_its_loop(rows):
    """Its first version changed layouts and summed across rows 9 times per tile (each
    through shared memory, behind a barrier) and ran 5x slower than torch's convolution
    on an H200; nothing in the compiled IR here, with no GPU, had said so."""
    conv = [r for r in rows if r.name.startswith("causal conv")]
    # forward, backward; from zeros, after a tail; fp32, fp64; the backward's 2 candidate
    # tiles
    assert len(conv) == 2 * 10
    assert [(r.name, r.arch) for r in conv if r.loop_exchanges != 0] == []


# A pass of a loop as nvdisasm prints it: a load, a libdevice-like slow path (a predicated
# branch around an inner loop), a store, the back branch; and the branch-to-itself after
# EXIT, which is no loop.
SASS = """
        /*0000*/                   MOV R1, c[0x0][0x28] ;
.L_x_3:
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/                   FMUL R8, R4, R5 ;
        /*0030*/              @!P0 BRA `(.L_x_1) ;
        /*0040*/                   IMAD R9, R8, R8, RZ ;
.L_x_2:
        /*0050*/                   LDG.E.CONSTANT R10, desc[UR4][R6.64] ;
        /*0060*/               @P1 BRA `(.L_x_2) ;
.L_x_1:
        /*0070*/                   STG.E.U16 desc[UR4][R2.64], R8 ;
        /*0080*/                   NOP ;
        /*0090*/               @P2 BRA `(.L_x_3) ;
        /*00a0*/                   EXIT ;
.L_x_4:
        /*00b0*/                   BRA `(.L_x_4);
"""


def test_a_loop_pass_counts_the_hot_path_and_a_warps_bytes():
    import kernel_check

    # LDG.E.128, FMUL, the skip, STG.E.U16, the back branch: 5 (the NOP is padding);
    # 32 threads x (16 + 2) bytes
    assert kernel_check.loop_pass(SASS) == (5, 32 * 18)
    no_loop = SASS.replace("@P2 BRA `(.L_x_3)", "@P2 BRA `(.L_x_4)")
    assert kernel_check.loop_pass(no_loop)[0] == 8  # the whole kernel, less the slow path


# A kernel's own loop behind the check that it runs at all (a ``while`` over a runtime
# bound, as the matrix scan's backward compiles at 16 columns): the guard jumps over a
# loop that stores, which is no slow path.
GUARDED = """
        /*0000*/                   ISETP.GE.AND P0, PT, R0, 0x1, PT ;
        /*0010*/              @!P0 BRA `(.L_x_1) ;
.L_x_2:
        /*0020*/                   LDG.E R4, desc[UR4][R2.64] ;
        /*0030*/                   FMUL R8, R4, R4 ;
        /*0040*/                   STG.E desc[UR4][R6.64], R8 ;
        /*0050*/               @P1 BRA `(.L_x_2) ;
.L_x_1:
        /*0060*/                   EXIT ;
"""


def test_a_loop_pass_counts_a_guarded_loop_that_stores_as_the_main_loop():
    import kernel_check

    # LDG, FMUL, STG, the back branch; 32 threads x (4 + 4) bytes
    assert kernel_check.loop_pass(GUARDED) == (4, 32 * 8)


@pytest.mark.skipif(not HAVE_TRITON, reason=NO_TRITON)
def test_an_only_that_names_no_kernel_is_refused_with_the_names_form(capsys):
    """Before, it compiled nothing and crashed building an empty table (TypeError)."""
    import kernel_check

    with pytest.raises(SystemExit) as stop:
        kernel_check.main(["--only", "conv"])
    assert stop.value.code == 2
    assert "no kernel's name starts with 'conv'" in capsys.readouterr().err

