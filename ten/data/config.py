"""``DataConfig``: every choice the data layer makes, typed and validated once.

Each field carries its bounds and description (``ten.config.Range``/``Doc``); the job's
``data`` section is built from them, the tokenizer nested on both sides. A bad value
raises a one-line :class:`DataError` naming the field (``DataConfig.seq_len``), which the
runner shows as the job key the user edits.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal

from ten.config import Doc, FieldError, Range, check_fields
from ten.data.errors import DataError


def cache_root() -> Path:
    """Where what can be made again is kept (prepared data, and whatever a caller keeps
    beside it) unless a config names a folder: ``$TEN_CACHE_DIR``, else ``~/.cache/ten``."""
    env = os.environ.get("TEN_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "ten"


MODES = ("pretokenized", "streaming", "download")
TOKENIZER_TYPES = ("bpe", "unigram")


def _check(config: object) -> None:
    """:func:`ten.config.check_fields`, raised as the data layer's one-line error."""
    try:
        check_fields(config)
    except FieldError as e:
        raise DataError(f"{type(config).__name__}.{e}") from None


@dataclass(frozen=True)
class TokenizerConfig:
    """The sentencepiece tokenizer: an existing model (``path``) or one trained on the
    dataset's training split with these settings."""

    vocab_size: Annotated[int, Range(ge=8), Doc("trained sentencepiece vocabulary size")] = 4096
    type: Annotated[Literal[TOKENIZER_TYPES], Doc("sentencepiece model type")] = "bpe"
    path: Annotated[str | None, Doc("existing sentencepiece .model: used as-is")] = None
    byte_fallback: Annotated[bool, Doc("unknown characters as bytes, never <unk>")] = True
    sample_chars: Annotated[int, Range(ge=1000), Doc(
        "characters of text the tokenizer is trained on (a capped sample)")] = 20_000_000

    def __post_init__(self) -> None:
        _check(self)

    def replace(self, **changes: object) -> TokenizerConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclass(frozen=True)
class DataConfig:
    """What to train on and how it becomes token sequences. The only declaration of
    these settings: the job's ``data`` section is built from these fields."""

    dataset: Annotated[str, Doc(
        "known hub name (e.g. finewebedu), a local .txt/.jsonl/.parquet path, glob or "
        "directory, or builtin:botocore-docs")] = "builtin:botocore-docs"
    mode: Annotated[Literal[MODES], Doc(
        "pretokenized: tokenize once into shards (the fast path); streaming: tokenize on "
        "the fly, nothing written; download: the hub's datasets library, then the same "
        "shards")] = "pretokenized"
    seq_len: Annotated[int, Range(ge=1), Doc("tokens per training sequence")] = 256
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    text_field: Annotated[str | None, Doc("text column; null: the dataset's own")] = None
    data_files: Annotated[str | None, Doc(
        "local files (same schema) standing in for a known hub name")] = None
    num_proc: Annotated[int | None, Range(ge=1), Doc(
        "tokenizing processes; null: all cores")] = None
    val_fraction: Annotated[float, Range(ge=0.0, lt=1.0), Doc(
        "documents held out for evaluation, by hash (the builtin corpus has its own "
        "split)")] = 0.01
    shuffle: Annotated[bool, Doc("a seeded shuffle each epoch (streaming: of documents, "
                                 "through a buffer)")] = True
    seed: Annotated[int, Range(ge=0), Doc("seeds the split's shuffles")] = 1234
    cache_dir: Annotated[str | None, Doc("null: $TEN_CACHE_DIR or ~/.cache/ten")] = None
    max_documents: Annotated[int | None, Range(ge=1), Doc(
        "read at most this many documents (before the split)")] = None
    shard_tokens: Annotated[int, Range(ge=2), Doc(
        "tokens per shard file (100M tokens = 200 MB at uint16)")] = 100_000_000
    verify_checksums: Annotated[bool, Doc(
        "sha256 every shard when opening (catches bit flips; ~1 s per GB)")] = True
    # Streaming: a unit of work for a DataLoader worker ends after this many documents
    # or characters, whichever comes first.
    stream_block_docs: Annotated[int, Range(ge=1), Doc("documents per streaming block")] = 64
    stream_block_chars: Annotated[int, Range(ge=1), Doc(
        "characters per streaming block")] = 65536
    progress: Annotated[bool, Doc("progress bars while preparing")] = True

    def __post_init__(self) -> None:
        if not self.dataset:
            raise DataError("DataConfig.dataset must name a dataset, a local path or "
                            "builtin:botocore-docs")
        if not isinstance(self.tokenizer, TokenizerConfig):
            raise DataError(f"DataConfig.tokenizer must be a TokenizerConfig, got "
                            f"{self.tokenizer!r}")
        _check(self)

    def replace(self, **changes: object) -> DataConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def cache_path(self) -> Path:
        return Path(self.cache_dir).expanduser() if self.cache_dir else cache_root()

    @property
    def processes(self) -> int:
        return self.num_proc or os.cpu_count() or 1

    def prepare_command(self) -> str:
        """The CLI line that (re)builds this config's shards: named in every stale-shard error."""
        args = ["python", "-m", "ten.data", "prepare", "--dataset", self.dataset,
                "--seq-len", str(self.seq_len)]
        defaults = DataConfig()
        flags = (("mode", "--mode"), ("tokenizer.vocab_size", "--vocab-size"),
                 ("tokenizer.type", "--tokenizer-type"), ("tokenizer.path", "--tokenizer-path"),
                 ("text_field", "--text-field"), ("data_files", "--data-files"),
                 ("val_fraction", "--val-fraction"), ("max_documents", "--max-documents"),
                 ("shard_tokens", "--shard-tokens"), ("cache_dir", "--cache-dir"))
        for dotted, flag in flags:
            value = _get(self, dotted)
            if value != _get(defaults, dotted):
                args += [flag, str(value)]
        return " ".join(shlex.quote(a) for a in args + ["--force"])


def _get(config: DataConfig, dotted: str) -> object:
    value: object = config
    for name in dotted.split("."):
        value = getattr(value, name)
    return value
