"""The third fault-injection round's faults as groups of trials on real runs.

``bench_faults.py`` measures kill -9 and SIGTERM at random moments of every phase and
damaged checkpoints, each resumed bit for bit. This script measures the faults found
after it (issue 23), each through ``python -m runner.cli`` in real processes:

    bucket     a bucket behind a fault-injecting proxy (tests/support/faultproxy.py) in
               front of ``rclone serve s3``: every committed step incomplete; two jobs of
               one name; small GETs whose body breaks off, at random; a LATEST naming a
               step above every committed one; SIGTERMs during the final upload; a
               final upload refused until the run exits 4, then a relaunch on the same disk
    signals    SIGHUP (a terminal or ssh session closing) at a random step
    streams    stdout and stderr closed; the output piped into ``head -n 3``
    ranks      one of two gloo ranks killed by SIGKILL
    resources  the data cache or a bucket run's working copy deleted mid-run; a memory
               limit the job does not fit; a run directory that links to nothing or to
               itself; `rm --force` under a live run
    hostile    values validate must refuse in one line; a garbage parquet dataset; a
               document with a lone surrogate among good ones
    secrets    ${VAR} values in exports, in the bucket's objects and the local cache's
               manifests, in validate's words
    readers    (issue 45) another valid tokenizer or a damaged one in a trained run, and
               another run's checkpoint as the newest, before sample, eval, export-model;
               weights replaced by finite garbage (re-hashed) before a resume

    python benchmarks/bench_fault_groups.py                    # every group, 3 trials where random
    python benchmarks/bench_fault_groups.py --groups signals,bucket --trials 5 --seed 7
    python benchmarks/bench_fault_groups.py --json benchmarks/results/faults-groups.json

Per trial: the exit code against the documented one, "Traceback" in any output, what the
case requires to hold (named in its note), and data lost (committed steps gone or trained
again). Per group the table prints trials, held, data lost, tracebacks and wrong exit
codes; the goal is all held, 0 lost, 0 tracebacks, every exit code the documented one.
Progress goes to stderr, the table to stdout; exit 1 when any trial misses the goal.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import re
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]
sys.path.insert(0, str(REPO / "tests" / "support"))  # the proxy and /proc helpers the tests use
import runhelpers  # noqa: E402
from bench_recovery import machine  # noqa: E402
from bench_storage import BUCKET, Rclone, isolate_aws_env, plain_client, say  # noqa: E402
from faultproxy import FaultProxy  # noqa: E402
from runhelpers import losses, rank_process  # noqa: E402

from runner.exit_codes import ExitCode  # noqa: E402

GROUPS = ("bucket", "signals", "streams", "ranks", "resources", "hostile", "secrets",
          "readers")
SECRET = "s3cr3t-9f2c-v4lu3"  # a value that must never be written or printed

JOB = """\
name: {name}
model: {{arch: ten, preset: tiny, d_model: 32, n_layers: 2, n_eigenstates: 8, n_heads: 2,
        chunk_size: 16}}
data:
  dataset: {dataset}
  mode: pretokenized
  seq_len: 32
  tokenizer: {{vocab_size: 400}}
  num_proc: 1
  num_workers: 0
  cache_dir: {cache}
  val_fraction: 0.05
train: {{max_steps: {steps}, batch_size: 4, lr: 3.0e-3, warmup_steps: 2, eval_every: 20,
        eval_batches: 2, log_every: 1, seed: 3, device: cpu}}
