"""Tokenize a source once into headered shards: the pre-tokenized and full-download modes.

Pre-tokenized mode reads documents in the main process, hands chunks of about
``CHUNK_CHARS`` characters to ``num_proc`` worker processes that tokenize them (EOS
after every document) and split them train/val, and appends the results *in source
order* to the shard writers. At most two chunks per worker are in flight, so memory
stays flat on any corpus size. Every ``COMMIT_EVERY_S`` seconds (at a chunk boundary)
the shards are fsynced and ``progress.json`` records (documents read, tokens
committed per split): an interrupted run restarts from there, dropping any
half-written tail, so no document is read twice or lost.

Download mode gets the same documents as a ``datasets.Dataset`` (``load_dataset`` for
hub names), tokenizes with ``Dataset.map(num_proc=...)`` (cached by datasets), and
writes the same shards in the same order: with the same source and tokenizer, both
modes produce byte-identical shards.

Either way the manifest is written last; a directory with one is reused with no work.

A full or read-only disk (ENOSPC, EROFS, EACCES, ...) is a one-line DataError naming
the shard folder and its free space, never a traceback: the shard files are closed and
the worker processes stopped, the committed progress is kept, and once space is freed
the next run truncates the half-written tail and carries on.
"""

from __future__ import annotations

import itertools
import json
import multiprocessing as mp
import shutil
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from pathlib import Path
from typing import Any

import numpy as np
from tqdm import tqdm

from ten.data.config import DataConfig
from ten.data.errors import DataError, disk_errors
from ten.data.shards import MANIFEST, PROGRESS, VERSION, SplitWriter, write_json
from ten.data.sources import Source, is_val, usable
from ten.data.tokenizer import Tokenizer, file_lock

CHUNK_CHARS = 1 << 21  # ~2 MB of text per unit of work
CHUNK_DOCS = 4096
# Progress is made durable (fsync + progress.json) at most this often: an interrupted
# run redoes at most this much work.
COMMIT_EVERY_S = 5.0

# A chunk: rows read, rows skipped as empty, texts, their split keys, val fraction.
# (Keys are usually the texts themselves: pickle sends a shared string once.)
Chunk = tuple[int, int, list[str], list[str], float]
# A result: counts (rows, skipped_empty, train_docs, val_docs, invalid_utf8, chars),
# train tokens, val tokens.
Result = tuple[dict[str, int], np.ndarray, np.ndarray]

_worker_tokenizer: Tokenizer | None = None


def _init_worker(tokenizer: Tokenizer) -> None:
    global _worker_tokenizer
    _worker_tokenizer = tokenizer


def tokenize_chunk(chunk: Chunk, tokenizer: Tokenizer | None = None) -> Result:
    """Tokenize one chunk and split it: runs in a worker process (or inline)."""
    tok = tokenizer or _worker_tokenizer
    assert tok is not None
    rows, skipped, texts, keys, fraction = chunk
    val = [is_val(k, fraction) for k in keys]
    train_texts = [t for t, v in zip(texts, val, strict=True) if not v]
    val_texts = [t for t, v in zip(texts, val, strict=True) if v]
    counts = {"rows": rows, "skipped_empty": skipped, "train_docs": len(train_texts),
              "val_docs": len(val_texts), "invalid_utf8": sum("\ufffd" in t for t in texts),
              "chars": sum(map(len, texts))}
    return counts, tok.encode_documents(train_texts), tok.encode_documents(val_texts)


def _chunks(docs: Iterator[tuple[str, str]], fraction: float) -> Iterator[Chunk]:
    rows, skipped, texts, keys, chars = 0, 0, [], [], 0
    for key, text in docs:
        rows += 1
        if not usable(text):
            skipped += 1
        else:
            texts.append(text)
            keys.append(key)
            chars += len(text)
        if chars >= CHUNK_CHARS or rows >= CHUNK_DOCS:
            yield rows, skipped, texts, keys, fraction
            rows, skipped, texts, keys, chars = 0, 0, [], [], 0
    if rows:
        yield rows, skipped, texts, keys, fraction


