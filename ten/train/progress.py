"""The progress line and its ETA: pure functions of the figures the loop measures."""

from __future__ import annotations

from typing import Any

from ten.text import clock


def eta_seconds(steps_left: int, steps_done: int, busy_s: float,
                first_step_s: float) -> float | None:
    """Seconds to finish at this process's average pace: ``busy_s`` is the wall time of
    the ``steps_done`` steps it has run, evaluations and checkpoints included (they recur,
    so they are spread over the steps rather than ignored or let dominate a window). The
    first step (compilation, warm-up: ``first_step_s``) is left out once there are others.
    None before any step."""
    if steps_done <= 0:
        return None
    if steps_done == 1:
        return steps_left * busy_s
    return steps_left * max(busy_s - first_step_s, 0.0) / (steps_done - 1)


def progress_line(step: int, total: int, rec: dict[str, Any]) -> str:
    eta = rec.get("eta_s")
    util = _pct(rec["mfu"])
    if rec.get("hfu") is not None and rec["hfu"] != rec["mfu"]:  # recomputation: say so
        util += f" (HFU {_pct(rec['hfu'])})"
    return (f"step {step:>{len(str(total))}}/{total} | loss {rec['loss']:.4f} | "
            f"lr {rec['lr']:.2e} | {rec['tokens_per_s']:,.0f} tok/s | MFU {util} | "
            f"data {100 * rec['data_wait_frac']:.1f}% | ETA {'-' if eta is None else clock(eta)}")


def _pct(fraction: float | None) -> str:
    return "-" if fraction is None else f"{100 * fraction:.1f}%"
