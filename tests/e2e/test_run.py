"""``ten-runner run`` as a user runs it: real subprocesses, real signals, kill -9."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from patience import communicate
from runhelpers import (
    FakeIMDS,
    cli,
    final_weights,
    kill_points,
    losses,
    run_to_end,
    same_weights,
    wait_for_step,
    write_job,
)
from sandbox import free_port

from runner.exit_codes import ExitCode
from ten.train import checkpoint as ckpt

# whole runs in subprocesses (seconds each): skipped by the inner loop, -m "not slow"
pytestmark = pytest.mark.slow


@pytest.mark.parametrize("mode", ["pretokenized", "streaming"])
def test_kill_9_at_a_random_step_then_resume_is_bit_exact(tmp_path, corpus, mode):
    ref_job = write_job(tmp_path, corpus, name="ref", mode=mode)
    code, _, err = run_to_end("run", ref_job, "--no-sample")
    assert code == 0, err
    assert ("documents held out" if mode == "streaming" else "sequences of 32), held out") in err
    ref = tmp_path / "store" / "ref"

    job = write_job(tmp_path, corpus, name="victim", mode=mode)
    run = tmp_path / "store" / "victim"
    kill_at = kill_points("the kill -9 step").randint(4, 30)
    print(f"kill -9 at step {kill_at}")
    proc = cli("run", job, "--no-sample")
    reached = wait_for_step(run / "metrics.jsonl", proc, kill_at)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert proc.returncode == -signal.SIGKILL
    assert ckpt.committed_steps(run / "checkpoints")[-1] <= reached

    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    assert "resumed from" in err
    assert losses(run) == losses(ref)
    (s1, w1), (s2, w2) = final_weights(ref), final_weights(run)
    assert s1 == s2 == 40 and same_weights(w1, w2)


def test_sigterm_commits_the_current_step_and_exits_preempted(tmp_path, corpus):
    job = write_job(tmp_path, corpus, workers=2, every=100)
    run = tmp_path / "store" / "t"
    proc = cli("run", job, "--no-sample")
    wait_for_step(run / "metrics.jsonl", proc, 5)
    proc.send_signal(signal.SIGTERM)
    _, err = communicate(proc, 120)
    assert proc.returncode == ExitCode.PREEMPTED, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    last_logged = max(losses(run))
    assert ckpt.committed_steps(run / "checkpoints") == [last_logged]

    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    assert f"step {last_logged:08d}" in err or f"step-{last_logged:08d}" in err


def test_a_hang_up_is_a_stop_and_the_dead_console_does_not_end_the_run(tmp_path, corpus):
    """The ssh session or terminal closes: SIGHUP, and every later write to the console
    fails. The run commits the step it is on and exits 75 as for SIGTERM, its lines
    going on into run.log (issue 23, faults 6 and 7: it died at once, status "running")."""
    job = write_job(tmp_path, corpus, every=100)
    run = tmp_path / "store" / "t"
    proc = cli("run", job, "--no-sample")
    wait_for_step(run / "metrics.jsonl", proc, 5)
    proc.stdout.close(), proc.stderr.close()  # the terminal is gone ...
    proc.send_signal(signal.SIGHUP)  # ... and says so
    assert proc.wait(timeout=120) == ExitCode.PREEMPTED
    log = (run / "run.log").read_text()
    assert "stopped by SIGHUP" in log and "Traceback" not in log
    assert ckpt.committed_steps(run / "checkpoints") == [max(losses(run))]
    assert json.loads((run / "status.json").read_text())["state"] != "running"


@pytest.mark.parametrize("console", ["closed", "read-then-closed"])
def test_a_run_does_not_depend_on_its_console(tmp_path, corpus, console):
    """``ten-runner run job.yaml 1>&- 2>&-``, or piped into ``head -n 3``: training goes
    on to its end and every line still reaches run.log (it exited 1, nothing trained)."""
    job = write_job(tmp_path, corpus, steps=12)
    run = tmp_path / "store" / "t"
    command = [sys.executable, "-m", "runner.cli", "run", str(job), "--no-sample"]
    if console == "closed":
        proc = subprocess.Popen(["sh", "-c", 'exec "$@" 1>&- 2>&-', "sh", *command])
    else:
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        for _ in range(3):
            proc.stdout.readline()
        proc.stdout.close()
    assert proc.wait(timeout=300) == 0
    assert ckpt.committed_steps(run / "checkpoints")[-1] == 12
    log = (run / "run.log").read_text()
    assert "Traceback" not in log and "done" in log


def test_running_out_of_memory_is_one_line_naming_the_settings(tmp_path, corpus):
    """A job too big for the machine (here: 2 GiB of address space, a batch that needs
    more) exited 1 with a traceback from the allocator (issue 23, fault 10). One line:
    what was asked, the settings that lower it; exit 2, as for every job that cannot
    run as configured."""
    import resource

    limit = 2 * 2**30
    job = write_job(tmp_path, corpus, batch=256, steps=3)

    def small_machine():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    proc = subprocess.run(
        [sys.executable, "-m", "runner.cli", "run", str(job), "--no-sample", "--set",
         "model.d_model=1024", "--set", "data.val_fraction=0.5"], capture_output=True,
        text=True, timeout=300, preexec_fn=small_machine,
        env={**os.environ, "MALLOC_ARENA_MAX": "2"})  # glibc's arenas reserve 64 MiB each
    assert proc.returncode == ExitCode.CONFIG, proc.stderr[-2000:]
    line = next(ln for ln in proc.stderr.splitlines() if "out of memory" in ln)
    assert "could not be allocated" in line and "lower train.batch_size" in line
    assert "Traceback" not in proc.stderr


def test_the_data_cache_deleted_mid_run_is_a_data_error(tmp_path, corpus):
    """Someone clears the data cache while a run trains (issue 23, fault 9): it crashed
    with a FileNotFoundError traceback at the final evaluation, exit 1. The run ends
    with one line and exit 3, its committed steps kept, and the next run prepares the
    data again and finishes."""
    import shutil

    own = tmp_path / "corpus"
    own.mkdir()
    shutil.copy(corpus / "docs.jsonl", own / "docs.jsonl")
    job = write_job(tmp_path, own, steps=30, every=5)
    run = tmp_path / "store" / "t"
    proc = cli("run", job, "--no-sample")
    wait_for_step(run / "metrics.jsonl", proc, 3)
    shutil.rmtree(own / "cache")
    _, err = communicate(proc, 300)
    assert proc.returncode == ExitCode.DATA, err[-3000:]
    assert "Traceback" not in err and "data error" in err
    assert ckpt.committed_steps(run / "checkpoints")
    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err[-3000:]


def test_ctrl_c_to_the_whole_process_group_spares_loader_workers(tmp_path, corpus):
    """SIGINT reaches every process of the group (a terminal's Ctrl-C): the DataLoader
    workers must neither die from it nor swallow it."""
    job = write_job(tmp_path, corpus, workers=2, every=100)
    run = tmp_path / "store" / "t"
    proc = cli("run", job, "--no-sample", start_new_session=True)
    wait_for_step(run / "metrics.jsonl", proc, 5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = communicate(proc, 120)
    assert proc.returncode == ExitCode.PREEMPTED, err
    assert "stopped by SIGINT" in err
    assert ckpt.committed_steps(run / "checkpoints") == [max(losses(run))]


def test_config_and_data_errors_have_distinct_codes_and_no_traceback(tmp_path, corpus):
    job = write_job(tmp_path, corpus)
    code, out, err = run_to_end("run", job, "--set", "train.lr=fast")
    assert code == ExitCode.CONFIG and "train.lr" in err and "Traceback" not in err + out

    missing = tmp_path / "missing.yaml"
    missing.write_text(job.read_text().replace(str(corpus / "docs.jsonl"),
                                               str(tmp_path / "nothing-here.jsonl")))
    code, out, err = run_to_end("run", missing)
    assert code == ExitCode.DATA, err
    assert "data error" in err and "nothing-here" in err and "Traceback" not in err + out


def test_a_compile_failure_is_one_line_naming_train_compile(tmp_path, corpus):
    """A machine without a working C++ compiler (a slim image): inductor cannot build the
    CPU kernels. The run ends with exit 2 and the field to turn off, not a traceback."""
    job = write_job(tmp_path, corpus, steps=2)
    code, out, err = run_to_end("run", job, "--no-sample", "--set", "train.compile=true",
                                env={"CXX": str(tmp_path / "no-such-compiler"),
                                     "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1"})
    assert code == ExitCode.CONFIG, err
    assert "torch.compile failed" in err and "set train.compile: false" in err
    assert "Traceback" not in err + out


def test_unsafe_resume_is_refused_with_the_differences(tmp_path, corpus):
    """Refused before the data is prepared again: a new seq_len would tokenize the
    corpus into new shards first. And before the heartbeat (issue 44, item 8): the run
    it refused keeps its status, not "failed"."""
    job = write_job(tmp_path, corpus, steps=4)
    assert run_to_end("run", job, "--no-sample")[0] == 0
    shards = sorted((corpus / "cache" / "shards").iterdir())
    status = tmp_path / "store" / "t" / "status.json"
    before = status.read_bytes()
    code, _, err = run_to_end("run", job, "--set", "model.d_model=48", "--set",
                              "train.max_steps=8", "--set", "data.seq_len=40")
    assert code == ExitCode.CONFIG
    assert "unsafe changes" in err and "d_model: 32 -> 48" in err and "seq_len: 32 -> 40" in err
    assert sorted((corpus / "cache" / "shards").iterdir()) == shards  # nothing prepared
    assert status.read_bytes() == before and json.loads(before)["state"] == "done"


def test_ddp_two_processes_agree_with_one(tmp_path, corpus):
    one = write_job(tmp_path, corpus, name="one", steps=4, batch=8, workers=0)
    two = write_job(tmp_path, corpus, name="two", steps=4, batch=4, workers=0)
    assert run_to_end("run", one, "--no-sample")[0] == 0
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(free_port()),
                        "-m", "runner.cli", "run", str(two), "--no-sample"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    a, b = losses(tmp_path / "store" / "one"), losses(tmp_path / "store" / "two")
    assert a.keys() == b.keys() == {1, 2, 3, 4}
    for step in a:
        assert abs(a[step] - b[step]) < 1e-4, (step, a[step], b[step])


def test_sample_prints_text_from_the_newest_checkpoint(tmp_path, corpus):
    job = write_job(tmp_path, corpus, steps=4)
    code, _, err = run_to_end("run", job)
    assert code == 0 and "sample:" in err and "perplexity" in err, err[-3000:]
    code, out, _ = run_to_end("sample", tmp_path / "store" / "t", "--prompt", "a checkpoint",
                              "--max-new-tokens", "5")
    assert code == 0 and out.startswith("[t step 4] a checkpoint")


def test_spot_notice_commits_the_current_step_before_any_signal(tmp_path, corpus):
    imds = FakeIMDS()
    try:
        job = write_job(tmp_path, corpus, every=100)
        job.write_text(job.read_text() + "resources:\n  spot: true\n  spot_notice: aws\n"
                       f"  metadata_endpoint: {imds.url}\n  notice_poll_s: 0.05\n")
        run = tmp_path / "store" / "t"
        proc = cli("run", job, "--no-sample")
        wait_for_step(run / "metrics.jsonl", proc, 5)
        imds.notice = True
        _, err = communicate(proc, 120)
    finally:
        imds.close()
    assert proc.returncode == ExitCode.PREEMPTED, err
    assert "stopped by aws preemption notice" in err
    assert "before the deadline" in err
    last = max(losses(run))
    assert 5 <= last < 40 and ckpt.committed_steps(run / "checkpoints") == [last]


def test_a_run_points_the_container_healthcheck_at_its_heartbeat(tmp_path, corpus,
                                                                  monkeypatch):
    """What the image's HEALTHCHECK relies on: after a run, `ten-runner healthcheck`
    finds that run's status.json through the pointer and judges it."""
    pointer = tmp_path / "pointer"
    monkeypatch.setenv("TEN_HEARTBEAT_POINTER", str(pointer))
    job = write_job(tmp_path, corpus, name="hc", steps=4, every=2)
    code, out, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    assert Path(pointer.read_text().strip()) == tmp_path / "store" / "hc" / "status.json"
    code, out, err = run_to_end("healthcheck")
    assert code == 0 and "done" in out + err
