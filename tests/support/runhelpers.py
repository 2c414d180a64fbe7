"""Helpers for tests that run ``ten-runner`` in real subprocesses (the whole runs in
tests/e2e, and a few others)."""

import http.server
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from patience import communicate, machine_note

from ten.train import checkpoint as ckpt
from ten.train.metrics import read_metrics

WORDS = ("a checkpoint is committed only when its manifest is written last and every file "
         "has been verified against its size and checksum before the pointer moves").split()

# The smallest valid job file: what the job-layer tests change one key of.
MINIMAL_JOB = """\
name: t
model: {arch: ten, preset: tiny}
data: {dataset: builtin:botocore-docs}
train: {max_steps: 10}
"""

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


def write_job(tmp_path, corpus, name="t", arch="ten", mode="pretokenized", steps=40, every=3,
              workers=1, batch=4, gpus=None):
    """``gpus``: a resources section with that many GPUs (2+ runs under torchrun; with
    train.device cpu, as here, the ranks use gloo on CPU)."""
    ten_extra = ", n_eigenstates: 8, n_heads: 2, chunk_size: 16" if arch == "ten" else ""
    path = tmp_path / f"{name}.yaml"
    text = JOB.format(name=name, arch=arch, ten_extra=ten_extra, corpus=corpus / "docs.jsonl",
                      mode=mode, workers=workers, cache=corpus / "cache", steps=steps,
                      batch=batch, every=every, store=tmp_path / "store")
    if gpus is not None:
        text += f"resources: {{gpus: {gpus}}}\n"
    path.write_text(text)
    return path


def copy_of_the_code(where: Path) -> Path:
    """This checkout's ``ten`` and ``runner`` under ``where``: a next release to change in
    a test (a model field added, a cloud's module) and run with ``cwd=where`` and
    ``PYTHONPATH=where``, which come before the installed project."""
    root = Path(__file__).resolve().parents[2]
    for package in ("ten", "runner"):
        shutil.copytree(root / package, where / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return where


def cli(*args, **kw):
    return subprocess.Popen([sys.executable, "-m", "runner.cli", *map(str, args)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)


class Launched:
    """``cli`` for tests that start processes which must not outlive a failed test:
    ``kill_all`` (a fixture's teardown) kill -9s those still running."""

    def __init__(self):
        self.procs = []

    def __call__(self, *args, **kw):
        self.procs.append(cli(*args, **kw))
        return self.procs[-1]

    def kill_all(self):
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def run_to_end(*args, timeout=300, env=None):
    """``env``: variables added to this process's environment for the run; ``timeout``:
    how long it may print nothing (patience.communicate)."""
    p = cli(*args, env=None if env is None else {**os.environ, **env})
    out, err = communicate(p, timeout)
    return p.returncode, out, err


def kill_points(what: str) -> random.Random:
    """A generator for the moments a test kills a run at: a fresh seed each time (every
    run tries other moments), printed so a failure can be replayed."""
    seed = random.SystemRandom().randrange(1 << 32)
    print(f"seed {seed}: {what}")  # pytest shows it with the failure
    return random.Random(seed)


def wait_for_step(metrics: Path, proc, step: int, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        done = [r["step"] for r in read_metrics(metrics) if r["kind"] == "train"]
        if done and done[-1] >= step:
            return done[-1]
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.005)
    raise AssertionError(f"step {step} not reached within {timeout} s ({machine_note()})")


def train_values(run_dir, key):
    """``key`` of each train record by step (a resumed run rewrites redone steps)."""
    by_step = {}
    for r in read_metrics(run_dir / "metrics.jsonl"):
        if r["kind"] == "train":
            by_step[r["step"]] = r[key]
    return by_step


def losses(run_dir):
    return train_values(run_dir, "loss")


def final_weights(run_dir):
    found = ckpt.latest_valid(run_dir / "checkpoints")
    return found.step, ckpt.load(found.path, "model.pt")


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def processes_of(job: Path, timeout: float = 0.0) -> list[int]:
    """Pids of live processes whose command line names the job file (Linux /proc); with
    a timeout, waits that long for them to be gone."""
    deadline = time.time() + timeout
    while True:
        alive = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if str(job).encode() in cmdline and state != "Z":
                alive.append(int(entry.name))
        if not alive or time.time() > deadline:
            return alive
        time.sleep(0.1)


def rank_process(job: Path, rank: int) -> int:
    """The pid of the training process of ``rank`` in a launch of ``job`` (not its loader
    workers, which share its environment)."""
    ranks = {}
    for pid in processes_of(job):
        try:
            if f"LOCAL_RANK={rank}\0".encode() in Path(f"/proc/{pid}/environ").read_bytes():
                status = Path(f"/proc/{pid}/status").read_text()
                ranks[pid] = int(next(ln.split()[1] for ln in status.splitlines()
                                      if ln.startswith("PPid:")))
        except OSError:  # gone meanwhile
            continue
    (pid,) = [pid for pid, parent in ranks.items() if parent not in ranks]
    return pid


class FakeIMDS:
    """The AWS instance metadata service (IMDSv2), with a switch for the spot notice."""

    def __init__(self):
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


