"""``ten-runner run`` as a user runs it: real subprocesses, real signals, kill -9."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from runner.exit_codes import ExitCode
from ten import checkpoint as ckpt
from ten.metrics import read_metrics

WORDS = ("a checkpoint is committed only when its manifest is written last and every file "
         "has been verified against its size and checksum before the pointer moves").split()

JOB = """\
name: {name}
model: {{arch: {arch}, preset: tiny, d_model: 32, n_layers: 2{ten_extra}}}
data:
  dataset: {corpus}
  mode: {mode}
  seq_len: 32
  tokenizer: {{vocab_size: 400}}
  num_proc: 1
  num_workers: {workers}
  cache_dir: {cache}
  val_fraction: 0.05
train:
  max_steps: {steps}
  batch_size: {batch}
  lr: 3.0e-3
  warmup_steps: 2
  eval_every: 20
  eval_batches: 2
  log_every: 1
  seed: 3
  device: cpu
checkpoint: {{every_steps: {every}, keep_last: 2}}
storage: {{url: {store}}}
"""


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("corpus")
    rng = random.Random(1)
    with open(root / "docs.jsonl", "w") as f:
        for _ in range(500):
            f.write(json.dumps({"text": " ".join(rng.choice(WORDS)
                                                 for _ in range(rng.randint(10, 90)))}) + "\n")
    return root


def write_job(tmp_path, corpus, name="t", arch="ten", mode="pretokenized", steps=40, every=3,
              workers=1, batch=4):
    ten_extra = ", n_eigenstates: 8, n_heads: 2, chunk_size: 16" if arch == "ten" else ""
    path = tmp_path / f"{name}.yaml"
    path.write_text(JOB.format(name=name, arch=arch, ten_extra=ten_extra,
                               corpus=corpus / "docs.jsonl", mode=mode, workers=workers,
                               cache=corpus / "cache", steps=steps, batch=batch, every=every,
                               store=tmp_path / "store"))
    return path


def cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "runner.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


def run_to_end(*args, timeout=300):
    p = cli(*args)
    out, err = p.communicate(timeout=timeout)
    return p.returncode, out, err


def wait_for_step(metrics: Path, proc, step: int, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = [r["step"] for r in read_metrics(metrics) if r["kind"] == "train"]
        if done and done[-1] >= step:
            return done[-1]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    raise AssertionError(f"step {step} never reached")


def losses(run_dir):
    by_step = {}
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r["kind"] == "train":
            by_step[r["step"]] = r["loss"]
    return by_step


def final_weights(run_dir):
    found = ckpt.latest_valid(run_dir / "checkpoints")
    return found.step, ckpt.load(found.path, "model.pt")


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("mode", ["pretokenized", "streaming"])
def test_kill_9_at_a_random_step_then_resume_is_bit_exact(tmp_path, corpus, mode):
    ref_job = write_job(tmp_path, corpus, name="ref", mode=mode)
    code, _, err = run_to_end("run", ref_job, "--no-sample")
    assert code == 0, err
    ref = tmp_path / "store" / "ref"

    job = write_job(tmp_path, corpus, name="victim", mode=mode)
    run = tmp_path / "store" / "victim"
    kill_at = random.Random().randint(4, 30)
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
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == ExitCode.PREEMPTED, err
    assert "stopped by SIGTERM" in err and "Traceback" not in err
    last_logged = max(losses(run))
    assert ckpt.committed_steps(run / "checkpoints") == [last_logged]

    code, _, err = run_to_end("run", job, "--no-sample")
    assert code == 0, err
    assert f"step {last_logged:08d}" in err or f"step-{last_logged:08d}" in err


def test_ctrl_c_to_the_whole_process_group_spares_loader_workers(tmp_path, corpus):
    """SIGINT reaches every process of the group (a terminal's Ctrl-C): the DataLoader
    workers must neither die from it nor swallow it."""
    job = write_job(tmp_path, corpus, workers=2, every=100)
    run = tmp_path / "store" / "t"
    proc = cli("run", job, "--no-sample", start_new_session=True)
    wait_for_step(run / "metrics.jsonl", proc, 5)
    os.killpg(proc.pid, signal.SIGINT)
    _, err = proc.communicate(timeout=120)
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


def test_unsafe_resume_is_refused_with_the_differences(tmp_path, corpus):
    job = write_job(tmp_path, corpus, steps=4)
    assert run_to_end("run", job, "--no-sample")[0] == 0
    code, _, err = run_to_end("run", job, "--set", "model.d_model=48", "--set",
                              "train.max_steps=8")
    assert code == ExitCode.CONFIG
    assert "unsafe changes" in err and "d_model: 32 -> 48" in err


def test_ddp_two_processes_agree_with_one(tmp_path, corpus):
    one = write_job(tmp_path, corpus, name="one", steps=4, batch=8, workers=0)
    two = write_job(tmp_path, corpus, name="two", steps=4, batch=4, workers=0)
    assert run_to_end("run", one, "--no-sample")[0] == 0
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_port", str(random.randint(20000, 40000)),
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
    assert code == 0 and "sample:" in err and "perplexity" in err
    code, out, _ = run_to_end("sample", tmp_path / "store" / "t", "--prompt", "a checkpoint",
                              "--max-new-tokens", "5")
    assert code == 0 and out.startswith("[t step 4] a checkpoint")


class FakeIMDS:
    """The AWS instance metadata service (IMDSv2), with a switch for the spot notice."""

    def __init__(self):
        import http.server
        import threading

        fake = self
        self.notice = False

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_PUT(self):
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"token-1")

            def do_GET(self):
                if self.headers.get("X-aws-ec2-metadata-token") != "token-1":
                    self.send_response(401)
                    self.end_headers()
                    return
                if self.path.endswith("/spot/instance-action") and fake.notice:
                    when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 120))
                    body = json.dumps({"action": "terminate", "time": when}).encode()
                    self.send_response(200)
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self.send_response(404)
                    self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


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
        _, err = proc.communicate(timeout=120)
    finally:
        imds.close()
    assert proc.returncode == ExitCode.PREEMPTED, err
    assert "stopped by aws preemption notice" in err
    assert "before the deadline" in err
    last = max(losses(run))
    assert 5 <= last < 40 and ckpt.committed_steps(run / "checkpoints") == [last]
