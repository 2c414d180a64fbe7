"""Batches from shards, and the cursor that makes them resumable.

Example ``i`` of a split is the window of ``seq_len + 1`` tokens starting at token
``i * seq_len`` of its packed stream (the extra token is the last target), so there are
``(tokens - 1) // seq_len`` examples and no padding anywhere.

Order: epoch ``e`` visits the examples in ``permutation(seed, e)`` (identity when
shuffling is off). Global batch ``g`` of an epoch is examples ``order[g*B:(g+1)*B]``,
and rank ``r`` of ``W`` takes global batches ``k*W + r``, so ranks never overlap and the
cursor is the same on all of them.

The cursor is ``(epoch, position, seed)``: ``position`` counts batches *handed to the
caller* in this epoch. The order lives in the main process (a sampler of batch
numbers); DataLoader workers only fetch a batch by number, so however far they
prefetch, and however many there are, the cursor is the caller's position and a fresh
loader restored from it yields exactly the batches that would have come next.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable, Iterator
from multiprocessing.resource_sharer import _ResourceSharer
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from ten.data.errors import DataError
from ten.data.shards import TokenStream

CURSOR_VERSION = 1
# A worker that produces nothing for this long is reported, never waited on forever.
WORKER_TIMEOUT_S = 300
# The loop in which multiprocessing's resource sharer serves one connection after another.
_SHARER_LOOP = _ResourceSharer._serve.__code__


# What a terminal sends its whole foreground process group: Ctrl-C, and the hang-up when
# it closes (an ssh session ending).
GROUP_SIGNALS = {signal.SIGINT, signal.SIGHUP}


def init_worker(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: the trainer decides when a worker stops, and a
    worker stays quiet about the trainer's own end."""
    ignore_stop_signals()
    sys.excepthook = quiet_when_the_trainer_leaves(sys.excepthook)


def ignore_stop_signals() -> None:
    """A terminal's Ctrl-C or hang-up is the trainer's business.

    Both reach every process of the foreground group. A worker that died of one would
    take with it the batches the trainer still needs to finish its step and commit a
    checkpoint; the main process decides when everyone stops. Workers are forked with
    them blocked (:func:`start_workers`), so one that arrives before this runs stays
    pending and is discarded here. SIGTERM keeps its default: supervisors (docker, tini,
    torchrun) send it to the main process only, and multiprocessing relies on it to stop
    workers at exit.
    """
    for sig in GROUP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, GROUP_SIGNALS)


def quiet_when_the_trainer_leaves(previous: Callable[..., Any]) -> Callable[..., Any]:
    """``sys.excepthook`` for a worker: silent when the trainer leaves mid-handover.

    A worker hands each batch's storage over as a file descriptor: the trainer connects
    to the worker's resource sharer (a thread of multiprocessing's) to fetch it. A trainer
    killed during that handshake (the OOM killer, ``kill -9``) resets the connection, and
    the sharer reports the reset through ``sys.excepthook``: a traceback from an orphan,
    printed under the rank's name after the one line that says what happened. The sharer
    has no other peer, so a lost connection there only ever means the trainer's end;
    anything else still goes to ``previous``.
    """
    def hook(kind, value, tb):
        if (isinstance(value, ConnectionError | EOFError) and tb is not None
                and tb.tb_frame.f_code is _SHARER_LOOP):
            return
        previous(kind, value, tb)
    return hook


