"""Where documents come from: known hub datasets, local files, the builtin corpus.

Every source yields the same thing, in a deterministic order: ``(key, text)`` pairs,
one per document. ``key`` decides the train/validation split (a hash of it, see
:func:`is_val`): the text itself for hub and local sources, so duplicates land in the
same split, and the service name for the builtin corpus, so its held-out set is fixed.

Rules shared by all three data modes (so they produce the same token stream):

* a document is one row of a hub dataset / .jsonl / .parquet file, or one paragraph
  (lines up to a blank line) of a .txt file; files of a directory or glob in sorted order;
* empty and whitespace-only documents are skipped and counted;
* bytes that are not valid UTF-8 (local .txt/.jsonl files) are replaced with U+FFFD,
  never an error; documents containing U+FFFD are counted and reported.
"""

from __future__ import annotations

import glob
import itertools
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ten.data import builtin
from ten.data.errors import DataError, environment_cause, os_data_error
from ten.data.fingerprint import digest, unit_hash

Doc = tuple[str, str]  # (split key, text)

LOCAL_SUFFIXES = (".txt", ".jsonl", ".parquet")


@dataclass(frozen=True)
class HubSpec:
    """Where a known dataset lives on the Hugging Face hub."""

    path: str
    name: str | None
    split: str
    text_field: str


KNOWN: dict[str, HubSpec] = {
    "finewebedu": HubSpec("HuggingFaceFW/fineweb-edu", "sample-10BT", "train", "text"),
    "wikitext-103": HubSpec("wikitext", "wikitext-103-raw-v1", "train", "text"),
    "wikitext-2": HubSpec("wikitext", "wikitext-2-raw-v1", "train", "text"),
    "openwebtext": HubSpec("Skylion007/openwebtext", None, "train", "text"),
    "pg19": HubSpec("deepmind/pg19", None, "train", "text"),
    "tinystories": HubSpec("roneneldan/TinyStories", None, "train", "text"),
    "imdb": HubSpec("stanfordnlp/imdb", "plain_text", "train", "text"),
    "ag_news": HubSpec("fancyzhx/ag_news", None, "train", "text"),
}


def is_val(key: str, fraction: float) -> bool:
    """Whether a document belongs to the held-out split: a pure function of its key."""
    return fraction > 0 and unit_hash(key) < fraction


def usable(text: Any) -> bool:
    """Documents every mode skips (and counts): missing, empty or whitespace-only."""
    return isinstance(text, str) and not text.isspace() and text != ""


class Source:
    """A deterministic, restartable sequence of documents."""

    name: str
    #: Held-out fraction this source imposes (builtin), or None to use the config's.
    fixed_val_fraction: float | None = None

    def val_fraction(self, configured: float) -> float:
        """The held-out fraction in force: the source's own, else the configured one."""
        return configured if self.fixed_val_fraction is None else self.fixed_val_fraction

    def fingerprint(self) -> str:  # pragma: no cover
        raise NotImplementedError

    def documents(self, start: int = 0) -> Iterator[Doc]:  # pragma: no cover
        """Documents from index ``start`` on (indices count every row, even skipped ones)."""
        raise NotImplementedError

    def total_bytes(self) -> int | None:
        """Size of the input if cheaply known (drives the progress bar's ETA)."""
        return None

    def materialize(self) -> None:
        """Do any one-time local work now, in the main process (not in loader workers)."""

    def to_dataset(self, cache_dir: Path) -> Any:
        """A ``datasets.Dataset`` with columns key/text (download mode)."""
        import datasets

        return datasets.Dataset.from_generator(
            _generate, gen_kwargs={"source": self, "fp": self.fingerprint()},
            cache_dir=str(cache_dir / "hf"))


def _generate(source: Source, fp: str) -> Iterator[dict[str, str]]:
    # fp is only there so datasets' cache key changes when the source does.
    for key, text in source.documents():
        yield {"key": key, "text": text}


# --- the builtin corpus ---------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinSource(Source):
    cache_dir: Path
    name: str = builtin.NAME
    fixed_val_fraction: float | None = builtin.VAL_FRACTION

    def fingerprint(self) -> str:
        return digest({"builtin": self.name, "version": builtin.version()})

    def _path(self) -> Path:
        return builtin.corpus_path(self.cache_dir)

    def materialize(self) -> None:
        self._path()

    def documents(self, start: int = 0) -> Iterator[Doc]:
        with open(self._path(), encoding="utf-8") as f:
            for line in itertools.islice(f, start, None):
                row = json.loads(line)
                yield row["key"], row["text"]

    def total_bytes(self) -> int | None:
        return self._path().stat().st_size


