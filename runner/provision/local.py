"""``submit --to local``: each attempt is ``python -m runner.cli run JOB.yaml`` as a plain
process on this machine, in its own session (so a Ctrl-C in the submitting terminal never
reaches it, and teardown can signal its whole process group, loader workers included).
Its output goes to ``<job dir>/attempt-<n>.log``.

The controller may be restarted while an attempt runs, so everything needed to find the
process again is in ``Instance.details`` (pid, process group, start time). A process
that is our child reports its exit code; one that is not (a previous controller started
it) can only be seen alive or gone: its exit code is unknowable here, and the managed
loop takes it from the job's final heartbeat instead. A death by a reclaim-like signal
(SIGKILL, SIGTERM, SIGINT, SIGHUP) reads as PREEMPTED: that is how the tests simulate a
spot interruption.

When Docker is usable, ``--to local`` runs the job's container instead
(:class:`runner.provision.docker.DockerProvider` on
:class:`runner.provision.container.LocalHost`); :class:`LocalDestination` chooses once
per job.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.provision.base import (
    LOCAL_REFUSED,
    LOCAL_ZONE,
    Instance,
    InstanceStatus,
    LaunchSpec,
    Phase,
    Provider,
    UnhealthyHost,
)
from runner.provision.destinations import Destination
from runner.provision.policy import PREEMPT_SIGNALS
from runner.provision.registry import job_dir


class LocalProvider(Provider):
    name = "local"

    def __init__(self, cwd: Path | str | None = None, grace_s: float = 30.0,
                 python: str = sys.executable) -> None:
        self.cwd = Path(cwd) if cwd is not None else None
        self.grace_s, self.python = grace_s, python
        self._children: dict[int, subprocess.Popen] = {}

    def launch(self, spec: LaunchSpec, avoid: frozenset[str] = frozenset()) -> Instance:
        if LOCAL_ZONE in avoid:
            raise UnhealthyHost(LOCAL_REFUSED)
        log_path = job_dir(spec.job_id) / f"attempt-{spec.attempt}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        launched_at = time.time()  # before the start: any status it writes is newer
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                [self.python, "-m", "runner.cli", "run", str(spec.job_file)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                cwd=self.cwd, env={**os.environ, **spec.env}, start_new_session=True)
        self._children[proc.pid] = proc
        return Instance(provider=self.name, id=str(proc.pid), zone=LOCAL_ZONE, spot=False,
                        launched_at=launched_at,
                        details={"pid": proc.pid, "pgid": proc.pid, "log": str(log_path),
                                 "host": socket.gethostname(),
                                 "start_ticks": _start_ticks(proc.pid)})

    def poll(self, instance: Instance) -> InstanceStatus:
        pid = int(instance.details["pid"])
        child = self._children.get(pid)
        if child is not None:
            code = child.poll()
            if code is None:
                return InstanceStatus(Phase.RUNNING)
            if code < 0 and -code in PREEMPT_SIGNALS:
                return InstanceStatus(Phase.PREEMPTED, code,
                                      f"killed by {signal.Signals(-code).name}")
            return InstanceStatus(Phase.EXITED, code)
        if _is_ours(pid, instance.details.get("start_ticks")):
            return InstanceStatus(Phase.RUNNING)
        return InstanceStatus(Phase.GONE, None, f"process {pid} is gone (exit code not "
                              "known to this controller)")

    def terminate(self, instance: Instance) -> None:
        """SIGTERM the attempt's main process (it commits a checkpoint and exits 75; its
        loader workers stop with it, as under ``docker stop``), then SIGKILL whatever is
        left of its process group after ``grace_s`` (at once when the main process is
        already gone). Idempotent."""
        pid = int(instance.details["pid"])
        pgid = int(instance.details.get("pgid", pid))
        child = self._children.get(pid)
        if child is None and not _group_is_ours(pgid, instance.details.get("start_ticks")):
            return
        _stop_group(pid, pgid, instance.details.get("start_ticks"), child, self.grace_s)
        if child is not None:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            else:
                self._children.pop(pid, None)

    def logs(self, instance: Instance) -> str:
        try:
            return Path(instance.details["log"]).read_text(encoding="utf-8", errors="replace")
        except (OSError, KeyError):
            return ""


def _stop_group(pid: int, pgid: int, ticks: Any, child: subprocess.Popen | None,
                grace_s: float) -> None:
    """SIGTERM the main process, SIGKILL its group ``grace_s`` later if any of it is
    left, and give up 10 s after that (an uninterruptible sleep) rather than hang."""
    sent: signal.Signals | None = None
    deadline = 0.0
    while True:
        if child is not None:
            child.poll()  # reap it, or its zombie keeps the group alive
        if not _group_alive(pgid):
            return
        now = time.monotonic()
        try:
            if sent is None and _is_ours(pid, ticks):
                os.kill(pid, signal.SIGTERM)  # the main process only, like docker stop
                sent, deadline = signal.SIGTERM, now + grace_s
            elif sent is None or (sent == signal.SIGTERM and now > deadline):
                os.killpg(pgid, signal.SIGKILL)
                sent, deadline = signal.SIGKILL, now + 10.0
            elif sent == signal.SIGKILL and now > deadline:
                return
        except (ProcessLookupError, PermissionError):
            return  # gone, or the id now belongs to someone else's group
        time.sleep(0.05)


class LocalDestination(Destination):
    """``--to local``: this machine, running the job's container when Docker is usable,
    else a plain process (:func:`runner.provision.container.choose_mode`;
    ``TEN_LOCAL_MODE`` forces it). The choice is made once, logged, and kept in the
    record's ``local_mode`` (saved), so a restarted controller launches the same way."""

    def provider(self, record: Any, job: Callable[[], Any],
                 log: Callable[[str], None]) -> Provider:
        from runner.provision.container import CONTAINER, LocalHost, choose_mode
        from runner.provision.docker import DockerProvider

        mode = record.details.get("local_mode")
        if mode is None and record.instance:  # a record from before the modes existed
            mode = record.instance.get("details", {}).get("mode", "process")
        if mode is None:
            mode, why = choose_mode(job())
            record.details["local_mode"] = mode
            record.transition(record.state, f"--to local runs a {mode} ({why})")
            record.save()
            log(f"{record.job_id}: --to local runs a {mode} ({why})")
        if mode == CONTAINER:
            return DockerProvider(LocalHost(), job())
        return LocalProvider(cwd=record.details.get("cwd"))


