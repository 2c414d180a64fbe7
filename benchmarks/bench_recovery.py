"""What a preemption costs a managed job: the real ``submit --to local`` loop, a real S3
server (``rclone serve s3``, started here), a small TEN model on CPU.

    python benchmarks/bench_recovery.py                # 3 interruptions of each kind
    python benchmarks/bench_recovery.py --repeats 5 --poll-s 0.5
    python benchmarks/bench_recovery.py --modes sigkill --keep   # keep logs and bucket

Two managed jobs run one after the other (``runner.provision.jobs.submit_managed(...,
"local", detach=False)`` in a thread, as tests/e2e/test_submit_local.py does).
Each is interrupted ``--repeats`` times, each time once its current attempt has trained
a few steps, at a different phase of the checkpoint interval (an offset of 1/2R, 3/2R,
... of it), and the loop relaunches it:

* ``sigterm``: SIGTERM to the attempt's main process, what ``docker stop`` or a
  preemption notice does: the trainer finishes its step, commits a checkpoint to the
  bucket and exits 75.
* ``sigkill``: SIGKILL to the attempt's process group (the machine vanished). The next
  attempt starts on an empty disk: the provider deletes ``runner.job.layout.run_dir_of(job)``
  just before it launches the relaunch (the moment the loop has decided, so the delete
  can never race the new process), keeping the dead attempt's metrics.jsonl first.
  The prepared-data cache beside the run directory survives: the data is prepared
  once before the jobs start (:func:`prepare_data`), so fetching or preparing it on a
  truly new machine is not timed.

Per interruption, from the job record's history (RECOVERING), the attempts' launch
times, the healthcheck pointer each attempt writes when ``run`` starts, the heartbeat's
"start" event (after the store is connected and the checkpoint restored), the trainer's
metrics.jsonl ("start" after data, model and resume; one "train" record per step) and
each attempt's log ("restored step N ... in X s"):

* detection: kill → the attempt's process is gone → the loop records RECOVERING,
* relaunch: RECOVERING → the new process → ... → its first training step,
* downtime: the last step the interrupted attempt finished → the first step after,
* steps lost: that last step − the step the new attempt resumed from,
* the downtime in step times and in checkpoint intervals, and the whole cost in steps
  (steps lost + downtime / step time).

Progress goes to stderr; the table alone to stdout. Everything lives in a temporary
directory that is removed at the end; the S3 server and every attempt are stopped.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import shlex
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_storage import BUCKET, Rclone, isolate_aws_env, make_corpus, say  # noqa: E402

JOB = """\
name: {name}
model: {{arch: ten, preset: tiny, d_model: {d_model}}}
data:
  dataset: {corpus}
  mode: pretokenized
  seq_len: {seq}
  tokenizer: {{vocab_size: 512}}
  num_proc: 1
  num_workers: 1
  cache_dir: {cache}
  val_fraction: 0.05
train:
  max_steps: {steps}
  batch_size: {batch}
  lr: 1.0e-3
  warmup_steps: 10
  eval_every: {steps}
  log_every: 1
  seed: 3
  device: cpu
