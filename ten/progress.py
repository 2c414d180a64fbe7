"""The progress line and its ETA: pure functions of the figures the loop measures; and how
the project writes what it prints: durations (``clock`` for an ETA, ``duration`` in
prose) and aligned tables (``table``)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any


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


def clock(seconds: float) -> str:
    """h:mm:ss, for an ETA: 3725 -> '1:02:05'."""
    s = max(0, int(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


def duration(seconds: float) -> str:
    """A duration in prose, as precise as it needs to be: '42 s', '17 min', '3.5 h'."""
    seconds = max(0.0, seconds)
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def table(header: Sequence[str], rows: Sequence[Sequence[str]], right: Collection[int] = (),
          rule: bool = False) -> str:
    """Columns as wide as their widest cell, two spaces apart, trailing spaces trimmed;
    ``right``: the indexes of right-aligned (numeric) columns; ``rule``: a dashed line
    under the header."""
    lines = [list(header), *(list(r) for r in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]

    def row(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w)
                         for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    out = [row(lines[0])]
    if rule:
        out.append("  ".join("-" * w for w in widths))
    return "\n".join(out + [row(cells) for cells in lines[1:]])
