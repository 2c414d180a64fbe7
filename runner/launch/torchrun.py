"""``resources.gpus: N``: run a job as N ranks under torchrun and turn what they did into
the one exit code a supervisor acts on.

``ten-runner run`` calls :func:`launch` when :func:`needs_launcher` says so. It runs
torchrun (``python -m runner.launch.torchrun``: :func:`torchrun_main`) with ``--standalone
--nproc_per_node N -m runner.cli run JOB`` as a child process; each
rank is then an ordinary ``ten-runner run`` that sees torchrun's RANK/WORLD_SIZE (DDP,
NCCL on CUDA; with ``train.device: cpu``, gloo on CPU: the mode the tests use).

Why a launcher around torchrun rather than torchrun itself:

- torchrun returns 1 for any failure, and 0 or 1 cannot say "preempted, resume" (75)
  or "fix the job, do not retry" (2). Rank 0 leaves its exit code in the launch
  directory (:mod:`runner.launch.ranks`); the launcher returns it.
- On SIGTERM torchrun's agent signals each rank's whole process group, DataLoader
  workers included; a worker killed under the trainer fails the step that was to be
  checkpointed. So the launcher sends a stop signal to the ranks themselves (their pids
  are in the launch directory) and leaves torchrun alone; it exits when they have.
  Each rank finishes its step, rank 0 commits (and uploads) the checkpoint, all exit 75.
- torchrun runs in a session of its own, so a terminal's Ctrl-C reaches the launcher
  only, which passes it on once; a second Ctrl-C is passed on too (the user insists:
  the ranks stop without a checkpoint). Repeated SIGTERMs are not passed on.
- A kill -9 of the launcher ends torchrun, and that ends the ranks (the kernel's
  parent-death signal, :func:`runner.launch.ranks.die_with_parent`): nothing keeps training
  beside the next run.

Several machines: set TEN_NNODES, TEN_NODE_RANK, TEN_MASTER_ADDR and TEN_MASTER_PORT
(default 29500) on every machine; they become torchrun's --nnodes, --node_rank,
--master_addr and --master_port (static rendezvous), and resources.gpus counts the GPUs
of one machine. Without them the run is a single machine (--standalone). Only rank 0
writes checkpoints, so the checkpoints must be in a bucket: the first rank of each other
machine fetches the step rank 0 resumes from (runner.run.restore.fetch_checkpoint).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runner.errors import UserError
from runner.exit_codes import ExitCode
from runner.launch.ranks import EXIT_FILE, LAUNCH_DIR_ENV, die_with_parent, pid_file
from ten.train.stop import Stop

TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")
NODE_ENV = ("TEN_NNODES", "TEN_NODE_RANK", "TEN_MASTER_ADDR", "TEN_MASTER_PORT")
DEFAULT_MASTER_PORT = 29500
KILLED_FILE = "killed"  # "<rank> <signal>": the first rank that died of a signal
LAUNCH_PREFIX = "ten-runner-launch-"


@dataclass(frozen=True)
class Nodes:
    """The machines of a multi-node run, as torchrun's static rendezvous wants them."""

    count: int
    rank: int
    master_addr: str
    master_port: int = DEFAULT_MASTER_PORT


def needs_launcher(job: Any, env: dict[str, str] | None = None) -> bool:
    """More than one GPU (or machine) asked for, and not already a rank that torchrun
    started."""
    env = os.environ if env is None else env
    several = job.resources.gpus > 1 or any(env.get(k) for k in NODE_ENV)
    return several and not any(k in env for k in TORCHRUN_ENV)


