"""Fault injection for ``ten-runner run``, each fault resumed and compared bit for bit.

kill -9 and SIGTERM at a random moment of every phase, and damaged checkpoints and
data, on a local and an S3 store (``rclone serve s3``, started here); every interrupted
run is resumed and compared with an uninterrupted one.

    python benchmarks/bench_faults.py                  # 3 trials per cell: 76 trials, ~20 min
    python benchmarks/bench_faults.py --trials 5 --stores local,s3 --seed 7 --json out.json
    python benchmarks/bench_faults.py --trials 1 --stores local          # a smoke run

One reference run per store and job shape (uninterrupted) gives the final weights, the
per-step losses, and how long each phase lasts as this script observes it. Then each
trial, in fresh directories (and a fresh bucket prefix):

1. ``python -m runner.cli run JOB --no-sample`` (with the sample for the final-sample
   phase), in its own process group;
2. waits for the target phase (for a repeated phase, a random occurrence of it), then a
   random delay of up to half the phase's length in the reference, and sends the
   signal: SIGTERM to the main process (what ``docker stop`` does), or SIGKILL to the
   whole group (the machine is gone);
3. with the S3 store, deletes the local working copy (``data.cache_dir/runs/<name>``):
   a spot machine comes back with an empty disk;
4. runs the same command again to the end.

Phases, from what the run writes (its log lines on stderr, metrics, checkpoint folders,
the bucket): preparation (``job <name>:`` is logged, and with a bucket the writer lease,
until ``data ready``; the data cache is fresh for these trials), training (a random
step: from its line to the next step's), save (a ``.tmp-step-*`` checkpoint folder exists), upload
(S3 only: the newest local commit is ahead of the bucket's ``LATEST``), eval (the step
line of a periodic evaluation step until its ``eval step`` line), final sample
(``done:`` until ``sample:``). Save and upload trials use a wider model that
checkpoints every 2 steps, so a save takes long enough to be hit.

Corruption trials (one per store each): the run is killed (-9) between two saves once
the store holds two checkpoints, then one thing is damaged before the resume: a byte of
the newest checkpoint's model.pt; the "files" key of its manifest.json (renamed); its
model.pt replaced by a pickle whose ``__reduce__`` would create a marker file, with the
manifest's sha256 rewritten to match (an attacker with write access to the bucket); a
byte of the cached tokenizer.model; a prepared shard cut to half its size. Checkpoint
damage is done where the store keeps it (for S3, in the bucket, through boto3).

The goal, per trial: the resume exits 0 with final weights identical to the reference
and every logged loss equal to the reference's; no "Traceback" in any output; the
signalled run exits as documented (SIGTERM: 75 in every phase, or 0 once the run has
logged "done:" and only the process's teardown is left; kill -9: -9); steps
lost (trained before the signal, then trained again) 0 after SIGTERM (the trainer
commits the step it finished) and after kill -9 at most checkpoint.every_steps on a
local store, twice that with a bucket and an empty disk (the newest checkpoint may still
be uploading in the background when the machine dies). A
corruption trial must also resume from the step before the damaged one (or, for data
damage, from the newest), name the problem in one line, and never run the pickle. A
trial whose signal could not be sent (the run ended first) misses the goal too.

Progress goes to stderr; the tables to stdout; the exit status is 1 when any trial
misses the goal. Everything lives in a temporary directory, removed at the end unless
``--keep``. The faults of the third round (a flaky bucket behind a proxy, hang-ups,
closed consoles, rank kills, resources, hostile values, secrets) are measured by
``bench_fault_groups.py``, in groups.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import io
import json
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_recovery import machine  # noqa: E402
from bench_storage import BUCKET, Rclone, isolate_aws_env, plain_client, say  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
PHASES = ("preparation", "training", "save", "upload", "eval", "final sample")
SIGNALS = ("sigterm", "sigkill")
EXPECTED_EXIT = {"sigterm": 75, "sigkill": -signal.SIGKILL}
# ... except that a SIGTERM landing once the run has finished (its "done:" line logged and
# everything committed) may leave the exit code at 0: the job is over either way.
CORRUPTIONS = ("model.pt byte flip", "manifest without files", "pickle in model.pt",
               "tokenizer byte flip", "truncated shard")
# A line names a damaged file when it names the file and one of these.
PROBLEM_WORDS = ("corrupt", "sha256", "refuse", "unusable", "malformed", "format", "tamper",
                 "bytes", "missing", "invalid", "skipping")
MAX_STEPS, EVAL_EVERY = 20, 10
POLL_S = 0.002  # a save of the wide model lasts tens of milliseconds
DELAY_FRACTION = 0.5  # of the phase's length in the reference run (load varies)
EXIT_TIMEOUT_S = 120  # after the signal
RUN_TIMEOUT_S = 600  # a run still going after this is hung

JOB = """\
name: {name}
model: {{arch: ten, preset: tiny, d_model: {d_model}, n_layers: 2, n_eigenstates: 8,
        n_heads: 2, chunk_size: 16}}
