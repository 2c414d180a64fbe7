"""``open_data(cfg)``: source + tokenizer + (shards or stream) behind one small object.

What the trainer sees is the same in every mode::

    data = open_data(cfg)
    loader = data.train_loader(batch_size, num_workers, rank, world_size)
    batch = next(iter(loader))            # (B, seq_len + 1) int64
    state = loader.state_dict()           # JSON-able cursor
    data.val_batches(batch_size)          # finite, deterministic

Cache layout under ``cfg.cache_path``::

    builtin/       extracted builtin corpus (JSONL, keyed by botocore version)
    tokenizers/K/  tokenizer.model + its .sha256 (written last), K = hash(source
                   fingerprint, tokenizer settings)
    shards/N-F/    shards + manifest.json, F = hash(source, tokenizer, seq_len, split, ...)
    hf/            datasets' own cache (download mode)
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch

from ten.data import prepare as prep
from ten.data.config import DataConfig
from ten.data.errors import DataError, disk_errors
from ten.data.fingerprint import digest
from ten.data.loader import ShardLoader, sequential_batches
from ten.data.shards import MANIFEST, TokenStream, verify
from ten.data.sources import Source, is_val, open_source, usable
from ten.data.streaming import DocumentStream, StreamLoader, stream_val_batches
from ten.data.tokenizer import (
    Tokenizer,
    cached_model_path,
    cached_model_problem,
    discard_cached_model,
    load_or_train,
    log,
    training_key,
)

# Streaming val_batches(max_batches=None) stops here: the held-out documents are
# scattered through the stream, so "all of them" can mean reading the whole dataset.
STREAM_VAL_MAX_BATCHES = 64


class PreparedCache(Protocol):
    """Somewhere prepared data is shared between machines (the runner's bucket): the
    tokenizer and shards are fetched from it instead of being rebuilt. Whatever this
    machine has and did not fetch is published, built here just now or found in the
    local cache from an earlier run without the bucket, so the next machine fetches
    it. Keys are fingerprints, so a hit is always the same data."""

    def fetch(self, key: str, directory: Path) -> bool:
        """Fill ``directory`` with the committed copy of ``key``; False when there is none."""

    def publish(self, key: str, directory: Path) -> None:
        """Share ``directory`` under ``key`` unless a committed copy is already there
        (checking is the cache's job: it may be cheap, and can run in the background)."""


def open_tokenizer(cfg: DataConfig, source: Source,
                   cache: PreparedCache | None = None) -> Tokenizer:
    """The given ``.model``, or one trained on the source's training documents (cached)."""
    if cfg.tokenizer.path:
        return Tokenizer(Path(cfg.tokenizer.path).expanduser())
    fraction = source.val_fraction(cfg.val_fraction)

    def texts() -> Iterator[str]:
        docs = source.documents()
        for i, (key, text) in enumerate(docs):
            if cfg.max_documents is not None and i >= cfg.max_documents:
                return
            if usable(text) and not is_val(key, fraction):
                yield text

    wanted = cfg.tokenizer
    key = training_key(source.fingerprint(), wanted.vocab_size, wanted.type,
                       wanted.byte_fallback, wanted.sample_chars, fraction)
    key = digest({"key": key, "max_documents": cfg.max_documents})
    model, name = cached_model_path(cfg.cache_path, key), f"tokenizer-{key}"
    fetched = False
    local_problem = cached_model_problem(model) if cache is not None else None
    if local_problem is not None:
        if local_problem != "missing":  # say so: fetching over it must not hide it
            log(f"the cached tokenizer {model} {local_problem}; fetching the shared copy")
            discard_cached_model(model)
        fetched = cache.fetch(name, model.parent)
        problem = cached_model_problem(model) if fetched else None
        if problem is not None:  # e.g. uploaded from a machine whose disk corrupted it
            log(f"the tokenizer fetched for {name} {problem}; training it here instead")
            discard_cached_model(model)
            fetched = False
    tokenizer = _train_or_load(cfg, key, texts())
    if cache is not None and not fetched:
        cache.publish(name, model.parent)
    return tokenizer


def _train_or_load(cfg: DataConfig, key: str, texts: Iterator[str]) -> Tokenizer:
    wanted = cfg.tokenizer
    return load_or_train(cfg.cache_path, key, texts, vocab_size=wanted.vocab_size,
                         model_type=wanted.type, byte_fallback=wanted.byte_fallback,
                         max_chars=wanted.sample_chars, num_threads=cfg.processes)


class ShardData:
    """Pre-tokenized / downloaded data: verified shards on local disk."""

    def __init__(self, cfg: DataConfig, source: Source, tokenizer: Tokenizer,
                 directory: Path, manifest: dict[str, Any]) -> None:
        self.cfg, self.source, self.tokenizer = cfg, source, tokenizer
        self.prepared_dir: Path | None = directory
        self.manifest = manifest
        self.fingerprint: str = manifest["fingerprint"]
        self.train = TokenStream(directory, manifest["splits"]["train"]["shards"],
                                 manifest["dtype"])
        self.val = TokenStream(directory, manifest["splits"]["val"]["shards"], manifest["dtype"])

    def train_loader(self, batch_size: int, num_workers: int = 0, rank: int = 0,
                     world_size: int = 1, pin_memory: bool = False) -> ShardLoader:
        return ShardLoader(self.train, self.cfg.seq_len, batch_size, num_workers, rank,
                           world_size, self.cfg.seed, self.cfg.shuffle, self.fingerprint,
                           pin_memory)

    def describe(self) -> str:
        """One line: documents and tokens, and how they split into train and held out."""
        split = self.manifest["splits"]
        train, val = split["train"], split["val"]
        return (f"{train['documents'] + val['documents']:,} documents, "
                f"{train['tokens'] + val['tokens']:,} tokens: train {train['tokens']:,} "
                f"({train['documents']:,} documents, {train['sequences']:,} sequences of "
                f"{self.cfg.seq_len}), held out {val['tokens']:,} "
                f"({val['documents']:,} documents)")

    def check_splits(self, batch_size: int) -> None:
        """DataError now when the held-out split cannot fill one evaluation batch, which
        the run would otherwise meet at its first evaluation, after training."""
        _check_val(len(self.val), self.cfg.seq_len, batch_size, self.manifest["val_fraction"])

    def val_batches(self, batch_size: int, max_batches: int | None = None
                    ) -> Iterator[torch.Tensor]:
        self.check_splits(batch_size)
        return sequential_batches(self.val, self.cfg.seq_len, batch_size, max_batches)


def _check_val(tokens: int, seq_len: int, batch_size: int, fraction: float) -> None:
    have = max(0, (tokens - 1) // seq_len)
    if have < batch_size:
        raise DataError(f"the validation split has {tokens:,} tokens, {have} sequences of "
                        f"{seq_len}: fewer than one batch of {batch_size} (val_fraction="
                        f"{fraction}); raise DataConfig.val_fraction, or lower "
                        "TrainConfig.batch_size (the evaluation's too) or DataConfig.seq_len")


class StreamData:
    """Streaming data: nothing prepared on disk, tokenized in loader workers."""

    prepared_dir = None

    def __init__(self, cfg: DataConfig, source: Source, tokenizer: Tokenizer) -> None:
        self.cfg, self.source, self.tokenizer = cfg, source, tokenizer
        self.fraction = source.val_fraction(cfg.val_fraction)
        self.fingerprint = digest({
            "kind": "stream", "source": source.fingerprint(), "tokenizer": tokenizer.fingerprint,
            "seq_len": cfg.seq_len, "val_fraction": self.fraction,
            "max_documents": cfg.max_documents, "block_docs": cfg.stream_block_docs,
            "block_chars": cfg.stream_block_chars, "shuffle": cfg.shuffle})

    def _docs(self, split: str, shuffle: bool) -> DocumentStream:
        return DocumentStream(self.source, self.fraction, split, self.cfg.max_documents,
                              shuffle, self.cfg.seed, self.cfg.stream_block_docs,
                              self.cfg.stream_block_chars)

    def train_loader(self, batch_size: int, num_workers: int = 0, rank: int = 0,
                     world_size: int = 1, pin_memory: bool = False) -> StreamLoader:
        return StreamLoader(self._docs("train", self.cfg.shuffle), self.tokenizer,
                            self.cfg.seq_len, batch_size, num_workers, rank, world_size,
                            self.fingerprint, pin_memory)

    def describe(self) -> str:
        """One line: what a stream can say before it is read."""
        cut = (f", the first {self.cfg.max_documents:,} documents"
               if self.cfg.max_documents is not None else "")
        return (f"streaming {self.source.name}{cut}, tokenized as it is read; about "
                f"{self.fraction:.1%} of documents held out")

    def check_splits(self, batch_size: int) -> None:
        """Nothing to check before reading: a stream's split sizes are known as it is read
        (its evaluation says so when the held-out split runs short)."""

    def val_batches(self, batch_size: int, max_batches: int | None = None
                    ) -> Iterator[torch.Tensor]:
        cap = STREAM_VAL_MAX_BATCHES if max_batches is None else max_batches
        batches = stream_val_batches(self._docs("val", False), self.tokenizer, self.cfg.seq_len,
                                     batch_size, cap)
        first = next(batches, None)
        if first is None and cap > 0:
            _check_val(0, self.cfg.seq_len, batch_size, self.fraction)
        return _prepend(first, batches)


def _prepend(first: torch.Tensor | None, rest: Iterator[torch.Tensor]) -> Iterator[torch.Tensor]:
    if first is not None:
        yield first
        yield from rest


def shard_identity(cfg: DataConfig, source: Source, tokenizer: Tokenizer) -> dict[str, Any]:
    """What a shard directory must have been built from: recorded in its manifest."""
    sfp = source.fingerprint()
    fingerprint = digest({
        "kind": "shards", "source": sfp, "tokenizer": tokenizer.fingerprint,
        "seq_len": cfg.seq_len, "val_fraction": source.val_fraction(cfg.val_fraction),
        "max_documents": cfg.max_documents, "shard_tokens": cfg.shard_tokens})
    return {"fingerprint": fingerprint, "seq_len": cfg.seq_len,
            "source": {"fingerprint": sfp}, "tokenizer": {"fingerprint": tokenizer.fingerprint}}


def shard_dir(cfg: DataConfig, source: Source, identity: dict[str, Any]) -> Path:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(source.name).name or source.name)[:40]
    return cfg.cache_path / "shards" / f"{slug}-{identity['fingerprint']}"


def open_data(cfg: DataConfig, on_commit: Any = None,
              cache: PreparedCache | None = None) -> ShardData | StreamData:
    """Prepare (or reuse, or fetch from ``cache``) the tokenizer and shards, or set up
    streaming. Raises DataError, also for a full or read-only disk (naming the file)."""
    # Most writes name their own file; this is the net for the rest (datasets' cache,
    # a source's own files), which can only name the cache folder.
    with disk_errors(cfg.cache_path, what="access"):
        return _open_data(cfg, on_commit, cache)


def _open_data(cfg: DataConfig, on_commit: Any,
               cache: PreparedCache | None) -> ShardData | StreamData:
    source = open_source(cfg.dataset, cfg.text_field, cfg.cache_path, cfg.data_files)
    source.materialize()
    tokenizer = open_tokenizer(cfg, source, cache)
    if cfg.mode == "streaming":
        return StreamData(cfg, source, tokenizer)
    identity = shard_identity(cfg, source, tokenizer)
    directory = shard_dir(cfg, source, identity)
    key = f"shards-{identity['fingerprint']}"
    # Most specific first, so a mismatch names its cause (e.g. another tokenizer).
    expected = {"tokenizer.fingerprint": tokenizer.fingerprint,
                "source.fingerprint": identity["source"]["fingerprint"],
                "seq_len": cfg.seq_len, "dtype": tokenizer.dtype.name,
                "fingerprint": identity["fingerprint"]}

    def fetch_and_prepare() -> bool:
        fetched = not (directory / MANIFEST).exists() and cache is not None and cache.fetch(
            key, directory)
        prep.prepare(cfg, source, tokenizer, directory, identity, on_commit=on_commit)
        return fetched

    fetched = fetch_and_prepare()
    try:
        manifest = verify(directory, expected, cfg.prepare_command(), cfg.verify_checksums)
    except DataError as e:
        # The folder is this cache's own, keyed by fingerprint: a damaged copy (a
        # truncated or altered shard) is made again rather than stopping the run. Once.
        log(f"prepared data in {directory} is damaged ({e}); preparing it again")
        with disk_errors(directory.parent):
            shutil.rmtree(directory, ignore_errors=True)
        fetched = fetch_and_prepare()
        manifest = verify(directory, expected, cfg.prepare_command(), cfg.verify_checksums)
    # Not only when built here: shards prepared by an earlier run without the bucket
    # would otherwise be tokenized again by every machine that has the bucket.
    if cache is not None and not fetched:
        cache.publish(key, directory)
    return ShardData(cfg, source, tokenizer, directory, manifest)
