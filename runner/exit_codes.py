"""Process exit codes of ``ten-runner``: a supervisor (the managed relaunch loop, a
container restart policy, a shell script) decides what to do from these alone."""

from __future__ import annotations

import enum

from ten.train.stop import PREEMPTED as _STOPPED  # the library's own code for it (stdlib only)


class ExitCode(enum.IntEnum):
    OK = 0  # the budget is done
    CRASH = 1  # a bug or an unexpected failure: relaunch at most max_restarts times
    CONFIG = 2  # the job (YAML, --set, environment) is wrong: fix it, do not retry
    DATA = 3  # the dataset, tokenizer or shards are wrong: fix them, do not retry
    STORAGE = 4  # the checkpoint store cannot be read or written
    UNHEALTHY_HOST = 5  # the GPU failed the pre-flight check: relaunch on another host
    # Provisioning (``ten-runner submit``), never returned by ``run``:
    NO_CAPACITY = 6  # the cloud has no capacity for the instance type (spot and fallback)
    HOST_UNREACHABLE = 7  # ssh cannot reach the host
    CLOUD_CREDENTIALS = 8  # no usable cloud credentials, or they are not allowed to do it
    DIVERGED = 9  # the loss or gradients stayed non-finite (lower train.lr): do not retry
    GPU_UNUSABLE = 10  # a GPU is here but this software cannot use it (the driver is older
    #                    than the image's CUDA, a CPU-only torch): fix the host image or the
    #                    container image; every host of that image fails the same way
    PREEMPTED = _STOPPED  # 75: stopped by a signal after committing: resume (EX_TEMPFAIL)


# Exits a relaunch cannot fix: the same job file, data or hyper-parameters fail the same
# way on any machine, so a supervisor stops instead of paying for another attempt.
DETERMINISTIC_FAILURES = frozenset({ExitCode.CONFIG, ExitCode.DATA, ExitCode.DIVERGED,
                                    ExitCode.GPU_UNUSABLE})