data:
  dataset: {corpus}
  mode: pretokenized
  seq_len: 64
  tokenizer: {{vocab_size: 1000}}
  num_proc: 1
  num_workers: 0
  cache_dir: {cache}
  val_fraction: 0.05
train:
  max_steps: {steps}
  batch_size: 4
  lr: 3.0e-3
  warmup_steps: 2
  eval_every: {eval_every}
  eval_batches: 8
  log_every: 1
  seed: 3
  device: cpu
checkpoint: {{every_steps: {every}, keep_last: 2}}
storage: {storage}
"""


@dataclasses.dataclass(frozen=True)
class Shape:
    """A job's model width and checkpoint interval."""

    name: str
    d_model: int
    every: int


SMALL = Shape("small", 64, 5)
WIDE = Shape("wide", 256, 2)  # 1.5 M parameters: an 18 MB checkpoint, saved every 2 steps


def shape_of(phase: str) -> Shape:
    return WIDE if phase in ("save", "upload") else SMALL


def make_corpus(path: Path) -> None:
    """About 3 MB of random-word documents (fixed seed): preparation takes seconds."""
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9)))
             for _ in range(3000)]
    with open(path, "w") as f:
        for _ in range(6000):
            text = " ".join(rng.choice(words) for _ in range(rng.randint(40, 120)))
            f.write(json.dumps({"text": text}) + "\n")


# --- where a job's files are ----------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Paths:
    """One job: ``held`` is what its store holds, on disk (for S3 the rclone server's
    folder, read directly; written only through boto3), ``run`` the working copy the
    runner writes (the same folder for a local store)."""

    job: Path
    cache: Path
    held: Path
    run: Path
    remote: bool
    every: int


class LocalStore:
    kind, remote = "local", False

    def storage(self, name: str, trial_dir: Path) -> tuple[str, Path]:
        root = trial_dir / "store"
        return f"{{url: '{root}'}}", root / name

    def put(self, path: Path, data: bytes) -> None:
        path.write_bytes(data)


class S3Store:
    """A bucket of ``rclone serve s3``; each job gets its own prefix."""

    kind, remote = "s3", True

    def __init__(self, work: Path):
        self.server = Rclone(work / "s3")
        self.root = work / "s3" / BUCKET
        self.client = plain_client(self.server.endpoint)

    def storage(self, name: str, trial_dir: Path) -> tuple[str, Path]:
        return (f"{{url: 's3://{BUCKET}/{name}', endpoint_url: '{self.server.endpoint}'}}",
                self.root / name / name)

    def put(self, path: Path, data: bytes) -> None:
        self.client.put_object(Bucket=BUCKET, Key=path.relative_to(self.root).as_posix(),
                               Body=data)


def write_job(store, shape: Shape, name: str, trial_dir: Path, cache: Path,
              corpus: Path) -> Paths:
    storage, held = store.storage(name, trial_dir)
    trial_dir.mkdir(parents=True, exist_ok=True)
    job = trial_dir / f"{name}.yaml"
    job.write_text(JOB.format(name=name, d_model=shape.d_model, corpus=corpus, cache=cache,
                              steps=MAX_STEPS, eval_every=EVAL_EVERY, every=shape.every,
                              storage=storage))
    run = cache / "runs" / name if store.remote else held
    return Paths(job, cache, held, run, store.remote, shape.every)