def start_workers(loader: DataLoader) -> Iterator[Any]:
    """``iter(loader)`` with the group's signals blocked while its workers are forked:
    they inherit the mask, so none can die of a Ctrl-C or hang-up before
    :func:`init_worker` runs. The main process gets any that came meanwhile as
    soon as the mask is restored."""
    old = signal.pthread_sigmask(signal.SIG_BLOCK, GROUP_SIGNALS)
    try:
        return iter(loader)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def epoch_order(n: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    """The order examples are visited in an epoch: a pure function of (seed, epoch)."""
    if not shuffle:
        return np.arange(n)
    return np.random.default_rng([seed, epoch]).permutation(n)


def windows(stream: TokenStream, starts: np.ndarray, seq_len: int) -> torch.Tensor:
    """(len(starts), seq_len + 1) int64 batch of windows starting at the given examples."""
    out = np.empty((len(starts), seq_len + 1), dtype=np.int64)
    for row, i in enumerate(starts):
        out[row] = stream.read(int(i) * seq_len, seq_len + 1)
    return torch.from_numpy(out)


class _Batches(Dataset):
    """Map-style dataset whose items are whole batches, keyed by (epoch, position)."""

    def __init__(self, stream: TokenStream, n: int, seq_len: int, batch_size: int, rank: int,
                 world_size: int, seed: int, shuffle: bool) -> None:
        self.stream, self.n, self.seq_len, self.batch_size = stream, n, seq_len, batch_size
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        self._order: tuple[int, np.ndarray] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_order": None}

    def __getitem__(self, key: tuple[int, int]) -> torch.Tensor:
        epoch, position = key
        if self._order is None or self._order[0] != epoch:
            self._order = (epoch, epoch_order(self.n, self.seed, epoch, self.shuffle))
        g = position * self.world_size + self.rank
        picked = self._order[1][g * self.batch_size:(g + 1) * self.batch_size]
        return windows(self.stream, picked, self.seq_len)  # (B, T + 1)


class _CursorSampler(Sampler):
    """(epoch, position) keys from a cursor on, forever."""

    def __init__(self, epoch: int, position: int, per_epoch: int) -> None:
        self.epoch, self.position, self.per_epoch = epoch, position, per_epoch

    def __iter__(self) -> Iterator[tuple[int, int]]:
        epoch, position = self.epoch, self.position
        while True:
            yield epoch, position
            position += 1
            if position == self.per_epoch:
                epoch, position = epoch + 1, 0


def check_cursor(state: dict[str, Any], kind: str, expect: dict[str, Any]) -> None:
    """Refuse a cursor from another kind of loader, dataset or batch geometry."""
    if not isinstance(state, dict) or state.get("kind") != kind:
        got = state.get("kind") if isinstance(state, dict) else type(state).__name__
        raise DataError(f"data cursor is for a {got!r} loader, this one is {kind!r}; "
                        "resume with the same DataConfig.mode")
    if state.get("version") != CURSOR_VERSION:
        raise DataError(f"data cursor version {state.get('version')} is not {CURSOR_VERSION}")
    for key, want in expect.items():
        if state.get(key) != want:
            raise DataError(f"data cursor has {key}={state.get(key)!r} but this loader has "
                            f"{want!r}; resume with the same data settings and batch size")


class ShardLoader:
    """Infinite, resumable iterable of (B, seq_len + 1) int64 batches from a shard split.

    Use one live iterator at a time: ``iter(loader)`` starts from the current cursor,
    and ``load_state_dict`` takes effect at the next ``iter(loader)``.
    """

    kind = "shards"

    def __init__(self, stream: TokenStream, seq_len: int, batch_size: int, num_workers: int = 0,
                 rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True,
                 fingerprint: str = "", pin_memory: bool = False) -> None:
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"bad loader geometry: batch_size={batch_size}, rank={rank}, "
                            f"world_size={world_size}")
        self.stream, self.seq_len, self.batch_size = stream, seq_len, batch_size
        self.num_workers, self.rank, self.world_size = num_workers, rank, world_size
        self.seed, self.shuffle, self.fingerprint = seed, shuffle, fingerprint
        self.pin_memory = pin_memory
        self.num_examples = max(0, (len(stream) - 1) // seq_len)
        self.batches_per_epoch = self.num_examples // (batch_size * world_size)
        if self.batches_per_epoch == 0:
            raise DataError(f"the training split has {self.num_examples} sequences of "
                            f"{seq_len} tokens, fewer than one batch of {batch_size} x "
                            f"{world_size} rank(s); lower batch_size or seq_len, or use more data")
        self.epoch, self.position = 0, 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        dataset = _Batches(self.stream, self.num_examples, self.seq_len, self.batch_size,
                           self.rank, self.world_size, self.seed, self.shuffle)
        sampler = _CursorSampler(self.epoch, self.position, self.batches_per_epoch)
        workers = self.num_workers
        loader = DataLoader(dataset, batch_size=None, sampler=sampler, num_workers=workers,
                            timeout=WORKER_TIMEOUT_S if workers else 0,
                            prefetch_factor=4 if workers else None, pin_memory=self.pin_memory,
                            worker_init_fn=init_worker)
        for batch in start_workers(loader):
            self.position += 1  # the caller now holds this batch: the cursor moves past it
            if self.position == self.batches_per_epoch:
                self.epoch, self.position = self.epoch + 1, 0
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": CURSOR_VERSION, "epoch": self.epoch,
                "position": self.position, "seed": self.seed, "shuffle": self.shuffle,
                "batch_size": self.batch_size, "world_size": self.world_size,
                "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_cursor(state, self.kind, {"seed": self.seed, "shuffle": self.shuffle,
                                        "batch_size": self.batch_size,
                                        "world_size": self.world_size,
                                        "fingerprint": self.fingerprint})
        if not 0 <= state["position"] < self.batches_per_epoch or state["epoch"] < 0:
            raise DataError(f"data cursor position {state['position']} is outside an epoch of "
                            f"{self.batches_per_epoch} batches")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])


def sequential_batches(stream: TokenStream, seq_len: int, batch_size: int,
                       max_batches: int | None) -> Iterator[torch.Tensor]:
    """Validation: examples in order, full batches only, at most ``max_batches``."""
    n = max(0, (len(stream) - 1) // seq_len)
    count = n // batch_size
    if max_batches is not None:
        count = min(count, max_batches)
    for b in range(count):
        yield windows(stream, np.arange(b * batch_size, (b + 1) * batch_size), seq_len)