def _in_order(chunks: Iterator[Chunk], tokenizer: Tokenizer, processes: int) -> Iterator[Result]:
    """Tokenized chunks in source order, ``processes`` at a time, bounded look-ahead.

    A process pool executor rather than multiprocessing.Pool: if a worker dies (killed,
    out of memory) it raises BrokenProcessPool instead of waiting forever.
    """
    if processes == 1:
        for chunk in chunks:
            yield tokenize_chunk(chunk, tokenizer)
        return
    ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
    with ProcessPoolExecutor(processes, mp_context=ctx, initializer=_init_worker,
                             initargs=(tokenizer,)) as pool:
        pending: deque[Future[Result]] = deque()
        try:
            for chunk in chunks:
                pending.append(pool.submit(tokenize_chunk, chunk))
                if len(pending) >= 2 * processes:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        except BrokenProcessPool:
            raise DataError("a tokenization worker process died (out of memory?); lower "
                            "DataConfig.num_proc and run again: finished work is kept") from None
        finally:
            for future in pending:
                future.cancel()


PLAIN_EVERY_S = 30.0  # seconds between progress lines when stderr is no terminal


class _Progress:
    """Characters read and tokens/s, on stderr: a tqdm bar on a terminal; on a file or a
    pipe (a container's log, nohup, ``submit --to local``) a plain line every
    :data:`PLAIN_EVERY_S` and one at the end, since a bar's carriage returns run into
    the lines around them there."""

    def __init__(self, cfg: DataConfig, source: Source, desc: str, done: int = 0) -> None:
        self.desc, self.total, self.done = desc, source.total_bytes(), done
        self.t0, self.tokens = time.perf_counter(), 0
        self.plain = cfg.progress and not _is_terminal(sys.stderr)
        self.last_line, self.closed = self.t0, False
        self.bar = tqdm(total=self.total, initial=done, unit="B", unit_scale=True, desc=desc,
                        disable=not cfg.progress or self.plain, file=sys.stderr,
                        mininterval=1.0)

    def update(self, chars: int, tokens: int) -> None:
        self.tokens += tokens
        self.done += chars
        self.bar.update(chars)
        self.bar.set_postfix_str(f"{self._rate() / 1e3:,.0f}K tok/s", refresh=False)
        now = time.perf_counter()
        if self.plain and now - self.last_line >= PLAIN_EVERY_S:
            self.last_line = now
            self._line()

    def close(self) -> None:  # called again after an error: the last line said once
        if self.plain and not self.closed:
            self._line(done=True)
        self.closed = True
        self.bar.close()

    def _rate(self) -> float:
        return self.tokens / max(time.perf_counter() - self.t0, 1e-9)

    def _line(self, done: bool = False) -> None:
        # Characters of text against the input's bytes: an estimate until the end.
        where = (f"{self.done / 1e6:,.1f}M characters" if done or not self.total
                 else f"about {min(self.done / self.total, 1):.0%} of "
                      f"{self.total / 1e6:,.1f} MB")
        print(f"{self.desc}: {where}, {self.tokens:,} tokens, "
              f"{self._rate() / 1e3:,.0f}K tok/s", file=sys.stderr, flush=True)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _fresh(directory: Path) -> None:
    for path in directory.glob("*.bin"):
        path.unlink()
    (directory / PROGRESS).unlink(missing_ok=True)