checkpoint: {{every_steps: {every}, keep_last: 2}}
storage: {storage}
{extra}"""


@dataclasses.dataclass
class Trial:
    group: str
    case: str
    index: int
    exit_code: int | None
    expected: tuple[int, ...]
    held: bool  # what the case requires after the fault (its note says what)
    lost: int  # committed steps gone, or trained again by the next run
    tracebacks: int
    note: str = ""

    @property
    def wrong_exit(self) -> bool:
        return self.exit_code not in self.expected

    @property
    def met(self) -> bool:
        return self.held and not self.lost and not self.tracebacks and not self.wrong_exit


class Bench:
    """The working folder, the corpus, the data cache the runs share, and the bucket."""

    def __init__(self, work: Path, rng: random.Random):
        self.work, self.rng = work, rng
        self.corpus = work / "docs.jsonl"
        write_corpus(self.corpus, random.Random(0))
        self.cache = work / "cache"
        self.s3: Rclone | None = None
        self.count = 0

    def bucket(self) -> Rclone:
        if self.s3 is None:
            self.s3 = Rclone(self.work / "s3")
        return self.s3

    def job(self, *, steps: int = 12, every: int = 3, s3: str | None = None,
            cache: Path | None = None, dataset: str | None = None, extra: str = "",
            name: str | None = None) -> tuple[Path, str, Path]:
        """A job file in a folder of its own: (path, name, where its run writes). ``s3``:
        the bucket's endpoint (direct, or a proxy in front of it); a fresh prefix."""
        self.count += 1
        name = name or f"j{self.count}"
        folder = self.work / f"trial-{self.count}"
        folder.mkdir()
        cache = cache or self.cache
        if s3:
            url = f"s3://{BUCKET}/p{self.count}"
            storage = f"{{url: '{url}', endpoint_url: '{s3}'}}"
            from runner.storage import StoreURL

            run_dir = cache / "runs" / StoreURL.parse(url).key(s3) / name
        else:
            storage, run_dir = f"{{url: '{folder / 'store'}'}}", folder / "store" / name
        path = folder / f"{name}.yaml"
        path.write_text(JOB.format(name=name, dataset=dataset or self.corpus, cache=cache,
                                   steps=steps, every=every, storage=storage, extra=extra))
        return path, name, run_dir

    def key(self, held: Path) -> str:
        """The object key of a file under the bucket's folder."""
        return held.relative_to(self.work / "s3" / BUCKET).as_posix()

    def put(self, held: Path, body: bytes) -> None:
        plain_client(self.bucket().endpoint).put_object(Bucket=BUCKET, Key=self.key(held),
                                                        Body=body)

    def delete(self, held: Path) -> None:
        plain_client(self.bucket().endpoint).delete_object(Bucket=BUCKET, Key=self.key(held))

    def held_objects(self, prefix_of: Path) -> Path:
        """The bucket's folder on disk for a job file (rclone keeps objects as files)."""
        url = next(line for line in prefix_of.read_text().splitlines() if "s3://" in line)
        prefix = url.split(f"s3://{BUCKET}/", 1)[1].split("'", 1)[0]
        return self.work / "s3" / BUCKET / prefix


def write_corpus(path: Path, rng: random.Random, docs: int = 1500) -> None:
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 8)))
             for _ in range(600)]
    with open(path, "w") as f:
        for _ in range(docs):
            f.write(json.dumps({"text": " ".join(rng.choice(words) for _ in range(60))}) + "\n")


# --- running ten-runner ----------------------------------------------------------------------

