"""``DataConfig``: every choice the data layer makes, typed and validated once.

The job YAML (runner side) maps onto these fields one to one; a bad value raises a
one-line :class:`DataError` that names the field to change.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from ten.data.errors import DataError

MODES = ("pretokenized", "streaming", "download")
TOKENIZER_TYPES = ("bpe", "unigram")
# The job YAML key for each field whose name differs there: errors name what the user
# edits. Fields the job does not expose (shard_tokens, ...) are named as DataConfig's.
JOB_KEYS = {"vocab_size": "data.tokenizer.vocab_size", "tokenizer_type": "data.tokenizer.type",
            "tokenizer_path": "data.tokenizer.path",
            "byte_fallback": "data.tokenizer.byte_fallback",
            "tokenizer_sample_chars": "data.tokenizer.sample_chars", "seed": "train.seed"}
_JOB_FIELDS = ("dataset", "mode", "seq_len", "text_field", "data_files", "num_proc",
               "val_fraction", "shuffle", "cache_dir", "max_documents")


def job_key(field: str) -> str:
    """The key a user sets for DataConfig ``field``: ``vocab_size`` ->
    ``data.tokenizer.vocab_size``."""
    if field in JOB_KEYS:
        return JOB_KEYS[field]
    return f"data.{field}" if field in _JOB_FIELDS else f"DataConfig.{field}"


@dataclass(frozen=True)
class DataConfig:
    # What to read: a known hub name (see ten.data.sources.KNOWN), a local
    # file/glob/directory (.txt, .jsonl, .parquet), or "builtin:botocore-docs".
    dataset: str = "builtin:botocore-docs"
    # "pretokenized": tokenize once in parallel into shards (the fast path);
    # "streaming": tokenize on the fly in DataLoader workers, nothing written;
    # "download": datasets.load_dataset + map(num_proc), into the same shards.
    mode: str = "pretokenized"
    seq_len: int = 256
    # Column holding the text; None -> the known dataset's field, else "text".
    text_field: str | None = None
    # For a known hub name: read these local files (same schema) instead of the hub.
    data_files: str | None = None
    vocab_size: int = 4096
    tokenizer_type: str = "bpe"
    # An existing sentencepiece .model: used as-is, nothing is trained.
    tokenizer_path: str | None = None
    byte_fallback: bool = True
    # Characters of training text fed to the tokenizer trainer (a capped sample).
    tokenizer_sample_chars: int = 20_000_000
    # Processes for tokenization (pretokenized/download); None -> os.cpu_count().
    num_proc: int | None = None
    # Fraction of documents held out (by hash of the document); the builtin corpus
    # ignores it and uses its own fixed split.
    val_fraction: float = 0.01
    shuffle: bool = True
    seed: int = 1234
    # None -> $TEN_CACHE_DIR or ~/.cache/ten
    cache_dir: str | None = None
    # Read at most this many documents from the source (before the split).
    max_documents: int | None = None
    # Tokens per shard file (100M tokens = 200 MB at uint16).
    shard_tokens: int = 100_000_000
    # sha256 every shard when opening (catches bit flips; ~1 s per GB).
    verify_checksums: bool = True
    # Streaming: a unit of work for a DataLoader worker ends after this many documents
    # or characters, whichever comes first.
    stream_block_docs: int = 64
    stream_block_chars: int = 65536
    progress: bool = True

    def __post_init__(self) -> None:
        def bad(field: str, why: str) -> DataError:
            return DataError(f"{job_key(field)} {why}, got {getattr(self, field)!r}")

        if not self.dataset:
            raise bad("dataset", "must name a dataset, a local path or builtin:botocore-docs")
        if self.mode not in MODES:
            raise bad("mode", f"must be one of {', '.join(MODES)}")
        if self.tokenizer_type not in TOKENIZER_TYPES:
            raise bad("tokenizer_type", f"must be one of {', '.join(TOKENIZER_TYPES)}")
        for field, low in (("seq_len", 1), ("vocab_size", 8), ("tokenizer_sample_chars", 1000),
                           ("shard_tokens", 2), ("stream_block_docs", 1),
                           ("stream_block_chars", 1)):
            if getattr(self, field) < low:
                raise bad(field, f"must be >= {low}")
        if self.num_proc is not None and self.num_proc < 1:
            raise bad("num_proc", "must be >= 1 (or null for all cores)")
        if self.max_documents is not None and self.max_documents < 1:
            raise bad("max_documents", "must be >= 1 (or null for all)")
        if not 0.0 <= self.val_fraction < 1.0:
            raise bad("val_fraction", "must be in [0, 1)")

    def replace(self, **changes: object) -> DataConfig:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]

    @property
    def cache_path(self) -> Path:
        if self.cache_dir:
            return Path(self.cache_dir).expanduser()
        env = os.environ.get("TEN_CACHE_DIR")
        return Path(env).expanduser() if env else Path.home() / ".cache" / "ten"

    @property
    def processes(self) -> int:
        return self.num_proc or os.cpu_count() or 1

    def prepare_command(self) -> str:
        """The CLI line that (re)builds this config's shards: named in every stale-shard error."""
        args = ["python", "-m", "ten.data", "prepare", "--dataset", self.dataset,
                "--seq-len", str(self.seq_len)]
        defaults = DataConfig()
        flags = (("mode", "--mode"), ("vocab_size", "--vocab-size"),
                 ("tokenizer_type", "--tokenizer-type"), ("tokenizer_path", "--tokenizer-path"),
                 ("text_field", "--text-field"), ("data_files", "--data-files"),
                 ("val_fraction", "--val-fraction"), ("max_documents", "--max-documents"),
                 ("shard_tokens", "--shard-tokens"), ("cache_dir", "--cache-dir"))
        for field, flag in flags:
            value = getattr(self, field)
            if value != getattr(defaults, field):
                args += [flag, str(value)]
        return " ".join(shlex.quote(a) for a in args + ["--force"])