def step_name(step: int) -> str:
    return f"step-{step:08d}"


def committed(ckpt_root: Path) -> list[int]:
    """Steps whose folder has a manifest, oldest first (local disk or the bucket's)."""
    try:
        names = os.listdir(ckpt_root)
    except OSError:
        return []
    return sorted(int(n[5:]) for n in names if re.fullmatch(r"step-\d{8}", n)
                  and os.path.exists(ckpt_root / n / "manifest.json"))


def bucket_latest(held: Path) -> int:
    """The step the bucket's LATEST names (0: none yet)."""
    try:
        m = re.fullmatch(r"step-(\d{8})", (held / "LATEST").read_text().strip())
    except OSError:
        return 0
    return int(m.group(1)) if m else 0


def train_losses(run_dir: Path, since: float = 0.0) -> list[tuple[int, float]]:
    """(step, loss) of every train record in metrics.jsonl written after ``since``."""
    out = []
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # a line torn by kill -9
        if rec.get("kind") == "train" and rec["time"] >= since:
            out.append((rec["step"], rec["loss"]))
    return out


def final_weights(paths: Paths) -> dict | None:
    """The model of the last step as the store holds it (None when it has none)."""
    path = paths.held / "checkpoints" / step_name(MAX_STEPS) / "model.pt"
    return torch.load(path, weights_only=True) if path.exists() else None


# --- one `ten-runner run` ---------------------------------------------------------------------

class Run:
    """``python -m runner.cli run JOB`` in its own process group. Its stderr (the run's
    log lines) is parsed as it arrives: the phase markers below."""

    STEP = re.compile(r"^step\s+(\d+)/\d+ \|")
    EVAL = re.compile(r"^eval step (\d+):")
    RESUMED = re.compile(r"resumed from \S+ \(step (\d+),")
    MARKERS = {"job": re.compile(r"^job \S+: "), "lease": re.compile(r"writer lease epoch"),
               "data ready": re.compile(r"^data ready in"), "done": re.compile(r"^done:"),
               "sample": re.compile(r"^(no )?sample:")}
    live: list[Run] = []  # stopped by stop_all, whatever happens

    def __init__(self, paths: Paths, sample: bool):
        self.started = time.time()
        cmd = [sys.executable, "-m", "runner.cli", "run", str(paths.job)]
        self.proc = subprocess.Popen(cmd + ([] if sample else ["--no-sample"]), cwd=REPO,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     errors="replace", start_new_session=True)
        Run.live.append(self)
        self.err: list[str] = []
        self.out: list[str] = []
        self.seen: set[str] = set()
        self.last_step, self.evals, self.resumed_from = 0, set(), 0
        self.readers = [threading.Thread(target=self._read_err, daemon=True),
                        threading.Thread(target=lambda: self.out.extend(self.proc.stdout),
                                         daemon=True)]
        for t in self.readers:
            t.start()

    def _read_err(self) -> None:
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.err.append(line)
            if m := self.STEP.match(line):
                self.last_step = int(m.group(1))
            elif m := self.EVAL.match(line):
                self.evals.add(int(m.group(1)))
            elif m := self.RESUMED.search(line):
                self.resumed_from = int(m.group(1))
            self.seen.update(k for k, rx in self.MARKERS.items() if rx.search(line))

    def alive(self) -> bool:
        """Running, and not for longer than any run should (then it counts as over)."""
        return self.proc.poll() is None and time.time() < self.started + RUN_TIMEOUT_S

    def signal(self, name: str) -> None:
        if name == "sigkill":
            os.killpg(self.proc.pid, signal.SIGKILL)
        else:
            self.proc.send_signal(signal.SIGTERM)

    def finish(self, timeout: float) -> int | None:
        """The exit code, or None when it had to be killed after ``timeout`` seconds."""
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            code = None
        self.stop()
        for t in self.readers:
            t.join(10)
        return code

    def stop(self) -> None:
        """Nothing of this run may outlive it (a process it started, a hung run)."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        if self in Run.live:
            Run.live.remove(self)

    @property
    def text(self) -> str:
        return "\n".join(self.out + self.err)

    def last_line(self) -> str:
        line = self.err[-1] if self.err else "(no output)"
        return line if len(line) <= 240 else line[:240] + "..."

    @classmethod
    def stop_all(cls) -> None:
        for run in list(cls.live):
            run.stop()


# --- phases, as observed ------------------------------------------------------------------------

def occurrence(phase: str, run: Run, paths: Paths):
    """Which occurrence of ``phase`` the run is in now (None: not in it). Training's
    occurrences are its steps: from one step's line to the next."""
    if phase == "preparation":
        ready = "data ready" in run.seen
        started = "job" in run.seen and ("lease" in run.seen or not paths.remote)
        return "preparation" if started and not ready else None
    if phase == "training":
        return run.last_step if 0 < run.last_step < MAX_STEPS else None
    if phase == "save":
        try:
            names = os.listdir(paths.run / "checkpoints")
        except OSError:
            return None
        return next((n for n in names if n.startswith(".tmp-step-")), None)
    if phase == "upload":
        local = max(committed(paths.run / "checkpoints"), default=0)
        return local if local > bucket_latest(paths.held) else None
    if phase == "eval":
        step = run.last_step
        due = 0 < step < MAX_STEPS and step % EVAL_EVERY == 0
        return step if due and step not in run.evals else None
    if phase == "final sample":
        return "sample" if "done" in run.seen and "sample" not in run.seen else None
    raise ValueError(phase)