def start(*args: object, env: dict[str, str] | None = None, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "runner.cli", *map(str, args)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", env={**os.environ, **(env or {})}, **kw)


def run(*args: object, env: dict[str, str] | None = None, timeout: float = 600,
        **kw) -> tuple[int, str]:
    """(exit code, stdout + stderr) of one ``ten-runner`` command to its end."""
    proc = start(*args, env=env, **kw)
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out + err


def steps_logged(run_dir: Path) -> list[int]:
    return sorted(losses(run_dir))


def wait_for_step(run_dir: Path, proc: subprocess.Popen, step: int) -> int:
    return runhelpers.wait_for_step(run_dir / "metrics.jsonl", proc, step, timeout=300)


def committed(run_dir: Path) -> list[int]:
    from ten.train import checkpoint as ckpt

    return ckpt.committed_steps(run_dir / "checkpoints")


def bucket_steps(held: Path, name: str) -> list[int]:
    """Committed steps of a bucket job, read from the server's folder (the layout of a
    local store)."""
    return committed(held / name)


def latest(held: Path, name: str) -> str:
    try:
        return (held / name / "LATEST").read_text().strip()
    except OSError:
        return ""


def tracebacks(*texts: str) -> int:
    return sum(t.count("Traceback") for t in texts)


def resumed_from(text: str) -> int:
    m = re.search(r"resumed from \S+ \(step (\d+)", text)
    return int(m.group(1)) if m else 0


# --- the groups --------------------------------------------------------------------------------

def bucket_group(b: Bench, trials: int) -> list[Trial]:
    s3 = b.bucket()
    out = []

    # 1. every committed step incomplete, and a new machine: refuse, prune nothing
    job, name, local = b.job(s3=s3.endpoint, steps=6, every=3)
    first = run("run", job, "--no-sample")
    held_dir = b.held_objects(job)
    for step in bucket_steps(held_dir, name):  # through S3 (rclone serves what it listed)
        b.delete(held_dir / name / "checkpoints" / f"step-{step:08d}" / "trainer.pt")
    before = bucket_steps(held_dir, name)
    shutil.rmtree(local, ignore_errors=True)
    code, text = run("run", job, "--no-sample")
    after = bucket_steps(held_dir, name)
    out.append(Trial("bucket", "every committed step incomplete", 0, code, (ExitCode.STORAGE,),
                     held=first[0] == 0 and before == after == [3, 6]
                     and "refusing to start from scratch" in text,
                     lost=len(set(before) - set(after)), tracebacks=tracebacks(text, first[1]),
                     note="exit 4, the steps kept"))

    # 2. two jobs of one name on one machine, different prefixes: each trains its own
    job_a, name, _ = b.job(s3=s3.endpoint, steps=6, every=3, name="twin")
    job_b, _, _ = b.job(s3=s3.endpoint, steps=6, every=3, name="twin")
    code_a, text_a = run("run", job_a, "--no-sample")
    code_b, text_b = run("run", job_b, "--no-sample")
    steps_b = bucket_steps(b.held_objects(job_b), name)
    out.append(Trial("bucket", "two jobs of one name", 0, code_b, (ExitCode.OK,),
                     held=code_a == 0 and steps_b == [3, 6] and "resumed" not in text_b,
                     lost=0, tracebacks=tracebacks(text_a, text_b),
                     note="job B trains and commits its own steps"))

    # 3. small GETs whose 200 body breaks off, at random, on a resume from the bucket
    for index in range(trials):
        proxy = FaultProxy(s3.endpoint).start()
        try:
            job, name, local = b.job(s3=proxy.endpoint, steps=6, every=3)
            first = run("run", job, "--no-sample")
            shutil.rmtree(local, ignore_errors=True)  # a new machine
            # small objects every resume reads (the lease: the epoch this machine takes)
            cuts = b.rng.sample(["/LATEST", "/manifest.json", "/lease/epoch-00000002",
                                 "/config.json", "/status.json", "/metrics.jsonl"], 2)
            for suffix in cuts:
                proxy.cut_body("GET", suffix, times=b.rng.randint(1, 3))
            code, text = run("run", job, "--no-sample", "--set", "train.max_steps=12")
            hits = proxy.hits
        finally:
            proxy.stop()
        held_dir = b.held_objects(job)
        out.append(Trial("bucket", "small GETs cut half-way", index, code, (ExitCode.OK,),
                         held=hits > 0 and first[0] == 0
                         and bucket_steps(held_dir, name)[-1:] == [12]
                         and latest(held_dir, name) == "step-00000012",
                         lost=6 - resumed_from(text), tracebacks=tracebacks(text, first[1]),
                         note=f"{hits} GETs of {', '.join(cuts)} cut; resumed from 6, "
                              "finished 12"))

    # 4. LATEST naming a step above every committed one is moved to the newest commit
    job, name, local = b.job(s3=s3.endpoint, steps=6, every=3)
    first = run("run", job, "--no-sample")
    held_dir = b.held_objects(job)
    b.put(held_dir / name / "LATEST", b"step-00000099")
    shutil.rmtree(local, ignore_errors=True)
    code, text = run("run", job, "--no-sample", "--set", "train.max_steps=12")
    out.append(Trial("bucket", "LATEST above every commit", 0, code, (ExitCode.OK,),
                     held=first[0] == 0 and latest(held_dir, name) == "step-00000012",
                     lost=6 - resumed_from(text), tracebacks=tracebacks(text, first[1]),
                     note=f"LATEST after: {latest(held_dir, name) or '-'}"))

    # 5. SIGTERMs during the final upload: the committed step still reaches the bucket
    for index in range(trials):
        proxy = FaultProxy(s3.endpoint).start()
        try:
            job, name, _ = b.job(s3=proxy.endpoint, steps=12, every=6)
            proxy.delay("PUT", "step-00000012/manifest.json", seconds=3.0)
            proc = start("run", job, "--no-sample")
            if not proxy.delayed.wait(300):
                raise RuntimeError("the final upload never started")
            for _ in range(10):
                proc.send_signal(signal.SIGTERM)
                time.sleep(b.rng.uniform(0.02, 0.2))
            outs = proc.communicate(timeout=300)
        finally:
            proxy.stop()
        steps = bucket_steps(b.held_objects(job), name)
        out.append(Trial("bucket", "10 SIGTERMs in the final upload", index, proc.returncode,
                         (ExitCode.OK, ExitCode.PREEMPTED), held=steps[-1:] == [12],
                         lost=12 - (steps[-1] if steps else 0), tracebacks=tracebacks(*outs),
                         note="step 12 in the bucket"))

    # 6. the final upload refused (a 503 storm) until the run exits 4; the relaunch on
    # the same disk must put the newer local step in the bucket before it says "done"
    for index in range(trials):
        proxy = FaultProxy(s3.endpoint).start()
        try:
            job, name, _ = b.job(s3=proxy.endpoint, steps=12, every=6)
            last = b.rng.choice(["model.pt", "manifest.json"])
            proxy.fail("PUT", f"step-00000012/{last}", status=503)
            first = run("run", job, "--no-sample")
            proxy.clear()
            code, text = run("run", job, "--no-sample")
        finally:
            proxy.stop()
        held_dir = b.held_objects(job)
        steps = bucket_steps(held_dir, name)
        out.append(Trial("bucket", "final upload refused, then a relaunch", index, code,
                         (ExitCode.OK,),
                         held=first[0] == ExitCode.STORAGE and steps[-1:] == [12]
                         and latest(held_dir, name) == "step-00000012",
                         lost=12 - (steps[-1] if steps else 0),
                         tracebacks=tracebacks(text, first[1]),
                         note=f"PUT {last} refused: exit {first[0]}, then step 12 in the "
                              "bucket before done"))
    return out


def signals_group(b: Bench, trials: int) -> list[Trial]:
    out = []
    for index in range(trials):
        job, _, run_dir = b.job(steps=60, every=100)  # only the stop commits
        proc = start("run", job, "--no-sample")
        at = wait_for_step(run_dir, proc, b.rng.randint(3, 20))
        proc.send_signal(signal.SIGHUP)
        outs = proc.communicate(timeout=300)
        logged = steps_logged(run_dir)
        state = json.loads((run_dir / "status.json").read_text()).get("state")
        kept = committed(run_dir)
        out.append(Trial("signals", "SIGHUP at a random step", index, proc.returncode,
                         (ExitCode.PREEMPTED,), held=kept == logged[-1:] and state != "running",
                         lost=(logged[-1] - kept[-1]) if kept and logged else len(logged),
                         tracebacks=tracebacks(*outs),
                         note=f"at step {at}: committed {kept[-1:]} of {logged[-1:]}, "
                              f"status {state}"))
    return out


def streams_group(b: Bench, trials: int) -> list[Trial]:
    out = []
    for case in ("stdout and stderr closed", "piped into head -n 3"):
        job, _, run_dir = b.job(steps=12, every=3)
        command = [sys.executable, "-m", "runner.cli", "run", str(job), "--no-sample"]
        if case.startswith("stdout"):
            proc = subprocess.Popen(["sh", "-c", 'exec "$@" 1>&- 2>&-', "sh", *command],
                                    cwd=REPO)
        else:
            proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT)
            for _ in range(3):
                proc.stdout.readline()
            proc.stdout.close()
        code = proc.wait(timeout=600)
        log = (run_dir / "run.log").read_text() if (run_dir / "run.log").exists() else ""
        kept = committed(run_dir)
        out.append(Trial("streams", case, 0, code, (ExitCode.OK,),
                         held=kept[-1:] == [12] and "done" in log, lost=12 - max(kept, default=0),
                         tracebacks=tracebacks(log), note="trained to 12, run.log complete"))
    return out