checkpoint: {{every_steps: {every}, keep_last: 2}}
storage: {{url: 's3://{bucket}/runs', endpoint_url: '{endpoint}'}}
resources: {{gpus: 0, spot: false}}
"""
MAX_STEPS = 100_000  # never reached: each job is cancelled after its last interruption
MARGIN = 3  # steps an attempt trains after its first before it may be interrupted
MODES = ("sigterm", "sigkill")


# --- watching files the attempts write ---------------------------------------------------

class Tail:
    """The records of a JSON-lines file that may be deleted and written anew (a new
    machine's run directory): reads only what was appended since the last call."""

    def __init__(self, path: Path):
        self.path, self.records = path, []
        self._offset, self._inode = 0, None

    def reset(self) -> None:
        """Read the file from its start again (it was deleted; a new one may reuse the
        inode number, so this is not left to the inode check)."""
        self._offset, self._inode = 0, None

    def poll(self) -> list[dict]:
        try:
            st = self.path.stat()
            if st.st_ino != self._inode or st.st_size < self._offset:
                self._inode, self._offset = st.st_ino, 0
            with open(self.path, "rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except OSError:
            return self.records
        end = chunk.rfind(b"\n") + 1  # whole lines only
        self._offset += end
        self.records += parse_jsonl(chunk[:end].decode("utf-8", "replace"))
        return self.records


def parse_jsonl(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def train_steps(records: list[dict], since: float, until: float = float("inf")) -> list[dict]:
    return [r for r in records if r.get("kind") == "train" and since <= r["time"] <= until]


def process_gone(pid: int) -> bool:
    """Dead: no /proc entry, or a zombie waiting for the loop's poll to reap it."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return text[text.rindex(")") + 2] in "ZX"


def wait_until(predicate, what: str, alive, timeout: float = 180.0, every: float = 0.02):
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        if not alive():
            raise RuntimeError(f"the managed loop ended while waiting for {what}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(every)


# --- one managed job, interrupted R times --------------------------------------------------

def new_machine_provider(run_dir: Path, wipe: bool):
    """LocalProvider whose relaunches (``wipe``) start with the run directory gone."""
    from runner.provision.local import LocalProvider

    class Provider(LocalProvider):
        def __init__(self):
            super().__init__(grace_s=30)
            self.launched, self.old_metrics = [], {}

        def launch(self, spec, avoid=frozenset()):
            if wipe and spec.attempt > 1:
                metrics = run_dir / "metrics.jsonl"
                self.old_metrics[spec.attempt - 1] = (
                    metrics.read_text() if metrics.exists() else "")
                shutil.rmtree(run_dir, ignore_errors=True)
            instance = super().launch(spec, avoid)
            self.launched.append(instance)
            return instance

    return Provider()


def write_job(work: Path, name: str, endpoint: str, args) -> Path:
    path = work / f"{name}.yaml"
    path.write_text(JOB.format(name=name, d_model=args.d_model, corpus=work / "docs.jsonl",
                               seq=args.seq, cache=work / "cache", steps=MAX_STEPS,
                               batch=args.batch, every=args.every, bucket=BUCKET,
                               endpoint=endpoint))
    return path


def prepare_data(path: Path) -> None:
    """Tokenizer and shards into the local cache before any job starts, so no attempt
    builds them and shares them with the bucket in the background: an attempt stopped
    while that upload runs waits for it on its way out (see BENCHMARKS.md), which is
    not what this measures."""
    from runner.job import load_job
    from runner.job.library import data_config
    from ten.data import open_data

    open_data(data_config(load_job(path, check_model=False)))


def run_mode(mode: str, work: Path, endpoint: str, args, pointer: Path) -> dict:
    """Submit one managed job, interrupt it ``args.repeats`` times, cancel it; returns
    the measurements of each interruption and the step times seen."""
    from runner.job import load_job
    from runner.job.layout import run_dir_of
    from runner.provision.jobs import request_cancel, submit_managed
    from runner.provision.registry import list_records, load_record

    name = f"recovery-{mode}"
    path = write_job(work, name, endpoint, args)
    job = load_job(path, check_model=False)
    run_dir = run_dir_of(job)
    provider = new_machine_provider(run_dir, wipe=mode == "sigkill")
    done: dict = {}

    def loop_log(line: str) -> None:
        say(f"  loop: {line}")

    thread = threading.Thread(target=lambda: done.update(record=submit_managed(
        job, path, "local", provider=provider, detach=False, poll_s=args.poll_s,
        log=loop_log)), daemon=True)
    thread.start()
    metrics = Tail(run_dir / "metrics.jsonl")
    results, steps = [], []
    job_id = None
    try:
        job_id = wait_until(lambda: [r.job_id for r in list_records()
                                     if r.job_name == name], "the record", thread.is_alive)[0]

        def attempt(n: int) -> dict:
            def ready():
                rec = load_record(job_id)
                inst = rec.instance
                return rec if rec.attempt == n and inst and inst.get("launched_at") else None
            rec = wait_until(ready, f"attempt {n}", thread.is_alive, timeout=60)
            inst = rec.instance
            return {"launched": float(inst["launched_at"]), "pid": int(inst["details"]["pid"])}

        current = attempt(1)
        first = wait_until(lambda: train_steps(metrics.poll(), current["launched"]),
                           "the first step (data preparation on attempt 1)", thread.is_alive,
                           timeout=600)[0]
        say(f"{mode}: attempt 1 trains (first step {first['step']})")
        for i in range(args.repeats):
            offset = int((2 * i + 1) * args.every / (2 * args.repeats)) % args.every
            start = first["step"]
            target = max(start + MARGIN, args.every)
            target += (offset - target) % args.every
            wait_until(lambda t=target, c=current: any(
                r["step"] >= t for r in train_steps(metrics.poll(), c["launched"])),
                f"step {target}", thread.is_alive)
            pid = current["pid"]
            t_kill = time.time()
            if mode == "sigterm":
                os.kill(pid, signal.SIGTERM)
            else:
                os.killpg(pid, signal.SIGKILL)
            t_exit = wait_until(lambda p=pid: process_gone(p) and time.time(),
                                "the attempt's exit", lambda: True, timeout=120, every=0.002)
            say(f"{mode} {i + 1}/{args.repeats}: {mode.upper()} after step {target} "
                f"(offset {offset} in the interval), gone after {t_exit - t_kill:.2f} s")
            n = i + 2
            nxt = attempt(n)
            if mode == "sigkill":
                metrics.reset()  # launched: the old run directory is gone
            new_first = wait_until(lambda c=nxt: train_steps(metrics.poll(), c["launched"]),
                                   f"attempt {n}'s first step", thread.is_alive)[0]
            old = (parse_jsonl(provider.old_metrics.get(n - 1, "")) if mode == "sigkill"
                   else metrics.records)
            old_steps = train_steps(old, current["launched"], nxt["launched"])
            steps += [r["step_time_s"] for r in old_steps[2:]]  # settled steps only
            results.append(measure(job_id, run_dir, pointer, old_steps[-1], t_kill, t_exit,
                                   nxt, new_first, metrics.records, n))
            say(f"{mode} {i + 1}/{args.repeats}: " + ", ".join(
                f"{k} {v:.2f}" for k, v in results[-1].items() if isinstance(v, float)))
            current, first = nxt, new_first
        if job_id is not None:
            request_cancel(job_id, wait_s=90)
        thread.join(timeout=120)
    finally:  # whatever happened, leave nothing running
        if thread.is_alive() and job_id is not None:
            request_cancel(job_id, wait_s=60)
            thread.join(timeout=60)
        for instance in provider.launched:
            provider.terminate(instance)
    return {"results": results, "step_times": steps}


def measure(job_id: str, run_dir: Path, pointer: Path, last: dict, t_kill: float,
            t_exit: float, nxt: dict, first: dict, records: list[dict], n: int) -> dict:
    """One interruption's timeline (unix times from the files the attempts wrote)."""
    from runner.provision.registry import load_record

    rec = load_record(job_id)
    recovering = min(h["time"] for h in rec.history
                     if h["state"] == "RECOVERING" and h["time"] >= t_kill)
    start = [r for r in records if r.get("kind") == "start" and r["time"] >= nxt["launched"]]
    events = parse_jsonl((run_dir / "events.jsonl").read_text())
    hb = [e["time"] for e in events if e.get("kind") == "start" and e.get("pid") == nxt["pid"]]
    log = (rec.dir / f"attempt-{n}.log").read_text(errors="replace")
    restored = re.search(r"restored step (\d+) from \S+ in ([\d.]+)s", log)
    data = re.search(r"data ready in ([\d.]+)s", log)
    started = pointer.stat().st_mtime  # rewritten by each attempt as `run` begins
    resumed = int(start[0]["step"])
    graceful = t_exit >= last["time"] >= t_kill  # SIGTERM: it finished a step, then left
    nan = float("nan")

    def event(kind: str) -> float:  # the interrupted attempt's, on its way out
        found = [e["time"] for e in events if e.get("kind") == kind
                 and last["time"] <= e["time"] <= t_exit]
        return found[0] if graceful and found else nan
    saved, stopped = event("checkpoint"), event("stop")
    return {
        "kill_to_exit": t_exit - t_kill,
        "kill_to_last_step": last["time"] - t_kill if graceful else nan,
        "last_step_to_saved": saved - last["time"],
        "saved_to_stopped": stopped - saved,
        "stopped_to_exit": t_exit - stopped,
        "exit_to_recovering": recovering - t_exit,
        "detection": recovering - t_kill,
        "recovering_to_launch": nxt["launched"] - recovering,
        "launch_to_run": started - nxt["launched"],
        "run_to_restored": hb[0] - started,
        "restore_s": float(restored.group(2)) if restored else float("nan"),
        "restored_to_trainer": start[0]["time"] - hb[0],
        "data_s": float(data.group(1)) if data else nan,
        "trainer_to_first_step": first["time"] - start[0]["time"],
        "relaunch": first["time"] - recovering,
        "downtime": first["time"] - last["time"],
        "kill_to_first_step": first["time"] - t_kill,
        "last_step": last["step"],
        "resumed": resumed,
        "lost": last["step"] - resumed,
    }


# --- the report -----------------------------------------------------------------------------

def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def machine() -> str:
    import torch

    return (f"{os.cpu_count()} cores, {cpu_model()}, {platform.system()} "
            f"{platform.release()}, Python {platform.python_version()}, torch "
            f"{torch.__version__} ({torch.get_num_threads()} threads); load average "
            + " ".join(f"{x:.2f}" for x in os.getloadavg()))


ROWS = [  # (key, what, unit)
    ("detection", "detection: kill → the loop records RECOVERING", "s"),
    ("kill_to_exit", "  kill → the attempt's process is gone", "s"),
    ("kill_to_last_step", "    its step in flight finishes (SIGTERM)", "s"),
    ("last_step_to_saved", "    checkpoint saved on local disk", "s"),
    ("saved_to_stopped", "    committed to the bucket (commit_now), uploader closed", "s"),
    ("stopped_to_exit", "    last heartbeat written and uploaded, process exits", "s"),
    ("exit_to_recovering", "  process gone → RECOVERING (the loop's next poll)", "s"),
    ("relaunch", "relaunch: RECOVERING → first training step of the new attempt", "s"),
    ("recovering_to_launch", "  RECOVERING → new process started", "s"),
    ("launch_to_run", "  → `run` begins (interpreter, imports incl. torch, job file checked)", "s"),
    ("run_to_restored", "  → bucket, lease, checkpoint restored, heartbeat on", "s"),
    ("restore_s", "    of which the checkpoint download (restore_latest)", "s"),
    ("restored_to_trainer", "  → data open, model and optimizer built, checkpoint loaded", "s"),
    ("data_s", "    of which opening the prepared data (from the log, to 0.1 s)", "s"),
    ("trainer_to_first_step", "  → first step done", "s"),
    ("downtime", "downtime: last step before the kill → first step after", "s"),
    ("kill_to_first_step", "  (kill → first step after)", "s"),
    ("lost", "steps lost: last step trained − step resumed from", "steps"),
    ("downtime_steps", "downtime / step time", "x"),
    ("downtime_intervals", "downtime / checkpoint interval", "x"),
    ("cost_steps", "whole cost: steps lost + downtime / step time", "steps"),
]


def fmt(value: float, unit: str) -> str:
    if value != value:  # nan
        return "-"
    if unit == "s":
        return f"{value:.2f} s"
    if unit == "steps":
        return f"{value:.0f}" if float(value).is_integer() else f"{value:.1f}"
    return f"{value:.2f}x"


def import_torch_s() -> float:
    """For scale: a fresh interpreter importing torch (median of 3)."""
    import subprocess

    def once() -> float:
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import torch"], check=True)
        return time.perf_counter() - t
    return statistics.median(once() for _ in range(3))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3,
                        help="interruptions of each kind (default 3)")
    parser.add_argument("--poll-s", type=float, default=1.0,
                        help="the managed loop's poll interval (default 1 s)")
    parser.add_argument("--every", type=int, default=20, help="checkpoint.every_steps")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--tmp", default=None, help="parent of the temporary directory")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary directory (records, attempt logs, bucket)")
    args = parser.parse_args(argv)

    isolate_aws_env()
    started = time.perf_counter()
    header = [
        f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M:%S} UTC",
        f"command: {shlex.join([sys.executable.split('/')[-1]] + sys.argv)}",
        f"machine: {machine()}",
    ]
    work = Path(tempfile.mkdtemp(prefix="bench-recovery-", dir=args.tmp))
    server = None
    out: dict[str, dict] = {}
    saved_env = {k: os.environ.get(k) for k in ("TEN_RUNNER_HOME", "TEN_HEARTBEAT_POINTER")}
    try:
        say(f"working in {work}")
        pointer = work / "heartbeat-pointer"
        os.environ["TEN_RUNNER_HOME"] = str(work / "home")  # records, attempt logs
        os.environ["TEN_HEARTBEAT_POINTER"] = str(pointer)  # its mtime: when `run` began
        make_corpus(work / "docs.jsonl", 3000)
        server = Rclone(work / "s3")
        header.append(f"server: {server.version()} (`rclone serve s3`) on 127.0.0.1")
        t = time.perf_counter()
        prepare_data(write_job(work, "recovery-data", server.endpoint, args))
        say(f"data prepared in the local cache in {time.perf_counter() - t:.1f} s")
        for mode in args.modes:
            out[mode] = run_mode(mode, work, server.endpoint, args, pointer)
    finally:
        if server is not None:
            server.stop()
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if args.keep:
            say(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)

    step = statistics.median(t for m in out.values() for t in m["step_times"])
    interval = args.every * step
    for m in out.values():
        for r in m["results"]:
            r["downtime_steps"] = r["downtime"] / step
            r["downtime_intervals"] = r["downtime"] / interval
            r["cost_steps"] = r["lost"] + r["downtime_steps"]
    header += [
        f"model: TEN tiny, d_model {args.d_model}, 4 layers, vocab 512, batch {args.batch} x "
        f"seq {args.seq}, fp32 CPU; median step {step:.3f} s; checkpoint every "
        f"{args.every} steps = {interval:.1f} s, uploaded in the background",
        f"managed loop: submit_managed(..., 'local', detach=False, poll_s={args.poll_s:g}); "
        "sigterm: SIGTERM to the attempt's main process; sigkill: SIGKILL to its process "
        "group, its run directory deleted before the relaunch (the prepared-data cache "
        "is kept, prepared before the jobs start)",
        f"{args.repeats} interruption(s) of each kind; last step trained before each: "
        + "; ".join(f"{mode} " + ", ".join(str(r["last_step"]) for r in m["results"])
                    for mode, m in out.items()),
        f"for scale: `python -c 'import torch'` takes {import_torch_s():.2f} s here; "
        f"wall time {time.perf_counter() - started:.0f} s; load average at the end "
        + " ".join(f"{x:.2f}" for x in os.getloadavg()),
    ]
    print("\n".join(header))
    print()
    cols = [(mode, f) for mode in out for f in ("median", "max")]
    print("| measurement | " + " | ".join(f"{mode} {f}" for mode, f in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for key, what, unit in ROWS:
        cells = []
        for mode, f in cols:
            values = [r[key] for r in out[mode]["results"]]
            values = [v for v in values if v == v] or [float("nan")]
            cells.append(fmt(statistics.median(values) if f == "median" else max(values),
                             unit))
        print(f"| {what} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
