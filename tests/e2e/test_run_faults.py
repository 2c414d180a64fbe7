"""``ten-runner run`` under the faults a user meets in the first hour: a second run of
the same job, a stop before the loop, a diverging learning rate, a full disk, a secret
in a path. Each ends with one line and its documented exit code, and loses nothing."""

import json
import random
import signal
import time

import pytest
import torch
from patience import communicate, machine_note
from runhelpers import cli, run_to_end, wait_for_step, write_job

from runner.exit_codes import ExitCode
from ten.train import checkpoint as ckpt


def _wait_for_line(path, needle, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if path.is_file() and needle in path.read_text():
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.01)
    raise AssertionError(f"{needle!r} not in {path} within {timeout} s ({machine_note()})")


def _wait_until_it_catches(proc, sig, timeout=30):
    """Until ``proc`` has a handler for ``sig`` (Linux: /proc/PID/status SigCgt): the
    first moment ten-runner's own code runs, a fraction of a second after exec, before
    which only the interpreter's defaults can answer."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        status = open(f"/proc/{proc.pid}/status").read()
        caught = int(status.split("SigCgt:")[1].split()[0], 16)
        if caught & (1 << (sig - 1)):
            return
        assert proc.poll() is None
        time.sleep(0.001)
    raise AssertionError(f"{sig.name} is never caught")


def test_a_second_run_of_the_same_job_exits_4_at_once_naming_the_first(tmp_path, corpus):
    job = write_job(tmp_path, corpus, steps=400, every=5)
    run = tmp_path / "store" / "t"
    first = cli("run", job, "--no-sample")
    try:
        wait_for_step(run / "metrics.jsonl", first, 2)
        t0 = time.time()
        code, _, err = run_to_end("run", job, "--no-sample", timeout=60)
        assert code == ExitCode.STORAGE, err
        assert f"pid {first.pid}" in err and "in use by another ten-runner run" in err
        assert "Traceback" not in err and time.time() - t0 < 30
        assert first.poll() is None  # the first run goes on, alone
        first.send_signal(signal.SIGKILL)
        first.communicate()
    finally:
        if first.poll() is None:
            first.kill()
    # A lock left by kill -9 does not block the relaunch.
    committed = ckpt.committed_steps(run / "checkpoints")[-1]
    code, _, err = run_to_end("run", job, "--no-sample", "--set",
                              f"train.max_steps={committed + 2}")
    assert code == 0, err
    assert "resumed from" in err


@pytest.mark.parametrize("phase", ["start-up", "data preparation"])
def test_sigterm_before_the_loop_exits_75_within_seconds(tmp_path, corpus, phase):
    if phase == "data preparation":
        # Enough text that the tokenizer trains for a while in native code, which only
        # the watchdog can interrupt.
        rng = random.Random(0)
        words = ["".join(rng.choice("abcdefghijklmnop") for _ in range(rng.randint(2, 9)))
                 for _ in range(3000)]
        big = tmp_path / "big"
        big.mkdir()
        with open(big / "docs.jsonl", "w") as f:
            for _ in range(20000):
                f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(60))})
                        + "\n")
        corpus = big
    job = write_job(tmp_path, corpus)
    if phase == "data preparation":
        job.write_text(job.read_text().replace("vocab_size: 400", "vocab_size: 3000"))
    run = tmp_path / "store" / "t"
    proc = cli("run", job, "--no-sample")
    if phase == "start-up":  # still importing, loading the job, ...
        _wait_until_it_catches(proc, signal.SIGTERM)
    else:
        _wait_for_line(run / "run.log", "job t:", proc)
        time.sleep(1.0)
    t0 = time.time()
    proc.send_signal(signal.SIGTERM)
    _, err = communicate(proc, 60)
    assert proc.returncode == ExitCode.PREEMPTED, err
    assert time.time() - t0 < 8
    assert "stopped by SIGTERM" in err and "nothing" in err and "save" in err
    assert "Traceback" not in err
    assert not ckpt.committed_steps(run / "checkpoints")


def test_a_diverging_run_stops_with_9_and_commits_nothing_non_finite(tmp_path, corpus):
    job = write_job(tmp_path, corpus, steps=30, every=2)
    run = tmp_path / "store" / "t"
    code, out, err = run_to_end("run", job, "--set", "train.lr=1e10", "--set",
                                "train.grad_clip=0")
    assert code == ExitCode.DIVERGED, err
    assert "diverged" in err and "train.lr" in err and "Traceback" not in err + out
    for step in ckpt.committed_steps(run / "checkpoints"):
        weights = ckpt.load(run / "checkpoints" / ckpt.step_name(step), "model.pt")
        assert all(torch.isfinite(w).all() for w in weights.values()), step


def test_a_full_disk_under_the_store_exits_4_and_keeps_the_earlier_checkpoint(
        tmp_path, corpus, small_disk):
    # Measure one checkpoint, then give the store room for about one and a half.
    ref = write_job(tmp_path, corpus, name="ref", steps=2, every=2)
    assert run_to_end("run", ref, "--no-sample")[0] == 0
    one = sum(f.stat().st_size for f in
              (tmp_path / "store" / "ref" / "checkpoints" / ckpt.step_name(2)).iterdir())
    disk = small_disk((one * 3 // 2 + 64 * 1024) // 1024)
    job = write_job(tmp_path, corpus, steps=20, every=2)
    job.write_text(job.read_text().replace(f"url: {tmp_path / 'store'}", f"url: {disk}"))
    code, out, err = run_to_end("run", job, "--no-sample")
    assert code == ExitCode.STORAGE, err
    assert "No space left on device" in err and "free on" in err
    assert "Traceback" not in err + out
    found = ckpt.latest_valid(disk / "t" / "checkpoints")
    assert found is not None and found.step == 2
    assert ckpt.load(found.path, "model.pt")


def test_a_secret_in_the_dataset_path_appears_nowhere(tmp_path, corpus, monkeypatch):
    secret = "s3cr3t-v4lu3-9f2c"
    (tmp_path / f"x-{secret}").mkdir()
    (tmp_path / f"x-{secret}" / "docs.jsonl").write_bytes((corpus / "docs.jsonl").read_bytes())
    job = write_job(tmp_path, corpus, steps=3, every=3)
    text = job.read_text().replace(str(corpus / "docs.jsonl"),
                                   str(tmp_path / "x-${MY_SECRET}" / "docs.jsonl"))
    job.write_text(text)
    monkeypatch.setenv("MY_SECRET", secret)
    code, out, err = run_to_end("run", job)
    assert code == 0, err
    assert secret not in out + err
    for f in [*(tmp_path / "store").rglob("*"), *(corpus / "cache").rglob("*")]:
        if f.is_file():  # the run, and the prepared data it left on this disk (issue 45)
            assert secret.encode() not in f.read_bytes(), f

    # An error about that path (caught when the job is loaded) does not show it either.
    monkeypatch.setenv("MY_SECRET", secret + "-missing")
    code, out, err = run_to_end("run", job, "--set", "name=u")
    assert code in (ExitCode.CONFIG, ExitCode.DATA), err
    assert "data.dataset" in err and secret not in out + err
    log = tmp_path / "store" / "u" / "run.log"
    assert not log.exists() or secret not in log.read_text()


def test_a_stop_inside_tokenizer_training_is_a_stop_not_a_data_error(tmp_path, corpus):
    """sentencepiece pulls its training text from a Python iterator: a SIGTERM handled
    there comes back as sentencepiece's own error ("tokenizer training failed:
    Interrupted"). The run must still end as a stop: exit 75, no data error."""
    import subprocess
    import sys

    job = write_job(tmp_path, corpus)
    # a cache of its own: the tokenizer must really be trained in this run
    job.write_text(job.read_text().replace(f"cache_dir: {corpus / 'cache'}",
                                           f"cache_dir: {tmp_path / 'cache'}"))
    script = (
        "import os, signal, sys\n"
        "import ten.data.tokenizer as tk\n"
        "original = tk._training_lines\n"
        "def lines(*args, **kwargs):\n"
        "    for i, line in enumerate(original(*args, **kwargs)):\n"
        "        if i == 50:\n"
        "            os.kill(os.getpid(), signal.SIGTERM)\n"
        "        yield line\n"
        "tk._training_lines = lines\n"
        "from runner.cli import main\n"
        f"sys.argv = ['ten-runner', 'run', {str(job)!r}, '--no-sample']\n"
        "main()\n")
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == ExitCode.PREEMPTED, p.stderr
    assert "stopped by SIGTERM during data preparation: nothing to save yet" in p.stderr
    assert "data error" not in p.stderr and "Traceback" not in p.stderr


