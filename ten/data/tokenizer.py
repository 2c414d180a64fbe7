"""The sentencepiece tokenizer: trained from the source once, cached by fingerprint.

Training settings chosen so that ``decode(encode(text)) == text`` for any text and so
that documents can be encoded line by line (several times faster than one long string)
with exactly the same ids as encoding them whole:

* identity normalisation and no whitespace folding: the text is kept byte for byte;
* no dummy prefix, and ``"\\n"`` is a user-defined piece, so no piece crosses a newline;
* byte fallback (default): characters missing from the vocabulary become byte pieces,
  never ``<unk>``;
* reserved ids: pad 0, unk 1, bos 2, eos 3. EOS separates documents in the stream.

The cache key covers the source fingerprint and every training setting, so the same
job never retrains; a different setting never reuses a stale model. A cached model
counts only with its checksum file beside it (``tokenizer.model.sha256``, written last):
one without, or one whose bytes no longer match, is trained again rather than used
(sentencepiece loads many corrupted models without complaint).
"""

from __future__ import annotations

import fcntl
import itertools
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import sentencepiece as spm

from ten.data.errors import DataError, disk_errors
from ten.data.fingerprint import digest
from ten.fileio import atomic_write, sha256_file

PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3
# 2: cached models carry a checksum file. Bumping it moves the cache key, so entries
# made before (none has a checksum, locally or in a bucket) are never consulted again;
# the models trained are the same bytes, so prepared shards are still reused.
RECIPE_VERSION = 2
CHECKSUM_SUFFIX = ".sha256"
# Training sentences longer than sentencepiece's limit (4192 bytes) are dropped by it;
# we cut long lines at a space before this many characters instead.
_MAX_TRAIN_LINE = 2000


class Tokenizer:
    """A loaded sentencepiece model. Pickles by path (cheap to send to worker processes)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise DataError(f"tokenizer model {str(self.path)!r} does not exist; fix "
                            "DataConfig.tokenizer.path or leave it empty to train one")
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.Load(str(self.path))
        except (OSError, RuntimeError):
            raise DataError(f"{str(self.path)!r} is not a sentencepiece model; fix "
                            "DataConfig.tokenizer.path") from None
        self.fingerprint = sha256_file(self.path)[:16]
        self.vocab_size = self._sp.get_piece_size()
        self.eos_id = self._sp.eos_id()
        if self.eos_id < 0:
            raise DataError(f"tokenizer {str(self.path)!r} has no EOS piece, which separates "
                            "documents; train it with eos_id set")
        # External models may have no pad piece: padding is never used by the data
        # layer (sequences are packed), so EOS stands in.
        self.pad_id = self._sp.pad_id() if self._sp.pad_id() >= 0 else self.eos_id
        self.bos_id = self._sp.bos_id()
        self.unk_id = self._sp.unk_id()
        # Line-by-line encoding is only used when it is exact: "\n" is a piece of its
        # own and no dummy prefix is added per line (true for models trained here).
        nl = self._sp.piece_to_id("\n")
        probe = ("x y", " z\tw ", "")
        whole = self._sp.encode("\n".join(probe))
        parts = [self._sp.encode(p) for p in probe]
        self._newline_id: int | None = nl if (
            self._sp.id_to_piece(nl) == "\n"
            and whole == parts[0] + [nl] + parts[1] + [nl] + parts[2]) else None
        self.dtype = np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    def __getstate__(self) -> dict[str, object]:
        return {"path": self.path}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__init__(state["path"])  # type: ignore[misc, arg-type]

    def __repr__(self) -> str:
        return f"Tokenizer({str(self.path)!r}, vocab_size={self.vocab_size})"

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def _encode_lines(self, texts: Sequence[str]) -> tuple[list[list[int]], list[int]]:
        """Every line of every text encoded in one batched call, and lines per text."""
        lines, counts = [], []
        for text in texts:
            parts = text.split("\n")
            lines.extend(parts)
            counts.append(len(parts))
        return self._sp.encode(lines, num_threads=1), counts

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids for each text (no EOS). Lines are encoded in one batched call when exact."""
        if self._newline_id is None:
            return [list(ids) for ids in self._sp.encode(list(texts), num_threads=1)]
        encoded, counts = self._encode_lines(texts)
        out, i, nl = [], 0, [self._newline_id]
        for n in counts:
            ids = list(encoded[i])
            for piece in encoded[i + 1:i + n]:
                ids += nl
                ids += piece
            out.append(ids)
            i += n
        return out

    def encode_documents(self, texts: Sequence[str]) -> np.ndarray:
        """The packed stream piece for these documents: ids with EOS after each, flat.

        Every line is followed by exactly one separator, a newline within a document and
        EOS after its last line, so the result is assembled with a few vector operations
        instead of a Python loop over tokens.
        """
        if not texts:
            return np.empty(0, dtype=self.dtype)
        if self._newline_id is None:
            return np.asarray([i for ids in self.encode_batch(texts) for i in ids + [self.eos_id]],
                              dtype=self.dtype)
        encoded, counts = self._encode_lines(texts)
        lens = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        seps = np.cumsum(lens + 1) - 1  # (lines,) position of each line's separator
        total = int(seps[-1]) + 1
        out = np.empty(total, dtype=self.dtype)
        is_token = np.ones(total, dtype=bool)
        is_token[seps] = False
        out[is_token] = np.fromiter(itertools.chain.from_iterable(encoded), dtype=self.dtype,
                                    count=total - len(encoded))
        out[seps] = self._newline_id
        out[seps[np.cumsum(counts) - 1]] = self.eos_id
        return out

    def decode(self, ids: Iterable[int]) -> str:
        return self._sp.decode([int(i) for i in ids])