def nodes_from_env(env: dict[str, str]) -> Nodes | None:
    """TEN_NNODES & co. -> Nodes; None for one machine. Errors name the variable."""
    given = [k for k in NODE_ENV if env.get(k)]
    if not given:
        return None
    count, rank, port = (_whole_number(env, k)
                         for k in ("TEN_NNODES", "TEN_NODE_RANK", "TEN_MASTER_PORT"))
    if count is None:
        raise UserError(f"{', '.join(given)} set but TEN_NNODES is not: set TEN_NNODES "
                        "(the number of machines) or unset them")
    if count < 1:
        raise UserError(f"TEN_NNODES={count} must be at least 1")
    if count == 1:
        return None
    missing = [k for k in ("TEN_NODE_RANK", "TEN_MASTER_ADDR") if not env.get(k)]
    if missing or rank is None:
        raise UserError(f"TEN_NNODES={count} needs {' and '.join(missing)} on every machine")
    if not 0 <= rank < count:
        raise UserError(f"TEN_NODE_RANK={rank} must be between 0 and {count - 1}")
    port = DEFAULT_MASTER_PORT if port is None else port
    if not 0 < port < 65536:
        raise UserError(f"TEN_MASTER_PORT={port} is not a TCP port")
    return Nodes(count, rank, env["TEN_MASTER_ADDR"], port)


def _whole_number(env: dict[str, str], key: str) -> int | None:
    """The variable as an int; None when unset or empty."""
    raw = env.get(key)
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"{key}={raw!r} is not a whole number") from None


def torchrun_command(job_file: str, sets: tuple[str, ...], nproc: int, nodes: Nodes | None,
                     no_sample: bool = False) -> list[str]:
    """The torchrun command line whose every rank runs ``ten-runner run JOB`` (torchrun
    through :func:`torchrun_main`)."""
    cmd = [sys.executable, "-m", "runner.launch.torchrun", "--nproc_per_node", str(nproc),
           "--monitor_interval", "0.5"]
    if nodes is None:
        cmd.append("--standalone")
    else:
        cmd += ["--nnodes", str(nodes.count), "--node_rank", str(nodes.rank),
                "--master_addr", nodes.master_addr, "--master_port", str(nodes.master_port)]
    cmd += ["-m", "runner.cli", "run", str(job_file)]
    for s in sets:
        cmd += ["--set", s]
    if no_sample:
        cmd.append("--no-sample")
    return cmd


def launch(job_file: str, sets: tuple[str, ...], job: Any, stop: Stop, *,
           no_sample: bool = False) -> int:
    """Run the job as ``resources.gpus`` ranks under torchrun; returns rank 0's exit
    code (75 after a stop signal once the checkpoint is committed, 0 when done, ...)."""
    nodes = nodes_from_env(dict(os.environ))
    nproc = max(job.resources.gpus, 1)  # per machine
    backend = _backend(job.train.device, nproc)
    where = "one machine" if nodes is None else f"machine {nodes.rank} of {nodes.count}"
    _say(f"{nproc} ranks under torchrun ({backend}, {where})")
    _sweep_launch_dirs()
    launch_dir = Path(tempfile.mkdtemp(prefix=f"{LAUNCH_PREFIX}{os.getpid()}-"))
    try:
        cmd = torchrun_command(job_file, sets, nproc, nodes, no_sample)
        env = {**os.environ, LAUNCH_DIR_ENV: str(launch_dir)}
        return supervise(cmd, env, launch_dir, nproc, stop)
    finally:
        shutil.rmtree(launch_dir, ignore_errors=True)


def _sweep_launch_dirs() -> None:
    """Remove the launch folders of launchers that were killed (kill -9 runs no cleanup):
    ``<prefix><pid>-*`` whose pid is gone."""
    for folder in Path(tempfile.gettempdir()).glob(f"{LAUNCH_PREFIX}*-*"):
        try:
            os.kill(int(folder.name[len(LAUNCH_PREFIX):].split("-")[0]), 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
        except (ValueError, PermissionError):  # not ours to judge: another user's
            continue


def supervise(cmd: list[str], env: dict[str, str], launch_dir: Path, nproc: int,
              stop: Stop) -> int:
    """Run torchrun to its end, passing stop signals on to the ranks; rank 0's code."""
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, preexec_fn=die_with_parent)
    relay = _SignalRelay(proc, launch_dir, nproc)
    with stop.relaying(relay):
        rc = proc.wait()
    code = read_exit_code(launch_dir)
    killed = read_killed(launch_dir)
    # A rank killed first, then rank 0 crashing on the lost connection: the kill decides.
    if killed is not None and not relay.signals and code in (None, ExitCode.CRASH):
        rank, signum = killed
        _say(f"rank {rank} was killed by {signum.name} (the kernel's OOM "
             f"killer, or a kill): exiting {128 + signum}, as one process killed so would; "
             "what was committed is kept")
        return 128 + signum
    if code is None:
        code = ExitCode.PREEMPTED if relay.signals else ExitCode.CRASH
        why = "stopped by a signal before it could" if relay.signals else "it failed before it"
        _say(f"torchrun exited {rc}; rank 0 left no exit code ({why} finish): exiting "
             f"{int(code)}")
    elif code != rc:
        _say(f"rank 0 exited {code} (torchrun, which knows only 0 and 1, exited {rc})")
    return int(code)