def ranks_group(b: Bench, trials: int) -> list[Trial]:
    job, _, run_dir = b.job(steps=30, every=3, extra="resources: {gpus: 2}\n")
    proc = start("run", job, "--no-sample")
    wait_for_step(run_dir, proc, 4)
    rank_1 = rank_process(job, 1)
    os.kill(rank_1, signal.SIGKILL)
    outs = proc.communicate(timeout=300)
    left = list(Path(tempfile.gettempdir()).glob(f"ten-runner-launch-{proc.pid}-*"))
    text = "".join(outs)
    return [Trial("ranks", "one of 2 ranks killed by SIGKILL", 0, proc.returncode,
                  (128 + signal.SIGKILL,),
                  held="rank 1 was killed by SIGKILL" in text and not left
                  and bool(committed(run_dir)), lost=0, tracebacks=tracebacks(text),
                  note="one line naming the rank, launch folder swept, commits kept")]


def resources_group(b: Bench, trials: int) -> list[Trial]:
    out = []
    # the data cache deleted mid-run: exit 3, commits kept; the next run prepares and resumes
    cache = b.work / f"own-cache-{b.count}"
    job, _, run_dir = b.job(steps=40, every=5, cache=cache)
    proc = start("run", job, "--no-sample")
    wait_for_step(run_dir, proc, 7)
    kept_before = committed(run_dir)
    for entry in cache.iterdir():
        if entry.name != "runs":
            shutil.rmtree(entry, ignore_errors=True)
    outs = proc.communicate(timeout=300)
    code2, text2 = run("run", job, "--no-sample")
    out.append(Trial("resources", "data cache deleted mid-run", 0, proc.returncode,
                     (ExitCode.DATA,), held=code2 == 0 and committed(run_dir)[-1:] == [40],
                     lost=max(0, max(kept_before, default=0) - resumed_from(text2)),
                     tracebacks=tracebacks(*outs, text2),
                     note="exit 3; the next run prepares the data again and resumes"))

    # a bucket run's working copy deleted mid-run: exit 4, the bucket keeps its commits
    s3 = b.bucket()
    job, name, local = b.job(s3=s3.endpoint, steps=40, every=5)
    proc = start("run", job, "--no-sample")
    wait_for_step(local, proc, 12)
    shutil.rmtree(local, ignore_errors=True)
    outs = proc.communicate(timeout=300)
    steps = bucket_steps(b.held_objects(job), name)
    out.append(Trial("resources", "working copy deleted mid-run (bucket)", 0, proc.returncode,
                     (ExitCode.STORAGE,), held=bool(steps), lost=0, tracebacks=tracebacks(*outs),
                     note=f"the bucket keeps {steps}"))

    # a job larger than the machine's memory: one line naming the settings, exit 2
    job, _, _ = b.job(steps=3)
    limit = 2 * 2**30

    def small_machine() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    code, text = run("run", job, "--no-sample", "--set", "model.d_model=1024", "--set",
                     "train.batch_size=256", "--set", "data.val_fraction=0.5",
                     env={"MALLOC_ARENA_MAX": "2"}, preexec_fn=small_machine)
    out.append(Trial("resources", "2 GiB address space, a job that needs more", 0, code,
                     (ExitCode.CONFIG,), held="lower train.batch_size" in text, lost=0,
                     tracebacks=tracebacks(text), note="one line naming the knobs"))

    # a run directory that links to nothing
    job, _, run_dir = b.job()
    run_dir.parent.mkdir(parents=True)
    run_dir.symlink_to(b.work / "nowhere")
    code, text = run("run", job, "--no-sample")
    out.append(Trial("resources", "run directory links to nothing", 0, code,
                     (ExitCode.STORAGE,), held="which does not exist" in text, lost=0,
                     tracebacks=tracebacks(text), note="one line naming the link"))

    # a run directory that links to itself
    job, _, run_dir = b.job()
    run_dir.parent.mkdir(parents=True)
    run_dir.symlink_to(run_dir.name)
    code, text = run("run", job, "--no-sample")
    out.append(Trial("resources", "run directory links to itself", 0, code,
                     (ExitCode.STORAGE,), held="leads back to itself" in text, lost=0,
                     tracebacks=tracebacks(text), note="one line naming the loop"))

    # rm --force under a live run: it ends (exit 4) and does not re-create its folder
    job, _, run_dir = b.job(steps=400, every=5)
    proc = start("run", job, "--no-sample")
    wait_for_step(run_dir, proc, b.rng.randint(3, 10))
    code_rm, text_rm = run("rm", run_dir, "--yes", "--force")
    outs = proc.communicate(timeout=300)
    out.append(Trial("resources", "rm --force under a live run", 0, proc.returncode,
                     (ExitCode.STORAGE,), held=code_rm == 0 and not run_dir.exists()
                     and "starts it over" in outs[1], lost=0,
                     tracebacks=tracebacks(*outs, text_rm),
                     note="the folder stays gone; no resume promised"))
    return out


