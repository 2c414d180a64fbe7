"""What a run cost and how much of it was useful: pure functions over metrics records and
events (no clock, no I/O).

* Paid time: one session per process start ("start" event; metrics "start" records as a
  fallback), from its start to the last thing it wrote (or ``now`` for the live one).
* Lost work: after a preemption the run resumes from its last committed checkpoint, so
  the steps between that checkpoint and the step reached before the preemption are
  computed twice. "resume" events carry ``lost_steps``/``lost_tokens``; without them the
  same figure is derived from the metrics (a resumed "start" record at step S after
  train records that reached step R > S).
* Goodput: useful tokens (the furthest the run got, excluding redone work) per paid
  GPU-second (machine-second for a CPU run); $ per 1B useful tokens.
* Interruptions, counted by cause (:func:`resume_cause`): a resume after a session that
  the user stopped (Ctrl-C: a "stop" event in state "stopped" or with reason SIGINT;
  ``ten-runner cancel``: state "cancelled"), that had finished (a budget extended) or that
  failed is not a preemption; exit code 75 is shared by the user's stops and a spot
  reclaim, so only the heartbeat's stop event tells them apart.
"""

from __future__ import annotations

import enum
from typing import Any

from runner.monitor.events import EventKind
from ten.train.metrics import MetricKind

# Stop reasons (ten.train.stop.Stop.reason) that mean "the user asked": Ctrl-C.
USER_STOP_REASONS = frozenset({"SIGINT"})


def is_user_stop(reason: str | None) -> bool:
    return reason in USER_STOP_REASONS


# Final states of a session the user ended (runner.monitor.heartbeat, .cancel).
USER_STOP_STATES = frozenset({"stopped", "cancelled"})


def _user_stopped(event: dict[str, Any]) -> bool:
    return event.get("kind") == EventKind.STOP and (event.get("state") in USER_STOP_STATES
                                            or is_user_stop(event.get("reason")))


def compute_kind(metrics: list[dict[str, Any]]) -> str:
    """"CPU" when every start record names a CPU device, else "GPU" (also when no device
    is recorded: what the paid-hours figure meant before records carried one)."""
    devices = [str(r["device"]) for r in metrics
               if r.get("kind") == MetricKind.START and r.get("device") is not None]
    if devices and all(d.split(":")[0] == "cpu" for d in devices):
        return "CPU"
    return "GPU"


def lost_work(reached_step: int | None, resumed_step: int,
              tokens_per_step: int | None) -> tuple[int, int | None]:
    """(steps, tokens) computed before a preemption and redone after resuming from
    ``resumed_step``; (0, 0) when nothing was lost or the reached step is unknown."""
    if reached_step is None or reached_step <= resumed_step:
        return 0, 0
    steps = reached_step - resumed_step
    return steps, None if tokens_per_step is None else steps * tokens_per_step


