"""How the project writes what it prints: durations (``clock`` for an ETA, ``duration`` in
prose) and aligned tables (``table``). No torch: the CLI's commands use them."""

from __future__ import annotations

from collections.abc import Collection, Sequence


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