HOSTILE_SETS = ("train.seed=99999999999999999999", "train.lr=1e300",
                "storage.endpoint_url=http://[::1", "resources.metadata_endpoint=http://[::1",
                "train.max_steps=1e100",
                "model.n_layers=" + "9" * 5000, "data.val_fraction=0", "storage.url=/etc",
                "storage.url=/", "storage.url=/dev/null")


def hostile_group(b: Bench, trials: int) -> list[Trial]:
    out = []
    job, _, _ = b.job()
    for assignment in HOSTILE_SETS:
        code, text = run("validate", job, "--set", assignment)
        problems = [ln for ln in text.splitlines() if ": " in ln and "--set" in ln]
        out.append(Trial("hostile", f"validate --set {assignment[:40]}", 0, code,
                         (ExitCode.CONFIG,), held=len(problems) == 1, lost=0,
                         tracebacks=tracebacks(text), note="one line"))
    garbage = b.work / "garbage.parquet"
    garbage.write_bytes(b"PAR1" + os.urandom(4096) + b"PAR1")
    job, _, _ = b.job(dataset=str(garbage), cache=b.work / "cache-garbage")
    code, text = run("run", job, "--no-sample")
    out.append(Trial("hostile", "a garbage parquet dataset", 0, code, (ExitCode.DATA,),
                     held="garbage.parquet" in text, lost=0, tracebacks=tracebacks(text),
                     note="one line naming the file"))
    surrogate = b.work / "surrogate.jsonl"
    surrogate.write_text(b.corpus.read_text() + '{"text": "bad \\ud800 here"}\n')
    job, _, run_dir = b.job(dataset=str(surrogate), cache=b.work / "cache-surrogate", steps=3)
    code, text = run("run", job, "--no-sample")
    out.append(Trial("hostile", "a lone surrogate in one document", 0, code, (ExitCode.OK,),
                     held=committed(run_dir)[-1:] == [3], lost=0, tracebacks=tracebacks(text),
                     note="replaced and counted; the job trains"))
    return out