def prepare(cfg: DataConfig, source: Source, tokenizer: Tokenizer, directory: Path,
            identity: dict[str, Any],
            on_commit: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Build (or reuse, or resume) the shards in ``directory``; returns the manifest.

    ``identity`` is recorded in the manifest and must match for progress to be resumed
    (fingerprints, seq_len). ``on_commit`` is called with the progress after each chunk
    (tests use it, with ``COMMIT_EVERY_S = 0``, to interrupt a run half way).
    """
    if (directory / MANIFEST).exists():
        return {}  # already complete: the caller verifies it
    with disk_errors(directory):
        directory.mkdir(parents=True, exist_ok=True)
        # The lock sits beside the directory, which holds nothing but what gets uploaded.
        with file_lock(directory.with_name(directory.name + ".lock")):
            if (directory / MANIFEST).exists():  # another process finished it meanwhile
                return {}
            if cfg.mode == "download":
                return _prepare_download(cfg, source, tokenizer, directory, identity)
            return _prepare_pretokenized(cfg, source, tokenizer, directory, identity,
                                         on_commit)


def _load_progress(directory: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    path = directory / PROGRESS
    if not path.exists():
        return None
    try:
        progress = json.loads(path.read_text())
    except json.JSONDecodeError:
        return None
    return progress if progress.get("identity") == identity else None


def _prepare_pretokenized(cfg: DataConfig, source: Source, tokenizer: Tokenizer,
                          directory: Path, identity: dict[str, Any],
                          on_commit: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
    progress = _load_progress(directory, identity)
    if progress is None:
        _fresh(directory)
        progress = {"identity": identity, "rows": 0, "chars": 0,
                    "counts": dict.fromkeys(("train_docs", "val_docs", "skipped_empty",
                                             "invalid_utf8"), 0),
                    "writers": {"train": None, "val": None}}
    writers = {split: SplitWriter(directory, split, tokenizer.dtype, cfg.shard_tokens, state)
               for split, state in progress["writers"].items()}
    counts = progress["counts"]
    fraction = source.val_fraction(cfg.val_fraction)
    limit = None if cfg.max_documents is None else max(0, cfg.max_documents - progress["rows"])
    bar = _Progress(cfg, source, f"tokenizing {source.name}", progress["chars"])
    docs = itertools.islice(source.documents(progress["rows"]), limit)
    results = _in_order(_chunks(docs, fraction), tokenizer, cfg.processes)
    try:
        last_commit = time.monotonic()
        for got, train, val in results:
            writers["train"].append(train)
            writers["val"].append(val)
            progress["rows"] += got["rows"]
            progress["chars"] += got["chars"]
            for name in counts:
                counts[name] += got[name]
            bar.update(got["chars"], len(train) + len(val))
            if time.monotonic() - last_commit >= COMMIT_EVERY_S:
                progress["writers"] = {s: w.sync() for s, w in writers.items()}
                write_json(directory / PROGRESS, progress)
                last_commit = time.monotonic()
                if on_commit is not None:
                    on_commit(progress)
        bar.close()  # before _finish's own lines, which would run on from the bar's
        return _finish(cfg, source, tokenizer, directory, identity, writers, progress["rows"],
                       counts)
    except BaseException:
        # Closed now, not when the traceback is dropped: the shard files, and the worker
        # pool (the generator's finally cancels its queue and joins the workers).
        results.close()
        for w in writers.values():
            w.close()
        raise
    finally:
        bar.close()


def _finish(cfg: DataConfig, source: Source, tokenizer: Tokenizer, directory: Path,
            identity: dict[str, Any], writers: dict[str, SplitWriter], rows: int,
            counts: dict[str, int]) -> dict[str, Any]:
    if counts["train_docs"] + counts["val_docs"] == 0:
        for w in writers.values():
            w.finish()
        _fresh(directory)
        raise DataError(f"DataConfig.dataset {source.name!r} has no non-empty documents "
                        f"({rows} rows read, {counts['skipped_empty']} empty)")
    splits = {}
    for split, writer in writers.items():
        tokens = writer.tokens
        splits[split] = {"tokens": tokens, "documents": counts[f"{split}_docs"],
                         "sequences": max(0, (tokens - 1) // cfg.seq_len),
                         "shards": writer.finish()}
    if counts["invalid_utf8"]:
        n = counts["invalid_utf8"]
        docs, verb = ("1 document", "contains") if n == 1 else (f"{n:,} documents", "contain")
        print(f"ten.data: {docs} of {source.name} {verb} U+FFFD (invalid UTF-8 bytes were "
              "replaced)", file=sys.stderr)
    manifest = {
        "format": "ten-token-shards", "version": VERSION, **identity,
        "dtype": tokenizer.dtype.name, "mode": cfg.mode,
        "source": {**identity["source"], "name": source.name},
        "tokenizer": {**identity["tokenizer"], "vocab_size": tokenizer.vocab_size,
                      "eos_id": tokenizer.eos_id, "path": str(tokenizer.path)},
        "documents": {"rows_read": rows, **counts},
        "val_fraction": source.val_fraction(cfg.val_fraction),
        "splits": splits, "command": cfg.prepare_command(),
    }
    write_json(directory / MANIFEST, manifest)
    (directory / PROGRESS).unlink(missing_ok=True)
    return manifest


# --- download mode: datasets.load_dataset + map(num_proc) ------------------------------


def _tokenize_rows(batch: dict[str, list[Any]], model_path: str, tokenizer_fp: str,
                   fraction: float) -> dict[str, list[Any]]:
    """datasets.map function: per row, its stream piece (ids + EOS) and its split."""
    global _worker_tokenizer
    if _worker_tokenizer is None or _worker_tokenizer.fingerprint != tokenizer_fp:
        _worker_tokenizer = Tokenizer(model_path)
    texts = batch["text"]
    keys = batch.get("key") or texts
    ok = [usable(t) for t in texts]
    good = [t for t, k in zip(texts, ok, strict=True) if k]
    encoded = iter(_worker_tokenizer.encode_batch(good))
    eos = _worker_tokenizer.eos_id
    ids = [next(encoded) + [eos] if k else [] for k in ok]
    return {"ids": ids, "usable": ok,
            "val": [k and is_val(key, fraction) for k, key in zip(ok, keys, strict=True)],
            "bad": [k and "\ufffd" in t for k, t in zip(ok, texts, strict=True)]}


def _prepare_download(cfg: DataConfig, source: Source, tokenizer: Tokenizer, directory: Path,
                      identity: dict[str, Any]) -> dict[str, Any]:
    _fresh(directory)  # the expensive part (map) is cached by datasets; writing is cheap
    # datasets writes its own cache (in its worker processes too) and wraps the OSError
    # of a full disk in its own errors: named here as its folder, in one line.
    with disk_errors(cfg.cache_path / "hf"):
        ds = source.to_dataset(cfg.cache_path)
        rows = len(ds)
        if cfg.max_documents is not None and cfg.max_documents < rows:
            ds, rows = ds.select(range(cfg.max_documents)), cfg.max_documents
        fraction = source.val_fraction(cfg.val_fraction)
        ds = ds.map(_tokenize_rows, batched=True, batch_size=256,
                    num_proc=max(1, min(cfg.processes, rows)),
                    remove_columns=ds.column_names, desc=f"tokenizing {source.name}",
                    fn_kwargs={"model_path": str(tokenizer.path),
                               "tokenizer_fp": tokenizer.fingerprint, "fraction": fraction})
    writers = {split: SplitWriter(directory, split, tokenizer.dtype, cfg.shard_tokens)
               for split in ("train", "val")}
    counts = dict.fromkeys(("train_docs", "val_docs", "skipped_empty", "invalid_utf8"), 0)
    try:
        _write_mapped(ds, writers, counts)
        return _finish(cfg, source, tokenizer, directory, identity, writers, rows, counts)
    except BaseException:
        for w in writers.values():  # closed now, not whenever the traceback is dropped
            w.close()
        raise


def _write_mapped(ds: Any, writers: dict[str, SplitWriter], counts: dict[str, int]) -> None:
    """Append the mapped rows' ids to the split writers, counting documents."""
    for batch in ds.with_format("arrow").iter(batch_size=1024):
        val = batch.column("val").to_numpy(zero_copy_only=False)
        usable_ = batch.column("usable").to_numpy(zero_copy_only=False)
        ids = batch.column("ids").combine_chunks()  # ListArray: per-row ids
        for split, mask in (("train", usable_ & ~val), ("val", val)):
            picked = ids.filter(mask)
            if len(picked):
                writers[split].append(picked.flatten().to_numpy())
            counts[f"{split}_docs"] += int(mask.sum())
        counts["skipped_empty"] += int((~usable_).sum())
        counts["invalid_utf8"] += int(batch.column("bad").to_numpy(zero_copy_only=False).sum())


def remove(directory: Path) -> None:
    """Delete a prepared directory (``prepare --force``)."""
    if directory.exists():
        shutil.rmtree(directory)