DESTINATION = LocalDestination()


# -- processes this controller did not start ------------------------------------------
def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, process group, start time in clock ticks) from /proc; None when the
    process does not exist or /proc is not there."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()  # after "pid (comm) "
    return fields[0], int(fields[2]), int(fields[19])


def _start_ticks(pid: int) -> int | None:
    found = _stat(pid)
    return None if found is None else found[2]


def _is_ours(pid: int, start_ticks: int | None) -> bool:
    """Is ``pid`` still the live (not zombie) process we launched? The start time
    guards against the pid having been reused by another process."""
    found = _stat(pid)
    if found is not None:
        state, _, ticks = found
        return state not in ("Z", "X") and (start_ticks is None or ticks == start_ticks)
    if Path("/proc/self/stat").exists():
        return False  # Linux, and no such process
    try:  # no /proc (macOS): existence is all we can check
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_is_ours(pgid: int, start_ticks: int | None) -> bool:
    """Safe to signal group ``pgid``? A group id is not reused while any member lives;
    once it is empty a new process with that pid may start a new group. So: ours unless
    a different process now holds the leader's pid."""
    found = _stat(pgid)
    if found is None:
        return True  # leader gone: any member left is one of our orphans
    return start_ticks is None or found[2] == start_ticks


def _group_alive(pgid: int) -> bool:
    """Does any non-zombie process remain in group ``pgid``?"""
    proc = Path("/proc")
    if not (proc / "self" / "stat").exists():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    for entry in proc.iterdir():
        if entry.name.isdigit():
            found = _stat(int(entry.name))
            if found is not None and found[1] == pgid and found[0] not in ("Z", "X"):
                return True
    return False