def secrets_group(b: Bench, trials: int) -> list[Trial]:
    out = []
    env = {"BENCH_SECRET_DIR": SECRET, "BENCH_PASS": SECRET}
    data_dir = b.work / SECRET
    data_dir.mkdir(exist_ok=True)
    shutil.copy(b.corpus, data_dir / "docs.jsonl")
    s3 = b.bucket()
    job, name, local = b.job(s3=s3.endpoint, steps=6, every=3,
                             dataset=str(b.work / "${BENCH_SECRET_DIR}" / "docs.jsonl"),
                             cache=b.work / "cache-secret")
    code, text = run("run", job, "--no-sample", env=env)
    leaked = [p.relative_to(b.held_objects(job)).as_posix()
              for p in b.held_objects(job).rglob("*")
              if p.is_file() and SECRET.encode() in p.read_bytes()]
    out.append(Trial("secrets", "a ${VAR} in the dataset path: the bucket's objects", 0, code,
                     (ExitCode.OK,), held=not leaked and SECRET not in text, lost=0,
                     tracebacks=tracebacks(text),
                     note="leaked into: " + (", ".join(leaked) if leaked else "nothing")))
    cached = [p.name for p in (b.work / "cache-secret").rglob("*.json")
              if SECRET.encode() in p.read_bytes()]
    out.append(Trial("secrets", "the same: the local cache's manifests", 0, code,
                     (ExitCode.OK,), held=not cached, lost=0, tracebacks=0,
                     note="leaked into: " + (", ".join(cached) if cached else "nothing")))
    for target in ("skypilot", "k8s"):
        dest = b.work / f"export-{target}.yaml"
        code, text = run("export", job, "--to", target, "-o", dest, env=env)
        written = dest.read_text() if dest.exists() else ""
        out.append(Trial("secrets", f"export --to {target}", 0, code, (ExitCode.OK,),
                         held=bool(written) and SECRET not in written + text, lost=0,
                         tracebacks=tracebacks(text), note="every ${VAR} by name"))
    job, _, _ = b.job(extra="", s3="http://minio:${BENCH_PASS}@127.0.0.1:9")
    code, text = run("validate", job, env=env)
    out.append(Trial("secrets", "endpoint_url with user:password@", 0, code, (ExitCode.CONFIG,),
                     held="carries credentials" in text and SECRET not in text, lost=0,
                     tracebacks=tracebacks(text), note="refused without printing it"))
    return out


