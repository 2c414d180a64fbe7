"""The heartbeat: every ``period_s`` a small ``status.json`` (step, tokens, loss, tokens/s,
MFU, ETA, GPU summary, last checkpoint, diagnoses, $ so far) in the run directory and in
the job's store, so ``ten-runner status`` works from a laptop while the job runs
elsewhere; plus ``events.jsonl`` (start, resume with lost work, preemption notice,
checkpoint committed, stop) and ``gpu.jsonl`` (the GPU samples, for the report).
Each beat is mirrored to the store with the run's other files (log, metrics,
TensorBoard event files) by :mod:`runner.storage.mirror`.

Stalls are judged from the trainer's per-step signal (:meth:`Heartbeat.step`) when it
is wired, else from the metrics records (a slow run logs rarely: see
:func:`runner.monitor.diagnose.stall_threshold`).

It reads the trainer's own ``metrics.jsonl`` tail (ten never imports the runner) and
never raises into training: every beat is guarded and errors are logged at most once a
minute. :func:`build_status` is the pure part.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.monitor.cost import cost_summary, is_user_stop, lost_work
from runner.monitor.diagnose import CRITICAL, Diagnosis, diagnose
from runner.monitor.events import EventKind
from runner.monitor.nvml import summarize
from runner.storage.mirror import EVENTS_FILE, GPU, METRICS, STATUS, RunMirror
from ten.train.metrics import MetricKind

EVENTS = EVENTS_FILE
GPU_KEYS = ("util", "mem_used", "mem_total", "power_w", "power_limit_w", "temp_c",
            "sm_clock_mhz", "throttle", "name")


def build_status(job: str, records: list[dict[str, Any]], events: list[dict[str, Any]],
                 samples: list[dict[str, Any]], now: float, *, state: str = "running",
                 period_s: float = 30.0, price_per_hour: float | None = None, gpus: int = 1,
                 stall_after_s: float = 600.0, host: str | None = None,
                 session_start: float | None = None,
                 last_step: tuple[int, float] | None = None) -> dict[str, Any]:
    """The status document from what the run wrote so far (pure). ``session_start``:
    when this process started; ``last_step``: (step, time) of the newest completed
    step when the trainer reports every step (see
    :func:`runner.monitor.diagnose.diagnose`)."""
    train = [r for r in records if r.get("kind") == MetricKind.TRAIN]
    evals = [r for r in records if r.get("kind") == MetricKind.EVAL]
    starts = [r for r in records if r.get("kind") == MetricKind.START]
    last = train[-1] if train else {}
    step = max((int(r.get("step", 0)) for r in records[-1:] + train[-1:]), default=0)
    if last_step is not None:  # fresher than the last record
        step = max(step, int(last_step[0]))
    total = starts[-1].get("total_steps") if starts else None
    eta = None
    if total is not None and last.get("step_time_s") is not None:
        eta = max(0, total - step) * last["step_time_s"]
    ckpts = [e for e in events if e.get("kind") == EventKind.CHECKPOINT]
    diagnoses = (diagnose(records, samples, now, stall_after_s, session_start, last_step)
                 if state == "running" else [])
    gpu = samples[-1] if samples else None
    return {
        "job": job,
        "state": state,
        "time": now,
        "period_s": period_s,
        "host": host,
        "step": step,
        "total_steps": total,
        "tokens": last.get("tokens"),
        "loss": last.get("loss"),
        "eval_loss": evals[-1].get("loss") if evals else None,
        "tokens_per_s": last.get("tokens_per_s"),
        "mfu": last.get("mfu"),
        "data_wait_frac": last.get("data_wait_frac"),
        "eta_s": eta,
        "gpu": None if gpu is None else {k: gpu.get(k) for k in GPU_KEYS},
        "gpu_summary": summarize(gpu) if gpu else None,
        "last_checkpoint": ({"step": ckpts[-1].get("step"), "time": ckpts[-1].get("time")}
                            if ckpts else None),
        "diagnoses": [d.to_dict() for d in diagnoses],
        "cost": cost_summary(records, events, price_per_hour, gpus,
                             now=now if state == "running" else None),
    }


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; torn or foreign lines are skipped."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    return parse_jsonl(text)


def parse_jsonl(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            out.append(value)
    return out


class Heartbeat:
    """Writes the status every ``period_s`` from a daemon thread (see module doc).

    With a ``store`` (a :class:`runner.storage.Store`; None: local only) every beat is
    mirrored under ``<job_prefix>/`` in it (:class:`runner.storage.mirror.RunMirror`:
    the status every beat, the other files every ``files_every`` beats and at
    :meth:`stop`), and :meth:`start` brings back the history a previous machine left.
    ``on_stall(diagnosis)`` is called once when the run is diagnosed stalled (e.g. to
    exit so the managed loop restarts it). ``started`` is when this process started
    (default: now); metrics older than that belong to a previous life of the job and
    never make this one look stalled.
    """

    def __init__(self, run_dir: Path | str, store: Any = None, job_prefix: str = "",
                 period_s: float = 30.0, price_per_hour: float | None = None,
                 sampler: Any = None, log: Callable[[str], None] = print, *,
                 gpus: int = 1, stall_after_s: float = 600.0,
                 on_stall: Callable[[Diagnosis], None] | None = None,
                 files_every: int = 4, started: float | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.job = job_prefix.strip("/")
        self.period_s, self.price_per_hour = float(period_s), price_per_hour
        self.sampler, self.log, self.gpus = sampler, log, gpus
        self.stall_after_s, self.on_stall = stall_after_s, on_stall
        self.host = socket.gethostname()
        self.records: list[dict[str, Any]] = []
        self._metrics_offset = 0
        self._events_dirty = False
        self._gpu_written_until = 0.0
        self._stalled = False
        self._active: set[str] = set()
        self._last_warn = 0.0
        self._last_error = 0.0
        self._prev_step: int | None = None
        self._resumes_seen = 0
        self._exit_code: int | None = None  # set by stop()
        self._stop_reason: str | None = None  # set by stop()
        self._last_step: tuple[int, float] | None = None  # set by step()
        self._lock = threading.Lock()  # events.jsonl's and run.log's writers hold it
        self.mirror = None if store is None else \
            RunMirror(store, self.job, self.run_dir, self._lock, files_every)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = time.time() if started is None else started

    # -- public -----------------------------------------------------------------------
    def start(self) -> None:
        """Record a "start" event and begin beating. Brings metrics.jsonl, events.jsonl
        and gpu.jsonl from the store when it has more than this machine (a job resumed on
        a new host keeps its history); call it before the trainer starts."""
        if self.mirror is not None:
            self._guard(self.mirror.adopt_history)
        self._prev_step = self._guard(self._previous_step)
        self._metrics_offset = 0
        self._guard(self._read_metrics)
        self._resumes_seen = sum(1 for r in self.records if _is_resume(r))
        self.event(EventKind.START, host=self.host, pid=os.getpid())
        self._thread = threading.Thread(target=self._loop, name="heartbeat", daemon=True)
        self._thread.start()

    def event(self, kind: EventKind, **fields: Any) -> None:
        """Append one event to ``events.jsonl`` (uploaded by the next beat, which this
        wakes). Never raises."""
        record = {"kind": kind.value, "time": time.time(), **fields}
        try:
            with self._lock:  # into the run directory, never re-creating it (rm --force)
                with open(self.run_dir / EVENTS, "a", encoding="utf-8") as f:
                    f.write(json.dumps(record, default=str) + "\n")
                self._events_dirty = True
        except Exception as e:  # noqa: BLE001
            self._error(e)
        self._wake.set()

    def step(self, step: int) -> None:
        """The trainer completed ``step``: called from the training loop after every step,
        so it only stores an int and a time (no I/O, no lock: one attribute assignment
        is atomic). The stall rule then means "no step completed", not "nothing logged"."""
        self._last_step = (step, time.time())

    def checkpoint_committed(self, path: Path | str, seconds: float | None = None) -> None:
        """The "checkpoint" event for a committed ``.../step-NNNNNNNN`` directory."""
        name = Path(path).name
        step = int(name.split("-")[-1]) if name.split("-")[-1].isdigit() else None
        self.event(EventKind.CHECKPOINT, step=step, seconds=seconds, path=name)

    def stop(self, state: str = "done", exit_code: int | None = None,
             reason: str | None = None) -> None:
        """A last beat with ``state`` (done, preempted, cancelled, failed, stopped) and the
        process's ``exit_code`` (a managed job's supervisor reads it from the store), every
        file uploaded, thread joined. ``reason``: why training stopped (the trainer's stop
        reason: "SIGTERM", "SIGINT", "aws preemption notice", ...); a "preempted" stop
        whose reason is the user's (Ctrl-C) is recorded as "stopped", so the report does
        not count it as a preemption (the exit code stays). Never raises; callable from
        ``on_stall`` (the heartbeat's own thread), e.g. before ``Stop.end_process``."""
        if state == "preempted" and is_user_stop(reason):
            state = "stopped"
        self._exit_code, self._stop_reason = exit_code, reason
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=self.period_s + 30)
            self._thread = None
        self._guard(self._read_metrics)
        self._guard(self._detect_resumes)  # before "stop": a resume belongs to this life
        self.event(EventKind.STOP, state=state, exit_code=exit_code,
                   **({"reason": reason} if reason else {}))
        self._guard(self.beat, state, True)

    def beat(self, state: str = "running", upload_files: bool = False) -> dict[str, Any]:
        """One heartbeat: read the metrics tail, build and write the status."""
        now = time.time()
        self._read_metrics()
        self._detect_resumes()
        samples = self.sampler.snapshot() if self.sampler is not None else []
        self._append_gpu(samples)
        # One snapshot of events.jsonl feeds both the status and the upload below, so the
        # store never holds an events.jsonl newer than its status.json (a reader that saw
        # a "checkpoint" event finds it in the status too).
        with self._lock:
            try:
                events_data: bytes | None = (self.run_dir / EVENTS).read_bytes()
            except OSError:
                events_data = None
            events_dirty, self._events_dirty = self._events_dirty, False
        events = parse_jsonl((events_data or b"").decode("utf-8", "replace"))
        status = build_status(self.job, self.records, events, samples, now, state=state,
                              period_s=self.period_s, price_per_hour=self.price_per_hour,
                              gpus=self.gpus, stall_after_s=self.stall_after_s,
                              host=self.host, session_start=self.started,
                              last_step=self._last_step)
        if state != "running" and self._exit_code is not None:
            status["exit_code"] = self._exit_code
        if state != "running" and self._stop_reason:
            status["stop_reason"] = self._stop_reason
        data = json.dumps(status, indent=1, default=str).encode()
        tmp = self.run_dir / (STATUS + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self.run_dir / STATUS)
        self._react(status)
        if self.mirror is not None:
            try:
                self.mirror.beat(data, events_data if events_dirty else None, upload_files)
            except BaseException:
                if events_dirty:  # not uploaded: the next beat tries again
                    self._events_dirty = True
                raise
        return status

    # -- the thread -------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            self._guard(self.beat)
            self._wake.wait(self.period_s)
            self._wake.clear()

    def _react(self, status: dict[str, Any]) -> None:
        """Log each warning/critical diagnosis when it appears; a stall every 5 min."""
        active = {d["code"]: d for d in status["diagnoses"]
                  if d["severity"] != "info" and d["code"] != "stalled"}
        for code in active.keys() - self._active:
            self.log(f"monitor: {active[code]['message']}")
        self._active = set(active)
        stalled = [d for d in status["diagnoses"] if d["code"] == "stalled"]
        now = time.monotonic()
        if stalled and now - self._last_warn >= 300:
            self._last_warn = now
            self.log(f"WARNING {stalled[0]['message']}")
        if stalled and not self._stalled:
            self._stalled = True
            self.event(EventKind.STALL, message=stalled[0]["message"])
            if self.on_stall is not None:
                self.on_stall(Diagnosis("stalled", CRITICAL, stalled[0]["message"]))
        elif not stalled:
            self._stalled = False

    # -- files ------------------------------------------------------------------------
    def _read_metrics(self) -> None:
        path = self.run_dir / METRICS
        try:
            with open(path, "rb") as f:
                f.seek(self._metrics_offset)
                chunk = f.read()
        except OSError:
            return
        end = chunk.rfind(b"\n") + 1  # only whole lines; a torn tail waits a beat
        self._metrics_offset += end
        self.records += parse_jsonl(chunk[:end].decode("utf-8", "replace"))
        if len(self.records) > 200_000:
            self.records = self.records[-100_000:]

    def _detect_resumes(self) -> None:
        """A resumed "start" record newer than this heartbeat: a "resume" event with the
        work lost since the step reached before (previous status or metrics)."""
        resumes = [i for i, r in enumerate(self.records) if _is_resume(r)]
        for i in resumes[self._resumes_seen:]:
            r = self.records[i]
            before = []  # steps of the previous life only (since its start record)
            for x in reversed(self.records[:i]):
                if x.get("kind") == MetricKind.START:
                    break
                if x.get("kind") in (MetricKind.TRAIN, MetricKind.EVAL, MetricKind.END) \
                        and "step" in x:
                    before.append(int(x["step"]))
            reached = max([*before, *([self._prev_step] if self._prev_step else [])],
                          default=None)
            steps, tokens = lost_work(reached, int(r.get("step", 0)), r.get("tokens_per_step"))
            self.event(EventKind.RESUME, time=r.get("time", time.time()), from_step=r.get("step"),
                       reached_step=reached,
                       lost_steps=steps, lost_tokens=tokens)
            if steps:
                self.log(f"resumed at step {r.get('step')}: {steps} steps ({tokens or 0:,} "
                         "tokens) done before the interruption are redone")
        self._resumes_seen = len(resumes)

    def _append_gpu(self, samples: list[dict[str, Any]]) -> None:
        new = [s for s in samples if s.get("time", 0) > self._gpu_written_until]
        if not new:
            return
        with open(self.run_dir / GPU, "a", encoding="utf-8") as f:
            for s in new:
                f.write(json.dumps(s, default=str) + "\n")
        self._gpu_written_until = new[-1]["time"]

    def _previous_step(self) -> int | None:
        """The step the previous session reached, from its last status."""
        data = self.mirror.last_status() if self.mirror is not None else None
        if data is None and (self.run_dir / STATUS).exists():
            data = (self.run_dir / STATUS).read_bytes()
        if not data:
            return None
        step = json.loads(data).get("step")
        return int(step) if step is not None else None

    # -- errors -----------------------------------------------------------------------
    def _guard(self, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - monitoring never breaks training
            self._error(e)
            return None

    def _error(self, e: BaseException) -> None:
        now = time.monotonic()
        if now - self._last_error >= 60.0:
            self._last_error = now
            self.log(f"heartbeat: {' '.join(str(e).split())[:200] or type(e).__name__}")


def _is_resume(record: dict[str, Any]) -> bool:
    return record.get("kind") == MetricKind.START and bool(record.get("resumed"))
