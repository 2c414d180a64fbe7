"""The notice window's maths, said to the user: would an emergency checkpoint fit it,
and how close the last one came. Pure functions, tested from tables."""

from __future__ import annotations

from runner.preemption.notices import Notice
from runner.preemption.providers import NAMES, spot_provider


def notice_window_s(provider: str) -> float:
    """The provider's documented notice, in seconds (aws 120, gcp 30, azure 30)."""
    return spot_provider(provider).window_s


def startup_warning(
    provider: str, last_checkpoint_s: float | None, detect_latency_s: float = 0.0
) -> str | None:
    """Say at startup, not after the loss, that an emergency checkpoint cannot fit.

    ``last_checkpoint_s`` is the last measured save+upload time (None: nothing
    measured yet, so nothing to say). ``detect_latency_s`` is how late the notice
    may be seen (the poll interval); it eats into the window too.
    """
    if last_checkpoint_s is None:
        return None
    declared = spot_provider(provider)
    window = declared.window_s
    if last_checkpoint_s + detect_latency_s <= window:
        return None
    took = f"last checkpoint upload took {_secs(last_checkpoint_s)} s"
    fix = "checkpoint more often or make checkpoints smaller"
    if last_checkpoint_s > window:
        return (
            f"{took}; the {declared.title} notice window is {_secs(window)} s: a preemption "
            f"will lose work since the last periodic checkpoint — {fix}"
        )
    return (
        f"{took}; the {declared.title} notice window is {_secs(window)} s and the notice may "
        f"be seen {_secs(detect_latency_s)} s late: an emergency checkpoint may not finish in "
        f"time — {fix}, or poll more often"
    )


def emergency_report(notice: Notice, committed_at: float) -> str:
    """One line for the log after the emergency checkpoint: how close it was."""
    after = committed_at - notice.received_at
    head = f"emergency checkpoint committed {after:.1f} s after the notice"
    if notice.deadline is None:
        title = (spot_provider(notice.provider).title if notice.provider in NAMES
                 else notice.provider)
        return f"{head} (the {title} deadline is unknown)"
    margin = notice.deadline - committed_at
    if margin >= 0:
        return f"{head}, {margin:.1f} s before the deadline"
    return f"{head}, {-margin:.1f} s AFTER the deadline"


def _secs(x: float) -> str:
    return f"{x:.0f}" if abs(x) >= 10 else f"{x:.1f}"
