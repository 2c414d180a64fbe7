"""Where training figures go: ``metrics.jsonl`` (one JSON object per line, appended and
flushed, so a crash loses nothing already logged), TensorBoard event files, and any
other :class:`Sink` a caller adds."""

from __future__ import annotations

import enum
import json
import math
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


class MetricKind(str, enum.Enum):
    """The kinds of record in ``metrics.jsonl``: written by the trainer, read by the
    runner's monitor (status, cost, report, diagnosis). A str: a record's ``kind`` equals
    the member, and JSON holds its value."""

    START = "start"  # a process began training (resumed or not): device, batch, model
    TRAIN = "train"  # a log step: loss, lr, tokens/s, MFU, ...
    EVAL = "eval"  # a held-out evaluation: loss, perplexity, recall
    STATE = "state"  # a TEN's state, per layer, at an evaluation (ten.model.statehealth)
    END = "end"  # the loop ended: outcome, tokens


class Sink(Protocol):
    """Somewhere else a run's figures go (TensorBoard, an experiment tracker): each
    record's finite numbers, under ``<kind>/<name>``, at its step."""

    def write(self, step: int, scalars: dict[str, float]) -> None: ...

    def close(self) -> None: ...


class TensorBoard:
    """TensorBoard event files in ``<run>/tensorboard`` (a :class:`Sink`)."""

    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self._writer = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, step: int, scalars: dict[str, float]) -> None:
        for name, value in scalars.items():
            self._writer.add_scalar(name, value, step)

    def close(self) -> None:
        self._writer.close()


class MetricsWriter:
    """Append-only metrics log; TensorBoard too when the package is installed, and any
    other ``sinks`` given (the runner's experiment trackers)."""

    def __init__(self, run_dir: Path, tensorboard: bool = True,
                 sinks: Sequence[Sink] = ()) -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        self.path = run_dir / "metrics.jsonl"
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - closed in close()
        self._sinks = list(sinks)
        if tensorboard:
            try:
                self._sinks.insert(0, TensorBoard(run_dir))
            except ImportError:  # tensorboard is optional at run time
                pass

    def write(self, kind: MetricKind, step: int, values: dict[str, Any]) -> None:
        record = {"kind": kind.value, "step": step, "time": time.time(), **values}
        self._file.write(json.dumps(record, default=_jsonable) + "\n")
        self._file.flush()
        scalars = {f"{kind.value}/{key}": value for key, value in values.items()
                   if isinstance(value, (int, float)) and not isinstance(value, bool)
                   and math.isfinite(value)}
        if scalars:
            for sink in self._sinks:
                sink.write(step, scalars)

    def close(self) -> None:
        self._file.close()
        for sink in self._sinks:
            sink.close()


def _jsonable(value: Any) -> Any:
    return str(value)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl; a torn last line (crash mid-write) is skipped."""
    records = []
    if not path.exists():
        return records
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue
    return records
