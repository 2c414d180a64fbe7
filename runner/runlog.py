"""RunLog: a run's progress lines, to stderr and to ``<run>/run.log``."""

from __future__ import annotations

import sys
import time
from pathlib import Path


class RunLog:
    """Lines to stderr and to ``<run>/run.log`` (structured figures go to metrics.jsonl)."""

    def __init__(self, run_dir: Path, tag: str = "") -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(run_dir / "run.log", "a", encoding="utf-8")  # noqa: SIM115
        self.tag = tag  # "[rank 1] ": which torchrun rank said it

    def __call__(self, line: str) -> None:
        line = self.tag + line
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        print(line, file=sys.stderr, flush=True)
        self._file.write(f"{stamp} {line}\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()