def observe(run: Run, paths: Paths, phases: list[str]) -> dict[str, list[float]]:
    """Poll until the run ends: the length of every occurrence of each phase."""
    current: dict[str, tuple[object, float]] = {}
    lengths: dict[str, list[float]] = {p: [] for p in phases}
    while run.alive():
        now = time.monotonic()
        for p in phases:
            occ = occurrence(p, run, paths)
            if p in current and current[p][0] != occ:
                lengths[p].append(now - current.pop(p)[1])
            if occ is not None and p not in current:
                current[p] = (occ, now)
        time.sleep(POLL_S)
    return lengths


@dataclasses.dataclass(frozen=True)
class Plan:
    """A phase as the reference run showed it: how many times, how long (median)."""

    seen: int
    length_s: float

    def pick(self, rng: random.Random) -> tuple[int, float]:
        """Which occurrence to hit (not the last seen: polling may miss a short one, so
        a trial may see one fewer), and the delay into it."""
        return (rng.randrange(max(1, self.seen - 1)),
                rng.uniform(0.0, DELAY_FRACTION * self.length_s))


def fire(run: Run, paths: Paths, phase: str, sig: str, plan: Plan,
         rng: random.Random) -> tuple[bool, bool]:
    """Wait for the chosen occurrence of ``phase``, the random delay, then signal.
    Returns (sent, the run was still in the phase just before sending)."""
    skip, delay = plan.pick(rng)
    seen, last = 0, None
    while True:
        if not run.alive():
            return False, False
        occ = occurrence(phase, run, paths)
        if occ is not None and occ != last:
            if seen == skip:
                break
            seen += 1
        last = occ
        time.sleep(POLL_S)
    time.sleep(delay)
    hit = occurrence(phase, run, paths) is not None
    if not run.alive():
        return False, False
    run.signal(sig)
    return True, hit


# --- references ---------------------------------------------------------------------------------

@dataclasses.dataclass
class Reference:
    weights: dict
    losses: dict[int, float]
    plans: dict[str, Plan]


def reference(store, shape: Shape, work: Path, cache: Path, corpus: Path) -> Reference:
    """The uninterrupted run (with the sample, so its phase is measured too)."""
    phases = (["preparation", "training", "eval", "final sample"] if shape is SMALL
              else ["save"] + (["upload"] if store.remote else []))
    paths = write_job(store, shape, f"ref-{shape.name}", work / f"ref-{store.kind}-{shape.name}",
                      cache, corpus)
    run = Run(paths, sample=True)
    lengths = observe(run, paths, phases)
    code = run.finish(RUN_TIMEOUT_S)
    weights = final_weights(paths)
    if code != 0 or weights is None or "Traceback" in run.text:
        sys.exit(f"the {store.kind} reference run ({shape.name}) failed: exit {code}, "
                 f"last line: {run.last_line()}")
    missing = [p for p in phases if not lengths[p]]
    if missing:
        sys.exit(f"the {store.kind} reference run ({shape.name}) never showed {missing}")
    plans = {p: Plan(len(lengths[p]), statistics.median(lengths[p])) for p in phases}
    return Reference(weights, dict(train_losses(paths.run)), plans)