def readers_group(b: Bench, trials: int) -> list[Trial]:
    """What `sample`, `eval` and `export-model` trust in a trained run (issue 45)."""
    import sentencepiece as spm

    out = []
    job, name, run_dir = b.job(steps=6, every=3)
    first = run("run", job, "--no-sample")
    other_job, _, other_dir = b.job(steps=9, every=9, name="other")  # same data, tokenizer
    second = run("run", other_job, "--no-sample")
    text_file = b.work / "text.txt"
    text_file.write_text("a committed step in the bucket " * 100)
    spm.SentencePieceTrainer.train(input=str(b.corpus), vocab_size=60, hard_vocab_limit=False,
                                   eos_id=2, minloglevel=2, model_prefix=str(b.work / "spm"))

    def readers(where: Path, out_dir: Path) -> list[tuple[str, int, str]]:
        return [(args[0], *run(*args)) for args in (
            ("sample", where), ("eval", where, "--data", text_file),
            ("export-model", where, "--out", out_dir))]

    cases = {"another valid tokenizer": ("another", ExitCode.DATA, "is not the tokenizer"),
             "a damaged tokenizer": ("damaged", ExitCode.DATA, "is not a sentencepiece model"),
             "another run's checkpoint as the newest": ("foreign", ExitCode.CONFIG,
                                                        "is a checkpoint of run 'other'")}
    for case, (kind, code, says) in cases.items():
        copy = b.work / f"reader-{kind}" / name
        shutil.copytree(run_dir, copy)
        if kind == "another":
            shutil.copyfile(b.work / "spm.model", copy / "tokenizer.model")
        elif kind == "damaged":
            (copy / "tokenizer.model").write_bytes(b"not a sentencepiece model" * 10)
        else:
            shutil.copytree(other_dir / "checkpoints" / "step-00000009",
                            copy / "checkpoints" / "step-00000009")
        out_dir = copy.parent / "exported"
        for command, got, text in readers(copy, out_dir):
            lines = [ln for ln in text.splitlines() if ln.strip()]
            out.append(Trial("readers", f"{case}: {command}", 0, got, (code,),
                             held=first[0] == second[0] == 0 and len(lines) == 1
                             and says in text and not out_dir.exists(), lost=0,
                             tracebacks=tracebacks(text), note="one line, nothing written"))

    # weights replaced by finite garbage, the manifest re-hashed: the resume warns
    import hashlib

    import torch

    from ten.train import checkpoint as ckpt

    newest = run_dir / "checkpoints" / "step-00000006"
    weights = ckpt.load(newest, "model.pt")
    torch.save({k: torch.randn(v.shape) * 3 for k, v in weights.items()}, newest / "model.pt")
    manifest = json.loads((newest / "manifest.json").read_text())
    for entry in manifest["files"]:
        raw = (newest / entry).read_bytes()
        manifest["files"][entry] = {"size": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
    (newest / "manifest.json").write_text(json.dumps(manifest))
    code, text = run("run", job, "--no-sample", "--set", "train.max_steps=9")
    out.append(Trial("readers", "garbage weights re-hashed, then a resume", 0, code,
                     (ExitCode.OK,), held="far above" in text, lost=0,
                     tracebacks=tracebacks(text), note="a warning at the first loss"))
    return out


RUNNERS: dict[str, Callable[[Bench, int], list[Trial]]] = {
    "bucket": bucket_group, "signals": signals_group, "streams": streams_group,
    "ranks": ranks_group, "resources": resources_group, "hostile": hostile_group,
    "secrets": secrets_group, "readers": readers_group}


# --- the report --------------------------------------------------------------------------------

def table(trials: list[Trial], seconds: dict[str, float]) -> list[str]:
    rows = ["| group | trials | held | data lost | tracebacks | wrong exit codes | met | "
            "wall s |", "|---|---|---|---|---|---|---|---|"]
    for group in GROUPS:
        ts = [t for t in trials if t.group == group]
        if ts:
            rows.append(f"| {group} | {len(ts)} | {sum(t.held for t in ts)} | "
                        f"{sum(t.lost for t in ts)} | {sum(t.tracebacks for t in ts)} | "
                        f"{sum(t.wrong_exit for t in ts)} | {sum(t.met for t in ts)}/{len(ts)} | "
                        f"{seconds[group]:.0f} |")
    return rows


def detail(trials: list[Trial]) -> list[str]:
    rows = ["| group | case | # | exit (documented) | held | lost | tracebacks | note |",
            "|---|---|---|---|---|---|---|---|"]
    for t in trials:
        rows.append(f"| {t.group} | {t.case} | {t.index} | {t.exit_code} "
                    f"({'/'.join(map(str, map(int, t.expected)))}) | "
                    f"{'yes' if t.held else 'NO'} | {t.lost} | {t.tracebacks} | {t.note} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", default=",".join(GROUPS),
                   help="comma-separated: " + ", ".join(GROUPS))
    p.add_argument("--trials", type=int, default=3, help="trials of each random case (default 3)")
    p.add_argument("--seed", type=int, default=0, help="seeds the random moments and faults")
    p.add_argument("--json", dest="json_out", type=Path, help="also write the results here")
    p.add_argument("--keep", action="store_true", help="keep the working folder")
    args = p.parse_args(argv)
    groups = [g.strip() for g in args.groups.split(",") if g.strip()]
    if not groups or set(groups) - set(GROUPS):
        p.error(f"--groups takes {', '.join(GROUPS)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    isolate_aws_env()
    say(f"seed {args.seed}")
    work = Path(tempfile.mkdtemp(prefix="bench-fault-groups-"))
    os.environ["TEN_RUNNER_HOME"] = str(work / "home")
    os.environ["TEN_HEARTBEAT_POINTER"] = str(work / "heartbeat-pointer")
    started = time.time()
    bench = Bench(work, random.Random(args.seed))
    trials: list[Trial] = []
    seconds: dict[str, float] = {}
    try:
        for group in groups:
            t0 = time.time()
            found = RUNNERS[group](bench, args.trials)
            seconds[group] = time.time() - t0
            trials += found
            for trial in found:
                say(f"{group} / {trial.case} #{trial.index}: exit {trial.exit_code}, "
                    f"{'met' if trial.met else 'MISSED'} ({trial.note})")
    finally:
        if bench.s3 is not None:
            bench.s3.stop()
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    header = [f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
              f"command: {shlex.join(['python'] + sys.argv)}", f"machine: {machine()}",
              f"seed: {args.seed}; wall time {time.time() - started:.0f} s for {len(trials)} "
              "trials; jobs: TEN d_model 32, 2 layers, vocab 400, batch 4 x seq 32, CPU"]
    met = all(t.met for t in trials)
    print("\n".join(header + [""] + table(trials, seconds) + [""] + detail(trials) + [
        "", f"overall: {sum(t.met for t in trials)}/{len(trials)} trials met the goal: "
        + ("MET" if met else "MISSED")]))
    if args.json_out:
        args.json_out.write_text(json.dumps(
            {"header": header, "met": met, "seconds": seconds,
             "trials": [{**dataclasses.asdict(t), "met": t.met} for t in trials]}, indent=1))
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
