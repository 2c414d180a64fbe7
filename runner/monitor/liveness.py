"""The container's HEALTHCHECK: is the runner in this container alive and working?

The heartbeat thread rewrites ``<run dir>/status.json`` every ``period_s``; this module
judges that file. The run directory depends on the job (a bucket job's working copy lives
under the cache, a local job's under its store), so the runner writes the path of its
``status.json`` into a small *pointer* file at a fixed place (:func:`pointer_path`) when
it starts, and ``ten-runner healthcheck`` follows the pointer.

The runner must call :func:`write_pointer` when the process starts, before
``Heartbeat.start()``: the pointer's modification time marks the start of this process,
so a ``status.json`` left by a previous life of the container (a restart after a crash
still says "failed") is recognised as old and read as "starting", not as a verdict.

:func:`judge` is the pure decision, tested from a table. Only click and the standard
library are imported here: Docker runs the check every minute, it must start fast.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import click

POINTER_ENV = "TEN_HEARTBEAT_POINTER"
POINTER_NAME = "heartbeat-pointer"
DEFAULT_PERIOD_S = 30.0
MIN_MAX_AGE_S = 60.0  # a heartbeat is stale past max(3 x its period, this)
# The runner wrote its last beat and is exiting on purpose: healthy until it is gone.
EXITING = frozenset({"done", "preempted", "cancelled", "stopped"})
# The runner wrote its last beat because it failed (or hung and is being killed).
FAILED = frozenset({"failed", "stalled"})


def pointer_path() -> Path:
    """``$TEN_HEARTBEAT_POINTER``, else ``heartbeat-pointer`` in ``$TEN_CACHE_DIR`` (the
    cache the image mounts), else in ``~/.cache/ten``."""
    explicit = os.environ.get(POINTER_ENV)
    if explicit:
        return Path(explicit).expanduser()
    from ten.data.config import cache_root

    return cache_root() / POINTER_NAME


def write_pointer(status_json: Path) -> None:
    """Point the healthcheck at ``status_json`` (need not exist yet). Atomic: a check
    running at the same moment reads the old pointer or the new one, never half."""
    target = pointer_path()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(f"{Path(status_json).absolute()}\n")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def judge(status: dict[str, Any] | None, now: float,
          max_age_s: float | None = None) -> tuple[bool, str]:
    """(healthy, one-line reason) for a status document read at ``now`` (pure).

    No status yet: healthy (starting). A final state: healthy when the runner is exiting
    on purpose (done, preempted), unhealthy when it failed. Otherwise healthy while the
    last beat is younger than ``max_age_s`` (default ``max(3 x period_s, 60 s)``) and
    no stall is diagnosed: the heartbeat thread keeps beating while a hung data loader
    blocks training, so freshness alone would call a hung run healthy.
    """
    if status is None:
        return True, "starting: no heartbeat yet"
    state = str(status.get("state") or "running")
    step = status.get("step")
    if state in EXITING:
        return True, f"{state} at step {step}: the runner is exiting"
    if state in FAILED:
        code = status.get("exit_code")
        return False, f"{state} at step {step}" + (f" (exit code {code})" if code is not None
                                                   else "")
    beat = _number(status.get("time"))
    if beat is None:
        return False, "status.json has no valid time: not written by a heartbeat"
    period = _number(status.get("period_s"))
    period = period if period is not None and period > 0 else DEFAULT_PERIOD_S
    limit = max_age_s if max_age_s is not None else max(3.0 * period, MIN_MAX_AGE_S)
    age = max(0.0, now - beat)
    if age >= limit:
        return False, (f"heartbeat stale: last beat {age:.0f}s ago (limit {limit:.0f}s); "
                       "the runner is hung or gone")
    for diagnosis in status.get("diagnoses") or []:
        if isinstance(diagnosis, dict) and diagnosis.get("code") == "stalled":
            return False, f"stalled at step {step}: {diagnosis.get('message', '')}".rstrip()
    return True, f"{state} at step {step}, last beat {age:.0f}s ago"


def check(path: Path | None = None, max_age_s: float | None = None) -> tuple[bool, str]:
    """Judge ``path`` (a status.json), or the status the pointer names; a missing pointer
    or status means the runner is still starting. A status older than the pointer
    belongs to a previous process (see the module doc) and also reads as starting."""
    started = None
    if path is None:
        pointer = pointer_path()
        try:
            text = pointer.read_text(encoding="utf-8").strip()
            started = pointer.stat().st_mtime
        except FileNotFoundError:
            return True, f"starting: no heartbeat pointer at {pointer} yet"
        except OSError as e:
            return False, f"cannot read the heartbeat pointer {pointer}: {e.strerror or e}"
        if not text:
            return False, f"the heartbeat pointer {pointer} is empty"
        path = Path(text)
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return True, f"starting: no {Path(path).name} at {path} yet"
    except OSError as e:
        return False, f"cannot read {path}: {e.strerror or e}"
    try:
        status = json.loads(raw)
    except ValueError:
        status = None
    if not isinstance(status, dict):
        return False, f"{path} is not a JSON status document"
    beat = _number(status.get("time"))
    if started is not None and beat is not None and beat < started:
        return True, f"starting: {path} is from a previous run of the container"
    return judge(status, time.time(), max_age_s)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@click.command("healthcheck")
@click.option("--status", "status_path", type=click.Path(dir_okay=False, path_type=Path),
              default=None, help="A status.json to judge instead of the one the runner's "
              f"pointer names (${POINTER_ENV}).")
@click.option("--max-age", "max_age_s", type=click.FloatRange(min=0, min_open=True),
              default=None, help="Seconds after which a heartbeat is stale "
              "[default: max(3 x the heartbeat period, 60)].")
def healthcheck(status_path: Path | None, max_age_s: float | None) -> None:
    """Exit 0 when the runner in this container is healthy (starting, beating, or
    exiting on purpose), 1 when its heartbeat is stale or it failed. One line of output:
    what Docker's HEALTHCHECK shows in `docker inspect`."""
    ok, reason = check(status_path, max_age_s)
    click.echo(f"{'healthy' if ok else 'unhealthy'}: {reason}")
    click.get_current_context().exit(0 if ok else 1)


if __name__ == "__main__":
    healthcheck()