def test_a_scan_backend_that_cannot_run_here_is_a_config_error(tmp_path, corpus):
    import os

    job = write_job(tmp_path, corpus, steps=2)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = cli("run", job, "--set", "model.scan_backend=fused", env=env)
    _, err = communicate(proc, 120)
    assert proc.returncode == ExitCode.CONFIG, err
    assert "model.scan_backend" in err and "Traceback" not in err
    lines = [line for line in err.splitlines() if "model.scan_backend" in line
             and "the job sets" not in line]  # the start's model line names it too
    assert len(lines) == 1


@pytest.mark.parametrize("target", ["missing", "/dev/null", "itself"])
def test_a_run_directory_that_is_no_folder_is_one_line(tmp_path, corpus, target):
    """The job's run directory is a link to nothing, or to /dev/null (issue 23, fault
    15): it said "cannot open .../.lock: File exists"; or to itself (issue 45: it said
    the link's target "does not exist"). One line naming what it is, exit 4, and the
    link's target untouched."""
    job = write_job(tmp_path, corpus)
    (tmp_path / "store").mkdir()
    link = tmp_path / "store" / "t"
    link.symlink_to({"missing": tmp_path / "missing", "itself": "t"}.get(target, target))
    code, out, err = run_to_end("run", job, "--no-sample")
    assert code == ExitCode.STORAGE, err
    want = {"missing": "which does not exist", "/dev/null": "is a link to /dev/null, not a "
            "folder", "itself": "is a link to t that leads back to itself: remove the link"}
    assert f"run directory {link}" in err and want[target] in err
    assert "Traceback" not in err + out and "File exists" not in err
    assert link.is_symlink() and not (tmp_path / "missing").exists()