# --- training -------------------------------------------------------------------------


def _training_lines(texts: Iterable[str], max_chars: int) -> Iterator[str]:
    """Up to ``max_chars`` of text as sentencepiece training sentences (lines, cut short)."""
    total = 0
    for text in texts:
        for line in text.split("\n"):
            while line:
                piece = line
                if len(piece) > _MAX_TRAIN_LINE:
                    cut = piece.rfind(" ", 0, _MAX_TRAIN_LINE)
                    piece = piece[:cut if cut > 0 else _MAX_TRAIN_LINE]
                line = line[len(piece):]
                if piece.strip():
                    yield piece
                    total += len(piece)
                    if total >= max_chars:
                        return


def train(texts: Iterable[str], out_path: Path, vocab_size: int, model_type: str = "bpe",
          byte_fallback: bool = True, max_chars: int = 20_000_000, num_threads: int = 1) -> None:
    """Train a sentencepiece model on (a capped sample of) ``texts`` and write it atomically."""
    import io

    lines = _training_lines(texts, max_chars)
    first = next(lines, None)
    if first is None:
        raise DataError("no text to train the tokenizer on: the source has no non-empty "
                        "training documents; check DataConfig.dataset / DataConfig.text_field")
    buf = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=_chain(first, lines), model_writer=buf, vocab_size=vocab_size,
            model_type=model_type, byte_fallback=byte_fallback,
            pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID, eos_id=EOS_ID,
            user_defined_symbols=["\n"], normalization_rule_name="identity",
            remove_extra_whitespaces=False, add_dummy_prefix=False, split_digits=True,
            character_coverage=0.9995, input_sentence_size=2_000_000,
            shuffle_input_sentence=True, num_threads=num_threads, minloglevel=2)
    except RuntimeError as e:
        raise DataError(f"tokenizer training failed: {_training_hint(str(e), vocab_size)}"
                        ) from None
    write_atomic(out_path, buf.getvalue())


# sentencepiece's complaints about vocab_size go both ways: more pieces than the text
# can yield, or fewer than the characters it must cover. The hint follows the complaint.
_TOO_HIGH = re.compile(r"Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+)")
_TOO_LOW = re.compile(r"Vocabulary size is smaller than required_chars\. (\d+) vs (\d+)")


