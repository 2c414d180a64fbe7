"""What ``ten-runner run`` decides in-process (runner.run.JobRun, runner.run.spot): the
warnings and courtesies around a run. Whole runs in subprocesses: tests/e2e."""

import pytest
from runhelpers import write_job


@pytest.mark.parametrize("step_s,window_s,warns", [(0.5, 30, False), (30, 30, False),
                                                   (31, 30, True), (200, 120, True)])
def test_a_step_longer_than_the_notice_window_is_warned_about(step_s, window_s, warns):
    from runner.run.spot import step_warning

    warning = step_warning(step_s, window_s)
    assert (warning is not None) == warns
    if warns:
        assert f"{window_s} s preemption notice" in warning and "train.batch_size" in warning


def test_a_failing_sample_never_turns_a_finished_run_into_a_crash(tmp_path, corpus, capfd):
    from runner.job import load_job
    from runner.run.jobrun import JobRun
    from ten.train.stop import Stop

    class Broken:
        def parameters(self):
            raise RuntimeError("probability tensor contains either inf or nan")

    run = JobRun(load_job(write_job(tmp_path, corpus)), Stop(), "The")
    run._sample(Broken(), tokenizer=None)  # must not raise
    assert "no sample: RuntimeError: probability tensor" in capfd.readouterr().err


def _failures():
    import errno

    from runner.exit_codes import ExitCode
    from runner.storage import StorageError
    from ten.data import DataError
    from ten.kernels.fp8 import FP8Error
    from ten.kernels.scan import ScanBackendError
    from ten.train.checkpoint import CheckpointWriteError
    from ten.train.trainstate import DivergedError, ResumeError

    return [
        (ResumeError("unsafe changes: d_model"), ExitCode.CONFIG, "resume refused: unsafe"),
        (ScanBackendError("fused needs CUDA"), ExitCode.CONFIG, "config error: fused"),
        (FP8Error("TENConfig.fp8 runs float8 GEMMs on a GPU"), ExitCode.CONFIG,
         "config error: model.fp8 runs"),
        (DataError("no text field"), ExitCode.DATA, "data error: no text"),
        (DivergedError("loss nan"), ExitCode.DIVERGED, "diverged: loss nan"),
        (CheckpointWriteError("disk full"), ExitCode.STORAGE, "storage error: disk full"),
        (StorageError("bucket gone"), ExitCode.STORAGE, "storage error: bucket gone"),
        (OSError(errno.ENOSPC, "No space left on device", "/x"), ExitCode.STORAGE,
         "storage error: "),
        (RuntimeError("a bug"), ExitCode.CRASH, "crash:\n"),
    ]


@pytest.mark.parametrize("case", range(len(_failures())))
def test_every_way_a_run_fails_has_its_exit_code_and_one_message(tmp_path, case):
    from runner.run.failures import exit_code_of

    error, code, start = _failures()[case]
    said = []
    assert exit_code_of(error, None, tmp_path, False, said.append) == code
    assert len(said) == 1 and said[0].startswith(start), said


@pytest.mark.parametrize("bucket,then", [
    (False, "nothing of it is left here, so running the job again starts it over"),
    (True, "running the job again resumes from what the bucket still holds (nothing, "
           "after ten-runner rm)"),
])
def test_a_run_directory_removed_mid_run_promises_no_resume_it_cannot_keep(tmp_path, bucket,
                                                                           then):
    """Issue 45, fault 6: after rm --force the run said "a new run resumes from it"."""
    import errno

    from runner.exit_codes import ExitCode
    from runner.run.failures import exit_code_of

    gone = tmp_path / "runs" / "t" / "metrics.jsonl"
    said = []
    error = FileNotFoundError(errno.ENOENT, "No such file or directory", str(gone))
    assert exit_code_of(error, None, gone.parent, bucket, said.append) == ExitCode.STORAGE
    assert said == [f"storage error: {gone} vanished: the run directory was removed while "
                    f"the run wrote to it (ten-runner rm --force does that); {then}"]


def test_the_end_of_run_sample_is_printed_as_text(tmp_path, corpus, capfd):
    """Not a Python repr (quotes, \\n escapes): the text, its lines indented, and nothing a
    terminal would act on (an escape sequence in generated text shows as U+FFFD)."""
    import torch

    from runner.job import load_job
    from runner.run.jobrun import JobRun
    from ten.train.stop import Stop

    class Model:
        def parameters(self):
            return iter([torch.zeros(1)])

        def generate(self, ids, n, **kw):
            return ids

    class Tokenizer:
        eos_id = 0

        def encode(self, text):
            return [1]

        def decode(self, ids):
            return "The sea's edge\nwhere \x1b[2Jnothing"

    JobRun(load_job(write_job(tmp_path, corpus)), Stop(), "The")._sample(Model(), Tokenizer())
    err = capfd.readouterr().err
    assert "sample: The sea's edge\n  where \ufffd[2Jnothing" in err


def test_a_cpu_run_says_one_line_about_gpus(tmp_path, corpus, capfd):
    """On a machine without a GPU the first screen has one line about it, not a skipped
    gate and then a monitor that cannot find NVML."""
    from runner.job import load_job
    from runner.run.jobrun import JobRun
    from ten.train.stop import Stop

    run = JobRun(load_job(write_job(tmp_path, corpus)), Stop(), "The")  # device: cpu
    try:
        assert run._start() is None
    finally:
        run.resources.close()
    said = [line for line in capfd.readouterr().err.splitlines() if "GPU" in line]
    assert said == ["no GPU: training on the CPU, no GPU health gate or monitoring"]
    assert run.sampler is None and run.heartbeat is not None
