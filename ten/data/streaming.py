"""Streaming mode: tokenize in DataLoader workers, pack in the main process, resumable.

Nothing is written to disk: documents are read from the source as training runs
(``datasets`` streaming for hub names), so the first batch arrives in seconds.

The work is cut into *blocks* of consecutive documents (see :class:`DocumentStream`). Block ``b`` is
tokenized by worker ``(b - start) % num_workers``; the DataLoader collects worker
outputs round-robin, so the main process receives the blocks in order whatever the
number of workers (and checks it). The main process packs the token stream into the
same windows as the shard loader (``seq_len + 1`` tokens every ``seq_len``), so with
shuffling off both modes yield the same batches.

Why our own cursor rather than ``datasets``' ``state_dict``: with DataLoader workers,
each worker iterates its own copy of the dataset, so a single ``state_dict`` of what
the *caller* has consumed does not exist there. Ours is ``(epoch, block, offset)``: the
first block still in the pack buffer and how many of its stream's tokens have been
used, plus the document position where that block starts. It is independent of
``num_workers``. Resuming an unshuffled stream starts reading at that document (for hub
datasets, ``IterableDataset.skip``); a shuffled one replays the epoch's shuffle buffer
from its start without tokenizing the skipped blocks.

Shuffling is a seeded document shuffle buffer (``SHUFFLE_BUFFER`` documents, seed from
``(seed, epoch)``), replayed identically on resume.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from ten.data.errors import DataError
from ten.data.loader import (
    CURSOR_VERSION,
    WORKER_TIMEOUT_S,
    check_cursor,
    init_worker,
    start_workers,
)
from ten.data.sources import Doc, Source, is_val, usable
from ten.data.tokenizer import Tokenizer

SHUFFLE_BUFFER = 1024


def shuffled(docs: Iterator[Doc], seed: int, epoch: int, size: int = SHUFFLE_BUFFER
             ) -> Iterator[Doc]:
    """A deterministic shuffle buffer: same (seed, epoch, input) -> same order."""
    rng = np.random.default_rng([seed, epoch, 7])
    buf: list[Doc] = []
    for doc in docs:
        if len(buf) < size:
            buf.append(doc)
            continue
        i = int(rng.integers(size))
        buf[i], doc = doc, buf[i]
        yield doc
    rng.shuffle(buf)  # type: ignore[arg-type]
    yield from buf


class DocumentStream:
    """One split's documents in a given epoch's order, cut into numbered blocks.

    A block ends after ``block_docs`` documents or once it holds ``block_chars``
    characters, whichever comes first (both splits' documents count, so the cut is the
    same for train and val). Small blocks keep the first batch fast; the rule is a pure
    function of the document sequence, so block numbers are stable across runs.
    """

    def __init__(self, source: Source, fraction: float, split: str,
                 max_documents: int | None, shuffle: bool, seed: int, block_docs: int,
                 block_chars: int) -> None:
        self.source, self.fraction, self.split = source, fraction, split
        self.max_documents, self.shuffle, self.seed = max_documents, shuffle, seed
        self.block_docs, self.block_chars = block_docs, block_chars

    def blocks(self, epoch: int, start: int = 0, start_doc: int = 0
               ) -> Iterator[tuple[int, int, list[str]]]:
        """(block number, document position after it, its texts of this split) from block
        ``start`` on. Unshuffled, reading starts at document ``start_doc`` (where block
        ``start`` begins); shuffled, the epoch is replayed from its first document."""
        skip, number = (0, 0) if self.shuffle else (start_doc, start)
        limit = None if self.max_documents is None else max(0, self.max_documents - skip)
        docs: Iterator[Doc] = itertools.islice(self.source.documents(skip), limit)
        if self.shuffle:
            docs = shuffled(docs, self.seed, epoch)
        want_val = self.split == "val"
        position, block, chars = skip, [], 0
        for doc in docs:
            block.append(doc)
            chars += len(doc[1])
            position += 1
            if len(block) >= self.block_docs or chars >= self.block_chars:
                if number >= start:
                    yield number, position, self._texts(block, want_val)
                number, block, chars = number + 1, [], 0
        if block and number >= start:
            yield number, position, self._texts(block, want_val)

    def _texts(self, block: list[Doc], want_val: bool) -> list[str]:
        return [t for k, t in block if usable(t) and is_val(k, self.fraction) == want_val]


class _Blocks(IterableDataset):
    """Each worker tokenizes its share of the blocks (b - start) % num_workers == id."""

    def __init__(self, docs: DocumentStream, tokenizer: Tokenizer, epoch: int, start: int,
                 start_doc: int) -> None:
        self.docs, self.tokenizer, self.epoch = docs, tokenizer, epoch
        self.start, self.start_doc = start, start_doc

    def __iter__(self) -> Iterator[tuple[int, int, torch.Tensor]]:
        info = get_worker_info()
        wid, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        for number, after, texts in self.docs.blocks(self.epoch, self.start, self.start_doc):
            if (number - self.start) % workers == wid:
                ids = self.tokenizer.encode_documents(texts).astype(np.int64)
                yield number, after, torch.from_numpy(ids)


class StreamLoader:
    """Infinite, resumable iterable of (B, seq_len + 1) int64 batches from a live stream.

    Use one live iterator at a time: ``iter(loader)`` starts from the current cursor,
    and ``load_state_dict`` takes effect at the next ``iter(loader)``.
    """

    kind = "stream"

    def __init__(self, docs: DocumentStream, tokenizer: Tokenizer, seq_len: int, batch_size: int,
                 num_workers: int = 0, rank: int = 0, world_size: int = 1,
                 fingerprint: str = "", pin_memory: bool = False) -> None:
        if batch_size < 1 or world_size < 1 or not 0 <= rank < world_size:
            raise DataError(f"bad loader geometry: batch_size={batch_size}, rank={rank}, "
                            f"world_size={world_size}")
        self.docs, self.tokenizer, self.seq_len = docs, tokenizer, seq_len
        self.batch_size, self.num_workers = batch_size, num_workers
        self.rank, self.world_size, self.fingerprint = rank, world_size, fingerprint
        self.pin_memory = pin_memory
        # Cursor: first block still buffered, the document it starts at, tokens used of it.
        self.epoch, self.block, self.doc, self.offset = 0, 0, 0, 0

    def __iter__(self) -> Iterator[torch.Tensor]:
        L, B, W = self.seq_len, self.batch_size, self.world_size
        group = W * B  # windows cut at once: every rank advances the same cursor
        while True:
            fresh = self.block == 0 and self.offset == 0
            produced = 0
            blocks = _Blocks(self.docs, self.tokenizer, self.epoch, self.block, self.doc)
            loader = DataLoader(blocks, batch_size=None, num_workers=self.num_workers,
                                timeout=WORKER_TIMEOUT_S if self.num_workers else 0,
                                worker_init_fn=init_worker)
            # Unused tokens of blocks self.block, self.block + 1, ... (data[0] is the first
            # token of block self.block), each block's length, and the document after it.
            data = np.empty(0, dtype=np.int64)
            lens: deque[int] = deque()
            ends: deque[int] = deque()
            expected = self.block
            for number, after, ids in start_workers(loader):
                if number != expected:  # would be a bug, never a silently wrong stream
                    raise RuntimeError(f"stream blocks out of order: got {number}, "
                                       f"expected {expected}")
                expected += 1
                data = np.concatenate([data, ids.numpy()])
                lens.append(len(ids))
                ends.append(after)
                while len(data) - self.offset >= group * L + 1:
                    lo = self.offset + self.rank * B * L  # this rank's windows in the group
                    batch = np.stack([data[s:s + L + 1] for s in range(lo, lo + B * L, L)])
                    self.offset += group * L
                    dropped = 0
                    while lens and lens[0] <= self.offset:  # blocks now fully used
                        self.offset -= lens[0]
                        dropped += lens.popleft()
                        self.block, self.doc = self.block + 1, ends.popleft()
                    data = data[dropped:]  # a view: nothing is copied
                    produced += 1
                    out = torch.from_numpy(batch)  # (B, L + 1)
                    yield out.pin_memory() if self.pin_memory else out
            if fresh and produced == 0:
                raise DataError(f"the streamed training split is shorter than one batch of "
                                f"{B} x {W} rank(s) x {L} tokens; lower batch_size or seq_len, "
                                "or use more data")
            self.epoch, self.block, self.doc, self.offset = self.epoch + 1, 0, 0, 0

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "version": CURSOR_VERSION, "epoch": self.epoch,
                "block": self.block, "doc": self.doc, "offset": self.offset,
                "seed": self.docs.seed,
                "batch_size": self.batch_size, "world_size": self.world_size,
                "fingerprint": self.fingerprint}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        check_cursor(state, self.kind, {"seed": self.docs.seed, "batch_size": self.batch_size,
                                        "world_size": self.world_size,
                                        "fingerprint": self.fingerprint})
        self.epoch, self.block = int(state["epoch"]), int(state["block"])
        self.doc, self.offset = int(state["doc"]), int(state["offset"])


def stream_val_batches(docs: DocumentStream, tokenizer: Tokenizer, seq_len: int,
                       batch_size: int, max_batches: int) -> Iterator[torch.Tensor]:
    """Held-out batches from the start of the stream, in order (no workers)."""
    L, B = seq_len, batch_size
    buf = np.empty(0, dtype=np.int64)
    done = 0
    for _, _, texts in docs.blocks(0):
        if done >= max_batches:
            return
        buf = np.concatenate([buf, tokenizer.encode_documents(texts).astype(np.int64)])
        while len(buf) >= B * L + 1 and done < max_batches:
            yield torch.from_numpy(np.stack([buf[i * L:i * L + L + 1] for i in range(B)]))
            buf = buf[B * L:]
            done += 1