# --- judging a resumed run ----------------------------------------------------------------------

def compare(ref: Reference, paths: Paths, losses: list[tuple[int, float]]) -> list[str]:
    """Problems with the final weights or the logged losses (empty: bit-exact)."""
    weights = final_weights(paths)
    if weights is None:
        return [f"the store holds no {step_name(MAX_STEPS)}"]
    problems = []
    if weights.keys() != ref.weights.keys() or not all(
            torch.equal(weights[k], ref.weights[k]) for k in weights):
        problems.append("final weights differ from the uninterrupted run")
    wrong = sorted({s for s, loss in losses if ref.losses.get(s) != loss})
    missing = sorted(set(ref.losses) - {s for s, _ in losses})
    if wrong:
        problems.append(f"losses differ at steps {wrong[:5]}")
    if missing:
        problems.append(f"no loss logged for steps {missing[:5]}")
    return problems


@dataclasses.dataclass
class Trial:
    store: str
    phase: str
    fault: str
    index: int
    sent: bool = False
    in_phase: bool = False
    codes: tuple = ()
    lost: int = 0
    bit_exact: bool = False
    tracebacks: int = 0
    resumed_from: int = 0
    named: bool = True  # corruption trials: a line names the problem
    pickle_ran: bool = False
    problems: list[str] = dataclasses.field(default_factory=list)
    seconds: float = 0.0

    @property
    def name(self) -> str:
        """The job's name (a slug): its folders and bucket prefix."""
        what = (self.fault if self.phase == "corruption"
                else f"{self.phase}-{self.fault}-{self.index}")
        return re.sub(r"[^a-z0-9]+", "-", f"{self.store}-{what}").strip("-")


def judge_resume(trial: Trial, ref: Reference, paths: Paths, first: Run, second: Run,
                 code: int | None, before: list[tuple[int, float]]) -> None:
    """What every trial checks once the resume has ended."""
    trial.tracebacks = sum("Traceback" in r.text for r in (first, second))
    if trial.tracebacks:
        trial.problems.append(f"traceback in {trial.tracebacks} output(s)")
    trial.resumed_from = second.resumed_from
    trial.lost = max(0, max((s for s, _ in before), default=0) - second.resumed_from)
    if code != 0:
        trial.problems.append(f"resume exited {code}: {second.last_line()}")
        return
    mismatch = compare(ref, paths, before + train_losses(paths.run, second.started))
    trial.bit_exact = not mismatch
    trial.problems += mismatch


def resume(paths: Paths, sample: bool) -> tuple[Run, int | None]:
    if paths.remote:  # a spot machine comes back with an empty disk
        shutil.rmtree(paths.run, ignore_errors=True)
    run = Run(paths, sample)
    return run, run.finish(RUN_TIMEOUT_S)


# --- the trials -----------------------------------------------------------------------------------

def signal_trial(store, ref: Reference, phase: str, sig: str, index: int, rng: random.Random,
                 work: Path, corpus: Path) -> Trial:
    trial = Trial(store.kind, phase, sig, index)
    trial_dir = work / trial.name
    cache = trial_dir / "cache" if phase == "preparation" else work / "cache"
    paths = write_job(store, shape_of(phase), trial.name, trial_dir, cache, corpus)
    sample = phase == "final sample"
    first = Run(paths, sample)
    trial.sent, trial.in_phase = fire(first, paths, phase, sig, ref.plans[phase], rng)
    code = first.finish(EXIT_TIMEOUT_S)
    if not trial.sent:
        trial.codes = (code,)
        trial.problems.append(f"no signal sent: the run ended (exit {code}) before the "
                              "chosen moment")
        return trial
    if code is None:
        trial.problems.append(f"still running {EXIT_TIMEOUT_S} s after {sig.upper()}")
    elif code != EXPECTED_EXIT[sig] and not (sig == "sigterm" and code == 0
                                             and finished(first)):
        trial.problems.append(f"exited {code} after {sig.upper()}, expected "
                              f"{EXPECTED_EXIT[sig]}: {first.last_line()}")
    before = train_losses(paths.run)
    second, code2 = resume(paths, sample)
    trial.codes = (code, code2)
    judge_resume(trial, ref, paths, first, second, code2, before)
    # kill -9 loses the steps since the last checkpoint that survived: on local disk at
    # most one interval; with a bucket and an empty disk, the newest local checkpoint
    # may still have been uploading (uploads run in the background), so up to two.
    limit = 0 if sig == "sigterm" else paths.every * (2 if paths.remote else 1)
    if trial.lost > limit:
        trial.problems.append(f"{trial.lost} steps lost (at most {limit})")
    return trial