def _training_hint(error: str, vocab_size: int) -> str:
    """sentencepiece's error as one line that names the field to change, and which way."""
    msg = error.split("]")[-1].strip()
    if m := _TOO_HIGH.search(msg):
        return (f"DataConfig.tokenizer.vocab_size {vocab_size} is more than this text can fill "
                f"(Vocabulary size too high, at most {m.group(2)}); lower "
                "DataConfig.tokenizer.vocab_size or give more text")
    if m := _TOO_LOW.search(msg):
        return (f"DataConfig.tokenizer.vocab_size {vocab_size} is smaller than the {m.group(2)} "
                "characters and bytes the text needs (Vocabulary size too small); raise "
                f"DataConfig.tokenizer.vocab_size to at least {m.group(2)}")
    return (f"{msg}; check DataConfig.tokenizer.vocab_size and DataConfig.tokenizer.type, or give "
            "more text")


def write_atomic(path: Path, data: bytes) -> None:
    """``ten.fileio.atomic_write`` (its temp file is hidden, so a half-written one is never
    published with its folder), with the folder made first; a full or read-only disk is
    a one-line DataError."""
    with disk_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)


def _chain(first: str, rest: Iterator[str]) -> Iterator[str]:
    yield first
    yield from rest


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock: two jobs preparing the same cache entry take turns."""
    with disk_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        f = open(path, "a")  # noqa: SIM115 - closed below, after the lock is released
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def training_key(source_fingerprint: str, vocab_size: int, model_type: str,
                 byte_fallback: bool, max_chars: int, val_fraction: float) -> str:
    return digest({"source": source_fingerprint, "vocab": vocab_size, "type": model_type,
                   "byte_fallback": byte_fallback, "max_chars": max_chars,
                   "val_fraction": val_fraction, "recipe": RECIPE_VERSION})


def cached_model_path(cache_dir: Path, key: str) -> Path:
    """Where the tokenizer trained for ``key`` lives in the cache."""
    return cache_dir / "tokenizers" / key / "tokenizer.model"


def checksum_path(model: Path) -> Path:
    return model.with_name(model.name + CHECKSUM_SUFFIX)


def write_checksum(model: Path) -> None:
    """Record ``model``'s sha256 beside it (``sha256sum`` format). Written last: a model
    without one is unfinished."""
    write_atomic(checksum_path(model), f"{sha256_file(model)}  {model.name}\n".encode())


def cached_model_problem(model: Path) -> str | None:
    """None when a cached ``model`` is complete and matches its checksum, else what is
    wrong with it ("missing" when there is none)."""
    if not model.exists():
        return "missing"
    try:
        recorded = checksum_path(model).read_text().split()[0]
    except (FileNotFoundError, IndexError):
        return "has no checksum (never finished)"
    if sha256_file(model) != recorded:
        return "fails its sha256 check (corrupt)"
    return None


def discard_cached_model(model: Path) -> None:
    """Remove a cached model that is not to be used, checksum first (so no reader ever
    pairs a checksum with a model it does not belong to)."""
    with disk_errors(model.parent):
        checksum_path(model).unlink(missing_ok=True)
        model.unlink(missing_ok=True)


def log(line: str) -> None:
    print(f"ten.data: {line}", file=sys.stderr, flush=True)


def load_or_train(cache_dir: Path, key: str, texts: Iterable[str], **settings: object) -> Tokenizer:
    """The cached model for ``key``, training it first if this is the first time, or if
    the cached one fails its checksum."""
    path = cached_model_path(cache_dir, key)
    if cached_model_problem(path) is not None:
        with file_lock(path.parent / ".lock"):
            # Checked again under the lock: another process may have trained it meanwhile.
            problem = cached_model_problem(path)
            if problem is not None:
                if problem != "missing":
                    log(f"cached tokenizer {path} {problem}; training it again")
                discard_cached_model(path)
                train(texts, path, **settings)  # type: ignore[arg-type]
                write_checksum(path)
    return Tokenizer(path)