def read_killed(launch_dir: Path) -> tuple[int, signal.Signals] | None:
    """(rank, signal) of the first rank that died of a signal, as torchrun saw it."""
    try:
        rank, signum = map(int, (launch_dir / KILLED_FILE).read_text().split())
        return rank, signal.Signals(signum)
    except (OSError, ValueError):  # none, or not a signal this system knows
        return None


def read_exit_code(launch_dir: Path) -> int | None:
    try:
        return int((launch_dir / EXIT_FILE).read_text())
    except (OSError, ValueError):
        return None


class _SignalRelay:
    """What the launcher does with SIGTERM, SIGINT and SIGHUP: pass the first one on to
    the ranks (or, while they are still starting, to torchrun, whose agent stops them),
    then only a repeated SIGINT. SIGHUP (the terminal closed) goes on as SIGTERM, the
    signal the trainer stops on."""

    def __init__(self, proc: subprocess.Popen, launch_dir: Path, nproc: int) -> None:
        self.proc, self.launch_dir, self.nproc = proc, launch_dir, nproc
        self.signals: list[int] = []

    def __call__(self, signum: int) -> None:
        repeated = bool(self.signals)
        self.signals.append(signum)
        if repeated and signum != signal.SIGINT:
            return
        pids = []
        for local_rank in range(self.nproc):
            try:
                pids.append(int(pid_file(self.launch_dir, local_rank).read_text()))
            except (OSError, ValueError):
                continue
        targets = pids if len(pids) == self.nproc else [*pids, self.proc.pid]
        forward = signal.SIGTERM if signum == signal.SIGHUP else signum
        for pid in targets:
            try:
                os.kill(pid, forward)
            except ProcessLookupError:
                pass


def _backend(device: str, nproc: int) -> str:
    """NCCL on GPUs (there must be enough of them), gloo on CPU."""
    if device == "cpu":
        return "gloo on CPU"
    import torch

    visible = torch.cuda.device_count()
    if visible == 0 and device == "auto":
        return "gloo on CPU: no CUDA device"
    if visible < nproc:
        raise UserError(f"resources.gpus is {nproc} but {visible} CUDA device(s) are visible; "
                        "lower resources.gpus or set CUDA_VISIBLE_DEVICES",
                        exit_code=ExitCode.CONFIG)
    return "NCCL"


def torchrun_main(argv: list[str]) -> int:
    """torchrun (``python -m torch.distributed.run``) without the Python traceback it
    prints whenever a rank exits non-zero, 75 included: the ranks have said what
    happened, and the launcher reports rank 0's code."""
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main

    try:
        main(argv)
    except ChildFailedError as e:
        codes = ", ".join(f"rank {rank} {failure.exitcode}"
                          for rank, failure in sorted(e.failures.items()))
        print(f"torchrun: ranks exited non-zero ({codes})", file=sys.stderr, flush=True)
        rank, first = e.get_first_failure()
        if first.exitcode < 0 and os.environ.get(LAUNCH_DIR_ENV):  # died of a signal
            (Path(os.environ[LAUNCH_DIR_ENV]) / KILLED_FILE).write_text(
                f"{rank} {-first.exitcode}")
        return 1
    except SignalException as e:
        print(f"torchrun: stopped by {e.sigval.name}", file=sys.stderr, flush=True)
        return 1
    return 0


def _say(line: str) -> None:
    print(f"ten-runner: {line}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(torchrun_main(sys.argv[1:]))