def finished(run: Run) -> bool:
    """The run logged its end ("done: N steps"): a stop after this changes nothing."""
    return any(line.startswith("done: ") for line in run.err)


def kill_between_saves(run: Run, paths: Paths) -> int | None:
    """kill -9 once the store holds two checkpoints, nothing is on its way to it, and
    the next save is at least a step away; returns the newest step held then."""
    while run.alive():
        held = committed(paths.held / "checkpoints")
        local = max(committed(paths.run / "checkpoints"), default=0)
        if len(held) >= 2 and local == held[-1] and held[-1] < run.last_step <= (
                held[-1] + paths.every - 2):
            run.signal("sigkill")
            return held[-1]
        time.sleep(POLL_S)
    return None


class Payload:
    """Unpickling this creates ``marker``: what a tampered model.pt would do."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return open, (str(self.marker), "w")


def payload_bytes(marker: Path) -> bytes:
    buf = io.BytesIO()
    torch.save({"embed.weight": Payload(marker)}, buf)
    return buf.getvalue()


def check_payload(work: Path) -> None:
    """The payload does run when unpickled without weights_only (or 'pickle ran: no'
    would prove nothing)."""
    marker = work / "payload-self-test"
    torch.load(io.BytesIO(payload_bytes(marker)), weights_only=False)
    if not marker.exists():
        sys.exit("the pickle payload does not create its marker: fix check_payload")
    marker.unlink()


def flip_byte(path: Path) -> bytes:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    return bytes(data)


def corrupt(kind: str, store, paths: Paths, step: int, marker: Path) -> tuple[int, str]:
    """Damage one thing; returns the step the resume should start from and a word the
    line naming the problem must contain."""
    ckpt = paths.held / "checkpoints" / step_name(step)
    manifest = json.loads((ckpt / "manifest.json").read_text())
    if kind == "model.pt byte flip":
        store.put(ckpt / "model.pt", flip_byte(ckpt / "model.pt"))
    elif kind == "manifest without files":
        manifest["filez"] = manifest.pop("files")
        store.put(ckpt / "manifest.json", json.dumps(manifest).encode())
    elif kind == "pickle in model.pt":
        data = payload_bytes(marker)
        manifest["files"]["model.pt"] = {"size": len(data),
                                         "sha256": hashlib.sha256(data).hexdigest()}
        store.put(ckpt / "model.pt", data)
        store.put(ckpt / "manifest.json", json.dumps(manifest).encode())
    elif kind == "tokenizer byte flip":
        model = next(paths.cache.glob("tokenizers/*/tokenizer.model"))
        model.write_bytes(flip_byte(model))
        return step, "tokenizer"
    elif kind == "truncated shard":
        shard = next(paths.cache.glob("shards/*/train-*.bin"))
        shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
        return step, shard.name
    else:
        raise ValueError(kind)
    return step - paths.every, step_name(step)


def corruption_trial(store, ref: Reference, kind: str, work: Path, corpus: Path) -> Trial:
    trial = Trial(store.kind, "corruption", kind, 0)
    trial_dir = work / trial.name
    cache = trial_dir / "cache"  # its own copy: this trial may damage it
    shutil.copytree(work / "cache", cache, ignore=shutil.ignore_patterns("runs"))
    paths = write_job(store, SMALL, trial.name, trial_dir, cache, corpus)
    first = Run(paths, sample=False)
    step = kill_between_saves(first, paths)
    code = first.finish(EXIT_TIMEOUT_S)
    trial.sent = trial.in_phase = step is not None
    if step is None:
        trial.codes = (code,)
        trial.problems.append(f"the run ended before the store held two checkpoints ({code})")
        return trial
    if code != EXPECTED_EXIT["sigkill"]:
        trial.problems.append(f"exited {code} after SIGKILL: {first.last_line()}")
    before = train_losses(paths.run)
    marker = trial_dir / "PICKLE-RAN"
    expected, word = corrupt(kind, store, paths, step, marker)
    second, code2 = resume(paths, sample=False)
    trial.codes = (code, code2)
    judge_resume(trial, ref, paths, first, second, code2, before)
    if code2 == 0 and second.resumed_from != expected:
        trial.problems.append(f"resumed from step {second.resumed_from}, expected {expected}")
    trial.named = any(word in line and any(w in line.lower() for w in PROBLEM_WORDS)
                      for line in second.err)
    if not trial.named:
        trial.problems.append(f"no line names the problem ({word!r})")
    trial.pickle_ran = marker.exists()
    if trial.pickle_ran:
        trial.problems.append("the pickle in model.pt RAN (marker file created)")
    return trial


# --- the report ---------------------------------------------------------------------------------

def codes(values: list) -> str:
    counts = Counter(values)
    return ", ".join(f"{'-' if c is None else c}×{n}" for c, n in counts.most_common())


def signal_table(trials: list[Trial]) -> list[str]:
    rows = ["| store | phase | signal | trials | signal in phase | bit-exact resumes | "
            "steps lost (max) | tracebacks | exit codes: signalled run | resume | met |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    cells: dict[tuple, list[Trial]] = {}
    for t in trials:
        cells.setdefault((t.store, t.phase, t.fault), []).append(t)
    for (store, phase, sig), ts in cells.items():
        rows.append(
            f"| {store} | {phase} | {sig} | {len(ts)} | {sum(t.in_phase for t in ts)} | "
            f"{sum(t.bit_exact for t in ts)} | {max(t.lost for t in ts)} | "
            f"{sum(t.tracebacks for t in ts)} | {codes([t.codes[0] for t in ts])} | "
            f"{codes([t.codes[1] for t in ts if len(t.codes) > 1]) or '-'} | "
            f"{sum(not t.problems for t in ts)}/{len(ts)} |")
    return rows


def corruption_table(trials: list[Trial]) -> list[str]:
    rows = ["| store | kill -9, then | resumed from step | bit-exact | problem named | "
            "pickle ran | tracebacks | exit codes | met |", "|---|---|---|---|---|---|---|---|---|"]
    for t in trials:
        rows.append(f"| {t.store} | {t.fault} | {t.resumed_from} | "
                    f"{'yes' if t.bit_exact else 'NO'} | {'yes' if t.named else 'NO'} | "
                    f"{'YES' if t.pickle_ran else 'no'} | "
                    f"{t.tracebacks} | {' → '.join(str(c) for c in t.codes)} | "
                    f"{'yes' if not t.problems else 'NO'} |")
    return rows


def report(header: list[str], trials: list[Trial]) -> bool:
    """Print the tables and the failures; True when every trial met the goal."""
    signals = [t for t in trials if t.phase != "corruption"]
    damaged = [t for t in trials if t.phase == "corruption"]
    failed = [t for t in trials if t.problems]
    lines = header + [""]
    if signals:
        lines += signal_table(signals) + [""]
    if damaged:
        lines += corruption_table(damaged) + [""]
    lines.append(f"overall: {len(trials) - len(failed)}/{len(trials)} trials met the goal "
                 f"(100% bit-exact, 0 lost, 0 tracebacks, every exit code the documented one): "
                 + ("MET" if not failed else "MISSED"))
    for t in failed:
        what = t.fault if t.phase == "corruption" else f"{t.phase} {t.fault} #{t.index}"
        lines.append(f"- {t.store} {what}: " + "; ".join(t.problems))
    print("\n".join(lines))
    return not failed


def run_store(kind: str, store, args, rng: random.Random, work: Path, corpus: Path,
              header: list[str]) -> list[Trial]:
    """The references, then every signal trial and every corruption trial on one store."""
    say(f"{kind}: reference runs")
    refs = {SMALL: reference(store, SMALL, work, work / f"ref-{kind}" / "cache", corpus)}
    if not (work / "cache").exists():  # the prepared data the other trials share
        shutil.copytree(work / f"ref-{kind}" / "cache", work / "cache",
                        ignore=shutil.ignore_patterns("runs"))
    refs[WIDE] = reference(store, WIDE, work, work / "cache", corpus)
    plans = {**refs[SMALL].plans, **refs[WIDE].plans}
    header.append(f"{kind} reference, phase lengths (median of occurrences): " + ", ".join(
        f"{p} {plan.length_s:.2f} s (x{plan.seen})" for p, plan in plans.items()))
    trials = []

    def timed(make, *how) -> None:
        t0 = time.time()
        trial = make(store, *how, work, corpus)
        trial.seconds = time.time() - t0
        trials.append(trial)
        say(progress(trial))
        if not args.keep:
            shutil.rmtree(work / trial.name, ignore_errors=True)
            shutil.rmtree(work / "cache" / "runs" / trial.name, ignore_errors=True)

    cells = [(p, s) for p in PHASES if p in plans for s in SIGNALS]
    for index in range(args.trials):
        for phase, sig in cells:
            timed(signal_trial, refs[shape_of(phase)], phase, sig, index, rng)
    for corruption in CORRUPTIONS:
        timed(corruption_trial, refs[SMALL], corruption)
    return trials


def progress(t: Trial) -> str:
    where = "in phase" if t.in_phase else "after the phase"
    return (f"{t.store} {t.phase} {t.fault} #{t.index}: {where}, exit "
            f"{' → '.join(str(c) for c in t.codes)}, lost {t.lost}, {t.seconds:.0f} s: "
            + ("ok" if not t.problems else "; ".join(t.problems)))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=3,
                        help="trials per store, phase and signal (default 3)")
    parser.add_argument("--stores", default="local,s3", help="comma-separated: local, s3")
    parser.add_argument("--seed", type=int, default=0, help="seeds the occurrences and delays")
    parser.add_argument("--json", dest="json_out", default=None, help="also write results here")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    args = parser.parse_args(argv)
    # A SIGTERM to the benchmark itself unwinds like Ctrl-C, so its clean-up (runs
    # still going, the rclone server, the temporary directory) happens either way.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    kinds = [k.strip() for k in args.stores.split(",") if k.strip()]
    if not kinds or set(kinds) - {"local", "s3"}:
        parser.error("--stores takes local, s3 or local,s3")

    isolate_aws_env()
    rng = random.Random(args.seed)
    started = time.time()
    work = Path(tempfile.mkdtemp(prefix="bench-faults-"))
    os.environ["TEN_RUNNER_HOME"] = str(work / "home")
    os.environ["TEN_HEARTBEAT_POINTER"] = str(work / "heartbeat-pointer")
    header = [f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
              f"command: {shlex.join(['python'] + sys.argv)}", f"machine: {machine()}",
              f"jobs: TEN tiny, 2 layers, vocab 1000, batch 4 x seq 64, {MAX_STEPS} steps, "
              f"eval every {EVAL_EVERY}, CPU; d_model {SMALL.d_model} checkpointing every "
              f"{SMALL.every} steps; save/upload trials: d_model {WIDE.d_model} every "
              f"{WIDE.every}"]
    trials: list[Trial] = []
    s3 = None
    try:
        say(f"working in {work}")
        corpus = work / "docs.jsonl"
        make_corpus(corpus)
        check_payload(work)
        for kind in kinds:
            if kind == "s3":
                store = s3 = S3Store(work)
                header.append(f"S3: {s3.server.version()} (`rclone serve s3`) on 127.0.0.1")
            else:
                store = LocalStore()
            trials += run_store(kind, store, args, rng, work, corpus, header)
    finally:
        Run.stop_all()
        if s3 is not None:
            s3.server.stop()
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    header.append(f"wall time {time.time() - started:.0f} s for {len(trials)} trials")
    met = report(header, trials)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(
            {"header": header, "met": met, "trials": [dataclasses.asdict(t) for t in trials]},
            indent=1))
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
