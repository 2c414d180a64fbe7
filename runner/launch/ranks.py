"""The rank processes of one torchrun group agreeing on what only rank 0 decides.

Rank 0 alone talks to the bucket: it restores the newest checkpoint before training and
uploads the last one after it. The other ranks must wait for both: for the first so that
they load the same checkpoint, for the second because torchrun stops the whole group
(SIGTERM, then SIGKILL) as soon as one rank exits with a non-zero code such as 75, which
would cut rank 0's final upload short.

They cannot meet in the trainer's process group, which ``ten.train.trainer`` creates after the
data is open and destroys when training ends. They meet in torchrun's key-value store
instead: the agent serves it at MASTER_ADDR:MASTER_PORT for the whole life of the group.

For the launcher (:mod:`runner.launch.torchrun`) each rank leaves its pid in the launch directory
(stop signals go to the ranks themselves, see there why), and the lowest rank on the
machine leaves the run's exit code: torchrun itself only ever returns 0 or 1.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from pathlib import Path

# Set by runner.launch.torchrun for its ranks: where they leave their pids and the exit code.
LAUNCH_DIR_ENV = "TEN_RUNNER_LAUNCH_DIR"
EXIT_FILE = "exit_code"
# How long a rank waits for rank 0 (a big checkpoint's download or upload). If rank 0
# dies instead, torchrun ends the waiting ranks long before this.
WAIT = timedelta(hours=6)
# How long a rank that failed waits for rank 0's exit code before it exits anyway.
FAILED_WAIT = timedelta(seconds=30)


def pid_file(launch_dir: Path, local_rank: int) -> Path:
    return launch_dir / f"rank-{local_rank}.pid"


def die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this process when its parent dies.

    torchrun starts every rank in a session of its own, so when a launcher or torchrun
    is killed with SIGKILL nothing reaches its ranks, and they would go on training and
    writing checkpoints beside the next run. With this a kill -9 anywhere up the chain
    ends the whole tree, as losing the machine would."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request was in place
        os.kill(os.getpid(), signal.SIGKILL)


class RankGroup:
    """This process's place in a torchrun group of two or more ranks."""

    def __init__(self, env: dict[str, str]) -> None:
        self.rank = int(env["RANK"])
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.world_size = int(env["WORLD_SIZE"])
        self.node_rank = int(env.get("GROUP_RANK", "0"))
        self.multi_node = int(env.get("LOCAL_WORLD_SIZE", env["WORLD_SIZE"])) < self.world_size
        self.launch_dir = Path(env[LAUNCH_DIR_ENV]) if env.get(LAUNCH_DIR_ENV) else None
        self._addr = env.get("MASTER_ADDR", "localhost")
        self._port = int(env.get("MASTER_PORT", "0"))
        # Keys from an earlier life of the group (torchrun --max-restarts) must not count.
        self._prefix = f"ten-runner/{env.get('TORCHELASTIC_RESTART_COUNT', '0')}/"
        self._store = None

    @classmethod
    def from_env(cls) -> RankGroup | None:
        """The group this process belongs to; None outside torchrun or with one rank."""
        if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
            return None
        return cls(dict(os.environ))

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def started(self) -> None:
        """Tie this rank's life to torchrun's and tell the launcher where to signal it."""
        if "TORCHELASTIC_RUN_ID" in os.environ:
            die_with_parent()
        if self.launch_dir is not None:
            _write(pid_file(self.launch_dir, self.local_rank), str(os.getpid()))

    def store(self):
        if self._store is None:
            import torch.distributed as dist

            if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
                raise RuntimeError("ranks must be started by torchrun (its agent keeps the "
                                   "store where they meet): ten-runner run with "
                                   "resources.gpus > 1 does that")
            client = dist.TCPStore(self._addr, self._port, is_master=False, timeout=WAIT)
            self._store = dist.PrefixStore(self._prefix, client)
        return self._store

    def publish(self, key: str, value: str) -> None:
        self.store().set(key, value)

    def wait_for(self, key: str, timeout: timedelta | None = None) -> str:
        """The value once some rank has published it (raises after ``timeout``)."""
        store = self.store()
        if timeout is not None:
            store.wait([key], timeout)
        return store.get(key).decode()  # blocks until the key is set

    def finish(self, code: int) -> int:
        """The process exit code, once rank 0 is done with everything it must finish.

        Rank 0 publishes its code. A rank that ended in order (done, or stopped after a
        checkpoint) waits for it and exits with it, so all ranks of a stopped run say
        75. A rank that failed waits briefly: a job error (config, data) fails every
        rank, and rank 0's code should reach the launcher before torchrun, seeing this
        rank's non-zero exit, stops rank 0; a failure of this rank alone leaves rank 0
        blocked in a collective, and exiting is what lets torchrun end it. The lowest
        rank on each machine writes the code for its launcher."""
        from runner.exit_codes import ExitCode

        if self.is_main:
            # Written before it is published: a rank that hears it may exit, and
            # torchrun then stops this one.
            self._leave_exit_code(code)
            try:
                self.publish("exit", str(int(code)))
            except Exception as e:  # noqa: BLE001 - the store is gone: so is the group
                print(f"rank 0: could not publish exit code {int(code)} ({e})",
                      file=sys.stderr)
            return code
        orderly = code in (ExitCode.OK, ExitCode.PREEMPTED)
        try:
            code = int(self.wait_for("exit", None if orderly else FAILED_WAIT))
        except Exception as e:  # noqa: BLE001 - timed out, or the store is gone
            print(f"rank {self.rank}: no exit code from rank 0 ({e})", file=sys.stderr)
            code = ExitCode.CRASH if orderly else code
        self._leave_exit_code(code)
        return code

    def _leave_exit_code(self, code: int) -> None:
        if self.local_rank == 0 and self.launch_dir is not None:
            _write(self.launch_dir / EXIT_FILE, str(int(code)))


def _write(path: Path, text: str) -> None:
    """Atomically: a reader sees the whole value or no file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)