def lost_from_metrics(metrics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per resume found in metrics records: time, from_step, reached_step,
    lost_steps, lost_tokens."""
    out: list[dict[str, Any]] = []
    reached: int | None = None
    for r in metrics:
        kind = r.get("kind")
        if kind == MetricKind.START and r.get("resumed"):
            resumed = int(r.get("step", 0))
            steps, tokens = lost_work(reached, resumed, r.get("tokens_per_step"))
            out.append({"time": r.get("time"), "from_step": resumed, "reached_step": reached,
                        "lost_steps": steps, "lost_tokens": tokens})
            reached = resumed
        elif kind in (MetricKind.TRAIN, MetricKind.EVAL, MetricKind.END) and "step" in r:
            reached = max(reached or 0, int(r["step"]))
    return out


def sessions(events: list[dict[str, Any]], metrics: list[dict[str, Any]],
             now: float | None = None) -> list[tuple[float, float]]:
    """(start, end) unix times of each paid session, oldest first."""
    starts = sorted(e["time"] for e in events
                    if e.get("kind") == EventKind.START and "time" in e)
    if not starts:
        starts = sorted(r["time"] for r in metrics
                        if r.get("kind") == MetricKind.START and "time" in r)
    if not starts:
        return []
    stamps = sorted(x["time"] for x in [*events, *metrics] if "time" in x)
    out = []
    for i, start in enumerate(starts):
        nxt = starts[i + 1] if i + 1 < len(starts) else None
        inside = [t for t in stamps if t >= start and (nxt is None or t < nxt)]
        end = max(inside, default=start)
        if nxt is None and now is not None:
            end = max(end, now)
        out.append((start, end))
    return out


def goodput(useful_tokens: int | float, paid_gpu_seconds: float) -> float | None:
    """Useful tokens per paid GPU-second; None before anything was paid."""
    if paid_gpu_seconds <= 0:
        return None
    return useful_tokens / paid_gpu_seconds


def cost_summary(metrics: list[dict[str, Any]], events: list[dict[str, Any]],
                 price_per_hour: float | None, gpus: int = 1,
                 now: float | None = None) -> dict[str, Any]:
    """Paid time and money, useful and lost work, goodput. ``price_per_hour`` is what the
    machine (all its ``gpus``) costs per hour; None leaves the dollar figures None."""
    spans = sessions(events, metrics, now)
    paid_s = sum(end - start for start, end in spans)
    compute = compute_kind(metrics)
    compute_s = paid_s * max(gpus, 1) if compute == "GPU" else paid_s  # CPU: the machine
    progress = [r for r in metrics
                if r.get("kind") in (MetricKind.TRAIN, MetricKind.END) and "tokens" in r]
    useful = max((int(r["tokens"]) for r in progress), default=0)
    resumes = [e for e in events if e.get("kind") == EventKind.RESUME and "lost_steps" in e]
    if not resumes:
        resumes = lost_from_metrics(metrics)
    lost_steps = sum(int(e.get("lost_steps") or 0) for e in resumes)
    lost_tokens = sum(int(e.get("lost_tokens") or 0) for e in resumes)
    notices = [e for e in events if e.get("kind") == EventKind.PREEMPTION_NOTICE]
    user_stops = [e for e in events if _user_stopped(e)]
    causes = [resume_cause(r, events) for r in resumes]
    cost = None if price_per_hour is None else price_per_hour * paid_s / 3600.0
    gp = goodput(useful, compute_s)
    return {
        "sessions": len(spans),
        "preemptions": max(len(notices), causes.count(ResumeCause.PREEMPTED)),
        "user_stops": len(user_stops),
        "extensions": causes.count(ResumeCause.EXTENDED),
        "failures_resumed": causes.count(ResumeCause.FAILED),
        "paid_seconds": paid_s,
        "compute": compute,
        # GPU-hours for a GPU run, machine-hours for a CPU run ("compute" says which)
        "compute_hours": compute_s / 3600.0,
        "price_per_hour": price_per_hour,
        "cost_usd": cost,
        "useful_tokens": useful,
        "processed_tokens": useful + lost_tokens,
        "lost_steps": lost_steps,
        "lost_tokens": lost_tokens,
        "goodput_tokens_per_compute_s": gp,  # per GPU-second, or machine-second on CPU
        "usd_per_1b_tokens": (cost / useful * 1e9) if cost is not None and useful else None,
    }


class ResumeCause(str, enum.Enum):
    """Why the session before a resume ended: its last "stop" event (none: killed)."""

    PREEMPTED = "preempted"  # a spot reclaim, SIGTERM, kill -9: no stop of the user's
    USER = "user"  # Ctrl-C or ten-runner cancel
    EXTENDED = "extended"  # it had finished: the run was given a larger budget
    FAILED = "failed"  # it failed (a bucket refused, a crash) and was run again


def resume_cause(resume: dict[str, Any], events: list[dict[str, Any]]) -> ResumeCause:
    """How the session before ``resume`` ended: its "stop" event, between the previous
    session's start and the resume's own; a session killed without one (kill -9, a lost
    machine) reads as preempted."""
    t = resume.get("time")
    if t is None:
        return ResumeCause.PREEMPTED
    starts = sorted(e["time"] for e in events if e.get("kind") == EventKind.START
                    and e.get("time") is not None and e["time"] <= t)
    this_start = starts[-1] if starts else t
    prev_start = starts[-2] if len(starts) > 1 else float("-inf")
    stops = [e for e in events if e.get("kind") == EventKind.STOP and e.get("time") is not None
             and prev_start <= e["time"] <= this_start]
    if not stops:
        return ResumeCause.PREEMPTED
    last = max(stops, key=lambda e: e["time"])
    if _user_stopped(last):
        return ResumeCause.USER
    return {"done": ResumeCause.EXTENDED,
            "failed": ResumeCause.FAILED}.get(last.get("state"), ResumeCause.PREEMPTED)


def format_cost(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) rows for a report table."""
    def money(v: float | None) -> str:
        return "-" if v is None else f"${v:,.2f}"

    gp = summary["goodput_tokens_per_compute_s"]
    gpu = summary.get("compute", "GPU") == "GPU"
    rows = [
        ("sessions (starts)", str(summary["sessions"])),
        ("preemptions", str(summary["preemptions"])),
    ]
    for key, label in (("user_stops", "stopped by the user"),
                       ("extensions", "resumed with a larger budget"),
                       ("failures_resumed", "resumed after a failure")):
        if summary.get(key):
            rows.append((label, str(summary[key])))
    return rows + [
        ("GPU-hours paid" if gpu else "machine-hours paid (CPU)",
         f"{summary['compute_hours']:.2f}"),
        ("price per hour", money(summary["price_per_hour"])),
        ("cost", money(summary["cost_usd"])),
        ("useful tokens", f"{summary['useful_tokens']:,}"),
        ("lost (redone) work", f"{summary['lost_steps']:,} steps, "
                               f"{summary['lost_tokens']:,} tokens"),
        ("goodput", "-" if gp is None else
         f"{gp:,.0f} tokens / {'GPU-s' if gpu else 'machine-s'}"),
        ("$ per 1B tokens", money(summary["usd_per_1b_tokens"])),
    ]