# --- local files ----------------------------------------------------------------------


def resolve_files(spec: str) -> list[Path]:
    """A file, a directory (searched recursively) or a glob -> sorted supported files."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in LOCAL_SUFFIXES)
    elif path.is_file():
        files = [path]
    else:
        files = sorted(Path(p) for p in glob.glob(str(path), recursive=True) if Path(p).is_file())
    if not files:
        raise DataError(f"no {'/'.join(LOCAL_SUFFIXES)} files match DataConfig.dataset={spec!r}")
    unsupported = [p for p in files if p.suffix not in LOCAL_SUFFIXES]
    if unsupported:
        raise DataError(f"unsupported file type {unsupported[0].name!r} in "
                        f"DataConfig.dataset={spec!r}; "
                        f"supported: {', '.join(LOCAL_SUFFIXES)}")
    return files


def _txt_paragraphs(path: Path) -> Iterator[str]:
    """Paragraphs of a text file, streamed line by line (a blank line ends one)."""
    lines: list[str] = []
    with open(path, "rb") as f:
        for raw in f:
            line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
            if line.strip():
                lines.append(line)
            elif lines:
                yield "\n".join(lines)
                lines = []
    if lines:
        yield "\n".join(lines)


def _jsonl_texts(path: Path, field: str) -> Iterator[Any]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8", errors="replace"))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: not valid JSON ({e.msg}); fix or remove "
                                "the line") from None
            if not isinstance(row, dict) or field not in row:
                keys = sorted(row) if isinstance(row, dict) else type(row).__name__
                raise DataError(f"{path}:{lineno}: no text field {field!r} (available: {keys}); "
                                "set DataConfig.text_field")
            yield _without_lone_surrogates(row[field])


_SURROGATE = re.compile("[\ud800-\udfff]")


def _without_lone_surrogates(text: Any) -> Any:
    """JSON can spell a lone UTF-16 surrogate ("\\ud800"), which is no character: no UTF-8
    encodes it and sentencepiece refuses the whole batch. It becomes U+FFFD, as invalid
    UTF-8 bytes do, and is counted with them."""
    if not isinstance(text, str) or text.isascii():
        return text
    return _SURROGATE.sub("\ufffd", text)


def _parquet_texts(path: Path, field: str) -> Iterator[Any]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        pf = pq.ParquetFile(path)
        columns = pf.schema_arrow.names
        if field not in columns:
            raise DataError(f"{path}: no text field {field!r} (available: {columns}); "
                            "set DataConfig.text_field")
        for batch in pf.iter_batches(columns=[field], batch_size=1024):
            yield from batch.column(0).to_pylist()
    except (pa.ArrowException, OSError) as e:  # a damaged footer, page or row group
        why = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise DataError(f"{path}: not a readable parquet file ({why}); replace it or "
                        "leave it out of DataConfig.dataset") from None


@dataclass(frozen=True)
class LocalSource(Source):
    spec: str
    files: tuple[Path, ...]
    text_field: str = "text"

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.spec

    def fingerprint(self) -> str:
        stats = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in self.files]
        return digest({"local": stats, "field": self.text_field})

    def total_bytes(self) -> int | None:
        return sum(p.stat().st_size for p in self.files)

    def _texts(self) -> Iterator[Any]:
        for path in self.files:
            if path.suffix == ".txt":
                yield from _txt_paragraphs(path)
            elif path.suffix == ".jsonl":
                yield from _jsonl_texts(path, self.text_field)
            else:
                yield from _parquet_texts(path, self.text_field)

    def documents(self, start: int = 0) -> Iterator[Doc]:
        for text in itertools.islice(self._texts(), start, None):
            if text is not None and not isinstance(text, str):
                raise DataError(f"DataConfig.text_field {self.text_field!r} of {self.spec!r} holds "
                                f"{type(text).__name__}, not text; choose a text column")
            yield (text or ""), (text or "")


# --- the hub --------------------------------------------------------------------------


def load_hub(spec: HubSpec, streaming: bool, data_files: str | None = None,
             cache_dir: Path | None = None) -> Any:
    """``datasets.load_dataset`` for a known name; ``data_files`` reads local files of the
    same schema through the same code path (how the tests exercise it offline)."""
    import datasets

    kwargs: dict[str, Any] = {"streaming": streaming}
    if cache_dir is not None and not streaming:
        kwargs["cache_dir"] = str(cache_dir / "hf")
    try:
        if data_files is not None:
            files = [str(p) for p in resolve_files(data_files)]
            builder = {".parquet": "parquet", ".jsonl": "json", ".txt": "text"}[
                Path(files[0]).suffix]
            return datasets.load_dataset(builder, data_files=files, split="train", **kwargs)
        return datasets.load_dataset(spec.path, spec.name, split=spec.split, **kwargs)
    except DataError:
        raise
    except Exception as e:  # network, auth, missing config: all user-fixable
        if (cause := environment_cause(e)) is not None:  # a full cache disk, not the network
            raise os_data_error(cause, cache_dir / "hf" if cache_dir else None) from None
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
        raise DataError(f"could not load {spec.path!r} (config {spec.name!r}) from the hub: "
                        f"{first}; check the network / HF_TOKEN, or use a local path") from None


def _check_field(columns: Any, field: str, where: str) -> None:
    if columns is not None and field not in columns:
        raise DataError(f"{where}: no text field {field!r} (available: {sorted(columns)}); "
                        "set DataConfig.text_field")


@dataclass(frozen=True)
class HubSource(Source):
    name: str
    spec: HubSpec
    text_field: str
    data_files: str | None = None
    cache_dir: Path | None = None

    def fingerprint(self) -> str:
        local = None
        if self.data_files is not None:
            files = resolve_files(self.data_files)
            local = [(str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in files]
        return digest({"hub": [self.spec.path, self.spec.name, self.spec.split],
                       "field": self.text_field, "data_files": local})

    def documents(self, start: int = 0) -> Iterator[Doc]:
        ds = load_hub(self.spec, streaming=True, data_files=self.data_files)
        _check_field(ds.column_names, self.text_field, self.name)
        if start:
            ds = ds.skip(start)
        # ds.iter, not iter(ds): inside a DataLoader worker, iter(ds) silently yields only
        # that worker's share of the files; the streaming loader needs every document.
        for batch in ds.iter(batch_size=256):
            if self.text_field not in batch:
                _check_field(list(batch), self.text_field, self.name)
            for text in batch[self.text_field]:
                yield (text or ""), (text or "")

    def to_dataset(self, cache_dir: Path) -> Any:
        ds = load_hub(self.spec, streaming=False, data_files=self.data_files, cache_dir=cache_dir)
        _check_field(ds.column_names, self.text_field, self.name)
        ds = ds.select_columns([self.text_field])
        return ds.rename_column(self.text_field, "text") if self.text_field != "text" else ds


# --- choosing one ---------------------------------------------------------------------


def is_local(dataset: str) -> bool:
    """Whether ``DataConfig.dataset`` names local files: not the builtin corpus, not a
    known hub name, and :func:`looks_local` (how :func:`open_source` decides)."""
    return not dataset.startswith("builtin:") and dataset not in KNOWN and looks_local(dataset)


def looks_local(dataset: str) -> bool:
    """Whether a dataset name that is neither builtin nor a known hub name is read as a
    local path: it has a path separator, a glob character, a leading '.' or a supported
    suffix, or it exists. A name the OS refuses (a 1 MB string: "File name too long")
    does not exist, rather than raising."""
    if (os.sep in dataset or any(c in dataset for c in "*?[") or dataset.startswith(".")
            or Path(dataset).suffix in LOCAL_SUFFIXES):
        return True
    try:
        return Path(dataset).expanduser().exists()
    except (OSError, ValueError):  # ValueError: an embedded NUL
        return False


def open_source(dataset: str, text_field: str | None, cache_dir: Path,
                data_files: str | None = None) -> Source:
    """Resolve ``DataConfig.dataset`` to a source, or a one-line error listing what is known."""
    if dataset.startswith("builtin:"):
        if dataset != builtin.NAME:
            raise DataError(f"unknown builtin dataset {dataset!r}; known: {builtin.NAME}")
        return BuiltinSource(cache_dir=cache_dir)
    if dataset in KNOWN:
        spec = KNOWN[dataset]
        return HubSource(name=dataset, spec=spec, text_field=text_field or spec.text_field,
                         data_files=data_files, cache_dir=cache_dir)
    if not looks_local(dataset):
        raise DataError(f"unknown dataset {dataset!r}; known: {', '.join(KNOWN)}, "
                        f"{builtin.NAME}, or a local .txt/.jsonl/.parquet path, glob or directory")
    files = resolve_files(dataset)
    return LocalSource(spec=dataset, files=tuple(files), text_field=text_field or "text")
